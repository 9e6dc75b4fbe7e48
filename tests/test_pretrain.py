"""REALM pre-training job: the index refresh callback (sync / async in another process / off; Google §4) and the
Trainer-based job end to end."""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_same_top_k, small_world_corpus
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback

from openrealm import RealmBlockIndex, RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder, ShardedBlockIndex
from openrealm.tokenization.corpus import build_corpus, load_corpus
from openrealm.tokenization.salient_spans import make_span_annotator
from openrealm.trainers import cli, dropped, pretrain, towers
from openrealm.trainers.indexing import build_index, list_versions
from openrealm.trainers.options import train_pretrain
from openrealm.trainers.pretraining import RealmPretrainingExamples
from openrealm.trainers.pretraining.builder import build_request, default_builder_device, read_build_status
from openrealm.trainers.pretraining.refresh import (
    SNAPSHOTS_DIR,
    IndexRefreshCallback,
    clone_tensors,
    load_snapshot,
    snapshot_embedder,
)
from openrealm.trainers.stage_utils import parse_config_overrides

TINY = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,retriever_proj_size=16,"
TINY += "max_position_embeddings=384"
BUILD_TIMEOUT = 90  # seconds an async build may take (a builder process imports torch + transformers)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """conftest.small_world_corpus: 58 one-block articles, dates as salient spans."""
    return small_world_corpus(tmp_path_factory.mktemp("world"))


def tiny_embedder(tokenizer) -> RealmEmbedder:
    torch.manual_seed(0)
    fields = dict(item.split("=") for item in TINY.split(","))
    return RealmEmbedder(RealmConfig(vocab_size=len(tokenizer), **{k: int(v) for k, v in fields.items()}))


def setup_refresh(corpus: Path, root: Path, mode: str, refresh_every: int = 2, **kwargs):
    """(training embedder, examples over index v0, callback) with index v0 built from the embedder into root."""
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    embedder = tiny_embedder(tokenizer)
    index = build_index(embedder, corpus, root, version=0, keep=3, progress=False)
    examples = RealmPretrainingExamples(tokenizer, load_corpus(corpus), embedder, index)
    callback = IndexRefreshCallback(examples, corpus, root, refresh_every, mode, **kwargs)
    return embedder, examples, callback


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


def weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Bit for bit: the snapshots and reloads compared are copies, and any training step changes some weight."""
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # exact: above


def test_sync_refresh_swaps_every_n_steps_and_bumps_the_version(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "sync", refresh_every=2)
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


def test_sync_refresh_keeps_the_newest_three_versions(corpus, tmp_path):
    embedder, _, callback = setup_refresh(corpus, tmp_path / "index", "sync", refresh_every=1)
    steps = Steps(callback, embedder)
    for _ in range(4):
        steps.step()
    assert list_versions(tmp_path / "index") == [2, 3, 4] and callback.builds_started == 4


def test_off_mode_never_refreshes(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "off", refresh_every=1)
    steps = Steps(callback, embedder)
    for _ in range(5):
        steps.step()
    assert examples.index.version == 0 and list_versions(tmp_path / "index") == [0]
    assert callback.builds_started == 0 and callback.metrics(5)["index_staleness_steps"] == 5


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


def test_async_builder_of_a_sharded_run_writes_one_file_per_rank_and_the_examples_get_a_sharded_index(
    corpus, tmp_path
):
    embedder, examples, callback = setup_refresh(
        corpus, tmp_path / "index", "async", refresh_every=2, build_kwargs={"num_shards": 2}
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


def test_async_build_runs_in_another_process_without_blocking_the_steps(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2)
    callback.builder.command = sleeping_builder(callback, 1.5)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # step 2 ends: a snapshot is saved and the builder starts
    builder = callback.builder_process(timeout=30)  # started on the callback's background thread
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


def test_lagged_async_refresh_waits_for_a_slow_build_at_exactly_snapshot_plus_lag(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2, lag=3)
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


def test_lagged_async_refresh_holds_a_finished_build_until_its_step(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2, lag=40)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # the build of the step-2 snapshot starts
    callback.builder_process(timeout=30).wait(timeout=BUILD_TIMEOUT)
    for _ in range(41):
        steps.step(0.01)
    # Built long before, swapped in exactly 40 steps after its snapshot; the next build starts on the following step
    # end, as none may start while one waits.
    assert [(s["step"], s["version"], s["snapshot_step"]) for s in callback.swaps] == [(42, 1, 2)]
    assert callback.builds_started == 2 and examples.index.version == 1
    callback.close()


def test_async_builds_go_to_one_long_lived_builder_process_that_ends_with_training(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2, lag=2)
    steps = Steps(callback, embedder)
    builders = set()
    deadline = time.monotonic() + 3 * BUILD_TIMEOUT
    while len(callback.swaps) < 3:
        assert time.monotonic() < deadline, callback.failures
        steps.step()
        if callback._build is not None:
            builders.add(callback.builder_process(timeout=30).pid)
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
        snapshot, corpus, tmp_path / "reference", version=0, progress=False, device=callback.builder.device
    )
    torch.testing.assert_close(examples.index.block_emb, expected.block_emb, rtol=1e-4, atol=1e-4)
    callback.close()
    assert server.poll() is not None and callback.builder.server is None  # training over: no builder left running


def test_a_failed_build_of_the_long_lived_builder_is_logged_and_the_next_build_succeeds(corpus, tmp_path, caplog):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2)
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


def test_a_builder_process_that_dies_fails_its_build_and_the_next_build_starts_a_new_one(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2)
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # the first build goes to a new builder process
    first = callback.builder_process(timeout=30)
    first.kill()
    run_until(steps, lambda: callback.builds_failed > 0)
    assert "the builder process exited with status" in callback.failures[0]["log_tail"]
    run_until_swap(steps)
    assert examples.index.version == 1 and callback.builder.server.pid != first.pid
    callback.close()


def test_the_long_lived_builder_exits_when_its_input_ends(corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    snapshot = tmp_path / "snapshot"
    tiny_embedder(tokenizer).save_pretrained(snapshot)
    command = [sys.executable, "-m", "openrealm.trainers.pretraining.builder", "serve", "--corpus", str(corpus)]
    command += ["--output", str(tmp_path / "index"), "--device", "cpu", "--quiet"]
    requests = build_request(snapshot, 4) + build_request(snapshot, 5)
    finished = subprocess.run(command, input=requests, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    assert list_versions(tmp_path / "index") == [4, 5] and read_build_status(snapshot) == 0
    assert "Wrote exact index version 5" in (snapshot / "build.log").read_text()


@pytest.mark.parametrize("mode, lag", [("sync", 2), ("off", 2), ("async", 0)])
def test_refresh_lag_is_refused_outside_the_async_mode_or_below_one_step(corpus, tmp_path, mode, lag):
    with pytest.raises(ValueError, match="lag is a positive number of steps of the async mode"):
        setup_refresh(corpus, tmp_path / "index", mode, lag=lag)


def test_snapshot_from_reused_clones_holds_the_values_of_the_latest_clone(corpus):
    embedder = tiny_embedder(AutoTokenizer.from_pretrained(corpus))
    first = clone_tensors(embedder)
    perturb(embedder, 0)
    second = clone_tensors(embedder, into=first)
    assert all(second[key] is first[key] for key in first)  # overwritten in place, no new memory
    snapshot = snapshot_embedder(embedder, clones=second)
    assert weights_equal(snapshot, embedder) and not snapshot.training
    perturb(embedder, 1)  # training goes on: the snapshot keeps the cloned values
    assert not weights_equal(snapshot, embedder)
    assert all(not p.requires_grad for p in snapshot.parameters())


def test_snapshot_loaded_onto_the_query_embedder_structure_holds_the_saved_weights(corpus, tmp_path):
    embedder = tiny_embedder(AutoTokenizer.from_pretrained(corpus))
    template = snapshot_embedder(embedder)
    perturb(embedder, 0)
    embedder.save_pretrained(tmp_path / "snapshot")
    loaded = load_snapshot(template, tmp_path / "snapshot")
    assert weights_equal(loaded, embedder) and not weights_equal(template, embedder)
    assert not loaded.training and all(not p.requires_grad for p in loaded.parameters())
    state = loaded.state_dict(keep_vars=True)  # the tie the file stores once stays a tie
    assert state["cls.predictions.decoder.bias"] is state["cls.predictions.bias"]


def test_loading_a_snapshot_from_a_folder_without_its_weights_is_an_error(corpus, tmp_path):
    template = snapshot_embedder(tiny_embedder(AutoTokenizer.from_pretrained(corpus)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="lacks"):
        load_snapshot(template, tmp_path / "empty")


@pytest.mark.parametrize(
    ("num_gpus", "local_world_size", "device"),
    [(0, 1, "cpu"), (0, 2, "cpu"), (1, 1, "cuda:0"), (8, 8, "cuda:0"), (8, 7, "cuda:7"), (2, 1, "cuda:1")],
)
def test_builder_gets_a_gpu_no_training_process_uses_when_there_is_one(num_gpus, local_world_size, device):
    assert default_builder_device(num_gpus, local_world_size) == device


@pytest.mark.slow
def test_async_snapshot_holds_the_parameters_of_its_step_while_training_goes_on(corpus, tmp_path):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2)
    start_builder = callback._start_builder

    def late_start(*args):  # the background thread gets to the snapshot only after more training steps
        time.sleep(0.5)
        return start_builder(*args)

    callback._start_builder = late_start
    steps = Steps(callback, embedder)
    steps.step()
    steps.step()  # step 2 ends: only the parameters are cloned on the step
    at_step_2 = {name: tensor.clone() for name, tensor in embedder.state_dict().items()}
    for _ in range(3):
        steps.step()  # the optimiser stand-in changes the embedder in place meanwhile
    callback.builder_process(timeout=30)
    saved = RealmEmbedder.from_pretrained(tmp_path / "index" / SNAPSHOTS_DIR / "step-2")
    # exact: the snapshot is a copy of the weights at step 2
    assert all(torch.equal(saved.state_dict()[name], value) for name, value in at_step_2.items())
    assert not weights_equal(saved, embedder)
    run_until_swap(steps)
    assert weights_equal(examples.query_embedder, saved) and not examples.query_embedder.training
    assert all(not p.requires_grad for p in examples.query_embedder.parameters())
    callback.close()


def test_failed_async_build_is_logged_keeps_the_old_index_and_is_retried(corpus, tmp_path, caplog):
    embedder, examples, callback = setup_refresh(corpus, tmp_path / "index", "async", refresh_every=2)
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


def test_pretraining_job_logs_realm_metrics_and_saves_loadable_towers(corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--max-steps", "4", "--refresh-every", "2", "--refresh-mode", "sync", "--batch-size", "4"]
    argv += ["--logging-steps", "1", "--config-overrides", TINY, "--no-progress", "--index-batch-size", "32"]
    assert cli.main(["train", "pretrain", *argv]) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    logs = [entry for entry in summary["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    for name in (
        "retrieval_utility",
        "null_doc_prob",
        "retrieval_entropy",
        "num_trivial_retrieved",
        "index_staleness_seconds",
    ):
        assert all(name in entry for entry in logs), name
    # Sync refreshes at steps 2 and 4: the index in use and its staleness as logged after each step.
    assert [entry["index_version"] for entry in logs] == [0, 1, 1, 2]
    assert [entry["index_staleness_steps"] for entry in logs] == [1, 0, 1, 0]
    assert sum(entry["num_examples"] for entry in logs) > 0
    assert list_versions(output / "index") == [0, 1, 2]
    embedder = RealmEmbedder.from_pretrained(output / "embedder")
    encoder = RealmKnowledgeAugEncoder.from_pretrained(output / "encoder")
    assert embedder.config.hidden_size == 32 and encoder.config.retriever_proj_size == 16
    assert (
        AutoTokenizer.from_pretrained(output / "embedder").get_vocab()
        == AutoTokenizer.from_pretrained(corpus).get_vocab()
    )


class StepRecorder(TrainerCallback):
    """Records the global step at each step end."""

    def __init__(self):
        self.steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_extra_callbacks_passed_to_run_see_every_step(corpus, tmp_path):
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    argv = ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(tmp_path / "out")]
    argv += ["--max-steps", "3", "--refresh-every", "2", "--refresh-mode", "off", "--batch-size", "2"]
    argv += ["--config-overrides", TINY, "--no-progress", "--index-batch-size", "32"]
    recorder = StepRecorder()
    assert pretrain.run(parser.parse_args(argv), callbacks=[recorder]) == 0
    assert recorder.steps == [1, 2, 3]
    assert json.loads((tmp_path / "out" / "pretraining.json").read_text())["max_steps"] == 3


def test_embedder_learning_rate_gives_the_retriever_its_own_optimizer_groups(corpus, tmp_path):
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    args = parser.parse_args(
        ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(tmp_path / "out"),
         "--max-steps", "2", "--refresh-every", "10", "--refresh-mode", "off", "--learning-rate", "1e-3",
         "--embedder-learning-rate", "1e-5", "--no-progress"]
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    embedder = tiny_embedder(tokenizer)
    fields = {key: int(value) for key, value in (item.split("=") for item in TINY.split(","))}
    encoder = towers.load_encoder("random", tokenizer, fields)
    index = build_index(embedder, corpus, tmp_path / "index", version=0, progress=False)
    trainer = pretrain.build_trainer(args, embedder, encoder, tokenizer, load_corpus(corpus), index)
    groups = trainer.create_optimizer().param_groups
    embedder_ids = {id(p) for p in embedder.parameters()}
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert sum(len(group["params"]) for group in groups) == len(trainable)
    for group in groups:
        in_embedder = {id(p) in embedder_ids for p in group["params"]}
        assert len(in_embedder) == 1  # a group is all retriever or all encoder
        assert group["lr"] == (1e-5 if in_embedder == {True} else 1e-3)
    assert {group["lr"] for group in groups} == {1e-5, 1e-3}


def small_corpus(corpus: Path, output: Path, texts: list[str], spans: str = "regex") -> Path:
    """A corpus of one block per text (titles "Article i"), tokenized with the world's vocabulary."""
    articles = Dataset.from_list([{"title": f"Article {i}", "text": text} for i, text in enumerate(texts)])
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    build_corpus(articles, output, tokenizer, span_annotator=make_span_annotator(spans))
    return output


UNDATED = [f"The river number {i} flows past the city and into the sea." for i in range(8)]


def pretrain_argv(corpus: Path, output: Path, *extra: str) -> list[str]:
    argv = ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--refresh-every", "100", "--refresh-mode", "off", "--config-overrides", TINY, "--no-progress"]
    return argv + ["--index-batch-size", "32", *extra]


def cli_pretrain(corpus: Path, output: Path, *extra: str) -> int:
    from openrealm.trainers import cli

    return cli.main(["train", "pretrain", *pretrain_argv(corpus, output, *extra)])


def test_pretraining_refuses_a_corpus_without_any_salient_span_naming_the_counts_and_flags(corpus, tmp_path, capsys):
    blocks = small_corpus(corpus, tmp_path / "corpus", UNDATED[:3], spans="none")
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("openrealm: error: 0 of 3 blocks") and "(span annotators: none)" in error
    for flag in ("--spans spacy", "--spans MODEL", "--spans random_span", "--spans random_token"):
        assert flag in error, flag
    assert not output.exists()  # refused before any index was built


def test_pretraining_refuses_a_refresh_lag_without_async_refresh_before_building_anything(corpus, tmp_path, capsys):
    output = tmp_path / "out"
    assert (
        cli.main(["train", "pretrain", *pretrain_argv(corpus, output, "--max-steps", "2", "--refresh-lag", "5")]) == 2
    )
    assert "got lag=5 with mode='off' (--refresh-mode, --refresh-every, --refresh-lag)" in capsys.readouterr().err
    assert not output.exists()


def test_random_span_masking_trains_on_a_corpus_without_spans(corpus, tmp_path):
    blocks = small_corpus(corpus, tmp_path / "corpus", UNDATED, spans="none")
    argv = pretrain_argv(blocks, tmp_path / "out", "--max-steps", "1", "--spans", "random_span", "--batch-size", "2")
    assert cli.main(["train", "pretrain", *argv]) == 0
    summary = json.loads((tmp_path / "out" / "pretraining.json").read_text())
    assert summary["totals"]["num_examples"] == 2 and summary["skipped_batches"] == 0


def test_batches_of_only_dropped_examples_are_skipped_counted_and_training_finishes(corpus, tmp_path, capsys):
    # One block of 8 has a date: batches of 2 over the 8 blocks (one epoch in 4 steps) leave 3 batches empty.
    texts = ["The river was named in March 1912 by the city.", *UNDATED[1:]]
    blocks = small_corpus(corpus, tmp_path / "corpus", texts)
    output = tmp_path / "out"
    argv = pretrain_argv(blocks, output, "--max-steps", "4", "--batch-size", "2", "--logging-steps", "1")
    assert cli.main(["train", "pretrain", *argv]) == 0
    assert "1 of 8 blocks have a salient span" in capsys.readouterr().out
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["skipped_batches"] == 3 and summary["dropped_examples"] == 7
    assert summary["totals"]["num_examples"] == 1 and summary["totals"]["num_skipped_queries"] == 7
    logs = [entry for entry in summary["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    assert sorted(entry["num_skipped_batches"] for entry in logs) == [0, 1, 1, 1]
    trained = [entry for entry in logs if entry["num_skipped_batches"] == 0]
    assert trained[0]["num_examples"] == 1 and "retrieval_utility" in trained[0]
    assert all("retrieval_utility" not in entry for entry in logs if entry["num_skipped_batches"])
    assert [entry["num_dropped_examples"] for entry in logs] == [
        2 if entry["num_skipped_batches"] else 1 for entry in logs
    ]
    assert math.isfinite(summary["train_loss"])


def test_cli_corpus_build_with_defaults_feeds_train_pretrain_with_defaults(corpus, tmp_path):
    from openrealm.trainers import cli

    texts = [f"The city number {i} was founded in {1800 + 7 * i} near the river." for i in range(6)] + UNDATED[:4]
    source = tmp_path / "articles.jsonl"
    source.write_text("".join(json.dumps({"title": f"Town {i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    built = tmp_path / "corpus"
    assert cli.main(["corpus", "build", "--input", str(source), "--output", str(built), "--tokenizer", str(corpus.parent / "vocab")]) == 0  # fmt: skip
    output = tmp_path / "out"
    argv = ["train", "pretrain", "--corpus", str(built), "--embedder", "random", "--encoder", "random"]
    argv += ["--output", str(output), "--max-steps", "2", "--refresh-every", "100", "--config-overrides", TINY]
    assert cli.main(argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["spans"] == "salient" and summary["refresh_mode"] == "async" and summary["batch_size"] == 4
    assert summary["totals"]["num_examples"] > 0 and math.isfinite(summary["train_loss"])
    assert json.loads((built / "corpus_config.json").read_text())["span_annotators"] == ["date-regex"]


DATED = [f"In March {1900 + i} the river number {i} was named by the city." for i in range(10)]


def repeated_corpus(corpus: Path, output: Path, texts: list[str], copies: int) -> Path:
    """`copies` copies of the articles "Article i" (one block each), duplicates kept (--no-deduplicate)."""
    rows = [{"title": f"Article {i}", "text": text} for i, text in enumerate(texts)] * copies
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    build_corpus(Dataset.from_list(rows), output, tokenizer, span_annotator=make_span_annotator("regex"), deduplicate=False)  # fmt: skip
    return output


def test_pretraining_that_drops_every_example_for_duplicate_blocks_ends_with_an_error_and_saves_nothing(
    corpus, tmp_path, capsys
):
    # The run: 10 articles present 3 times (30 blocks, 20 duplicates), 4 steps of 4 with sync refreshes.
    blocks = repeated_corpus(corpus, tmp_path / "corpus", DATED, copies=3)
    output = tmp_path / "out"
    argv = ["--max-steps", "4", "--batch-size", "4", "--refresh-every", "2", "--refresh-mode", "sync"]
    assert cli_pretrain(blocks, output, *argv) == 2
    err = capsys.readouterr().err
    assert "REALM pre-training: warning: 20 of 30 blocks duplicate an earlier block" in err
    error = err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: REALM pre-training ended: 16 of 16 corpus rows read (100%) give no training example: 16 "
        "because their retrieved blocks held two copies of one block"
    )
    assert "Rebuild the corpus with `openrealm corpus build` (without --no-deduplicate)" in error
    assert "more than --max-dropped-share 0.9" in error and error.endswith("No model was saved.")
    assert not (output / "pretraining.json").exists() and not (output / "embedder").exists()


def test_pretraining_stops_at_the_first_logging_step_past_the_share_once_enough_rows_were_read(
    corpus, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(dropped, "MIN_EXAMPLES_TO_STOP", 8)  # 200 rows by default: too many for a test
    recorder = StepRecorder()
    blocks = repeated_corpus(corpus, tmp_path / "corpus", DATED, copies=3)
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    args = parser.parse_args(pretrain_argv(blocks, tmp_path / "out", "--max-steps", "40", "--batch-size", "4", "--logging-steps", "2"))  # fmt: skip
    with pytest.raises(ValueError, match=r"REALM pre-training stopped after step 2 of 40: 8 of 8 corpus rows read"):
        pretrain.run(args, callbacks=[recorder])
    assert recorder.steps == [1, 2]
    assert not (tmp_path / "out" / "pretraining.json").exists()


def test_pretraining_summary_line_warns_when_most_rows_give_no_example_with_the_counts_by_cause(
    corpus, tmp_path, capsys
):
    texts = ["The river was named in March 1912 by the city.", *UNDATED[1:]]  # 1 of 8 blocks has a salient span
    blocks = small_corpus(corpus, tmp_path / "corpus", texts)
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "4", "--batch-size", "2") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"REALM pre-training: saved embedder/, encoder/ and scorer/ to {output} (train loss ")
    assert "; warning: 7 of 8 corpus rows read (88%) give no training example: 7 because their block has no " in line
    assert "--spans spacy" in line and "--spans random_span" in line
    summary = json.loads((output / "pretraining.json").read_text())
    assert (
        summary["totals"]["num_skipped_no_valid_spans"] == 7 and summary["totals"]["num_dropped_duplicate_uids"] == 0
    )


def test_pretraining_summary_line_has_no_warning_when_most_rows_train(corpus, tmp_path, capsys):
    blocks = small_corpus(corpus, tmp_path / "corpus", DATED[:8])
    assert cli_pretrain(blocks, tmp_path / "out", "--max-steps", "2", "--batch-size", "2") == 0
    assert "warning" not in capsys.readouterr().out.splitlines()[-1]


def test_pretraining_refuses_more_candidates_than_distinct_blocks_before_building_anything(corpus, tmp_path, capsys):
    blocks = repeated_corpus(corpus, tmp_path / "corpus", DATED[:3], copies=3)
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        f"openrealm: error: --num-candidates 8 retrieves 8 blocks per query, but {blocks} holds only 3 distinct ones "
        "(9 searchable blocks, of which 6 duplicate another): every query would be dropped. Lower --num-candidates"
    )
    assert not output.exists()


def test_pretraining_refuses_a_corpus_of_one_block_before_building_anything(corpus, tmp_path, capsys):
    blocks = small_corpus(corpus, tmp_path / "corpus", DATED[:1])
    assert cli_pretrain(blocks, tmp_path / "out", "--max-steps", "2") == 2
    assert "holds only 1 distinct ones (1 searchable blocks): every query" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_pretraining_refuses_a_corpus_where_too_few_blocks_have_a_salient_span_unless_told_to_train_anyway(
    corpus, tmp_path, capsys
):
    texts = [DATED[0], *(f"The river number {i} flows past the city number {i}." for i in range(11))]
    blocks = small_corpus(corpus, tmp_path / "corpus", texts)  # 1 of 12 blocks has a date: 92% dropped at least
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "1", "--batch-size", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: 11 of 12 corpus rows (92%) give no training example: 11 because their block has no salient "
        "span"
    )
    assert not output.exists()
    assert cli_pretrain(blocks, output, "--max-steps", "1", "--batch-size", "2", "--max-dropped-share", "1") == 0
    assert (output / "pretraining.json").is_file()


def test_pretraining_whose_masks_all_lie_past_the_query_length_ends_with_an_error_naming_it(corpus, tmp_path, capsys):
    # Towers of 16 positions read queries of 12 wordpieces: every date below comes later in its sentence.
    texts = [
        f"The river number {i} flows past the old city and into the sea since March {1900 + i}." for i in range(8)
    ]
    blocks = small_corpus(corpus, tmp_path / "corpus", texts)
    argv = ["--max-steps", "2", "--batch-size", "2", "--config-overrides", TINY + ",max_position_embeddings=16"]
    assert cli_pretrain(blocks, tmp_path / "out", *argv) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert "4 of 4 corpus rows read (100%) give no training example: 4 because the words to mask lie past the first " in error  # fmt: skip
    assert "10 wordpieces of their sentence" in error and "max_position_embeddings" in error


def test_held_out_query_blocks_give_no_training_query_and_are_listed_in_the_summary(corpus, tmp_path):
    from openrealm.trainers.pretraining.evaluation import held_out_query_blocks

    blocks = load_corpus(corpus)
    args = SimpleNamespace(hold_out_queries=10, seed=3)
    held_out = held_out_query_blocks(blocks, 10, seed=3)
    training = pretrain.training_queries(blocks, args)
    assert len(held_out) == 10 and len(training) == len(blocks) - 10
    assert not set(training["block_id"]) & set(held_out)
    assert all(len(blocks[i]["span_char_starts"]) for i in held_out)  # each can give a query
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "2", "--hold-out-queries", "10", "--seed", "3") == 0
    assert json.loads((output / "pretraining.json").read_text())["held_out_query_blocks"] == held_out


def test_the_oracle_reader_trains_the_retriever_through_the_command_line_and_logs_its_answer_metrics(corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--max-steps", "2", "--logging-steps", "1", "--oracle-reader-weight", "1", "--batch-size", "8"]
    assert cli_pretrain(corpus, output, *argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["oracle_reader_weight"] == 1.0
    logged = [entry for entry in summary["log_history"] if "answer_in_candidates" in entry]
    assert len(logged) == 2 and all(0 <= entry["answer_in_candidates"] <= 1 for entry in logged)
    assert all(math.isfinite(entry["answer_posterior_gain"]) for entry in logged)
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert not weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)  # the retriever moved


def test_a_frozen_retriever_takes_no_update_while_the_reader_trains(corpus, tmp_path):
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "3", "--freeze-retriever-steps", "3", "--batch-size", "8") == 0
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)  # no step touched it
    trained = RealmKnowledgeAugEncoder.from_pretrained(output / "encoder")
    initial = towers.load_encoder("random", AutoTokenizer.from_pretrained(corpus), parse_config_overrides(TINY), 0)
    assert not weights_equal(trained, initial)  # the reader did train
    assert json.loads((output / "pretraining.json").read_text())["freeze_retriever_steps"] == 3


def test_the_retriever_trains_once_its_frozen_steps_are_over(corpus, tmp_path):
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "3", "--freeze-retriever-steps", "2", "--batch-size", "8") == 0
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert not weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)


def test_initial_prior_entropy_scales_the_start_so_the_sampled_prior_has_that_entropy(corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--max-steps", "1", "--initial-prior-entropy", "1.2", "--batch-size", "8", "--learning-rate", "0"]
    assert cli_pretrain(corpus, output, *argv) == 0
    prior = json.loads((output / "pretraining.json").read_text())["initial_prior"]
    assert prior["entropy_after"] == pytest.approx(1.2, abs=1e-3)
    assert prior["entropy_before"] > 1.5 and prior["embedding_scale"] > 1  # a random start's prior is near uniform
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    scaled = RealmEmbedder.from_pretrained(output / "embedder")  # lr 0: the scale is all that changed
    torch.testing.assert_close(scaled.cls.LayerNorm.weight, start.cls.LayerNorm.weight * prior["embedding_scale"])


def test_an_initial_prior_entropy_of_log_k_or_more_is_refused_before_anything_is_built(corpus, tmp_path, capsys):
    output = tmp_path / "out"
    assert cli_pretrain(corpus, output, "--max-steps", "1", "--initial-prior-entropy", "2.5") == 2
    error = capsys.readouterr().err
    assert "--initial-prior-entropy 2.5 must lie between 0 and log K = 2.079 nats (K = --num-candidates 8)" in error
    assert not (output / "index").exists()


def test_gradient_accumulation_updates_once_per_accumulated_batches(corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--max-steps", "2", "--gradient-accumulation-steps", "2", "--batch-size", "4", "--logging-steps", "1"]
    assert cli_pretrain(corpus, output, *argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["gradient_accumulation_steps"] == 2
    assert summary["totals"]["num_examples"] + summary["dropped_examples"] == 2 * 2 * 4  # steps x micro-batches x size
