"""The `train` commands with bad input: a bad line of `train openqa --train/--dev`, an option out of its range, a
`--config-overrides` key that is no field or a value of the wrong type, a tower larger than any device, and settings
the corpus cannot serve are refused (exit 2, one line) before anything is written or removed."""

import json
import re

import pytest
from helpers import (
    DATED,
    NILE_ARTICLE,
    TEXTS,
    TINY,
    TITLES,
    cli_pretrain,
    one_error_line,
    refused_argument,
    small_corpus,
    write_corpus,
    write_lines,
)

from openrealm.tokenization.corpus import build_corpus
from openrealm.trainers.cli import main

TRAIN_LINE = '{"question": "q", "answers": ["a"]}'


@pytest.mark.parametrize(
    ("flag", "line", "message"),
    [
        ("--train", '{"question": "q", "answers": [null]}', r"train\.jsonl, line 2: answers\[0\] must be a string"),
        ("--dev", "{oops", r"dev\.jsonl, line 2: invalid JSON"),
        ("--gold-passages", '{"text": "a"}', r"gold\.jsonl, line 2: missing field 'id'"),
    ],
    ids=["train", "dev", "gold-passages"],
)
def test_train_openqa_bad_line_exits_2_before_writing_anything(tmp_path, capsys, flag, line, message):
    first = {"train": TRAIN_LINE, "dev": TRAIN_LINE, "gold": '{"id": 1, "text": "t"}'}
    bad = {"--train": "train", "--dev": "dev", "--gold-passages": "gold"}[flag]
    files = {
        name: write_lines(tmp_path / f"{name}.jsonl", first[name], *([line] if name == bad else [])) for name in first
    }
    (tmp_path / "model").mkdir()
    argv = ["train", "openqa", "--model", str(tmp_path / "model"), "--train", files["train"], "--dev", files["dev"]]
    argv += ["--gold-passages", files["gold"], "--output", str(tmp_path / "out"), "--max-steps", "1"]
    assert main(argv) == 2
    assert re.search(message, one_error_line(capsys))
    assert not (tmp_path / "out").exists()


def test_a_config_override_of_the_wrong_type_exits_2_naming_the_field(tmp_path, capsys):
    from helpers import fixture_tokenizer

    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    build_corpus(source, tmp_path / "corpus", fixture_tokenizer(), progress=False)
    argv = ["train", "ict", "--corpus", str(tmp_path / "corpus"), "--init", "random", "--output", str(tmp_path / "o")]
    argv += ["--max-dropped-share", "1"]  # the one-block corpus would otherwise be refused first, as too small
    assert main([*argv, "--config-overrides", "hidden_size=abc", "--max-steps", "1"]) == 2
    assert (
        one_error_line(capsys)
        == "openrealm: error: RealmConfig: Field 'hidden_size' expected int, got str (value: 'abc')"
    )
    assert not (tmp_path / "o").exists()


TRAIN = {
    "ict": "train ict --corpus C --init random --output {out} --max-steps 1",
    "mlm": "train mlm --corpus C --init random --output {out} --max-steps 1",
    "pretrain": "train pretrain --corpus C --embedder random --encoder random --output {out} --max-steps 1 "
    "--refresh-every 1",
    "openqa": "train openqa --model M --train Q.jsonl --output {out} --max-steps 1",
}
POSITIVE, NON_NEGATIVE = (
    "must be a positive integer (at least 1), got",
    "must be a non-negative integer (0 or more), got",
)
RATE, SHARE = "must be a finite number of at least 0, got", "must be from 0 to 1, got"
SEED = "must be an integer from 0 to 2147483647, got"
BAD_OPTIONS = [
    ("ict", "--max-steps -1", f"{POSITIVE} -1"),
    ("ict", "--learning-rate nan", f"{RATE} nan"),
    ("ict", "--learning-rate -0.0001", f"{RATE} -0.0001"),
    ("ict", "--warmup-steps -1", f"{NON_NEGATIVE} -1"),
    ("ict", "--query-seq-len 0", "must be an integer of at least 3, got 0"),
    ("ict", "--block-seq-len 3", "must be an integer of at least 4, got 3"),
    ("ict", "--mask-rate 1.5", f"{SHARE} 1.5"),
    ("ict", "--embedding-dropout nan", f"{SHARE} nan"),
    ("ict", "--seed -1", f"{SEED} -1"),
    ("ict", "--logging-steps 0", f"{POSITIVE} 0"),
    ("ict", "--save-steps -1", f"{NON_NEGATIVE} -1"),
    ("ict", "--save-total-limit 0", f"{POSITIVE} 0"),
    ("ict", "--eval-steps -1", f"{NON_NEGATIVE} -1"),
    ("ict", "--eval-blocks 0", f"{POSITIVE} 0"),
    ("ict", "--eval-queries -1", f"{NON_NEGATIVE} -1"),
    ("ict", "--num-workers -1", f"{NON_NEGATIVE} -1"),
    ("ict", "--max-dropped-share 2", f"{SHARE} 2"),
    ("mlm", "--max-seq-len 3", "must be an integer of at least 4, got 3"),
    ("mlm", "--eval-blocks -1", f"{NON_NEGATIVE} -1"),
    ("mlm", "--learning-rate inf", f"{RATE} inf"),
    ("mlm", "--seed 2147483648", f"{SEED} 2147483648"),
    ("pretrain", "--oracle-reader-weight 2", f"{SHARE} 2"),
    ("pretrain", "--oracle-reader-weight nan", f"{SHARE} nan"),
    ("pretrain", "--oracle-reader-weight -0.5", f"{SHARE} -0.5"),
    ("pretrain", "--num-candidates 0", "must be an integer of at least 2, got 0"),
    ("pretrain", "--num-candidates 1", "must be an integer of at least 2, got 1"),
    ("pretrain", "--hold-out-queries -1", f"{NON_NEGATIVE} -1"),
    ("pretrain", "--freeze-retriever-steps -3", f"{NON_NEGATIVE} -3"),
    ("pretrain", "--refresh-lag 0", f"{POSITIVE} 0"),
    ("pretrain", "--embedder-learning-rate nan", f"{RATE} nan"),
    ("pretrain", "--initial-prior-entropy nan", "must be a finite number, got nan"),
    ("pretrain", "--embedding-dropout 1.5", f"{SHARE} 1.5"),
    ("pretrain", "--preflight-steps -1", f"{NON_NEGATIVE} -1"),
    ("pretrain", "--save-steps -1", f"{NON_NEGATIVE} -1"),
    ("openqa", "--gradient-accumulation-steps 0", f"{POSITIVE} 0"),
    ("openqa", "--searcher-beam-size 0", f"{POSITIVE} 0"),
    ("openqa", "--reader-beam-size 0", f"{POSITIVE} 0"),
    ("openqa", "--eval-reader-beam-size 0", f"{POSITIVE} 0"),
    ("openqa", "--eval-steps 0", f"{POSITIVE} 0"),
    ("openqa", "--eval-batch-size 0", f"{POSITIVE} 0"),
    ("openqa", "--min-passage-overlap 1.5", f"{SHARE} 1.5"),
    ("openqa", "--learning-rate nan", f"{RATE} nan"),
    ("openqa", "--seed -1", f"{SEED} -1"),
    ("openqa", "--logging-steps 0", f"{POSITIVE} 0"),
]


@pytest.mark.parametrize(("job", "option", "message"), BAD_OPTIONS, ids=[f"{j} {o}" for j, o, _ in BAD_OPTIONS])
def test_a_train_option_out_of_its_range_is_refused_naming_it_before_anything_is_written(
    tmp_path, capsys, job, option, message
):
    argv = TRAIN[job].format(out=tmp_path / "out").split() + option.split()
    line = refused_argument(argv, capsys)
    assert line == f"openrealm train {job}: error: argument {option.split()[0]}: {message}"
    assert not (tmp_path / "out").exists()


CLOSEST = "is not a field of RealmConfig: did you mean hidden_size?"
BAD_OVERRIDES = [
    ("ict", "hidden_sise=32,num_hidden_layers=1", f"config override 'hidden_sise' {CLOSEST}"),
    ("mlm", "hiddensize=32", f"config override 'hiddensize' {CLOSEST}"),
    ("pretrain", "bogus_key=3", "config override 'bogus_key' is not a field of RealmConfig (the fields that size a "
     "model: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, retriever_proj_size, "
     "max_position_embeddings, vocab_size)"),
    ("ict", "hidden_size=32,hidden_size=64", "config override 'hidden_size' is given twice"),
    ("ict", "hidden_size", "config override 'hidden_size' is not key=value"),
]  # fmt: skip


@pytest.mark.parametrize(("job", "overrides", "message"), BAD_OVERRIDES, ids=[o for _, o, _ in BAD_OVERRIDES])
def test_a_config_override_that_names_no_field_is_refused_naming_the_closest_field(
    tmp_path, capsys, job, overrides, message
):
    argv = TRAIN[job].format(out=tmp_path / "out").split() + ["--config-overrides", overrides]
    line = refused_argument(argv, capsys)
    assert line == f"openrealm train {job}: error: argument --config-overrides: {message}"
    assert not (tmp_path / "out").exists()


def ict_argv(tmp_path, corpus, *extra: str) -> list[str]:
    argv = ["train", "ict", "--corpus", str(corpus), "--init", "random", "--output", str(tmp_path / "out")]
    return argv + ["--max-steps", "1", "--query-seq-len", "16", "--block-seq-len", "64", "--no-progress", *extra]


def test_a_tower_larger_than_any_device_is_refused_before_it_is_allocated(tmp_path, capsys, monkeypatch):
    from openrealm.trainers import towers

    def allocated(config):
        raise AssertionError("the tower was allocated")

    monkeypatch.setattr(towers, "RealmEmbedder", allocated)
    corpus = write_corpus(tmp_path / "corpus")
    assert main(ict_argv(tmp_path, corpus, "--batch-size", "4", "--config-overrides", "hidden_size=1000000008")) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: --init random with --config-overrides hidden_size=1000000008: a tower of hidden_size "
        "1000000008, 12 layers, intermediate_size 3072 and 158 wordpieces has about 5e+19 parameters, more than the "
        "10 billion that training fits on one device (16 bytes each: 160 GB): give smaller sizes"
    )
    assert not (tmp_path / "out").exists()


def test_overwrite_removes_the_earlier_run_only_once_every_check_passed(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    earlier = tmp_path / "out" / "checkpoint-3"
    earlier.mkdir(parents=True)
    (earlier / "trainer_state.json").write_text("{}")
    argv = ict_argv(tmp_path, corpus, "--batch-size", "4", "--config-overrides", "hidden_size=1000000008")
    assert main([*argv, "--overwrite"]) == 2
    assert "more than the 10 billion" in one_error_line(capsys)
    assert (earlier / "trainer_state.json").read_text() == "{}"


def test_ict_in_batch_evaluation_of_fewer_blocks_than_a_batch_is_refused_before_training(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    argv = ict_argv(tmp_path, corpus, "--config-overrides", TINY, "--batch-size", "4")
    assert main([*argv, "--eval-steps", "1", "--eval-blocks", "3"]) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: --eval-blocks 3 is fewer than one global batch (4 x 1 processes): the in-batch evaluation "
        "keeps whole batches only and would score nothing; raise --eval-blocks or lower --batch-size"
    )
    assert not (tmp_path / "out").exists()


def test_ict_recall_at_5_over_a_corpus_of_4_blocks_is_refused_before_training(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", TITLES[:4], TEXTS[:4])
    argv = ict_argv(tmp_path, corpus, "--config-overrides", TINY, "--batch-size", "2", "--eval-queries", "10")
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: --eval-queries measures recall@5 over the corpus, but {corpus} has 4 blocks: pass "
        "--eval-queries 0, or use a larger corpus"
    )
    assert not (tmp_path / "out").exists()


def test_more_held_out_queries_than_blocks_with_a_span_is_refused_and_the_corrected_rerun_trains(
    world_corpus, tmp_path, capsys
):
    corpus = small_corpus(world_corpus, tmp_path / "corpus", DATED)  # 10 blocks, each with a date
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "1", "--batch-size", "2", "--hold-out-queries", "11") == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: --hold-out-queries 11 asks for more held-out query blocks than the 10 blocks of {corpus} "
        "with a salient span (they are drawn among those): lower it"
    )
    assert not output.exists()
    assert cli_pretrain(corpus, output, "--max-steps", "1", "--batch-size", "2", "--hold-out-queries", "2") == 0
    assert json.loads((output / "pretraining.json").read_text())["held_out_query_blocks"] == [4, 6]


def test_holding_out_every_block_with_a_span_is_refused_under_salient_masking(world_corpus, tmp_path, capsys):
    corpus = small_corpus(world_corpus, tmp_path / "corpus", DATED)
    assert cli_pretrain(corpus, tmp_path / "out", "--max-steps", "1", "--hold-out-queries", "10") == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: --hold-out-queries 10 holds out every block of {corpus} with a salient span, and --spans "
        "salient masks salient spans only: no query would train; lower it"
    )
    assert not (tmp_path / "out").exists()


def test_a_pretraining_batch_larger_than_the_training_queries_is_refused_before_index_v0(
    world_corpus, tmp_path, capsys
):
    corpus = small_corpus(world_corpus, tmp_path / "corpus", DATED)  # 10 blocks
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "1", "--batch-size", "8", "--hold-out-queries", "3") == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: corpus {corpus} gives 7 training queries (its blocks less those removed and held out), "
        "fewer than one global batch (8 x 1 processes): lower --batch-size"
    )
    assert not output.exists()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-0.02"])
def test_a_config_override_of_an_initializer_range_that_gives_no_weights_is_refused(tmp_path, capsys, value):
    corpus = write_corpus(tmp_path / "corpus")
    argv = ict_argv(tmp_path, corpus, "--batch-size", "4", "--config-overrides", f"{TINY},initializer_range={value}")
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: RealmConfig: field 'initializer_range' must be a finite number of at least 0, got "
        f"{float(value)}"
    )
    assert not (tmp_path / "out").exists()
