"""How the quickstart's stages share the CPU (trainers/quickstart/stages.py, trainers/stage_utils.py): half of the
cores for a trainer beside its index builder, every core for the stage that runs alone, and never more threads per
process than the user's OMP_NUM_THREADS."""

import os

import pytest
import torch

from openrealm.trainers.quickstart.stages import share_cpu_cores
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
