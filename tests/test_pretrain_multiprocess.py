"""REALM pre-training under `accelerate launch` with 2 CPU processes (DDP over gloo): every rank uses the same index
version from the same step on (async and sync refresh), a resumed run restores the checkpoint's index version on every
rank, and the output folders load. Each rank's OUTPUT/refresh/rank-R.json records (first step, index version) pairs."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ACCELERATE_ENV, DATED, UNDATED, accelerate_launch, pretrain_argv, repeated_corpus, small_corpus

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder, RealmScorer
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers.indexing import list_versions

TIMEOUT = 180  # seconds per launch (2 trainers and a builder process share the cores)

# The CLI job plus one callback: stop three steps after the first index swap (the two batches collated ahead still
# hold the old version). It decides from the rank's own swaps, so the ranks stop at the same step only if they swapped
# at the same step (otherwise DDP hangs and the launch times out). Each step also sleeps 50 ms: the two trainers leave
# the cores to the builder process, which ends sooner.
STOP_AFTER_SWAP = """
import sys
import time
from transformers import TrainerCallback
from openrealm.trainers import cli
from openrealm.trainers.jobs import train_pretrain as pretrain

class StopAfterSwap(TrainerCallback):
    def __init__(self, refresh):
        self.refresh = refresh

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)
        if self.refresh.swaps and state.global_step >= self.refresh.swaps[0]["step"] + 3:
            control.should_training_stop = True

build_trainer = pretrain.build_trainer

def build_with_stop(*args, **kwargs):
    trainer = build_trainer(*args, **kwargs)
    trainer.add_callback(StopAfterSwap(trainer.refresh))
    return trainer

pretrain.build_trainer = build_with_stop
sys.exit(cli.main(["train", "pretrain", *sys.argv[1:]]))
"""


def run_argv(corpus_dir: Path, output: Path, mode: str, max_steps: int) -> list[str]:
    """`train pretrain`'s options: tiny towers, a refresh every 2 steps in `mode`, batches of 2, a log every step."""
    extra = ["--max-steps", str(max_steps), "--batch-size", "2", "--logging-steps", "1"]
    return pretrain_argv(corpus_dir, output, *extra, refresh_every=2, refresh_mode=mode)


def launch(program: list[str], argv: list[str]) -> str:
    """Run `accelerate launch PROGRAM ARGV` on 2 CPU processes; returns its output (fails the test on an error)."""
    result = subprocess.run(
        [*accelerate_launch(), *program, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **ACCELERATE_ENV},
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


def rank_records(output: Path) -> list[dict]:
    return [json.loads((output / "refresh" / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


def assert_output_folders_load(output: Path) -> None:
    assert RealmEmbedder.from_pretrained(output / "embedder").config.hidden_size == 32
    assert RealmKnowledgeAugEncoder.from_pretrained(output / "encoder").config.retriever_proj_size == 16
    assert RealmScorer.from_pretrained(output / "scorer").config.retriever_proj_size == 16
    assert json.loads((output / "pretraining.json").read_text())["num_processes"] == 2


@pytest.mark.slow
def test_async_refresh_swaps_every_rank_to_the_built_version_at_the_same_step(world_corpus, tmp_path):
    output = tmp_path / "out"
    script = tmp_path / "stop_after_swap.py"
    script.write_text(STOP_AFTER_SWAP)
    launch([str(script)], run_argv(world_corpus, output, "async", 1000))
    first, second = rank_records(output)
    assert (first["rank"], second["rank"], first["world_size"]) == (0, 1, 2)
    # Rank 0 built version 1 from the step-2 embedder; both ranks swapped to it at the same step boundary. The warm
    # builder may finish the next version (from an embedder taken after that swap) before training stops: every rank
    # then swaps to it at the same step too.
    swaps = first["swaps"]
    assert swaps == second["swaps"] and [s["version"] for s in swaps] == list(range(1, len(swaps) + 1))
    assert swaps[0]["snapshot_step"] == 2 and swaps[0]["step"] > 2
    assert all(later["snapshot_step"] >= earlier["step"] for earlier, later in zip(swaps, swaps[1:]))
    expected_versions = [[1, 0]] + [[s["step"] + 1, s["version"]] for s in swaps]
    assert first["index_versions"] == second["index_versions"] == expected_versions
    # The batches were collated from the same versions at the same steps on both ranks, old versions first.
    assert first["batch_index_versions"] == second["batch_index_versions"]
    batch_versions = [version for _, version in first["batch_index_versions"]]
    assert batch_versions[:2] == [0, 1] and batch_versions == sorted(batch_versions)
    # Every rank reads the index from the memory-mapped file (shared pages), not from a private copy.
    assert first["index_memory_mapped"] and second["index_memory_mapped"]
    # Every swapped version, plus one more when a build that started after the last swap ended before training did.
    built = list(range(len(swaps) + 1))
    assert list_versions(output / "index") in (built, [*built, len(swaps) + 1])
    assert not [p.name for p in (output / "index").iterdir() if p.name.startswith(".v")]  # no half-written version
    assert_output_folders_load(output)


@pytest.fixture(scope="module")
def sync_run(world_corpus, tmp_path_factory) -> tuple[Path, list[dict]]:
    """4 steps with a sync refresh every 2 and a checkpoint every 2 (output folder, rank records)."""
    output = tmp_path_factory.mktemp("sync") / "out"
    launch(["-m", "openrealm", "train", "pretrain"], run_argv(world_corpus, output, "sync", 4) + ["--save-steps", "2"])
    return output, rank_records(output)


@pytest.mark.slow
def test_sync_refresh_embeds_sharded_and_every_rank_swaps_at_the_refresh_steps(sync_run):
    output, (first, second) = sync_run
    swaps = [(s["step"], s["version"], s["snapshot_step"]) for s in first["swaps"]]
    assert swaps == [(2, 1, 2), (4, 2, 4)] and first["swaps"] == second["swaps"]
    assert first["index_versions"] == second["index_versions"] == [[1, 0], [3, 1]]
    assert first["index_memory_mapped"] and second["index_memory_mapped"]
    # Both processes embedded a share of the blocks of each version.
    info = json.loads((output / "index" / "v000002" / "build_info.json").read_text())
    assert info["world_size"] == 2
    assert_output_folders_load(output)


@pytest.mark.slow
def test_a_sharded_index_run_holds_half_the_rows_per_rank_and_trains_as_an_unsharded_one(world_corpus, sync_run):
    unsharded, whole_records = sync_run
    output = unsharded.parent / "sharded"
    launch(["-m", "openrealm", "train", "pretrain"], run_argv(world_corpus, output, "sync", 4) + ["--shard-index"])
    first, second = rank_records(output)
    num_blocks = len(load_corpus(world_corpus))
    assert (first["index_rows"], second["index_rows"]) == ((num_blocks + 1) // 2, num_blocks // 2)
    assert [record["index_rows"] for record in whole_records] == [num_blocks, num_blocks]
    assert first["index_memory_mapped"] and second["index_memory_mapped"]  # each rank maps its own shard file
    assert first["swaps"] == second["swaps"] and [s["version"] for s in first["swaps"]] == [1, 2]
    for version in (0, 1, 2):
        folder = output / "index" / f"v{version:06d}" / "block_index"
        names = sorted(p.name for p in folder.glob("block_emb*"))
        assert names == ["block_emb-00001-of-00002.safetensors", "block_emb-00002-of-00002.safetensors"]
    # The same batches give the same losses and retrieval utility: a search's ids and scores are those of the whole
    # index, up to how ties and float32 rounding fall (the ranks score other matmul shapes; this random tiny embedder
    # gives many blocks exactly tied scores, so the order of tied candidates may differ).
    logs = [
        [entry for entry in json.loads((run / "pretraining.json").read_text())["log_history"] if "loss" in entry]
        for run in (output, unsharded)
    ]
    assert len(logs[0]) == len(logs[1]) == 4
    for sharded, whole in zip(*logs):
        assert sharded["loss"] == pytest.approx(whole["loss"], rel=1e-4)
        assert sharded["retrieval_utility"] == pytest.approx(whole["retrieval_utility"], abs=1e-3)


@pytest.mark.slow
def test_checkpoint_holds_every_rank_state_and_resume_restores_its_index_version_on_every_rank(world_corpus, sync_run):
    output, _ = sync_run
    checkpoint = output / "checkpoint-4"
    assert {"rng_state_0.pth", "rng_state_1.pth", "refresh_state.json"} <= set(os.listdir(checkpoint))
    assert json.loads((checkpoint / "refresh_state.json").read_text())["index_version"] == 2
    resumed = output.parent / "resumed"
    shutil.copytree(output, resumed)
    stdout = launch(
        ["-m", "openrealm", "train", "pretrain"],
        run_argv(world_corpus, resumed, "sync", 6) + ["--save-steps", "2", "--resume-from-checkpoint", "last"],
    )
    assert stdout.count("resuming from") == 1  # printed by rank 0 only
    first, second = rank_records(resumed)
    # Steps 5 and 6 ran on version 2 (checkpoint-4's) on both ranks; the sync refresh at step 6 built version 3.
    assert first["index_versions"] == second["index_versions"] == [[5, 2]]
    assert first["swaps"] == second["swaps"] == [{"step": 6, "version": 3, "snapshot_step": 6}]
    assert (resumed / "checkpoint-6").is_dir()


@pytest.mark.slow
def test_ranks_whose_batches_are_all_dropped_train_on_in_step_and_the_skips_are_summed(world_corpus, tmp_path):
    # One block of 8 has a date; 2 ranks x 1 query x 4 steps: 7 of the 8 per-rank batches are empty. An empty batch
    # that skipped DDP's forward would leave the other rank waiting in its gradient all-reduce (a timeout).
    texts = ["The river was named in March 1912 by the city.", *UNDATED[1:]]
    blocks = small_corpus(world_corpus, tmp_path / "corpus", texts)
    output = tmp_path / "out"
    argv = run_argv(blocks, output, "off", 4)
    argv[argv.index("--batch-size") + 1] = "1"
    launch(["-m", "openrealm", "train", "pretrain"], argv)
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["num_processes"] == 2 and summary["log_history"][-1]["step"] == 4
    assert summary["skipped_batches"] == 7 and summary["dropped_examples"] == 7
    assert summary["totals"]["num_examples"] == 1


# The CLI with the share checked from 2 rows read on (200 by default): the stop at a logging step runs on every rank.
STOP_FROM_TWO_ROWS = """
import sys
from openrealm.trainers import cli, dropped

dropped.MIN_EXAMPLES_TO_STOP = 2
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ranks_stop_together_when_duplicate_blocks_drop_every_example_and_one_error_is_printed(world_corpus, tmp_path):
    blocks = repeated_corpus(world_corpus, tmp_path / "corpus", DATED, copies=3)
    script = tmp_path / "stop_from_two_rows.py"
    script.write_text(STOP_FROM_TWO_ROWS)
    output = tmp_path / "out"
    argv = run_argv(blocks, output, "off", 40)
    argv[argv.index("--batch-size") + 1] = "1"
    result = subprocess.run(
        [*accelerate_launch(), str(script), "train", "pretrain", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **ACCELERATE_ENV},
        timeout=TIMEOUT,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("openrealm: error:")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr[-4000:]
    assert errors[0].startswith(
        "openrealm: error: REALM pre-training stopped after step 1 of 40: 2 of 2 corpus rows read (100%) give no "
        "training example: 2 because their retrieved blocks held two copies of one block"
    )
    assert not (output / "pretraining.json").exists()
    records = rank_records(output)
    assert [record["batch_index_versions"] for record in records] == [[[1, 0]], [[1, 0]]]  # one step on each rank
