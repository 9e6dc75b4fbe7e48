"""Refresh the MIPS index during REALM pre-training: a transformers `TrainerCallback` (Google §4, paper §3.3).

`IndexRefreshCallback(examples, corpus_dir, index_root, refresh_every, mode)` keeps the pair (query embedder snapshot,
index) of a `RealmPretrainingExamples` up to date with the training embedder:

- `mode="async"` (default, as REALM): every `refresh_every` steps, or as soon as the previous build has ended when a
  build takes longer than that, the trainer's embedder is copied (eval mode, no gradients), saved to
  `index_root/.snapshots/step-N/` and a builder process (`python -m openrealm.trainers.index_builder`) embeds the corpus
  with it into `index_root/vNNNNNN/`. The trainer never waits: at each step boundary (`on_step_begin`) the builder is
  polled; once it has exited 0 the new index and its snapshot replace the old pair together; when it fails, its log
  tail is reported, the old index stays, and the next step end starts a new build from a fresh snapshot.
- `mode="sync"`: every `refresh_every` steps the index is rebuilt in the training process (the trainer stalls for the
  whole build) and swapped at once: no staleness beyond `refresh_every`, useful as the reference for async.
- `mode="off"`: the index built before training is kept (the stale-index ablation).

Logged (merged into the Trainer's log entries by `on_log`, and returned by `metrics(step)`): `index_version`,
`index_staleness_steps` (steps since the snapshot behind the index in use was taken), `index_staleness_seconds`,
`refresh_stall_seconds` (time the trainer spent in the last swap and pruning: for sync the whole build),
`refresh_build_start_seconds` (time the last async build start took on its step: snapshot copy, save, process start),
`index_builds_started`,
`index_builds_failed`. Each swap is also recorded in `self.swaps` (step, version, snapshot step, stall). The newest
`keep` (3, as Google's refresher) versions are kept on disk, and the snapshots behind them, plus the version in use and
those in `protected_versions` (the versions that kept training checkpoints resume with); the callback prunes after each
swap (builds themselves prune nothing, so a protected version is never deleted by a builder).

Checkpoints: `checkpoint_state()` is what a training checkpoint records (index version in use, its snapshot step and
time, index_root, counters; JSON-safe) and `restore(state, query_embedder, index)` puts a run back on that pair.

This callback runs in one training process. Under multi-process training the processes must agree on when to swap
(every rank's examples need the same index version); that coordination comes with the multi-process pre-training work.

Departures from Google's code (spec §4):
- The refresh is triggered by the step count (`refresh_every`) rather than by the checkpoint-export cadence, and the
  swap happens at a step boundary rather than at a data-shard boundary; the spec's recommended "refresh every N steps
  plus an index version tag on each batch". The batches already collated (the DataLoader's prefetch) keep their old
  candidates, as Google never invalidates in-flight examples; each batch carries its `index_version`.
- The builder embeds on the training machine (GPU when there is one), not on 16 separate TPUs.
- A failed build is retried from a fresh snapshot instead of the refresher crashing.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import TrainerCallback

from openrealm.trainers.index_builder import build_index, list_versions, load_index, version_dir_name

logger = logging.getLogger(__name__)

MODES = ("async", "sync", "off")
KEEP_VERSIONS = 3  # Google's refresher keeps the newest 3 encoded exports
SNAPSHOTS_DIR = ".snapshots"
LOG_TAIL_CHARS = 2000
# A builder process must not join the trainer's torch.distributed job (it is one process on its own).
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")

BuilderCommand = Callable[[Path, int], Sequence[str]]


def snapshot_embedder(embedder: torch.nn.Module, device: str | torch.device | None = None) -> torch.nn.Module:
    """A frozen copy of the embedder (eval mode, no gradients) on device (default: where the embedder is)."""
    snapshot = copy.deepcopy(embedder)
    if device is not None:
        snapshot.to(device)
    snapshot.eval()
    snapshot.requires_grad_(False)
    return snapshot


class IndexRefreshCallback(TrainerCallback):
    """Rebuild the index from the training embedder every `refresh_every` steps and swap it into `examples`.

    examples: the `RealmPretrainingExamples` the data collator uses (its `update_index` receives each new pair).
    corpus_dir: the knowledge-corpus folder the index covers; index_root: where versions `vNNNNNN/` are written (the
    index in use may come from elsewhere; new versions number from max(in use, on disk) + 1).
    snapshot_step / snapshot_time: when the snapshot behind the current index was taken (training step, time.time()).
    device: where snapshots live and sync builds run (default: the training embedder's device).
    builder_device: `--device` of the async builder process (default cuda when available, else cpu).
    builder_command: (snapshot folder, version) -> argv of the async builder; default `index_builder_command`.
    build_kwargs: extra keyword arguments of `build_index` (sync) / options of the builder (async): index_type,
    batch_size.
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
    ):
        if mode not in MODES:
            raise ValueError(f"refresh mode must be one of {MODES}, got {mode!r}")
        if mode != "off" and refresh_every < 1:
            raise ValueError(f"refresh_every must be a positive number of steps, got {refresh_every}")
        self.examples = examples
        self.corpus_dir = Path(corpus_dir).absolute()
        self.index_root = Path(index_root).absolute()
        self.refresh_every = refresh_every
        self.mode = mode
        self.keep = keep
        self.device = device
        self.builder_device = builder_device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.builder_command = builder_command or self.index_builder_command
        self.build_kwargs = dict(build_kwargs or {})
        self.snapshot_step = snapshot_step
        self.snapshot_time = time.time() if snapshot_time is None else snapshot_time
        self.last_build_step = snapshot_step  # the step of the snapshot of the newest build started (or in use)
        self.builds_started = 0
        self.builds_failed = 0
        self.stall_seconds = 0.0
        self.build_start_seconds = 0.0  # time the last async build start took from its training step
        self.swaps: list[dict] = []
        self.failures: list[dict] = []
        self.protected_versions: set[int] = set()  # index versions pruning must keep (used by kept checkpoints)
        self.index_in_use_root = self.index_root  # the root of the index in use (set it when that came from elsewhere)
        self._build: dict | None = None  # the running async build: process, version, snapshot, log, step, time

    # -- state ---------------------------------------------------------------------------------------------------------

    @property
    def index_version(self) -> int:
        return self.examples.index.version

    @property
    def building(self) -> bool:
        return self._build is not None

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
        return max([self.index_version, *list_versions(self.index_root)]) + 1

    def _due(self, global_step: int) -> bool:
        return self.mode != "off" and global_step - self.last_build_step >= self.refresh_every

    # -- Trainer events ------------------------------------------------------------------------------------------------

    def on_step_begin(self, args, state, control, **kwargs):
        if self.mode == "async" and self._build is not None:
            self.poll(state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self._due(state.global_step) or self._build is not None:
            return
        embedder = _unwrap(model).embedder
        if self.mode == "sync":
            self.refresh_sync(embedder, state.global_step)
        else:
            self.start_build(embedder, state.global_step)

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

    # -- sync ----------------------------------------------------------------------------------------------------------

    def refresh_sync(self, embedder: torch.nn.Module, global_step: int) -> None:
        """Snapshot, build the next version in this process, swap: the trainer waits for all of it."""
        started = time.perf_counter()
        snapshot = snapshot_embedder(embedder, self.device)
        snapshot_time = time.time()
        version = self.next_version()
        self.builds_started += 1
        self.last_build_step = global_step
        index = build_index(
            snapshot,
            self.corpus_dir,
            self.index_root,
            version=version,
            keep=None,  # pruned by the callback, which knows the protected versions
            progress=False,
            **self.build_kwargs,
        )
        self._swap(snapshot, index, global_step, global_step, snapshot_time, started)
        self.prune_versions()

    # -- async ---------------------------------------------------------------------------------------------------------

    def index_builder_command(self, snapshot_dir: Path, version: int) -> list[str]:
        """argv of a builder process: `python -m openrealm.trainers.index_builder` writing index_root/vNNNNNN."""
        command = [
            sys.executable,
            "-m",
            "openrealm.trainers.index_builder",
            "--embedder",
            str(snapshot_dir),
            "--corpus",
            str(self.corpus_dir),
            "--output",
            str(self.index_root),
            "--version",
            str(version),
            "--device",
            self.builder_device,
            "--quiet",
        ]
        if "index_type" in self.build_kwargs:
            command += ["--index-type", str(self.build_kwargs["index_type"])]
        if "batch_size" in self.build_kwargs:
            command += ["--batch-size", str(self.build_kwargs["batch_size"])]
        return command

    def start_build(self, embedder: torch.nn.Module, global_step: int) -> None:
        """Save a snapshot of the embedder and start a builder process for the next version (does not wait).

        The snapshot copy and save happen on the training step (logged as refresh_build_start_seconds)."""
        start_started = time.perf_counter()
        snapshot = snapshot_embedder(embedder, self.device)
        snapshot_time = time.time()
        snapshot_dir = self.index_root / SNAPSHOTS_DIR / f"step-{global_step}"
        if snapshot_dir.exists():  # a failed build of the same step: start clean
            shutil.rmtree(snapshot_dir)
        snapshot.save_pretrained(snapshot_dir)
        version = self.next_version()
        log_path = snapshot_dir / "build.log"
        env = {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_ENV}
        with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the builder
            process = subprocess.Popen(
                list(self.builder_command(snapshot_dir, version)), stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.builds_started += 1
        self.last_build_step = global_step
        self.build_start_seconds = time.perf_counter() - start_started
        self._build = {
            "process": process,
            "version": version,
            "snapshot": snapshot,
            "snapshot_dir": snapshot_dir,
            "log": log_path,
            "step": global_step,
            "time": snapshot_time,
        }
        logger.info(
            "index refresh: building version %d from the step-%d embedder (pid %d)", version, global_step, process.pid
        )

    def poll(self, global_step: int) -> bool:
        """Check the running build without waiting; swap in its index when it succeeded. True when a swap happened."""
        build = self._build
        if build is None or build["process"].poll() is None:
            return False
        self._build = None
        code = build["process"].returncode
        version_dir = self.index_root / version_dir_name(build["version"])
        if code != 0 or not version_dir.is_dir():
            self._fail(build, global_step, f"exit status {code}")
            return False
        started = time.perf_counter()
        try:
            index = load_index(self.index_root, build["version"])
        except (OSError, ValueError) as error:  # pruned already or unreadable: keep the index in use
            self._fail(build, global_step, f"cannot load {version_dir}: {error}")
            return False
        self._swap(build["snapshot"], index, global_step, build["step"], build["time"], started)
        self.prune_versions()
        self._prune_snapshots()
        # The pruning also happens on the step boundary: count it in the stall.
        self.stall_seconds = time.perf_counter() - started
        self.swaps[-1]["stall_seconds"] = self.stall_seconds
        return True

    def close(self) -> None:
        """Stop a running builder (training ended): its unfinished version is discarded."""
        build, self._build = self._build, None
        if build is None:
            return
        process = build["process"]
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.returncode == 0:
            return  # it finished: the version stays on disk for later use
        for staging in self.index_root.glob(f".{version_dir_name(build['version'])}.tmp-*"):
            shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(build["snapshot_dir"], ignore_errors=True)

    def _fail(self, build: dict, global_step: int, reason: str) -> None:
        self.builds_failed += 1
        tail = _tail(build["log"])
        self.failures.append({"step": global_step, "version": build["version"], "reason": reason, "log_tail": tail})
        logger.error(
            "index refresh: the build of version %d (step-%d embedder) failed (%s); keeping index version %d and "
            "retrying at the next step. Builder log tail:\n%s",
            build["version"],
            build["step"],
            reason,
            self.index_version,
            tail,
        )
        shutil.rmtree(build["snapshot_dir"], ignore_errors=True)

    # -- shared --------------------------------------------------------------------------------------------------------

    def _swap(self, snapshot, index, global_step: int, snapshot_step: int, snapshot_time: float, started: float):
        """Hand the consistent pair (snapshot, index) to the examples; record the stall and the staleness origin."""
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
        if self._build is not None:
            keep.add(self._build["version"])
        versions = list_versions(self.index_root)
        deleted = [v for v in versions[: -self.keep] if v not in keep] if self.keep else []
        for version in deleted:
            shutil.rmtree(self.index_root / version_dir_name(version), ignore_errors=True)
        return deleted

    # -- checkpoints ---------------------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """What a training checkpoint records to resume on the same (query embedder, index) pair (JSON-safe)."""
        return {
            "index_version": self.index_version,
            "index_root": str(self.index_in_use_root),
            "snapshot_step": self.snapshot_step,
            "snapshot_time": self.snapshot_time,
            # A build running now is lost on resume: it is due again from the snapshot in use.
            "last_build_step": self.snapshot_step if self._build is not None else self.last_build_step,
            "mode": self.mode,
            "refresh_every": self.refresh_every,
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

    def _prune_snapshots(self) -> None:
        """Keep the snapshot folders of the versions kept on disk (the newest `keep` builds), drop older ones."""
        folder = self.index_root / SNAPSHOTS_DIR
        if not folder.is_dir():
            return
        steps = sorted(int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if p.name[5:].isdigit())
        running = self._build["step"] if self._build is not None else None
        for step in [s for s in steps if s != running][: -self.keep]:
            shutil.rmtree(folder / f"step-{step}", ignore_errors=True)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DDP / torch.compile wrappers (the callback needs its `embedder`)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no builder log)"


__all__ = ["IndexRefreshCallback", "MODES", "snapshot_embedder"]
