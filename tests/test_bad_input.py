"""Nothing lost, nothing half-written, every bad input named: malformed JSONL (articles, QA rows, gold passages) is
reported as FILE, line N (1-based) with what is wrong and leaves nothing behind; `corpus build --overwrite` deletes only
what a build wrote; `openrealm evaluate` refuses bad flags before running; the CLI prints one line, not a traceback."""

import argparse
import errno
import json
import os
import re

import pytest
from conftest import fixture_folder, make_openqa_model

from openrealm import RealmTokenizer
from openrealm.tokenization import corpus
from openrealm.tokenization.corpus import JsonlError, build_corpus, iter_jsonl, load_corpus
from openrealm.trainers import options
from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import evaluate_open_qa, load_qa_dataset
from openrealm.trainers.openqa import read_gold_passages

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "nile", "paris", "london", "is", "a", "city"]
ARTICLE = {"title": "nile", "text": "The nile is a city."}


@pytest.fixture(scope="module")
def tokenizer():
    return RealmTokenizer(vocab={token: i for i, token in enumerate(VOCAB)})


@pytest.fixture(scope="module")
def model():
    return make_openqa_model(seed=0, reader_beam_size=2)


def write_lines(path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def one_error_line(capsys) -> str:
    """The error line of the CLI's stderr, checked to be its only `openrealm: error:` line (the last one; progress
    bars may come before it) with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], err
    assert lines[-1].startswith("openrealm: error: "), err
    return lines[-1]


# ---------------------------------------------------------------------------------------------------------------------
# The one JSONL reader
# ---------------------------------------------------------------------------------------------------------------------


def test_iter_jsonl_numbers_lines_from_one_counting_the_skipped_blank_ones(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', "", "   ", '{"n": 2}')
    assert list(iter_jsonl(path)) == [(1, {"n": 1}), (4, {"n": 2})]


def test_iter_jsonl_reports_invalid_json_with_file_line_and_the_parsers_message(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', "", '{"n": 2,}')
    with pytest.raises(JsonlError) as caught:
        list(iter_jsonl(path))
    assert (
        str(caught.value)
        == f"{path}, line 3: invalid JSON: Expecting property name enclosed in double quotes (column 9)"
    )
    assert (caught.value.path, caught.value.line) == (path, 3)


def test_iter_jsonl_refuses_a_line_that_is_not_an_object(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', '["a", "b"]')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: expected a JSON object, got an array$"):
        list(iter_jsonl(path))


def test_iter_jsonl_names_a_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": "\xff"}\n')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: not UTF-8 text"):
        list(iter_jsonl(path))


def test_iter_jsonl_reads_a_utf8_byte_order_mark(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"n": 1}\n')
    assert list(iter_jsonl(path)) == [(1, {"n": 1})]


# ---------------------------------------------------------------------------------------------------------------------
# corpus build --input
# ---------------------------------------------------------------------------------------------------------------------


def test_corpus_invalid_json_names_file_and_line_and_writes_nothing(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE), "", "not json")
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 3: invalid JSON: Expecting value \(column 1\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def test_corpus_missing_text_field_names_the_line(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE), '{"title": "paris", "body": "x"}')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: missing field 'text' \(fields: body, title\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def test_corpus_null_title_names_the_line(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE), '{"title": null, "text": "x"}')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: field 'title' must be a string, got null"):
        build_corpus(source, tmp_path / "out", tokenizer)


def test_corpus_bad_line_of_the_second_input_file_is_named(tmp_path, tokenizer):
    first = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    second = write_lines(tmp_path / "b.jsonl", json.dumps(ARTICLE), json.dumps(ARTICLE), "7")
    with pytest.raises(JsonlError, match=r"b\.jsonl, line 3: expected a JSON object, got a number"):
        build_corpus([first, second], tmp_path / "out", tokenizer)
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl"]


def test_corpus_blank_lines_are_skipped(tmp_path, tokenizer):
    source = write_lines(
        tmp_path / "a.jsonl", "", json.dumps(ARTICLE), "", json.dumps({"title": "b", "text": "Paris."})
    )
    build_corpus(source, tmp_path / "out", tokenizer)
    assert load_corpus(tmp_path / "out")["title"] == ["nile", "b"]


def test_corpus_input_of_only_blank_lines_is_refused(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", "", "")
    with pytest.raises(ValueError, match=r"a\.jsonl holds no articles \(empty file\)"):
        build_corpus(source, tmp_path / "out", tokenizer)
    assert os.listdir(tmp_path) == ["a.jsonl"]


def corpus_cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.corpus_build(parser)
    return parser.parse_args([*argv, "--spans", "none"])


def test_corpus_cli_bad_line_exits_2_naming_the_line(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE), '{"title": "x", "text": 3}')
    args = corpus_cli("--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok"))
    assert corpus.run(args) == 2
    assert "a.jsonl, line 2: field 'text' must be a string, got a number" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "tok"]


# ---------------------------------------------------------------------------------------------------------------------
# corpus build --overwrite
# ---------------------------------------------------------------------------------------------------------------------


def test_corpus_config_lists_the_files_the_build_wrote(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "out", tokenizer)
    config = json.loads((tmp_path / "out" / "corpus_config.json").read_text())
    assert config["files"] == sorted(os.listdir(tmp_path / "out"))
    assert {"blocks", "block_records.safetensors", "corpus_config.json", "tokenizer.json"} <= set(config["files"])


def test_overwrite_refuses_a_corpus_folder_holding_files_it_did_not_write(tmp_path, tokenizer):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    build_corpus(source, tmp_path / "out", tokenizer)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"out: it holds files that corpus build did not write \(notes\.txt\)"):
        build_corpus(source, tmp_path / "out", tokenizer, overwrite=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert load_corpus(tmp_path / "out")["title"] == ["nile"]


def test_overwrite_refuses_an_input_inside_the_output_and_keeps_it(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "out", tokenizer)
    inside = write_lines(tmp_path / "out" / "more.jsonl", json.dumps({"title": "paris", "text": "Paris."}))
    with pytest.raises(ValueError, match=r"input .*more\.jsonl lies inside .*out, which replacing would delete"):
        build_corpus(inside, tmp_path / "out", tokenizer, overwrite=True)
    assert json.loads((tmp_path / "out" / "more.jsonl").read_text())["title"] == "paris"
    assert load_corpus(tmp_path / "out")["title"] == ["nile"]


def test_overwrite_refuses_a_folder_that_is_not_a_corpus(tmp_path, tokenizer):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("years of work")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    with pytest.raises(FileExistsError, match="not an openrealm corpus"):
        build_corpus(source, tmp_path / "out", tokenizer, overwrite=True)
    assert (tmp_path / "out" / "thesis.tex").read_text() == "years of work"


def test_overwrite_replaces_a_corpus_holding_only_what_a_build_wrote(tmp_path, tokenizer):
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "out", tokenizer)
    build_corpus(write_lines(tmp_path / "b.jsonl", '{"title": "b", "text": "Paris."}'), tmp_path / "out", tokenizer, overwrite=True)  # fmt: skip
    assert load_corpus(tmp_path / "out")["title"] == ["b"]
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "out"]


def test_cli_overwrite_with_the_input_inside_the_output_exits_2(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "out", tokenizer)
    inside = write_lines(tmp_path / "out" / "in.jsonl", json.dumps(ARTICLE))
    args = corpus_cli("--input", inside, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok"), "--overwrite")  # fmt: skip
    assert corpus.run(args) == 2
    assert "in.jsonl lies inside" in capsys.readouterr().err
    assert (tmp_path / "out" / "in.jsonl").is_file()


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("stage", ["_article_rows", "_write_block_records"])
def test_a_full_disk_during_corpus_build_names_the_output_not_the_input_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch, stage
):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    monkeypatch.setattr(corpus, stage, full_disk)  # while datasets reads the input / while records are written
    output = tmp_path / "new" / "corpus"
    with pytest.raises(OSError, match=r"No space left on the device holding .*new/corpus") as caught:
        build_corpus(source, output, tokenizer)
    assert "a.jsonl" not in str(caught.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.jsonl"]  # not even the parent folder "new"


# ---------------------------------------------------------------------------------------------------------------------
# QA datasets (evaluate --dataset, train openqa --train/--dev) and gold passages
# ---------------------------------------------------------------------------------------------------------------------


def test_qa_error_line_counts_blank_lines(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]}', "", '{"answers": ["b"]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 3: missing or empty 'question'"):
        load_qa_dataset(path)


def test_qa_invalid_json_gives_the_parsers_message(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]', "")
    with pytest.raises(JsonlError, match=r"qa\.jsonl, line 1: invalid JSON: Expecting ',' delimiter"):
        load_qa_dataset(path)


def test_qa_line_that_is_not_an_object_is_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '"where is paris ?"')
    with pytest.raises(JsonlError, match=r"qa\.jsonl, line 1: expected a JSON object, got a string"):
        load_qa_dataset(path)


def test_answers_null_is_an_error_naming_file_and_line(tmp_path):
    path = write_lines(
        tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]}', '{"question": "q", "answers": [null]}'
    )
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 2: answers\[0\] must be a string, got null"):
        load_qa_dataset(path)


def test_null_among_answers_is_an_error_not_the_answer_none(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["Paris", null]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 1: answers\[1\] must be a string, got null"):
        load_qa_dataset(path)


def test_answers_of_the_wrong_type_are_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": {"text": true}}')
    with pytest.raises(
        ValueError, match=r"qa\.jsonl, line 1: 'answers\.text' must be a list of strings, got a boolean"
    ):
        load_qa_dataset(path)


def test_a_question_that_is_not_a_string_is_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": ["q"], "answers": ["a"]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 1: 'question' must be a string, got an array"):
        load_qa_dataset(path)


def test_numeric_answers_are_read_as_their_text(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "when ?", "answers": [1969, "July 1969"]}')
    assert load_qa_dataset(path)["answers"] == [["1969", "July 1969"]]


def test_gold_passages_are_read_by_id(tmp_path):
    path = write_lines(tmp_path / "gold.jsonl", '{"id": 7, "text": "Paris."}', "", '{"id": "x", "text": "Nile."}')
    assert read_gold_passages(path) == {"7": "Paris.", "x": "Nile."}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": 1, "text": "a"', r"invalid JSON: Expecting ',' delimiter"),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('{"id": 1}', r"missing field 'text' \(fields: id\)"),
        ('{"id": null, "text": "a"}', "field 'id' must be a string or an integer, got null"),
        ('{"id": 1, "text": null}', "field 'text' must be a string, got null"),
    ],
    ids=["invalid-json", "not-an-object", "missing-text", "null-id", "null-text"],
)
def test_bad_gold_passage_lines_are_named(tmp_path, line, problem):
    path = write_lines(tmp_path / "gold.jsonl", '{"id": 0, "text": "ok"}', "", line)
    with pytest.raises(JsonlError, match=rf"gold\.jsonl, line 3: {problem}"):
        read_gold_passages(path)


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


# ---------------------------------------------------------------------------------------------------------------------
# openrealm evaluate
# ---------------------------------------------------------------------------------------------------------------------


def evaluate_argv(tmp_path, *extra: str) -> list[str]:
    dataset = write_lines(tmp_path / "qa.jsonl", '{"question": "where does the nile flow ?", "answers": ["egypt"]}')
    return ["evaluate", "--model", str(tmp_path / "model"), "--dataset", dataset, "--no-progress", *extra]


def test_evaluate_refuses_output_equal_to_the_dataset_before_anything_runs(tmp_path, capsys):
    (tmp_path / "model").mkdir()  # not a model: the refusal must come before loading it
    argv = evaluate_argv(tmp_path, "--output", str(tmp_path / "sub" / ".." / "qa.jsonl"))
    (tmp_path / "sub").mkdir()
    before = (tmp_path / "qa.jsonl").read_text()
    assert main(argv) == 2
    assert "is the dataset file" in one_error_line(capsys)
    assert (tmp_path / "qa.jsonl").read_text() == before


def test_evaluate_refuses_output_that_is_the_dataset_through_a_symlink(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    argv = evaluate_argv(tmp_path)
    os.symlink(tmp_path / "qa.jsonl", tmp_path / "link.json")
    assert main([*argv, "--output", str(tmp_path / "link.json")]) == 2
    assert "is the dataset file" in one_error_line(capsys)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_evaluate_refuses_a_batch_size_below_one(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exited:
        main([*evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json")), "--batch-size", value])
    assert exited.value.code == 2
    assert (
        f"argument --batch-size: must be a positive integer (at least 1), got {int(value)}" in capsys.readouterr().err
    )


def test_evaluate_refuses_a_recall_k_of_zero(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json")), "--recall-k", "1", "0"])
    assert exited.value.code == 2
    assert "argument --recall-k: must be a positive integer (at least 1), got 0" in capsys.readouterr().err


def test_evaluate_open_qa_refuses_a_batch_size_below_one(model):
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        evaluate_open_qa(model, [{"question": "q", "answers": ["a"]}], batch_size=0)


def test_recall_k_beyond_the_corpus_is_recall_over_the_corpus_with_a_note(model):
    rows = [{"question": "where does the nile flow ?", "answers": ["egypt"]}, {"question": "who ?", "answers": ["x"]}]
    capped = evaluate_open_qa(model, rows, recall_ks=(1, 20), num_blocks=2)
    whole = evaluate_open_qa(model, rows, recall_ks=(1, 6), num_blocks=2)
    assert capped["corpus_size"] == 6
    assert capped["recall@20"] == whole["recall@6"] == 50.0
    assert capped["notes"] == ["recall@20: the corpus holds only 6 blocks, so this is recall over all of them"]
    assert "notes" not in whole


@pytest.mark.parametrize("model_path", ["./nope", "/tmp/openrealm-no-such-model", "nope/inner/x"])
def test_evaluate_names_a_missing_local_model_folder(tmp_path, capsys, monkeypatch, model_path):
    monkeypatch.chdir(tmp_path)
    argv = evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json"))
    argv[argv.index("--model") + 1] = model_path
    assert main(argv) == 2
    assert one_error_line(capsys) == f"openrealm: error: --model {model_path}: no such folder"
    assert not (tmp_path / "r.json").exists()


def test_evaluate_bad_dataset_line_writes_no_results(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    write_lines(tmp_path / "bad.jsonl", '{"question": "q", "answers": ["a"]}', '{"question": "q", "answers": [null]}')
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--dataset", str(tmp_path / "bad.jsonl")]
    assert main([*argv, "--output", str(tmp_path / "r.json")]) == 2
    assert one_error_line(capsys).endswith("bad.jsonl, line 2: answers[0] must be a string, got null")
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "model"]


# ---------------------------------------------------------------------------------------------------------------------
# The CLI: one line, exit 2, for bad input of ask / evaluate / index build / convert
# ---------------------------------------------------------------------------------------------------------------------


def test_ask_with_a_missing_model_folder_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["ask", "--model", "./nope", "where is paris ?"]) == 2
    assert one_error_line(capsys) == "openrealm: error: --model ./nope: no such folder"


def test_evaluate_with_a_malformed_dataset_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    dataset = write_lines(tmp_path / "qa.jsonl", "{")
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--dataset", dataset, "--output", str(tmp_path / "r.json")]
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(f"openrealm: error: {dataset}, line 1: invalid JSON:")


def test_index_build_with_a_missing_corpus_exits_2_with_one_line(tmp_path, capsys):
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = [
        "index",
        "build",
        "--embedder",
        embedder,
        "--corpus",
        str(tmp_path / "nope"),
        "--output",
        str(tmp_path / "i"),
    ]
    assert main(argv) == 2
    assert one_error_line(capsys) == f"openrealm: error: corpus folder not found: {tmp_path / 'nope'}"
    assert not (tmp_path / "i").exists()


def test_convert_of_a_missing_source_exits_2_with_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert one_error_line(capsys) == f"openrealm: error: SOURCE {tmp_path / 'nope'}: no such folder"
    assert os.listdir(tmp_path) == []


def test_convert_into_its_own_source_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "src" / "out")]) == 2
    assert "overlaps the source" in one_error_line(capsys)


def test_openrealm_debug_re_raises_bad_input_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENREALM_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")])


def test_an_unexpected_error_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("openrealm.convert_legacy_folder", broken)
    (tmp_path / "src").mkdir()
    with pytest.raises(RuntimeError, match="a bug"):
        main(["convert", str(tmp_path / "src"), str(tmp_path / "out")])


def test_a_multi_line_message_is_printed_on_one_line(tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("first line\n  second line")

    monkeypatch.setattr("openrealm.convert_legacy_folder", failing)
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert one_error_line(capsys) == "openrealm: error: first line second line"


def test_evaluate_refuses_an_output_that_is_a_folder_before_anything_runs(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "results").mkdir()
    assert main(evaluate_argv(tmp_path, "--output", str(tmp_path / "results"))) == 2
    assert one_error_line(capsys).endswith("results is a folder; give the results JSON file to write")
    assert os.listdir(tmp_path / "results") == []
