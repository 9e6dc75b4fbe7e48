"""Starting from the BERT checkpoints users have: no trained weight is lost on the way (save, reload, every command),
and a checkpoint without BERT weights is refused instead of training on random ones."""

import logging

import pytest
import torch
from safetensors import safe_open
from transformers import BertConfig, BertForMaskedLM, BertForPreTraining, BertModel

from openrealm import RealmEmbedder, RealmForOpenQA, RealmKnowledgeAugEncoder, RealmReader, RealmScorer
from openrealm.modeling_realm import MissingWeightsError
from openrealm.trainers import towers

BERT = BertConfig(
    vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
    max_position_embeddings=128,
)  # fmt: skip


def bert_checkpoint(folder, layout: str) -> dict[str, torch.Tensor]:
    """Save a random BERT in one of the layouts users have; returns its encoder's state dict (bare BertModel keys).

    bare: a BertModel (sentence-transformers, all-MiniLM-L6-v2); mlm: BertForMaskedLM (`bert.*` + `cls.predictions`, no
    pooler); mlm_no_head: `bert.*` keys alone; pretraining: BertForPreTraining (`bert.*` with the pooler, MLM head and
    `cls.seq_relationship`), the layout of bert-base-uncased."""
    torch.manual_seed(7)
    model = {
        "bare": BertModel,
        "mlm": BertForMaskedLM,
        "mlm_no_head": BertForMaskedLM,
        "pretraining": BertForPreTraining,
    }[layout](BERT)
    if layout == "mlm_no_head":
        state = {key: value for key, value in model.state_dict().items() if key.startswith("bert.")}
        model.save_pretrained(folder, state_dict=state)
    else:
        model.save_pretrained(folder)
    return (model if layout == "bare" else model.bert).state_dict()


def saved_keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return set(weights.keys())


LAYOUTS = ["bare", "mlm", "mlm_no_head", "pretraining"]
CLASSES = [RealmEmbedder, RealmKnowledgeAugEncoder, RealmReader]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model_class", CLASSES, ids=lambda cls: cls.__name__)
def test_a_model_started_from_bert_saves_under_realm_keys_and_reloads_bit_exactly(model_class, layout, tmp_path):
    bert = bert_checkpoint(tmp_path / "bert", layout)
    model = model_class.from_bert_pretrained(tmp_path / "bert")
    model.save_pretrained(tmp_path / "saved")
    assert not any(key.startswith("bert.") for key in saved_keys(tmp_path / "saved"))
    reloaded, info = model_class.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    expected = model.state_dict()
    assert reloaded.state_dict().keys() == expected.keys()
    # exact: saved and reloaded
    assert all(torch.equal(reloaded.state_dict()[key], value) for key, value in expected.items())
    # ... and what was saved is the user's BERT, not a fresh initialisation.
    for key, value in bert.items():
        if not key.startswith("pooler.") or "pooler.dense.weight" in bert:
            assert torch.equal(reloaded.realm.state_dict()[key], value), key  # exact: copied, saved, reloaded


def test_the_bert_mlm_head_becomes_the_knowledge_augmented_encoders(tmp_path):
    bert_checkpoint(tmp_path / "bert", "pretraining")
    head = BertForPreTraining.from_pretrained(tmp_path / "bert").cls.predictions.transform.dense.weight
    encoder = RealmKnowledgeAugEncoder.from_bert_pretrained(tmp_path / "bert")
    assert torch.equal(encoder.cls.predictions.transform.dense.weight, head)  # exact: copied from the checkpoint


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model_class", CLASSES, ids=lambda cls: cls.__name__)
def test_starting_from_bert_prints_no_load_report_for_the_new_heads(model_class, layout, tmp_path, caplog):
    bert_checkpoint(tmp_path / "bert", layout)
    with caplog.at_level(logging.WARNING):
        model_class.from_bert_pretrained(tmp_path / "bert")
    assert "LOAD REPORT" not in caplog.text and "corrupted" not in caplog.text


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_encoder_from_a_bert_without_mlm_head_warns_that_it_cannot_read_yet(layout, tmp_path, caplog):
    bert_checkpoint(tmp_path / "bert", layout)
    with caplog.at_level(logging.WARNING):
        towers.load_encoder(str(tmp_path / "bert"))
    headless = layout in ("bare", "mlm_no_head")  # a sentence-transformers folder; `bert.*` keys alone
    assert ("has no masked-LM head" in caplog.text) is headless
    if headless:
        assert f"openrealm train mlm --corpus CORPUS --init {tmp_path / 'bert'}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        towers.load_encoder(str(tmp_path / "bert"), warn_untrained_head=False)
        towers.load_embedder(str(tmp_path / "bert"))  # the retriever has no MLM head to miss
    assert "masked-LM head" not in caplog.text


def test_a_bert_key_that_nothing_expects_stays_in_the_load_report(tmp_path, caplog):
    torch.manual_seed(0)
    model = BertForMaskedLM(BERT)
    state = {**model.state_dict(), "classifier.weight": torch.zeros(2, 32)}
    model.save_pretrained(tmp_path / "bert", state_dict=state)
    with caplog.at_level(logging.WARNING):
        _, info = RealmEmbedder.from_bert_pretrained(tmp_path / "bert", output_loading_info=True)
    assert info["unexpected_keys"] == {"classifier.weight"}


def test_from_pretrained_of_a_bert_checkpoint_names_the_missing_and_the_found_prefixes(tmp_path):
    bert_checkpoint(tmp_path / "bert", "mlm")
    with pytest.raises(MissingWeightsError) as error:
        RealmKnowledgeAugEncoder.from_pretrained(tmp_path / "bert")
    message = str(error.value)
    assert str(tmp_path / "bert") in message
    assert "['realm.embeddings', 'realm.encoder', 'realm.pooler']" in message
    assert "holds ['bert.embeddings', 'bert.encoder', 'cls.predictions']" in message
    assert "from_bert_pretrained" in message


def test_a_realm_folder_without_its_encoder_is_refused_unless_allowed(tmp_path):
    torch.manual_seed(0)
    from helpers import tiny_realm_config

    RealmScorer(tiny_realm_config()).save_pretrained(tmp_path / "scorer")
    with pytest.raises(MissingWeightsError, match="lacks the backbone weights"):
        RealmReader.from_pretrained(tmp_path / "scorer")
    reader = RealmReader.from_pretrained(tmp_path / "scorer", allow_missing_backbone=True)
    assert isinstance(reader, RealmReader)


def test_an_open_qa_folder_missing_its_reader_is_refused(tmp_path):
    from helpers import tiny_realm_config

    model = RealmForOpenQA(tiny_realm_config())
    state = {key: value for key, value in model.state_dict().items() if not key.startswith("reader.realm.")}
    model.save_pretrained(tmp_path / "openqa", state_dict=state)
    with pytest.raises(MissingWeightsError, match=r"\['reader.realm'\]"):
        RealmForOpenQA.from_pretrained(tmp_path / "openqa")


def test_a_folder_saved_under_bert_keys_by_openrealm_0_1_still_loads_with_a_key_mapping(tmp_path):
    bert = bert_checkpoint(tmp_path / "bert", "pretraining")
    model = RealmEmbedder.from_bert_pretrained(tmp_path / "bert")
    old = {
        ("bert." + key[len("realm.") :] if key.startswith("realm.") else key): v
        for key, v in model.state_dict().items()
    }
    model.save_pretrained(tmp_path / "old", state_dict=old)
    assert any(key.startswith("bert.") for key in saved_keys(tmp_path / "old"))
    with pytest.raises(MissingWeightsError, match="key_mapping"):
        RealmEmbedder.from_pretrained(tmp_path / "old")
    recovered = RealmEmbedder.from_pretrained(tmp_path / "old", key_mapping={r"^bert\.": "realm."})
    # exact: weights copied from the checkpoint
    assert torch.equal(recovered.realm.embeddings.word_embeddings.weight, bert["embeddings.word_embeddings.weight"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tower_loaders_take_every_bert_layout(layout, tmp_path):
    bert = bert_checkpoint(tmp_path / "bert", layout)
    embedder = towers.load_embedder(tmp_path / "bert")
    encoder = towers.load_encoder(tmp_path / "bert")
    for tower in (embedder, encoder):  # exact: weights copied from the checkpoint
        assert torch.equal(tower.realm.embeddings.word_embeddings.weight, bert["embeddings.word_embeddings.weight"])
        assert torch.equal(
            tower.realm.encoder.layer[1].output.dense.weight, bert["encoder.layer.1.output.dense.weight"]
        )  # exact: copied from the checkpoint


def test_the_encoder_loader_takes_the_reader_of_an_open_qa_folder(tmp_path):
    from helpers import tiny_realm_config

    torch.manual_seed(0)
    model = RealmForOpenQA(tiny_realm_config())
    model.save_pretrained(tmp_path / "openqa")
    encoder = towers.load_encoder(tmp_path / "openqa")
    # exact: saved and reloaded
    assert all(torch.equal(encoder.realm.state_dict()[k], v) for k, v in model.reader.realm.state_dict().items())


def test_save_tower_writes_model_tokenizer_and_files_and_keeps_other_entries(tmp_path):
    from helpers import fixture_tokenizer, tiny_realm_config

    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    model = RealmEmbedder(tiny_realm_config())
    towers.save_tower(model, tmp_path / "out", fixture_tokenizer(), {"summary.json": "{}\n"})
    assert (tmp_path / "out" / "checkpoint-5").is_dir()
    assert (tmp_path / "out" / "summary.json").read_text() == "{}\n"
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    reloaded = RealmEmbedder.from_pretrained(tmp_path / "out")
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in model.state_dict().items())  # exact: reloaded


@pytest.mark.parametrize(
    "command",
    [
        ["train", "ict", "--init", "{bad}", "--max-steps", "1"],
        [
            "train",
            "pretrain",
            "--embedder",
            "random",
            "--encoder",
            "{bad}",
            "--max-steps",
            "1",
            "--refresh-every",
            "1",
            "--spans",
            "random_span",
        ],  # fmt: skip
        ["index", "build", "--embedder", "{bad}"],
    ],
    ids=["ict --init", "pretrain --encoder", "index build --embedder"],
)
def test_a_command_given_a_checkpoint_without_bert_weights_stops_naming_it(command, tmp_path, capsys):
    """A REALM config beside `bert.*` weights (what OpenREALM 0.1 saved from a BERT checkpoint) is refused."""
    from openrealm.tokenization.corpus import build_corpus
    from openrealm.trainers.cli import main

    bert_checkpoint(tmp_path / "bert", "mlm")
    bad = tmp_path / "bad"
    model = RealmEmbedder.from_bert_pretrained(tmp_path / "bert")
    state = {("bert." + k[len("realm.") :] if k.startswith("realm.") else k): v for k, v in model.state_dict().items()}
    model.save_pretrained(bad, state_dict=state)
    from datasets import Dataset
    from helpers import fixture_tokenizer

    tokenizer = fixture_tokenizer()
    # enough blocks of several sentences that neither ICT nor pre-training refuses the corpus before the checkpoint
    articles = [{"title": f"A{i}", "text": f"It rained in May 19{i}0. The river rose."} for i in range(10)]
    build_corpus(Dataset.from_list(articles), tmp_path / "corpus", tokenizer)
    argv = [part.format(bad=bad) for part in command]
    argv += ["--corpus", str(tmp_path / "corpus"), "--output", str(tmp_path / "out")]
    assert main(argv) == 1
    error = capsys.readouterr().err
    assert f"openrealm: error: {bad} lacks the backbone weights" in error and "holds ['bert.embeddings'" in error
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_weights_holding_nan_are_refused_on_load_naming_the_tensor(tmp_path):
    from helpers import tiny_realm_config

    model = RealmEmbedder(tiny_realm_config())
    state = dict(model.state_dict())
    state["cls.dense.weight"] = state["cls.dense.weight"].clone()
    state["cls.dense.weight"][0, 0] = float("nan")
    model.save_pretrained(tmp_path / "nan", state_dict=state)
    with pytest.raises(ValueError, match="the weight cls.dense.weight holds NaN or inf values"):
        RealmEmbedder.from_pretrained(tmp_path / "nan")
