"""The `train` commands with bad input: a bad line of `train openqa --train/--dev` and a `--config-overrides` of the
wrong type are refused (exit 2, one line) before anything is written."""

import json
import re

import pytest
from helpers import NILE_ARTICLE, one_error_line, write_lines

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
