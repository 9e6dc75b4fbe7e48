"""How the quickstart's stages share the CPU (trainers/quickstart/stages.py, trainers/stage_utils.py): half of the
cores for a trainer beside its index builder, every core for the stage that runs alone, and never more threads per
process than the user's OMP_NUM_THREADS; and what of a preset reaches the stages it sets."""

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from openrealm.trainers.quickstart import stages as quickstart_stages
from openrealm.trainers.quickstart.stages import DEFAULT, Stages, share_cpu_cores
from openrealm.trainers.stage_utils import all_cpu_cores


@pytest.fixture
def threads(monkeypatch):
    """Restores torch's thread count and OMP_NUM_THREADS after a test that changes them; every core assumed 4."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_quickstart_gives_its_trainer_half_the_cores_and_may_use_them_all(threads):
    assert share_cpu_cores() == 4
    assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"


def test_the_users_omp_num_threads_caps_every_process_of_the_quickstart(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert share_cpu_cores() == 1
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"


def test_an_omp_num_threads_that_is_not_a_count_leaves_every_core(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    assert share_cpu_cores() == 4


def test_all_cpu_cores_takes_every_core_up_to_its_limit_then_restores(threads):
    torch.set_num_threads(1)
    with all_cpu_cores():
        assert torch.get_num_threads() == 4
    with all_cpu_cores(limit=3):
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == 1


def pretrain_argv(monkeypatch, tmp_path: Path, preset) -> list[str]:
    """The `train pretrain` command line the quickstart's REALM stage runs for `preset` (the run itself stubbed)."""
    calls = []
    monkeypatch.setattr(quickstart_stages.cli, "run_in_process", lambda command, argv, **_: calls.append(argv))
    Stages(tmp_path, preset, seed=0, progress=False).pretrain(Path("c"), Path("e"), Path("n"), evaluate=False)
    return calls[0]


def test_a_presets_pretrain_warmup_steps_reach_train_pretrain(monkeypatch, tmp_path):
    argv = pretrain_argv(monkeypatch, tmp_path, replace(DEFAULT, pretrain_warmup_steps=200))
    assert argv[argv.index("--warmup-steps") + 1] == "200"


def test_the_default_preset_leaves_realms_warmup_to_googles_formula(monkeypatch, tmp_path):
    assert DEFAULT.pretrain_warmup_steps is None
    assert "--warmup-steps" not in pretrain_argv(monkeypatch, tmp_path, DEFAULT)


def test_a_presets_null_match_weight_reaches_the_reading_warmup(monkeypatch, tmp_path):
    from openrealm.trainers.world import reading_warmup

    calls = []
    monkeypatch.setattr(reading_warmup, "warm_up_encoder", lambda *args, **kwargs: calls.append(kwargs))
    for weight in (0.0, 0.1):
        preset = replace(DEFAULT, reading_warmup_null_match_weight=weight)
        Stages(tmp_path, preset, seed=0, progress=False, max_threads=1).reading_warmup(Path("corpus"))
    assert [call["null_match_weight"] for call in calls] == [0.0, 0.1]
