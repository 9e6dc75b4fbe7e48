"""REALM pre-training's index refresh (paper §3.3, "Implementing asynchronous MIPS refreshes"; Google's
language/realm/refresh_doc_embeds.py): IndexRefreshCallback in its three modes (sync, async in a builder process,
off), the step boundaries at which it swaps the examples to a new index version, the lag, the versions it keeps, the
long-lived builder process (trainers.pretraining.builder.BuilderProcess, the callback's `builder`) and the snapshots of
the training embedder that it builds from. The callback is driven as Trainer drives it (Steps), without a model."""

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import assert_same_top_k, setup_refresh, tiny_embedder_for, weights_equal
from transformers import AutoTokenizer

from openrealm import RealmBlockIndex, RealmEmbedder, ShardedBlockIndex
from openrealm.trainers.indexing import build_index, list_versions
from openrealm.trainers.pretraining.builder import (
    SNAPSHOTS_DIR,
    build_request,
    clone_tensors,
    default_builder_device,
    load_snapshot,
    read_build_status,
    snapshot_embedder,
)
from openrealm.trainers.pretraining.refresh import IndexRefreshCallback

BUILD_TIMEOUT = 90  # seconds an async build may take (a builder process imports torch + transformers)


def perturb(embedder: RealmEmbedder, step: int) -> None:
    """Stand-in for an optimiser step: the embedder changes every step, so snapshots of different steps differ."""
    with torch.no_grad():
        next(embedder.parameters()).add_(0.001 * (step + 1))


class Steps:
    """Drives the callback as Trainer does: on_step_begin(global_step = steps done), the step, on_step_end(+1)."""

    def __init__(self, callback: IndexRefreshCallback, embedder: RealmEmbedder):
        self.callback, self.embedder = callback, embedder
        self.state = SimpleNamespace(global_step=0, log_history=[])
        self.model = SimpleNamespace(embedder=embedder)
        self.begin_seconds: list[float] = []
        self.version_changed_at: list[tuple[str, int]] = []

    def step(self, seconds: float = 0.0) -> None:
        cb, state = self.callback, self.state
        before = cb.index_version
        started = time.perf_counter()
        cb.on_step_begin(None, state, None)
        self.begin_seconds.append(time.perf_counter() - started)
        if cb.index_version != before:
            self.version_changed_at.append(("begin", state.global_step))
        time.sleep(seconds)
        perturb(self.embedder, state.global_step)
        state.global_step += 1
        before = cb.index_version
        cb.on_step_end(None, state, None, model=self.model)
        if cb.index_version != before:
            self.version_changed_at.append(("end", state.global_step))


# ---------------------------------------------------------------------------------------------------------------------
# Sync and off: the refresh on the step that ends each period, or none
# ---------------------------------------------------------------------------------------------------------------------


def test_sync_refresh_swaps_every_n_steps_and_bumps_the_version(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "sync", refresh_every=2)
    steps = Steps(callback, embedder)
    for _ in range(5):
        steps.step()
    assert steps.version_changed_at == [("end", 2), ("end", 4)]
    assert [(s["step"], s["version"], s["snapshot_step"]) for s in callback.swaps] == [(2, 1, 2), (4, 2, 4)]
    assert examples.index.version == 2 and list_versions(tmp_path / "index") == [0, 1, 2]
    # The query embedder is a frozen copy of the step-4 weights, not the (since changed) training embedder.
    assert examples.query_embedder is not embedder and not examples.query_embedder.training
    assert not weights_equal(examples.query_embedder, embedder)
    assert callback.metrics(5)["index_staleness_steps"] == 1 and callback.metrics(5)["index_version"] == 2


def test_sync_refresh_keeps_the_newest_three_versions(world_corpus, tmp_path):
    embedder, _, callback = setup_refresh(world_corpus, tmp_path / "index", "sync", refresh_every=1)
    steps = Steps(callback, embedder)
    for _ in range(4):
        steps.step()
    assert list_versions(tmp_path / "index") == [2, 3, 4] and callback.builds_started == 4


def test_off_mode_never_refreshes(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "off", refresh_every=1)
    steps = Steps(callback, embedder)
    for _ in range(5):
        steps.step()
    assert examples.index.version == 0 and list_versions(tmp_path / "index") == [0]
    assert callback.builds_started == 0 and callback.metrics(5)["index_staleness_steps"] == 5


@pytest.mark.parametrize("mode, lag", [("sync", 2), ("off", 2), ("async", 0)])
def test_refresh_lag_is_refused_outside_the_async_mode_or_below_one_step(world_corpus, tmp_path, mode, lag):
    with pytest.raises(ValueError, match="lag is a positive number of steps of the async mode"):
        setup_refresh(world_corpus, tmp_path / "index", mode, lag=lag)


# ---------------------------------------------------------------------------------------------------------------------
# Async: a builder process embeds a snapshot while training goes on; the swap waits for a step boundary
# ---------------------------------------------------------------------------------------------------------------------


def sleeping_builder(callback: IndexRefreshCallback, seconds: float):
    """The default builder command behind a sleep: a build that takes at least `seconds`."""

    def command(snapshot_dir, version):
        return [
            "sh",
            "-c",
            f'sleep {seconds}; exec "$@"',
            "sh",
            *callback.builder.build_command(snapshot_dir, version),
        ]

    return command


def run_until(steps: Steps, condition) -> None:
    deadline = time.monotonic() + BUILD_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"not reached after {BUILD_TIMEOUT}s: {steps.callback.failures}"
        steps.step(0.05)


def run_until_swap(steps: Steps, swaps: int = 1) -> None:
    run_until(steps, lambda: len(steps.callback.swaps) >= swaps)


def test_async_build_runs_in_another_process_without_blocking_the_steps(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2)
    callback.builder.command = sleeping_builder(callback, 1.5)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # step 2 ends: a snapshot is saved and the builder starts
    builder = callback.pending_swaps.builder_process(timeout=30)  # started on the callback's background thread
    assert builder.pid != os.getpid() and builder.poll() is None
    assert (tmp_path / "index" / SNAPSHOTS_DIR / "step-2" / "config.json").is_file()
    run_until_swap(steps)
    swap = callback.swaps[0]
    # The trainer went on stepping while the builder ran (>= 1.5 s of sleep at 0.05 s a step), never waiting for it.
    assert swap["step"] - 2 >= 10 and max(steps.begin_seconds[:-1]) < 0.5
    # The swap happened at a step boundary (on_step_begin), to version 1, from the step-2 snapshot.
    assert steps.version_changed_at == [("begin", swap["step"])]
    assert (swap["version"], swap["snapshot_step"], examples.index.version) == (1, 2, 1)
    assert callback.metrics(swap["step"])["index_staleness_steps"] == swap["step"] - 2
    # The query embedder of the new pair holds the step-2 weights: saved snapshot == query embedder.
    saved = RealmEmbedder.from_pretrained(tmp_path / "index" / SNAPSHOTS_DIR / "step-2")
    assert weights_equal(saved, examples.query_embedder)
    callback.close()


@pytest.mark.slow
def test_async_snapshot_holds_the_parameters_of_its_step_while_training_goes_on(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2)
    start_builder = callback.pending_swaps.start_builder

    def late_start(*args):  # the background thread gets to the snapshot only after more training steps
        time.sleep(0.5)
        return start_builder(*args)

    callback.pending_swaps.start_builder = late_start
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # step 2 ends: only the parameters are cloned on the step
    at_step_2 = {name: tensor.clone() for name, tensor in embedder.state_dict().items()}
    for _ in range(3):
        steps.step()  # the optimiser stand-in changes the embedder in place meanwhile
    callback.pending_swaps.builder_process(timeout=30)
    saved = RealmEmbedder.from_pretrained(tmp_path / "index" / SNAPSHOTS_DIR / "step-2")
    # exact: the snapshot is a copy of the weights at step 2
    assert all(torch.equal(saved.state_dict()[name], value) for name, value in at_step_2.items())
    assert not weights_equal(saved, embedder)
    run_until_swap(steps)
    assert weights_equal(examples.query_embedder, saved) and not examples.query_embedder.training
    assert all(not p.requires_grad for p in examples.query_embedder.parameters())
    callback.close()


def test_async_builder_of_a_sharded_run_writes_one_file_per_rank_and_the_examples_get_a_sharded_index(
    world_corpus, tmp_path
):
    embedder, examples, callback = setup_refresh(
        world_corpus, tmp_path / "index", "async", refresh_every=2, build_kwargs={"num_shards": 2}
    )
    for command in (callback.builder.build_command(tmp_path / "snapshot", 1), callback.builder.server_command()):
        assert command[command.index("--num-shards") + 1] == "2"
    steps = Steps(callback, embedder)
    run_until_swap(steps)
    folder = tmp_path / "index" / "v000001" / "block_index"
    assert sorted(p.name for p in folder.glob("block_emb*")) == [
        "block_emb-00001-of-00002.safetensors",
        "block_emb-00002-of-00002.safetensors",
    ]
    # One process (no group) holds both shards; it finds what the whole version finds.
    assert isinstance(examples.index, ShardedBlockIndex) and examples.index.version == 1
    queries = torch.randn(3, examples.index.dim, generator=torch.Generator().manual_seed(0))
    whole = RealmBlockIndex.from_pretrained(folder)
    assert_same_top_k(examples.index.search(queries, 5), whole.search(queries, 5))


def test_failed_async_build_is_logged_keeps_the_old_index_and_is_retried(world_corpus, tmp_path, caplog):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2)
    commands = []

    def failing_once(snapshot_dir, version):
        commands.append(version)
        if len(commands) == 1:
            return [sys.executable, "-c", "import sys; print('out of device memory', file=sys.stderr); sys.exit(3)"]
        return callback.builder.build_command(snapshot_dir, version)

    callback.builder.command = failing_once
    steps = Steps(callback, embedder)
    with caplog.at_level("ERROR", logger="openrealm.trainers.pretraining.refresh"):
        while callback.builds_failed == 0:
            assert steps.state.global_step < 200
            steps.step(0.02)
    assert examples.index.version == 0 and "out of device memory" in callback.failures[0]["log_tail"]
    assert "out of device memory" in caplog.text and callback.failures[0]["reason"] == "exit status 3"
    steps.step()  # the next step end retries, from a fresh snapshot, the same version number
    assert callback.builds_started == 2 and commands == [1, 1]
    run_until_swap(steps)
    assert examples.index.version == 1 and callback.metrics(steps.state.global_step)["index_builds_failed"] == 1
    callback.close()


# ---------------------------------------------------------------------------------------------------------------------
# Lag: a build swapped in exactly `lag` steps after its snapshot
# ---------------------------------------------------------------------------------------------------------------------


def test_lagged_async_refresh_waits_for_a_slow_build_at_exactly_snapshot_plus_lag(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2, lag=3)
    callback.builder.command = sleeping_builder(callback, 1.0)
    steps = Steps(callback, embedder)
    for _ in range(6):
        steps.step()
    # Snapshot at the end of step 2; the build (>= 1 s) was still running at the boundary after step 5, where the
    # trainer waited for it instead of going on with the old index.
    assert steps.version_changed_at == [("begin", 5)]
    assert [(s["step"], s["version"], s["snapshot_step"]) for s in callback.swaps] == [(5, 1, 2)]
    assert callback.swaps[0]["stall_seconds"] > 0.5 and max(steps.begin_seconds[:5]) < 0.5
    callback.close()


def test_lagged_async_refresh_holds_a_finished_build_until_its_step(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2, lag=40)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # the build of the step-2 snapshot starts
    callback.pending_swaps.builder_process(timeout=30).wait(timeout=BUILD_TIMEOUT)
    for _ in range(41):
        steps.step(0.01)
    # Built long before, swapped in exactly 40 steps after its snapshot; the next build starts on the following step
    # end, as none may start while one waits.
    assert [(s["step"], s["version"], s["snapshot_step"]) for s in callback.swaps] == [(42, 1, 2)]
    assert callback.builds_started == 2 and examples.index.version == 1
    callback.close()


# ---------------------------------------------------------------------------------------------------------------------
# The long-lived builder process
# ---------------------------------------------------------------------------------------------------------------------


def test_async_builds_go_to_one_long_lived_builder_process_that_ends_with_training(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2, lag=2)
    steps = Steps(callback, embedder)
    builders = set()
    deadline = time.monotonic() + 3 * BUILD_TIMEOUT
    while len(callback.swaps) < 3:
        assert time.monotonic() < deadline, callback.failures
        steps.step()
        if callback.pending_swaps.running is not None:
            builders.add(callback.pending_swaps.builder_process(timeout=30).pid)
    # Three versions, each swapped in 2 steps after its snapshot, all built by the same process.
    assert [(s["version"], s["step"] - s["snapshot_step"]) for s in callback.swaps] == [(1, 2), (2, 2), (3, 2)]
    assert len(builders) == 1 and builders != {os.getpid()}
    server = callback.builder.server
    # What each version holds is what a build of its own would have written: the saved snapshot's embeddings.
    snapshot = RealmEmbedder.from_pretrained(
        tmp_path / "index" / SNAPSHOTS_DIR / f"step-{callback.swaps[-1]['snapshot_step']}"
    )
    # Built alike: on the builder's device (a GPU where there is one) in its default precision (bf16 on a GPU).
    expected = build_index(
        snapshot, world_corpus, tmp_path / "reference", version=0, progress=False, device=callback.builder.device
    )
    torch.testing.assert_close(examples.index.block_emb, expected.block_emb, rtol=1e-4, atol=1e-4)
    callback.close()
    assert server.poll() is not None and callback.builder.server is None  # training over: no builder left running


def test_a_failed_build_of_the_long_lived_builder_is_logged_and_the_next_build_succeeds(
    world_corpus, tmp_path, caplog
):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2)
    save, corrupted = RealmEmbedder.save_pretrained, []

    def save_then_corrupt(self, folder, *args, **kwargs):  # the first snapshot's weights are unreadable
        result = save(self, folder, *args, **kwargs)
        if not corrupted:
            (Path(folder) / "model.safetensors").write_bytes(b"not safetensors")
            corrupted.append(folder)
        return result

    steps = Steps(callback, embedder)
    with (
        pytest.MonkeyPatch.context() as patch,
        caplog.at_level("ERROR", logger="openrealm.trainers.pretraining.refresh"),
    ):
        patch.setattr(RealmEmbedder, "save_pretrained", save_then_corrupt)
        run_until(steps, lambda: callback.builds_failed > 0)
    assert examples.index.version == 0 and callback.failures[0]["reason"] == "exit status 1"
    assert "Traceback" in callback.failures[0]["log_tail"] and "failed (exit status 1)" in caplog.text
    server = callback.builder.server
    run_until_swap(steps)  # the retry, from a fresh snapshot, goes to the same builder process
    assert examples.index.version == 1 and callback.builder.server is server and server.poll() is None
    callback.close()


def test_a_builder_process_that_dies_fails_its_build_and_the_next_build_starts_a_new_one(world_corpus, tmp_path):
    embedder, examples, callback = setup_refresh(world_corpus, tmp_path / "index", "async", refresh_every=2)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # the first build goes to a new builder process
    first = callback.pending_swaps.builder_process(timeout=30)
    first.kill()
    run_until(steps, lambda: callback.builds_failed > 0)
    assert "the builder process exited with status" in callback.failures[0]["log_tail"]
    run_until_swap(steps)
    assert examples.index.version == 1 and callback.builder.server.pid != first.pid
    callback.close()


def test_the_long_lived_builder_exits_when_its_input_ends(world_corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(world_corpus)
    snapshot = tmp_path / "snapshot"
    tiny_embedder_for(tokenizer).save_pretrained(snapshot)
    command = [sys.executable, "-m", "openrealm.trainers.pretraining.builder", "serve", "--corpus", str(world_corpus)]
    command += ["--output", str(tmp_path / "index"), "--device", "cpu", "--quiet"]
    requests = build_request(snapshot, 4) + build_request(snapshot, 5)
    finished = subprocess.run(command, input=requests, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    assert list_versions(tmp_path / "index") == [4, 5] and read_build_status(snapshot) == 0
    assert "Wrote exact index version 5" in (snapshot / "build.log").read_text()


# A served builder whose version write stops half-way (in RealmBlockIndex.write_files) until it is terminated.
WRITE_STALLS = """
import sys, time
from openrealm.index_realm import RealmBlockIndex
from openrealm.trainers.pretraining import builder

write_files = RealmBlockIndex.write_files

def stalled(self, directory):
    write_files(self, directory)
    print("writing", flush=True)
    time.sleep(60)

RealmBlockIndex.write_files = stalled
sys.exit(builder.main(sys.argv[1:]))
"""


def test_a_builder_terminated_while_it_writes_a_version_leaves_no_lock_or_staging_folder(world_corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(world_corpus)
    snapshot, root = tmp_path / "snapshot", tmp_path / "index"
    tiny_embedder_for(tokenizer).save_pretrained(snapshot)
    command = [sys.executable, "-c", WRITE_STALLS, "serve", "--corpus", str(world_corpus), "--output", str(root)]
    builder = subprocess.Popen([*command, "--device", "cpu", "--quiet"], stdin=subprocess.PIPE, text=True)
    builder.stdin.write(build_request(snapshot, 1))
    builder.stdin.flush()
    log = snapshot / "build.log"
    deadline = time.monotonic() + BUILD_TIMEOUT
    while "writing" not in (log.read_text() if log.is_file() else ""):
        assert time.monotonic() < deadline and builder.poll() is None
        time.sleep(0.05)
    assert [p.name for p in root.iterdir() if p.name.startswith(".")]  # the version's lock and staging folder
    builder.terminate()  # what the refresh does to a build still running when training ends
    assert builder.wait(timeout=30) != 0
    builder.stdin.close()
    assert not root.exists()  # no lock, no staging folder, and the index root this first build made goes too


@pytest.mark.parametrize(
    ("num_gpus", "local_world_size", "device"),
    [(0, 1, "cpu"), (0, 2, "cpu"), (1, 1, "cuda:0"), (8, 8, "cuda:0"), (8, 7, "cuda:7"), (2, 1, "cuda:1")],
)
def test_builder_gets_a_gpu_no_training_process_uses_when_there_is_one(num_gpus, local_world_size, device):
    assert default_builder_device(num_gpus, local_world_size) == device


# ---------------------------------------------------------------------------------------------------------------------
# Snapshots of the training embedder
# ---------------------------------------------------------------------------------------------------------------------


def test_snapshot_from_reused_clones_holds_the_values_of_the_latest_clone(world_corpus):
    embedder = tiny_embedder_for(AutoTokenizer.from_pretrained(world_corpus))
    first = clone_tensors(embedder)
    perturb(embedder, 0)
    second = clone_tensors(embedder, into=first)
    assert all(second[key] is first[key] for key in first)  # overwritten in place, no new memory
    snapshot = snapshot_embedder(embedder, clones=second)
    assert weights_equal(snapshot, embedder) and not snapshot.training
    perturb(embedder, 1)  # training goes on: the snapshot keeps the cloned values
    assert not weights_equal(snapshot, embedder)
    assert all(not p.requires_grad for p in snapshot.parameters())


def test_snapshot_loaded_onto_the_query_embedder_structure_holds_the_saved_weights(world_corpus, tmp_path):
    embedder = tiny_embedder_for(AutoTokenizer.from_pretrained(world_corpus))
    template = snapshot_embedder(embedder)
    perturb(embedder, 0)
    embedder.save_pretrained(tmp_path / "snapshot")
    loaded = load_snapshot(template, tmp_path / "snapshot")
    assert weights_equal(loaded, embedder) and not weights_equal(template, embedder)
    assert not loaded.training and all(not p.requires_grad for p in loaded.parameters())
    state = loaded.state_dict(keep_vars=True)  # the tie the file stores once stays a tie
    assert state["cls.predictions.decoder.bias"] is state["cls.predictions.bias"]


def test_loading_a_snapshot_from_a_folder_without_its_weights_is_an_error(world_corpus, tmp_path):
    template = snapshot_embedder(tiny_embedder_for(AutoTokenizer.from_pretrained(world_corpus)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="lacks"):
        load_snapshot(template, tmp_path / "empty")
