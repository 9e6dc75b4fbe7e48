"""Nothing lost, nothing half-written, every bad input named: malformed JSONL (articles, QA rows, gold passages) is
reported as FILE, line N (1-based) with what is wrong and leaves nothing behind; `corpus build --overwrite` deletes
only what a build wrote; `openrealm evaluate` refuses bad flags before running; the CLI prints one line, not a
traceback."""

import errno
import io
import json
import os
import re
import shutil

import pytest
from helpers import fixture_folder, make_openqa_model, tiny_config_kwargs

from openrealm import RealmTokenizer
from openrealm.tokenization import articles, corpus
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.jsonl import JsonlError, iter_jsonl
from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import evaluate_openqa, load_qa_dataset
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


def corpus_build_argv(*argv: str) -> list[str]:
    return ["corpus", "build", *argv, "--spans", "none"]


def test_corpus_cli_bad_line_exits_2_naming_the_line(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE), '{"title": "x", "text": 3}')
    argv = corpus_build_argv(
        "--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok")
    )
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {source}, line 2: field 'text' must be a string, got a number"
    )
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "tok"]


def test_corpus_build_with_a_missing_tokenizer_folder_exits_2_naming_it(tmp_path, capsys):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    argv = corpus_build_argv("--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "t"))
    assert main(argv) == 2
    assert one_error_line(capsys) == f"openrealm: error: --tokenizer {tmp_path / 't'}: no such folder"
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


def test_a_full_disk_during_corpus_build_exits_1_with_one_error_line(tmp_path, tokenizer, capsys, monkeypatch):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    monkeypatch.setattr(corpus, "write_block_records", full_disk)
    argv = corpus_build_argv(
        "--input", source, "--output", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok")
    )
    assert main(argv) == 1
    assert one_error_line(capsys).startswith(
        f"openrealm: error: No space left on the device holding {tmp_path / 'out'}"
    )
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "tok"]


def test_ask_without_a_question_exits_2_with_one_error_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert main(["ask", "--model", str(tmp_path / "model")]) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: no question given: pass one, or pipe them on stdin, one per line"
    )


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
    replacement = write_lines(tmp_path / "b.jsonl", '{"title": "b", "text": "Paris."}')
    build_corpus(replacement, tmp_path / "out", tokenizer, overwrite=True)
    assert load_corpus(tmp_path / "out")["title"] == ["b"]
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "out"]


def test_cli_overwrite_with_the_input_inside_the_output_exits_2(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "out", tokenizer)
    inside = write_lines(tmp_path / "out" / "in.jsonl", json.dumps(ARTICLE))
    argv = corpus_build_argv("--input", inside, "--output", str(tmp_path / "out"),
                             "--tokenizer", str(tmp_path / "tok"), "--overwrite")  # fmt: skip
    assert main(argv) == 2
    assert "in.jsonl lies inside" in one_error_line(capsys)
    assert (tmp_path / "out" / "in.jsonl").is_file()


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("module, stage", [(articles, "_article_rows"), (corpus, "write_block_records")])
def test_a_full_disk_during_corpus_build_names_the_output_not_the_input_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch, module, stage
):
    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    monkeypatch.setattr(module, stage, full_disk)  # while datasets reads the input / while records are written
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


@pytest.mark.parametrize(
    "argv",
    [
        "index build --embedder E --corpus C --output O --batch-size 0",
        "corpus add --corpus C --input A.jsonl --batch-size 0",
        "train ict --corpus C --init random --output O --max-steps 1 --batch-size 0",
        "train mlm --corpus C --init random --output O --max-steps 1 --batch-size 0",
        "train pretrain --corpus C --embedder E --encoder E --output O --max-steps 1 --refresh-every 1 --batch-size 0",
        "train pretrain --corpus C --embedder E --encoder E --output O --max-steps 1 --refresh-every 1 "
        "--index-batch-size 0",
        "train openqa --model M --train Q.jsonl --output O --max-steps 1 --batch-size 0",
    ],
    ids=["index build", "corpus add", "ict", "mlm", "pretrain", "pretrain index", "openqa"],
)
def test_a_batch_size_below_one_is_refused_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv.split())
    assert exited.value.code == 2
    flag = argv.split()[-2]
    assert f"argument {flag}: must be a positive integer (at least 1), got 0" in capsys.readouterr().err


def test_evaluate_refuses_a_recall_k_of_zero(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json")), "--recall-k", "1", "0"])
    assert exited.value.code == 2
    assert "argument --recall-k: must be a positive integer (at least 1), got 0" in capsys.readouterr().err


def test_evaluate_openqa_refuses_a_batch_size_below_one(model):
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        evaluate_openqa(model, [{"question": "q", "answers": ["a"]}], batch_size=0)


def test_recall_k_beyond_the_corpus_is_recall_over_the_corpus_with_a_note(model):
    rows = [{"question": "where does the nile flow ?", "answers": ["egypt"]}, {"question": "who ?", "answers": ["x"]}]
    capped = evaluate_openqa(model, rows, recall_ks=(1, 20), num_blocks=2)
    whole = evaluate_openqa(model, rows, recall_ks=(1, 6), num_blocks=2)
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


# ---------------------------------------------------------------------------------------------------------------------
# Model folders: config.json
# ---------------------------------------------------------------------------------------------------------------------


def write_config(folder, **fields) -> str:
    """A model folder holding only config.json: the tiny REALM config with `fields` replaced."""
    folder.mkdir()
    config = {**tiny_config_kwargs(), "model_type": "realm", "architectures": ["RealmForOpenQA"], **fields}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"hidden_size": "32"}, "Field 'hidden_size' expected int, got str (value: '32')"),
        ({"reader_beam_size": 0}, "field 'reader_beam_size' must be at least 1, got 0"),
        ({"num_attention_heads": 0}, "field 'num_attention_heads' must be at least 1, got 0"),
        ({"hidden_dropout_prob": 1.5}, "field 'hidden_dropout_prob' must be a probability from 0 to 1, got 1.5"),
        ({"hidden_act": "nope"}, "field 'hidden_act' names no activation function: 'nope'"),
        ({"pad_token_id": 158}, "field 'pad_token_id' must be an id of the vocabulary (0 to 157), got 158"),
        ({"architectures": "RealmForOpenQA"}, "field 'architectures' must be a list of class names"),
    ],
    ids=["wrong-type", "beam-0", "heads-0", "dropout", "activation", "pad-id", "architectures"],
)
def test_convert_of_a_config_json_with_a_bad_field_exits_2_naming_file_and_field(tmp_path, capsys, fields, problem):
    source = write_config(tmp_path / "src", **fields)
    assert main(["convert", source, str(tmp_path / "out")]) == 2
    assert one_error_line(capsys).startswith(f"openrealm: error: {source}/config.json: {problem}")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_ask_with_a_config_field_of_the_wrong_type_exits_2_naming_file_and_field(tmp_path, capsys):
    model = write_config(tmp_path / "model", vocab_size=158.0)
    assert main(["ask", "--model", model, "where is paris ?"]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {model}/config.json: Field 'vocab_size' expected int, got float (value: 158.0)"
    )


def test_invalid_json_in_config_json_exits_2_naming_file_line_and_column(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{\n  "model_type": "realm",\n}\n', encoding="utf-8")
    argv = evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json"))
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {tmp_path / 'model' / 'config.json'}: invalid JSON: Expecting property name enclosed in "
        "double quotes (line 3, column 1)"
    )
    assert not (tmp_path / "r.json").exists()


def test_realm_config_from_pretrained_names_the_file_and_the_field(tmp_path):
    from openrealm import RealmConfig

    folder = write_config(tmp_path / "model", max_span_width=-1)
    with pytest.raises(ValueError, match=r"model/config\.json: field 'max_span_width' must be at least 1, got -1$"):
        RealmConfig.from_pretrained(folder)


# ---------------------------------------------------------------------------------------------------------------------
# Model folders: tokenizer, weights, and what pipeline() reports
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A saved tiny RealmForOpenQA folder (weights, tokenizer, corpus, index); tests change copies of it."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    make_openqa_model(seed=0).save_pretrained(folder)
    return folder


def model_copy(saved_model, tmp_path) -> str:
    return str(shutil.copytree(saved_model, tmp_path / "model"))


def edit_config(folder: str, **fields) -> None:
    path = os.path.join(folder, "config.json")
    config = json.loads(open(path, encoding="utf-8").read())
    config.update(fields)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


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


def test_a_message_longer_than_the_limit_is_cut_and_says_how_to_see_it_whole(tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("x" * 5000)

    monkeypatch.setattr("openrealm.convert_legacy_folder", failing)
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert line == "openrealm: error: " + "x" * 599 + "… (OPENREALM_DEBUG=1 prints it whole)"


@pytest.fixture()
def pickled_4x_folder(tmp_path):
    """The 4.x open-QA fixture whose pytorch_model.bin also pickles an argparse.Namespace (training arguments)."""
    import argparse as argparse_module

    import torch

    folder = shutil.copytree(fixture_folder("openqa", "hub"), tmp_path / "legacy")
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save({**weights, "args": argparse_module.Namespace(lr=1.0)}, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("command", ["convert", "ask"])
def test_a_4x_pickle_refused_by_weights_only_exits_2_without_suggesting_to_unpickle_it(
    pickled_4x_folder, tmp_path, capsys, command
):
    argv = {
        "convert": ["convert", str(pickled_4x_folder), str(tmp_path / "out")],
        "ask": ["ask", "--model", str(pickled_4x_folder), "where is paris ?"],
    }[command]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line == (
        f"openrealm: error: {pickled_4x_folder / 'pytorch_model.bin'} is a pickle holding objects besides tensors "
        "(argparse.Namespace), which OpenREALM does not load. If you trust the file, save its tensors as "
        "model.safetensors (docs/migrating.md), then openrealm convert the folder"
    )
    assert "weights_only" not in line
    assert sorted(os.listdir(tmp_path)) == ["legacy"]


# ---------------------------------------------------------------------------------------------------------------------
# Questions that are not UTF-8 text
# ---------------------------------------------------------------------------------------------------------------------


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


def test_evaluate_names_a_dataset_line_whose_json_escapes_half_a_surrogate_pair(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    dataset = write_lines(tmp_path / "qa.jsonl", '{"question": "where is \\ud83d\\ude00 ?", "answers": ["a"]}')
    with open(dataset, "a", encoding="utf-8") as f:
        f.write('{"question": "where is \\udcff ?", "answers": ["a"]}\n')
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--dataset", dataset, "--output", str(tmp_path / "r.json")]
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {dataset}, line 2: \\udcff escapes half of a UTF-16 surrogate pair, not text"
    )
    assert sorted(os.listdir(tmp_path)) == ["model", "qa.jsonl"]


# ---------------------------------------------------------------------------------------------------------------------
# Corpus blocks: wordpiece ids
# ---------------------------------------------------------------------------------------------------------------------


def corpus_with_id(tmp_path, column: str, block: int, value: int) -> str:
    """A corpus of three articles (the fixture tokenizer: 158 wordpieces) whose `column` of `block` starts with
    `value`, as a hand edit of the Arrow file would leave it."""
    from datasets import load_from_disk
    from helpers import fixture_tokenizer

    articles = [{"title": name, "text": f"{name} is a city."} for name in ("paris", "london", "nile")]
    source = write_lines(tmp_path / "a.jsonl", *map(json.dumps, articles))
    folder = tmp_path / "corpus"
    build_corpus(source, folder, fixture_tokenizer(), progress=False)
    blocks = load_from_disk(str(folder / "blocks"))
    edited = blocks.map(lambda row, i: {column: [value, *row[column][1:]] if i == block else row[column]},
                        with_indices=True)  # fmt: skip
    edited.save_to_disk(str(tmp_path / "edited"))
    shutil.rmtree(folder / "blocks")
    os.rename(tmp_path / "edited", folder / "blocks")
    return str(folder)


@pytest.mark.parametrize(
    ("column", "value", "allowed"),
    [("token_ids", -5, "0 to 157, the vocabulary of"), ("title_ids", 158, "0 to 157, the vocabulary of")],
    ids=["negative", "beyond-the-vocabulary"],
)
def test_index_build_names_the_block_holding_a_wordpiece_id_outside_the_vocabulary(
    tmp_path, capsys, column, value, allowed
):
    corpus_dir = corpus_with_id(tmp_path, column, 1, value)
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = ["index", "build", "--embedder", embedder, "--corpus", corpus_dir, "--output", str(tmp_path / "index")]
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {corpus_dir}/blocks: block 1 holds wordpiece id {value} in {column}, outside {allowed} "
        f"{corpus_dir}/tokenizer.json: the blocks were changed after corpus build"
    )
    assert not (tmp_path / "index").exists()


# ---------------------------------------------------------------------------------------------------------------------
# A full disk while weights are written
# ---------------------------------------------------------------------------------------------------------------------


def full_disk_in_safetensors(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("writer", [full_disk, full_disk_in_safetensors], ids=["oserror", "safetensors-error"])
def test_a_full_disk_while_convert_writes_the_weights_names_the_destination_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, writer
):
    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", writer)
    destination = tmp_path / "new" / "converted"
    assert main(["convert", str(fixture_folder("openqa", "hub")), str(destination)]) == 1
    assert one_error_line(capsys) == (
        f"openrealm: error: No space left on the device holding {destination} while writing it (No space left on "
        "device); nothing was written: free some space or choose another output"
    )
    assert os.listdir(tmp_path) == []


def test_a_full_disk_while_a_results_file_is_written_names_the_file(tmp_path, monkeypatch):
    from openrealm.file_utils import FullDiskError, write_text_atomic

    monkeypatch.setattr("os.fsync", full_disk)
    with pytest.raises(FullDiskError, match=r"No space left on the device holding .*r\.json while writing it"):
        write_text_atomic(tmp_path / "r.json", "{}")
    assert os.listdir(tmp_path) == []


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


def test_a_config_override_of_the_wrong_type_exits_2_naming_the_field(tmp_path, capsys):
    from helpers import fixture_tokenizer

    source = write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE))
    build_corpus(source, tmp_path / "corpus", fixture_tokenizer(), progress=False)
    argv = ["train", "ict", "--corpus", str(tmp_path / "corpus"), "--init", "random", "--output", str(tmp_path / "o")]
    argv += ["--max-dropped-share", "1"]  # the one-block corpus would otherwise be refused first, as too small
    assert main([*argv, "--config-overrides", "hidden_size=abc", "--max-steps", "1"]) == 2
    assert (
        one_error_line(capsys)
        == "openrealm: error: RealmConfig: Field 'hidden_size' expected int, got str (value: 'abc')"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--training-summary", "--eval-results"])
def test_push_with_a_results_file_that_is_not_json_exits_2_naming_it_before_writing_the_card(
    saved_model, tmp_path, capsys, flag
):
    model = model_copy(saved_model, tmp_path)
    bad = write_lines(tmp_path / "bad.json", "{", '  "loss": 1,,')
    assert main(["push", "--model", model, "--repo-id", "someone/realm", flag, bad]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {bad}: invalid JSON: Expecting property name enclosed in double quotes (line 2, column 13)"
    )
    assert not os.path.exists(os.path.join(model, "README.md"))


def test_index_build_names_a_damaged_corpus_tokenizer_file(tmp_path, capsys):
    from helpers import fixture_tokenizer

    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(ARTICLE)), tmp_path / "corpus", fixture_tokenizer())
    (tmp_path / "corpus" / "tokenizer.json").write_text("{\n", encoding="utf-8")
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = ["index", "build", "--embedder", embedder, "--corpus", str(tmp_path / "corpus")]
    argv += ["--output", str(tmp_path / "i")]
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(
        f"openrealm: error: {tmp_path / 'corpus' / 'tokenizer.json'} is not a tokenizer file: EOF while parsing"
    )
    assert not (tmp_path / "i").exists()


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
