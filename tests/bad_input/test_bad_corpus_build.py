"""`openrealm corpus build` with bad input: every bad line named, nothing left behind; `--overwrite` deletes only what
a build wrote; a full disk names the output."""

import json
import os

import pytest
from helpers import NILE_ARTICLE, full_disk, one_error_line, refused_argument, write_lines

from openrealm.tokenization import articles, corpus
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.jsonl import JsonlError
from openrealm.trainers.cli import main


def corpus_build_argv(*argv: str) -> list[str]:
    return ["corpus", "build", *argv, "--spans", "none"]


def test_corpus_invalid_json_names_file_and_line_and_writes_nothing(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE), "", "not json")
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 3: invalid JSON: Expecting value \(column 1\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def test_corpus_missing_text_field_names_the_line(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE), '{"title": "paris", "body": "x"}')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: missing field 'text' \(fields: body, title\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def test_corpus_null_title_names_the_line(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE), '{"title": null, "text": "x"}')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: field 'title' must be a string, got null"):
        build_corpus(source, tmp_path / "out", tokenizer)


def test_corpus_bad_line_of_the_second_input_file_is_named(tmp_path, tokenizer):
    first = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    second = write_lines(tmp_path / "b.jsonl", json.dumps(NILE_ARTICLE), json.dumps(NILE_ARTICLE), "7")
    with pytest.raises(JsonlError, match=r"b\.jsonl, line 3: expected a JSON object, got a number"):
        build_corpus([first, second], tmp_path / "out", tokenizer)
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl"]


def test_corpus_blank_lines_are_skipped(tmp_path, tokenizer):
    source = write_lines(
        tmp_path / "a.jsonl", "", json.dumps(NILE_ARTICLE), "", json.dumps({"title": "b", "text": "Paris."})
    )
    build_corpus(source, tmp_path / "out", tokenizer)
    assert load_corpus(tmp_path / "out")["title"] == ["nile", "b"]


def test_corpus_input_of_only_blank_lines_is_refused(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", "", "")
    with pytest.raises(ValueError, match=r"a\.jsonl holds no articles \(empty file\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def test_corpus_cli_bad_line_exits_2_naming_the_line(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE), '{"title": "x", "text": 3}')
    argv = corpus_build_argv(
        "--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok")
    )
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {source}, line 2: field 'text' must be a string, got a number"
    )
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "tok"]


def test_corpus_build_with_a_missing_tokenizer_folder_exits_2_naming_it(tmp_path, capsys):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    argv = corpus_build_argv("--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "t"))
    assert main(argv) == 2
    assert one_error_line(capsys) == f"openrealm: error: --tokenizer {tmp_path / 't'}: no such folder"
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


def test_a_full_disk_during_corpus_build_exits_1_with_one_error_line(tmp_path, tokenizer, capsys, monkeypatch):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    monkeypatch.setattr(corpus, "write_block_records", full_disk)
    argv = corpus_build_argv(
        "--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok")
    )
    assert main(argv) == 1
    assert one_error_line(capsys).startswith(
        f"openrealm: error: No space left on the device holding {tmp_path / 'out'}"
    )
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "tok"]


def test_corpus_config_lists_the_files_the_build_wrote(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE)), tmp_path / "out", tokenizer)
    config = json.loads((tmp_path / "out" / "corpus_config.json").read_text())
    assert config["files"] == sorted(os.listdir(tmp_path / "out"))
    assert {"blocks", "block_records.safetensors", "corpus_config.json", "tokenizer.json"} <= set(config["files"])


def test_overwrite_refuses_a_corpus_folder_holding_files_it_did_not_write(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    build_corpus(source, tmp_path / "out", tokenizer)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"out: it holds files that corpus build did not write \(notes\.txt\)"):
        build_corpus(source, tmp_path / "out", tokenizer, overwrite=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert load_corpus(tmp_path / "out")["title"] == ["nile"]


def test_overwrite_refuses_an_input_inside_the_output_and_keeps_it(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE)), tmp_path / "out", tokenizer)
    inside = write_lines(tmp_path / "out" / "more.jsonl", json.dumps({"title": "paris", "text": "Paris."}))
    with pytest.raises(ValueError, match=r"input .*more\.jsonl lies inside .*out, which replacing would delete"):
        build_corpus(inside, tmp_path / "out", tokenizer, overwrite=True)
    assert json.loads((tmp_path / "out" / "more.jsonl").read_text())["title"] == "paris"
    assert load_corpus(tmp_path / "out")["title"] == ["nile"]


def test_overwrite_refuses_a_folder_that_is_not_a_corpus(tmp_path, tokenizer):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("years of work")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    with pytest.raises(FileExistsError, match="not an openrealm corpus"):
        build_corpus(source, tmp_path / "out", tokenizer, overwrite=True)
    assert (tmp_path / "out" / "thesis.tex").read_text() == "years of work"


def test_overwrite_replaces_a_corpus_holding_only_what_a_build_wrote(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE)), tmp_path / "out", tokenizer)
    replacement = write_lines(tmp_path / "b.jsonl", '{"title": "b", "text": "Paris."}')
    build_corpus(replacement, tmp_path / "out", tokenizer, overwrite=True)
    assert load_corpus(tmp_path / "out")["title"] == ["b"]
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "out"]


def test_cli_overwrite_with_the_input_inside_the_output_exits_2(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE)), tmp_path / "out", tokenizer)
    inside = write_lines(tmp_path / "out" / "in.jsonl", json.dumps(NILE_ARTICLE))
    argv = corpus_build_argv("--input", inside, "--output", str(tmp_path / "out"),
                             "--tokenizer", str(tmp_path / "tok"), "--overwrite")  # fmt: skip
    assert main(argv) == 2
    assert "in.jsonl lies inside" in one_error_line(capsys)
    assert (tmp_path / "out" / "in.jsonl").is_file()


@pytest.mark.parametrize("module, stage", [(articles, "_article_rows"), (corpus, "write_block_records")])
def test_a_full_disk_during_corpus_build_names_the_output_not_the_input_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch, module, stage
):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE))
    monkeypatch.setattr(module, stage, full_disk)  # while datasets reads the input / while records are written
    output = tmp_path / "new" / "corpus"
    with pytest.raises(OSError, match=r"No space left on the device holding .*new/corpus") as caught:
        build_corpus(source, output, tokenizer)
    assert "a.jsonl" not in str(caught.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.jsonl"]  # not even the parent folder "new"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--max-block-length 3", "must be an integer of at least 4, got 3"),
        ("--num-proc 0", "must be a positive integer (at least 1), got 0"),
        ("--batch-size -5", "must be a positive integer (at least 1), got -5"),
    ],
    ids=["max-block-length", "num-proc", "batch-size"],
)
def test_corpus_build_option_out_of_its_range_is_refused_naming_it(tmp_path, capsys, option, message):
    argv = corpus_build_argv("--input", "a.jsonl", "--tokenizer", "tok", "--output", str(tmp_path / "out"))
    line = refused_argument([*argv, *option.split()], capsys)
    assert line == f"openrealm corpus build: error: argument {option.split()[0]}: {message}"
    assert not (tmp_path / "out").exists()
