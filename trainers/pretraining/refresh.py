"""The index refresh of REALM pre-training: `IndexRefreshCallback`, a transformers `TrainerCallback` (Google's
refresh_doc_embeds.py; paper section 3.3).

It keeps the (query embedder snapshot, index) pair of a `RealmPretrainingExamples` up to date with the training
embedder: async (a builder process embeds while training goes on; the new pair is swapped in at a step boundary),
sync (training waits for each build) or off. This module holds the Trainer's side: when to build, the swap, what is
logged, what a checkpoint needs to resume on the same pair (`checkpoint_state`, `restore`), pruning old versions. The
async builds in flight are pending_swaps.py's `PendingSwaps`; under several processes every rank swaps to the same
version at the same step through rank_agreement.py's `RankAgreement`. How it works, what it logs and where it departs
from Google's code: docs/pretraining.md ("How the index refresh works").
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers.indexing import build_index, list_versions, load_index, next_version, version_dir_name
from openrealm.trainers.options import REFRESH_MODES as MODES
from openrealm.trainers.pretraining.builder import (
    SNAPSHOTS_DIR,
    BuilderCommand,
    BuilderProcess,
    default_builder_device,
    snapshot_embedder,
)
from openrealm.trainers.pretraining.pending_swaps import PendingSwaps
from openrealm.trainers.pretraining.rank_agreement import RankAgreement
from openrealm.trainers.stage_utils import rank_and_world, unwrap_model

logger = logging.getLogger(__name__)

KEEP_VERSIONS = 3  # Google's refresher keeps the newest 3 encoded exports


def check_refresh_settings(mode: str, refresh_every: int, lag: int | None = None) -> None:
    """Raise ValueError for settings IndexRefreshCallback refuses: an unknown mode, a period below 1 step (unless
    off), a lag outside the async mode or below 1. Commands call it before building anything."""
    if mode not in MODES:
        raise ValueError(f"refresh mode must be one of {MODES}, got {mode!r}")
    if mode != "off" and refresh_every < 1:
        raise ValueError(f"refresh_every must be a positive number of steps, got {refresh_every}")
    if lag is not None and (mode != "async" or lag < 1):
        raise ValueError(f"lag is a positive number of steps of the async mode, got lag={lag} with mode={mode!r}")


class IndexRefreshCallback(TrainerCallback):
    """Rebuild the index from the training embedder every `refresh_every` steps and swap it into `examples`.

    examples: the `RealmPretrainingExamples` the data collator uses (its `update_index` receives each new pair).
    corpus_dir: the knowledge-corpus folder the index covers; index_root: where versions `vNNNNNN/` are written (the
    index in use may come from elsewhere; new versions number from max(in use, on disk) + 1).
    snapshot_step / snapshot_time: when the snapshot behind the current index was taken (training step, time.time()).
    device: where snapshots live and sync builds run (default: the training embedder's device).
    builder_device: `--device` of the async builder process (default `default_builder_device()`: a GPU no training
    process of this machine uses when there is one, else cuda:0 shared with rank 0, else cpu).
    builder_command: (snapshot folder, version) -> argv of a process of its own for each async build (e.g.
    `BuilderProcess.build_command`); default None: every build goes to one long-lived builder process, started at the
    first build and stopped when training ends (`self.builder`, a `BuilderProcess`).
    build_kwargs: extra keyword arguments of `build_index` (sync) / options of the builder (async): index_type,
    batch_size, max_length, num_shards (> 1: each process holds and searches its shard, see ShardedBlockIndex).
    lag: async only: swap each build in exactly `lag` steps after its snapshot, waiting for it then if needed (a
    reproducible run); None (default, as Google): at the first step boundary after the build has ended.
    """

    def __init__(
        self,
        examples,
        corpus_dir: str | os.PathLike,
        index_root: str | os.PathLike,
        refresh_every: int,
        mode: str = "async",
        *,
        keep: int = KEEP_VERSIONS,
        snapshot_step: int = 0,
        snapshot_time: float | None = None,
        device: str | torch.device | None = None,
        builder_device: str | None = None,
        builder_command: BuilderCommand | None = None,
        build_kwargs: dict | None = None,
        lag: int | None = None,
    ):
        check_refresh_settings(mode, refresh_every, lag)
        self.lag = lag
        self.examples = examples
        self.corpus_dir = Path(corpus_dir).absolute()
        self.index_root = Path(index_root).absolute()
        self.refresh_every = refresh_every
        self.mode = mode
        self.keep = keep
        self.device = device
        self.build_kwargs = dict(build_kwargs or {})
        # num_shards > 1 (--shard-index): versions are written in shards and each rank holds its ShardedBlockIndex
        self.sharded = self.build_kwargs.get("num_shards", 1) > 1
        # main process, async: the builder process and its supervision
        builder_device = builder_device or default_builder_device()
        self.builder = BuilderProcess(
            self.corpus_dir, self.index_root, builder_device, self.build_kwargs, builder_command
        )
        self.snapshot_step = snapshot_step
        self.snapshot_time = time.time() if snapshot_time is None else snapshot_time
        self.last_build_step = snapshot_step  # the step of the snapshot of the newest build started (or in use)
        self.builds_started = 0
        self.builds_failed = 0
        self.stall_seconds = 0.0
        self.build_start_seconds = 0.0  # time the last async build start took on its training step
        self.swaps: list[dict] = []
        self.failures: list[dict] = []
        self.versions_by_step: list[tuple[int, int]] = []  # (first step run with a version, that version)
        self.protected_versions: set[int] = set()  # index versions pruning must keep (used by kept checkpoints)
        self.index_in_use_root = self.index_root  # the root of the index in use (set it when that came from elsewhere)
        self.pending_swaps = PendingSwaps(self)  # async: the build running, then the version loading until its swap
        self.agreement = RankAgreement()  # several processes: the same swap on every rank at the same step

    # -- state --------------------------------------------------------------------------------------------------------

    @property
    def index_version(self) -> int:
        return self.examples.index.version

    @property
    def building(self) -> bool:
        return self.pending_swaps.busy

    @property
    def is_main_process(self) -> bool:
        return rank_and_world()[0] == 0

    def metrics(self, global_step: int) -> dict[str, float]:
        """The refresh metrics at a training step."""
        return {
            "index_version": self.index_version,
            "index_staleness_steps": global_step - self.snapshot_step,
            "index_staleness_seconds": round(time.time() - self.snapshot_time, 3),
            "refresh_stall_seconds": round(self.stall_seconds, 4),
            "refresh_build_start_seconds": round(self.build_start_seconds, 4),
            "index_builds_started": self.builds_started,
            "index_builds_failed": self.builds_failed,
        }

    def next_version(self) -> int:
        return max(self.index_version + 1, next_version(self.index_root))

    def _due(self, global_step: int) -> bool:
        return self.mode != "off" and global_step - self.last_build_step >= self.refresh_every

    # -- Trainer events -----------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self.mode != "off":
            self.agreement.join()  # every rank calls on_train_begin: the one place to create a group collectively

    def on_step_begin(self, args, state, control, **kwargs):
        if self.mode == "async":
            self.pending_swaps.poll(state.global_step)
        if not self.versions_by_step or self.versions_by_step[-1][1] != self.index_version:
            self.versions_by_step.append((state.global_step + 1, self.index_version))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self._due(state.global_step):
            return
        embedder = unwrap_model(model).embedder
        if self.mode == "sync":
            self.refresh_sync(embedder, state.global_step)
        elif self.is_main_process and not self.building:  # the main process owns the builder
            self.pending_swaps.start(embedder, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Trainer.log appended its entry to log_history just before calling the callbacks: complete that entry, and
        # `logs` for the callbacks after this one, without overwriting what the trainer put there.
        metrics = self.metrics(state.global_step)
        for target in (logs, state.log_history[-1] if state.log_history else None):
            if target is not None:
                for key, value in metrics.items():
                    target.setdefault(key, value)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    # -- sync ---------------------------------------------------------------------------------------------------------

    def refresh_sync(self, embedder: torch.nn.Module, global_step: int) -> None:
        """Snapshot, build the next version, swap: the trainer waits for all of it. Under several processes every rank
        calls this at the same step: each embeds its share of the blocks (index_builder shards), the main process
        writes the version, every rank swaps to it."""
        started = time.perf_counter()
        snapshot = snapshot_embedder(embedder, self.device)
        snapshot_time = time.time()
        rank, world = rank_and_world()
        accelerator = None
        if world > 1:
            from accelerate import PartialState

            accelerator = PartialState()
        version = self.agreement.agree_on_version(self.next_version() if rank == 0 else -1)
        self.builds_started += 1
        self.last_build_step = global_step
        index = build_index(
            snapshot,
            self.corpus_dir,
            self.index_root,
            version=version,
            keep=None,  # pruned by the callback, which knows the protected versions
            accelerator=accelerator,
            progress=False,
            **self.build_kwargs,
        )
        # Every rank maps the written version (the builder's in-memory copy on the main process is dropped): the
        # ranks share its pages instead of each holding the embeddings.
        index = self.load_version(index.version)
        self.swap(snapshot, index, global_step, global_step, snapshot_time, started)
        if rank == 0:
            self.prune_versions()

    def load_version(self, version: int):
        """Index `version` of index_root: memory-mapped (shared by the ranks), or this rank's shard on the training
        device when sharded (its collectives then run over the training backend: gloo on CPU, NCCL on GPU)."""
        if not self.sharded:
            return load_index(self.index_root, version)
        device = self.device or next(self.examples.query_embedder.parameters()).device
        return load_index(self.index_root, version, device=device, sharded=True)

    # -- shared -------------------------------------------------------------------------------------------------------

    def swap(self, snapshot, index, global_step: int, snapshot_step: int, snapshot_time: float, started: float):
        """Hand the consistent pair (snapshot, index) to the examples; record the stall and the staleness origin."""
        if index.num_blocks != len(self.examples.blocks):  # a new corpus version (corpus add): its blocks come too
            self.examples.blocks = load_corpus(self.corpus_dir)
        self.examples.update_index(snapshot, index)
        self.index_in_use_root = self.index_root
        self.stall_seconds = time.perf_counter() - started
        self.snapshot_step, self.snapshot_time = snapshot_step, snapshot_time
        self.swaps.append(
            {
                "step": global_step,
                "version": index.version,
                "snapshot_step": snapshot_step,
                "stall_seconds": self.stall_seconds,
            }
        )
        logger.info(
            "index refresh: step %d now uses index version %d (step-%d embedder; stall %.3fs)",
            global_step,
            index.version,
            snapshot_step,
            self.stall_seconds,
        )

    def prune_versions(self) -> list[int]:
        """Delete the versions under index_root other than the newest `keep`, the one in use and the protected ones;
        returns the deleted versions."""
        keep = set(self.protected_versions)
        if self.index_in_use_root == self.index_root:
            keep.add(self.index_version)
        keep.update(build["version"] for build in self.pending_swaps.in_flight())
        versions = list_versions(self.index_root)
        deleted = [v for v in versions[: -self.keep] if v not in keep] if self.keep else []
        for version in deleted:
            shutil.rmtree(self.index_root / version_dir_name(version), ignore_errors=True)
        return deleted

    def close(self) -> None:
        """Stop a running builder (training ended): its unfinished version is discarded."""
        self.pending_swaps.close()
        self.builder.close()

    # -- checkpoints --------------------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """What a training checkpoint records to resume on the same (query embedder, index) pair (JSON-safe)."""
        return {
            "index_version": self.index_version,
            "index_root": str(self.index_in_use_root),
            "snapshot_step": self.snapshot_step,
            "snapshot_time": self.snapshot_time,
            # A build running (or loading) now is lost on resume: it is due again from the snapshot in use.
            "last_build_step": self.snapshot_step if self.building else self.last_build_step,
            "mode": self.mode,
            "refresh_every": self.refresh_every,
            "lag": self.lag,
            "builds_started": self.builds_started,
            "builds_failed": self.builds_failed,
        }

    def restore(self, state: dict, query_embedder: torch.nn.Module, index) -> None:
        """Resume on a checkpoint's pair: `index` (version state["index_version"]) and the snapshot embedder it was
        built with; the staleness origin and counters come back as recorded (a build running then is not resumed:
        the next step end starts one when it is due)."""
        if index.version != state["index_version"]:
            raise ValueError(f"the checkpoint used index version {state['index_version']}, got {index.version}")
        query_embedder.eval()
        query_embedder.requires_grad_(False)
        self.examples.update_index(query_embedder, index)
        self.index_in_use_root = Path(state.get("index_root") or self.index_root).absolute()
        self.snapshot_step, self.snapshot_time = state["snapshot_step"], state["snapshot_time"]
        self.last_build_step = state.get("last_build_step", state["snapshot_step"])
        self.builds_started = state.get("builds_started", 0)
        self.builds_failed = state.get("builds_failed", 0)

    def prune_snapshots(self) -> None:
        """Keep the snapshot folders of the versions kept on disk (the newest `keep` builds), drop older ones."""
        folder = self.index_root / SNAPSHOTS_DIR
        if not folder.is_dir():
            return
        steps = sorted(int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if p.name[5:].isdigit())
        running = {build["step"] for build in self.pending_swaps.in_flight()}
        for step in [s for s in steps if s not in running][: -self.keep]:
            shutil.rmtree(folder / f"step-{step}", ignore_errors=True)


__all__ = [
    "IndexRefreshCallback",
    "MODES",
    "check_refresh_settings",
]
