"""`openrealm ask` and `pipeline()` with bad input: model folders, tokenizers and questions that cannot be read are
named in one line (exit 2); the corpus's text is printed as text."""

import io
import json
import os

import pytest
from helpers import model_copy, one_error_line, refused_argument, write_config

from openrealm import RealmTokenizer
from openrealm.trainers.cli import main


def edit_config(folder: str, **fields) -> None:
    path = os.path.join(folder, "config.json")
    config = json.loads(open(path, encoding="utf-8").read())
    config.update(fields)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


def test_ask_without_a_question_exits_2_with_one_error_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert main(["ask", "--model", str(tmp_path / "model")]) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: no question given: pass one, or pipe them on stdin, one per line"
    )


def test_ask_with_a_missing_model_folder_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["ask", "--model", "./nope", "where is paris ?"]) == 2
    assert one_error_line(capsys) == "openrealm: error: --model ./nope: no such folder"


def test_ask_with_a_config_field_of_the_wrong_type_exits_2_naming_file_and_field(tmp_path, capsys):
    model = write_config(tmp_path / "model", vocab_size=158.0)
    assert main(["ask", "--model", model, "where is paris ?"]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {model}/config.json: Field 'vocab_size' expected int, got float (value: 158.0)"
    )


def test_ask_with_a_tokenizer_larger_than_the_vocabulary_exits_2_before_any_question(saved_model, tmp_path, capsys):
    model = model_copy(saved_model, tmp_path)
    tokenizer = RealmTokenizer.from_pretrained(model)
    tokenizer.add_tokens(["zzzone", "zzztwo"])
    tokenizer.save_pretrained(model)
    assert main(["ask", "--model", model, "zzzone where is paris ?"]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {model}: the tokenizer has 160 tokens but config.json's vocab_size is 158, so ids from "
        "158 on have no embedding: use the tokenizer the model was trained with"
    )


def test_the_pipeline_refuses_a_tokenizer_larger_than_the_vocabulary(saved_model):
    from transformers import pipeline

    tokenizer = RealmTokenizer.from_pretrained(saved_model)
    tokenizer.add_tokens(["zzzone"])
    with pytest.raises(ValueError, match=r"the tokenizer has 159 tokens but config\.json's vocab_size is 158"):
        pipeline("question-answering", model=str(saved_model), tokenizer=tokenizer)


def test_a_load_failure_inside_pipeline_is_one_line_without_load_table_or_traceback(saved_model, tmp_path, capsys):
    model = model_copy(saved_model, tmp_path)
    edit_config(model, vocab_size=100)  # a valid config that contradicts the weights
    assert main(["ask", "--model", model, "where is paris ?"]) == 2
    err = capsys.readouterr().err
    assert "LOAD REPORT" not in err and "Traceback" not in err
    assert err.startswith(f"openrealm: error: The config of {model} contradicts its weights (")
    assert err.endswith("to re-initialise the mismatched weights.\n") and err.count("\n") == 1


def test_ask_names_the_stdin_line_that_is_not_utf8(tmp_path, capsys, monkeypatch):
    (tmp_path / "model").mkdir()  # refused before the model is loaded
    stdin = io.TextIOWrapper(io.BytesIO(b"where is paris ?\n\nwhere is \xff paris ?\n"), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["ask", "--model", str(tmp_path / "model")]) == 2
    assert one_error_line(capsys) == "openrealm: error: stdin, line 3: not UTF-8 text (invalid start byte at byte 9)"


def test_ask_refuses_a_question_argument_holding_undecodable_bytes(saved_model, capsys):
    question = b"where is \xff paris ?".decode("utf-8", "surrogateescape")  # how Python passes such an argv
    assert main(["ask", "--model", str(saved_model), question]) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: question 0 is not text: it holds the lone surrogate U+DCFF at character 9 (bytes that "
        "were not UTF-8?)."
    )


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_ask_with_a_tokenizer_file_that_is_not_json_exits_2_naming_file_line_and_column(
    saved_model, tmp_path, capsys, name
):
    model = model_copy(saved_model, tmp_path)
    with open(os.path.join(model, name), "w", encoding="utf-8") as f:
        f.write('{\n  "version": "1.0",\n  oops\n}\n')
    assert main(["ask", "--model", model, "where is paris ?"]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {model}/{name}: invalid JSON: Expecting property name enclosed in double quotes (line 3, "
        "column 3)"
    )


def test_ask_prints_the_terminal_escapes_of_a_corpus_as_text(saved_model, tmp_path, capsys):
    from helpers import BLOCK_TEXTS

    from openrealm import BlockRecords

    model = model_copy(saved_model, tmp_path)
    os.remove(os.path.join(model, "block_records.safetensors"))
    titles = [f"\x1b]0;owned\x07title {i}\r" for i in range(len(BLOCK_TEXTS))]
    BlockRecords.write(os.path.join(model, "block_records.safetensors"), zip(titles, BLOCK_TEXTS))
    assert main(["ask", "--model", model, "where does the nile flow ?"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "[\\x1b]0;owned\\x07title " in out and "\\x0d] retrieval score" in out


@pytest.mark.parametrize("flag", ["--top-k", "--num-blocks"])
def test_ask_refuses_a_count_below_one_naming_the_flag_before_the_model_loads(capsys, flag):
    line = refused_argument(["ask", "--model", "M", flag, "0", "q"], capsys)
    assert line == f"openrealm ask: error: argument {flag}: must be a positive integer (at least 1), got 0"
