"""`openrealm train mlm`: BERT's masked-LM objective on the corpus blocks, the encoder's start for REALM pre-training
when the checkpoint has no trained MLM head (sentence-transformers models)."""

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import tiny_fields, tiny_overrides
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertModel

from openrealm import RealmKnowledgeAugEncoder
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers import cli, towers
from openrealm.trainers.masked_lm import CorpusBlocks, MaskedLmModel, collator, evaluate


@pytest.fixture(scope="module")
def headless_bert(quickstart_corpus, tmp_path_factory) -> Path:
    """A small BERT saved as a bare BertModel (no MLM head), as a sentence-transformers folder is."""
    folder = tmp_path_factory.mktemp("bert") / "bert"
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer), **tiny_fields(retriever_proj_size=None, max_position_embeddings=128)
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_loss_is_berts_cross_entropy_over_the_chosen_positions_only(quickstart_corpus):
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    encoder = towers.load_encoder("random", tokenizer, tiny_fields(retriever_proj_size=None))
    rows = [CorpusBlocks(load_corpus(quickstart_corpus), tokenizer, 64)[i] for i in range(4)]
    batch = collator(tokenizer, seed=0)(rows)
    assert (batch["labels"] != -100).any()
    out = MaskedLmModel(encoder).eval()(**batch)
    full = encoder.eval()(
        batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).logits
    expected = torch.nn.functional.cross_entropy(full.view(-1, full.shape[-1]), batch["labels"].view(-1))
    torch.testing.assert_close(out.loss, expected)


def test_bert_masking_never_chooses_special_tokens_or_padding(quickstart_corpus):
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    dataset = CorpusBlocks(load_corpus(quickstart_corpus), tokenizer, 64)
    batch = collator(tokenizer, seed=1)([dataset[i] for i in range(32)])
    chosen = batch["labels"] != -100
    special = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    assert not any(int(token) in special for token in batch["labels"][chosen])
    rate = chosen.sum() / (batch["attention_mask"].sum() - 3 * len(dataset.ids[:32]))
    assert 0.10 < float(rate) < 0.20  # BERT's 15%


def test_removed_blocks_are_not_trained_on(quickstart_corpus):
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    blocks = load_corpus(quickstart_corpus)
    dataset = CorpusBlocks(blocks, tokenizer, 64, removed={0, 5})
    assert len(dataset) == len(blocks) - 2
    assert 0 not in dataset.ids and 5 not in dataset.ids
    with pytest.raises(ValueError, match="no blocks left"):
        CorpusBlocks(blocks, tokenizer, 64, removed=set(range(len(blocks))))


def test_train_mlm_from_a_headless_bert_learns_and_saves_the_pretraining_encoder(
    quickstart_corpus, headless_bert, tmp_path, caplog
):
    output = tmp_path / "encoder"
    argv = [
        "train", "mlm", "--corpus", str(quickstart_corpus), "--init", str(headless_bert), "--output", str(output),
        "--max-steps", "60", "--batch-size", "16", "--learning-rate", "2e-3", "--warmup-steps", "5",
        "--max-seq-len", "64", "--eval-blocks", "64", "--quiet",
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert cli.main(argv) == 0
    assert "has no masked-LM head" not in caplog.text  # train mlm is the cure, not a case for the warning
    summary = json.loads((output / "mlm_training.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["masked_tokens"] == after["masked_tokens"] > 0  # the same fixed masks before and after
    assert after["loss"] < before["loss"] - 1.0
    assert after["accuracy"] > before["accuracy"]
    assert summary["blocks"] == 117 and summary["max_seq_len"] == 64

    # What was saved is the trained encoder, MLM head included, and pre-training loads it without a warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        encoder = towers.load_encoder(str(output))
    assert "masked-LM head" not in caplog.text
    assert isinstance(encoder, RealmKnowledgeAugEncoder)
    saved = load_file(output / "model.safetensors")
    for key in ("cls.predictions.transform.dense.weight", "realm.encoder.layer.0.output.dense.weight"):
        assert torch.equal(encoder.state_dict()[key], saved[key])  # exact: saved and reloaded
    start = BertModel.from_pretrained(headless_bert)
    # exact: any change at all means the run trained
    assert not torch.equal(saved["realm.encoder.layer.0.output.dense.weight"],
                           start.encoder.layer[0].output.dense.weight)  # fmt: skip


def test_train_mlm_refuses_a_non_empty_output(quickstart_corpus, headless_bert, tmp_path, capsys):
    output = tmp_path / "encoder"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    argv = ["train", "mlm", "--corpus", str(quickstart_corpus), "--init", str(headless_bert), "--output", str(output),
            "--max-steps", "1", "--quiet"]  # fmt: skip
    assert cli.main(argv) != 0
    assert f"output folder {output} is not empty" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "mine"


def tiny_encoder(corpus) -> RealmKnowledgeAugEncoder:
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    return towers.load_encoder("random", tokenizer, tiny_fields(retriever_proj_size=None))


def test_a_batch_whose_masking_chose_no_wordpiece_gives_a_zero_loss_that_reaches_the_weights(quickstart_corpus):
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    rows = [CorpusBlocks(load_corpus(quickstart_corpus), tokenizer, 64)[i] for i in range(2)]
    batch = collator(tokenizer, seed=0)(rows)
    batch["labels"].fill_(-100)
    model = MaskedLmModel(tiny_encoder(quickstart_corpus))
    out = model(**batch)
    assert out.loss.item() == 0.0 and out.accuracy.item() == 0.0
    out.loss.backward()
    head = model.encoder.cls.predictions.transform.dense.weight.grad
    assert head is not None and torch.count_nonzero(head) == 0


def test_evaluation_leaves_out_batches_without_a_chosen_wordpiece(quickstart_corpus):
    tokenizer = AutoTokenizer.from_pretrained(quickstart_corpus)
    rows = [CorpusBlocks(load_corpus(quickstart_corpus), tokenizer, 64)[i] for i in range(4)]
    masked = collator(tokenizer, seed=0)(rows)
    unmasked = {name: tensor.clone() for name, tensor in masked.items()}
    unmasked["labels"].fill_(-100)
    model = MaskedLmModel(tiny_encoder(quickstart_corpus))
    assert evaluate(model, [unmasked, masked]) == evaluate(model, [masked])


def mlm_argv(corpus, output, *extra: str) -> list[str]:
    return [
        "train", "mlm", "--corpus", str(corpus), "--init", "random", "--output", str(output), "--max-steps", "1",
        "--batch-size", "4", "--eval-blocks", "8", "--quiet", "--config-overrides",
        tiny_overrides(retriever_proj_size=None, max_position_embeddings=64), *extra,
    ]  # fmt: skip


def test_train_mlm_refuses_a_block_length_that_leaves_few_wordpieces_to_mask(quickstart_corpus, tmp_path, capsys):
    output = tmp_path / "encoder"
    argv = mlm_argv(quickstart_corpus, output, "--max-seq-len", "4", "--max-dropped-share", "0.8")
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: 99 of 117 blocks an epoch (85%) give no training example: 99 because BERT's masking "
        "(each wordpiece with probability 0.15) chooses none of the wordpieces of their block, which holds 1.0 on "
        "average at --max-seq-len 4"
    )
    assert "raise --max-seq-len" in error and not output.exists()


def test_train_mlm_summary_line_warns_when_most_blocks_get_no_mask(quickstart_corpus, tmp_path, capsys):
    output = tmp_path / "encoder"
    # 2 wordpieces a block: 72% unmasked
    assert cli.main(mlm_argv(quickstart_corpus, output, "--max-seq-len", "5")) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"masked LM: saved the RealmKnowledgeAugEncoder to {output} (train loss ")
    assert "; warning: 85 of 117 blocks an epoch (73%) give no training example: 85 because BERT's masking" in line
