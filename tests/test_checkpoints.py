"""Training checkpoints of every Trainer-based job (train ict, train mlm; train pretrain in
test_pretrain_checkpoints.py) appear whole or not at all: a run killed or failing while it saves step N leaves no
checkpoint-N, and `--resume-from-checkpoint` continues from the newest whole checkpoint."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
from helpers import job_argv
from transformers.trainer import TRAINER_STATE_NAME

from openrealm.trainers import checkpoints
from openrealm.trainers.cli import main

KILL_TIMEOUT = 120  # seconds for the child to import, build its model and reach the save of step 2
# Runs `openrealm ARGV...` and stops forever inside the save of step 2, after the model file is written and before
# the optimizer's: the parent kills it there (`kill -9` mid-save, at a fixed point).
BLOCKING_CHILD = """
import pathlib, sys, time
import transformers
from openrealm.trainers.cli import main

marker, save = pathlib.Path(sys.argv[1]), transformers.Trainer._save_optimizer_and_scheduler

def blocking(self, output_dir):
    if self.state.global_step == 2:
        marker.write_text(output_dir)
        time.sleep(600)
    return save(self, output_dir)

transformers.Trainer._save_optimizer_and_scheduler = blocking
sys.exit(main(sys.argv[2:]))
"""


def checkpoint_names(output: Path) -> list[str]:
    return sorted(name for name in os.listdir(output) if name.startswith("checkpoint-"))


def hidden_entries(output: Path) -> list[str]:
    return sorted(name for name in os.listdir(output) if name.startswith("."))


@pytest.fixture
def count_steps(monkeypatch) -> list[int]:
    """The global steps this process trains (Trainer.training_step calls)."""
    steps, training_step = [], transformers.Trainer.training_step

    def counting(self, *args, **kwargs):
        steps.append(self.state.global_step + 1)
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "training_step", counting)
    return steps


@pytest.mark.parametrize("job", ["ict", "mlm"])
def test_after_a_kill_during_a_save_resume_continues_from_the_newest_whole_checkpoint(
    job, quickstart_corpus, tmp_path, count_steps
):
    output, marker = tmp_path / "out", tmp_path / "saving"
    child = subprocess.Popen(
        [sys.executable, "-c", BLOCKING_CHILD, str(marker), *job_argv(job, quickstart_corpus, output, 1000)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + KILL_TIMEOUT
    while not marker.exists():
        assert child.poll() is None, child.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the child never reached the save of step 2"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert checkpoint_names(output) == ["checkpoint-1"]  # step 2's model file was written, but not as checkpoint-2

    assert main(job_argv(job, quickstart_corpus, output, 3) + ["--resume-from-checkpoint"]) == 0
    assert count_steps == [2, 3]  # resumed after step 1, not from scratch
    assert checkpoint_names(output) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert json.loads((output / "checkpoint-3" / TRAINER_STATE_NAME).read_text())["global_step"] == 3
    assert not [name for name in hidden_entries(output) if name.startswith(checkpoints.STAGING_PREFIX)]


@pytest.mark.parametrize("job", ["ict", "mlm"])
def test_a_full_disk_during_a_save_leaves_no_checkpoint_of_that_step(
    job, quickstart_corpus, tmp_path, monkeypatch, capsys
):
    output, save = tmp_path / "out", transformers.Trainer._save_optimizer_and_scheduler

    def disk_full_at_step_2(self, output_dir):
        if self.state.global_step == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(output_dir, "optimizer.pt"))
        return save(self, output_dir)

    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", disk_full_at_step_2)
    assert main(job_argv(job, quickstart_corpus, output, 3)) == 1
    assert "openrealm: error: " in capsys.readouterr().err
    assert checkpoint_names(output) == ["checkpoint-1"]
    assert hidden_entries(output) == []  # the staging folder of step 2 went with the failure


def test_rotation_never_removes_the_checkpoint_just_written(quickstart_corpus, tmp_path):
    output = tmp_path / "out"
    assert main(job_argv("ict", quickstart_corpus, output, 3)) == 0
    shutil.rmtree(output / "checkpoint-2")
    # Resumed from step 1 beside a newer checkpoint-3, keeping one: step 2's checkpoint is the one just written.
    resumed = job_argv("ict", quickstart_corpus, output, 2, kept=1)
    resumed += ["--resume-from-checkpoint", str(output / "checkpoint-1")]
    assert main(resumed) == 0
    assert checkpoint_names(output) == ["checkpoint-2", "checkpoint-3"]
    assert json.loads((output / "checkpoint-2" / TRAINER_STATE_NAME).read_text())["global_step"] == 2


def write_checkpoint(folder: Path, step: int, *files: str) -> Path:
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(json.dumps({"global_step": step}))
    return folder


def test_resume_last_takes_the_newest_checkpoint_holding_the_trainer_state(tmp_path):
    whole = write_checkpoint(tmp_path / "checkpoint-4", 4, TRAINER_STATE_NAME)
    write_checkpoint(tmp_path / "checkpoint-6", 6, "model.safetensors")  # a half-written save of an older version
    assert checkpoints.resolve_resume("last", tmp_path) == whole


def test_resume_last_with_no_whole_checkpoint_names_the_folder(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} holds no whole checkpoint"):
        checkpoints.resolve_resume("last", tmp_path)


def test_resume_from_a_checkpoint_folder_missing_a_file_names_it(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-2", 2, "model.safetensors")
    with pytest.raises(FileNotFoundError, match=f"{folder} is not a whole checkpoint: it has no {TRAINER_STATE_NAME}"):
        checkpoints.resolve_resume(str(folder), tmp_path)


def test_stale_staging_folders_are_removed_and_checkpoints_kept(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-4", 4, TRAINER_STATE_NAME)
    write_checkpoint(tmp_path / f"{checkpoints.STAGING_PREFIX}checkpoint-6" / "checkpoint-6", 6, "optimizer.pt")
    (tmp_path / "notes.txt").write_text("mine")
    checkpoints.remove_stale_staging(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "notes.txt"]


def test_only_the_saving_process_writes_the_towers_of_a_checkpoint(tmp_path):
    # Trainer.save_model calls _save on every process: another rank's save_pretrained of the same folder left it
    # without config.json and weights (a checkpoint that could not be resumed).
    class Tower:
        def save_pretrained(self, folder):
            Path(folder).mkdir(parents=True)

    trainer = SimpleNamespace(
        towers={"embedder": object}, args=SimpleNamespace(should_save=False, output_dir=str(tmp_path)),
        accelerator=SimpleNamespace(unwrap_model=lambda model: model), model=SimpleNamespace(embedder=Tower()),
    )  # fmt: skip
    checkpoints.StagedCheckpointTrainer._save(trainer, str(tmp_path / "checkpoint-2"))
    assert not (tmp_path / "checkpoint-2").exists()
    trainer.args.should_save = True
    checkpoints.StagedCheckpointTrainer._save(trainer, str(tmp_path / "checkpoint-2"))
    assert (tmp_path / "checkpoint-2" / "embedder").is_dir()
