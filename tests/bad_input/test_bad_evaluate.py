"""`openrealm evaluate` with bad input: bad flags and datasets refused before anything runs, the output never the
dataset, nothing written on failure."""

import os

import pytest
from helpers import evaluate_argv, one_error_line, write_lines

from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import evaluate_openqa


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


def test_evaluate_with_a_malformed_dataset_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    dataset = write_lines(tmp_path / "qa.jsonl", "{")
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--dataset", dataset, "--output", str(tmp_path / "r.json")]
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(f"openrealm: error: {dataset}, line 1: invalid JSON:")


def test_evaluate_refuses_an_output_that_is_a_folder_before_anything_runs(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "results").mkdir()
    assert main(evaluate_argv(tmp_path, "--output", str(tmp_path / "results"))) == 2
    assert one_error_line(capsys).endswith("results is a folder; give the results JSON file to write")
    assert os.listdir(tmp_path / "results") == []


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
