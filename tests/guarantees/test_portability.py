"""The suite passes on any x86-64 CPU: exact comparisons of floats need a stated reason (conftest.py), and the tests
that compare floats computed along different paths pass under other kernels than this machine's defaults."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_same_top_k

# Modules whose tests compare floats computed with different shapes: sharded against whole, chunked against one
# matmul, batched against one at a time, this code against transformers 4.57.6's stored outputs. Two groups of about
# equal run time under OTHER_KERNELS, run side by side: each is single-threaded.
FLOAT_SENSITIVE_MODULES = (
    ("test_index_realm.py", "test_openqa.py", "test_evaluation.py"),
    (
        "test_sharded_index.py",
        "compatibility/test_reference_parity.py",
        "test_retrieval_realm.py",
        "test_pipeline_realm.py",
        "test_modeling_realm.py",
        "test_pretraining.py",
    ),
)
# Other kernels than the defaults, on any x86-64 machine: one thread (other reduction splits), MKL's
# conditional-numerical-reproducibility code path (other GEMM kernels) and ATen's unvectorised kernels.
OTHER_KERNELS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "default",
}


def test_an_unexplained_exact_comparison_of_computed_floats_fails():
    a = torch.ones(3) / 3
    with pytest.raises(pytest.fail.Exception, match="compares floating-point values exactly"):
        torch.equal(a, a.clone())


def test_an_exact_comparison_of_floats_with_a_reason_passes():
    a = torch.ones(3) / 3
    assert torch.equal(a, a.clone())  # exact: a copy


def test_an_exact_comparison_of_integers_needs_no_reason():
    assert torch.equal(torch.arange(3), torch.tensor([0, 1, 2]))
    np.testing.assert_array_equal(np.arange(3), [0, 1, 2])


def test_an_unexplained_exact_comparison_of_numpy_floats_fails():
    with pytest.raises(pytest.fail.Exception, match="np.testing|array_equal"):
        np.testing.assert_array_equal(np.ones(2) / 3, np.ones(2) / 3)


def test_same_top_k_allows_near_ties_in_either_order():
    expected = (torch.tensor([[3.0, 2.0, 2.0 + 1e-7]]), torch.tensor([[4, 7, 9]]))
    assert_same_top_k((torch.tensor([[3.0, 2.0 + 1e-7, 2.0]]), torch.tensor([[4, 9, 7]])), expected)


def test_same_top_k_refuses_other_ids_where_the_scores_are_apart():
    expected = (torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[4, 7, 9]]))
    with pytest.raises(AssertionError, match="ranks 1..1"):
        assert_same_top_k((torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[4, 8, 9]])), expected)


@pytest.mark.slow
def test_the_float_sensitive_tests_pass_under_other_kernels(tmp_path):
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, **OTHER_KERNELS}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-m", "not slow"]
    logs = [tmp_path / f"group-{number}.log" for number in range(len(FLOAT_SENSITIVE_MODULES))]
    runs = []
    try:
        for group, log in zip(FLOAT_SENSITIVE_MODULES, logs):
            with log.open("w") as output:
                modules = [str(tests / name) for name in group]
                runs.append(
                    subprocess.Popen([*command, *modules], env=env, cwd=tests.parent, stdout=output, stderr=output)
                )
        for run, log in zip(runs, logs):
            assert run.wait(timeout=900) == 0, log.read_text()[-6000:]
    finally:
        for run in runs:  # the other group, when one failed
            if run.poll() is None:
                run.kill()
                run.wait()
