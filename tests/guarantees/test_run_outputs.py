"""A training job's --output holds one run (docs/guarantees.md): a job refuses a folder holding an earlier run unless
told to replace it (--overwrite) or to continue it (--resume-from-checkpoint), and a folder that a running job is
writing."""

import json
import threading
from pathlib import Path

import pytest
import transformers
from helpers import WAIT_SECONDS, cli_pretrain, files_under, job_argv, make_openqa_model, pretrain_argv, write_jsonl

from openrealm.trainers.cli import main


def pretrain(corpus_dir: Path, output: Path, *extra: str) -> int:
    """`openrealm train pretrain` at a tiny size, one checkpoint per step, index v0 built into OUTPUT/index."""
    return cli_pretrain(corpus_dir, output, "--batch-size", "2", "--save-steps", "1", *extra)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("openrealm: error: "), lines
    return lines[0]


@pytest.mark.parametrize("index", ["built", "given"])
def test_pretrain_refuses_an_output_holding_an_earlier_run_and_leaves_it_as_it_was(
    index, world_corpus, tmp_path, capsys
):
    # "given": with --index no index is built into OUTPUT, so nothing stopped the second run from replacing the first
    output, extra = tmp_path / "out", ()
    if index == "given":
        assert pretrain(world_corpus, tmp_path / "index-run", "--max-steps", "1") == 0
        extra = ("--index", str(tmp_path / "index-run" / "index"))
    assert pretrain(world_corpus, output, "--max-steps", "2", *extra) == 0
    before = files_under(output)
    capsys.readouterr()
    assert pretrain(world_corpus, output, "--max-steps", "1", "--seed", "1", *extra) == 2
    error = error_line(capsys)
    assert f"output folder {output} is not empty: pass --overwrite" in error and "--resume-from-checkpoint" in error
    assert files_under(output) == before


def test_pretrain_overwrite_starts_afresh_without_the_earlier_runs_checkpoints_or_index(world_corpus, tmp_path):
    output = tmp_path / "out"
    assert pretrain(world_corpus, output, "--max-steps", "2") == 0
    assert pretrain(world_corpus, output, "--max-steps", "1", "--seed", "1", "--overwrite") == 0
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-1"]
    assert [path.name for path in (output / "index").iterdir()] == ["v000000"]
    summary = json.loads((output / "pretraining.json").read_text())
    assert (summary["seed"], summary["max_steps"]) == (1, 1)
    # resuming now continues this run, not the earlier one's step 2
    state = json.loads((output / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and state["max_steps"] == 1


def test_pretrain_refuses_an_index_root_holding_versions_of_another_run(world_corpus, tmp_path, capsys):
    assert pretrain(world_corpus, tmp_path / "first", "--max-steps", "1", "--index-root", str(tmp_path / "index")) == 0
    capsys.readouterr()
    argv = ("--max-steps", "1", "--index-root", str(tmp_path / "index"))
    assert pretrain(world_corpus, tmp_path / "second", *argv) == 2
    error = error_line(capsys)
    assert f"--index-root {tmp_path / 'index'} already holds index versions" in error and "--version" not in error
    assert not (tmp_path / "second").exists()


@pytest.fixture
def openqa_inputs(tmp_path) -> list[str]:
    """The flags of a one-step `train openqa` of a tiny model (without --output)."""
    make_openqa_model(seed=0).save_pretrained(tmp_path / "model")
    questions = write_jsonl(
        tmp_path / "questions.jsonl", [{"question": "where does the nile flow ?", "answers": ["egypt"]}]
    )
    return ["train", "openqa", "--model", str(tmp_path / "model"), "--train", questions, "--max-steps", "1", "--quiet",
            "--max-dropped-share", "1"]  # fmt: skip


def test_openqa_refuses_an_output_holding_an_earlier_model_and_leaves_it_as_it_was(openqa_inputs, tmp_path, capsys):
    output = tmp_path / "openqa"
    assert main([*openqa_inputs, "--output", str(output)]) == 0
    before = files_under(output)
    capsys.readouterr()
    assert main([*openqa_inputs, "--output", str(output), "--learning-rate", "1e-3"]) == 2
    error = error_line(capsys)
    assert f"output folder {output} is not empty: pass --overwrite" in error and "--resume" not in error
    assert files_under(output) == before


def test_openqa_overwrite_replaces_the_earlier_model(openqa_inputs, tmp_path):
    output = tmp_path / "openqa"
    assert main([*openqa_inputs, "--output", str(output)]) == 0
    assert main([*openqa_inputs, "--output", str(output), "--learning-rate", "1e-3", "--overwrite"]) == 0
    assert json.loads((output / "openqa_training.json").read_text())["learning_rate"] == 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# Two runs into one --output at once
# ---------------------------------------------------------------------------------------------------------------------


def run_argv(job: str, corpus_dir: Path, output: Path, seed: int) -> list[str]:
    """`openrealm train JOB` of two steps at a tiny size, into output."""
    if job == "ict":
        return [*job_argv("ict", corpus_dir, output, 2), "--seed", str(seed)]
    argv = pretrain_argv(corpus_dir, output, "--max-steps", "2", "--batch-size", "2", "--seed", str(seed))
    return ["train", "pretrain", *argv]


@pytest.mark.parametrize("job", ["ict", "pretrain"])
def test_a_second_run_into_the_output_of_a_running_one_is_refused_at_once(
    job, world_corpus, tmp_path, monkeypatch, capsys
):
    output, inside, go, results = tmp_path / "out", threading.Event(), threading.Event(), {}
    training_step = transformers.Trainer.training_step

    def held_step(self, *args, **kwargs):  # the first run waits inside its first step until the second has ended
        if threading.current_thread().name == "first":
            inside.set()
            go.wait(WAIT_SECONDS)
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "training_step", held_step)

    def first() -> None:
        results["first"] = main(run_argv(job, world_corpus, output, seed=1))

    thread = threading.Thread(target=first, name="first")
    thread.start()
    try:
        assert inside.wait(WAIT_SECONDS)
        results["second"] = main(run_argv(job, world_corpus, output, seed=2))
    finally:
        go.set()
        thread.join(WAIT_SECONDS)
    assert results == {"first": 0, "second": 2}
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("openrealm: error: ")]
    assert len(error) == 1 and f"{output} is being written by another process" in error[0]
    summary = json.loads((output / ("ict_training.json" if job == "ict" else "pretraining.json")).read_text())
    assert summary["seed"] == 1  # the first run's model, whole; nothing of the second
    assert sorted(path.name for path in output.glob("checkpoint-*")) == (
        ["checkpoint-1", "checkpoint-2"] if job == "ict" else []
    )
