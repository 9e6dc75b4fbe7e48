"""The async index refresh's builds in flight (paper section 3.3; Google's refresh_doc_embeds.py): a build running in
the builder process, then the version it wrote, loaded by every rank on a background thread and swapped in at the
first step boundary where all of them have it (or, with `lag`, exactly `lag` steps after its snapshot). The decision
is taken by all ranks together (RankAgreement); the swap itself and the bookkeeping are the callback's
(IndexRefreshCallback in refresh.py)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from openrealm.file_utils import clean_leftovers
from openrealm.trainers.indexing import version_dir_name
from openrealm.trainers.pretraining.builder import (
    POLL_SECONDS,
    SNAPSHOTS_DIR,
    ServedBuild,
    clone_tensors,
    load_snapshot,
    log_tail,
    snapshot_embedder,
)
from openrealm.trainers.stage_utils import rank_and_world

if TYPE_CHECKING:
    from openrealm.trainers.pretraining.refresh import IndexRefreshCallback

logger = logging.getLogger(__name__)


class PendingSwaps:
    """The async builds of one `IndexRefreshCallback`: `running` (main process: the build started, its snapshot and
    version) and `loading` (every process: the built version being loaded, swapped in once all have it)."""

    def __init__(self, refresh: IndexRefreshCallback):
        self.refresh = refresh
        self.running: dict | None = None  # start future -> builder process, version, snapshot folder, step, time
        self.loading: dict | None = None  # version, snapshot step and time, "load" future -> (query embedder, index)
        self._clones: dict[int, torch.Tensor] | None = None  # the tensors of the last snapshot, reused
        self._executor: ThreadPoolExecutor | None = None  # snapshot save + builder start, and index loading

    @property
    def busy(self) -> bool:
        return self.running is not None or self.loading is not None

    def in_flight(self) -> list[dict]:
        """The builds running or loading (each with its "version" and snapshot "step"): pruning keeps them."""
        return [build for build in (self.running, self.loading) if build is not None]

    # -- the main process starts a build ------------------------------------------------------------------------------

    def start(self, embedder: torch.nn.Module, global_step: int) -> None:
        """Snapshot the embedder and start a builder process for the next version (does not wait).

        On the training step only the parameters are copied (a device-side clone: they are exactly this step's
        parameters, whatever the optimiser does next); building the snapshot module from them, saving it and starting
        the builder process happen on a background thread (logged: refresh_build_start_seconds = the part on the step).
        """
        refresh = self.refresh
        started = time.perf_counter()
        # The clones are reused from build to build: the previous snapshot module built around them was dropped once
        # saved (every rank, this one included, loads the query embedder of a version from its saved snapshot).
        self._clones = clones = clone_tensors(embedder, self._clones)
        snapshot_time = time.time()
        snapshot_dir = refresh.index_root / SNAPSHOTS_DIR / f"step-{global_step}"
        version = refresh.next_version()
        argv = refresh.builder.argv(snapshot_dir, version)
        start = self.background().submit(self.start_builder, embedder, clones, snapshot_dir, version, argv)
        refresh.builds_started += 1
        refresh.last_build_step = global_step
        self.running = {
            "start": start,  # future -> builder process
            "version": version,
            "snapshot_dir": snapshot_dir,
            "log": snapshot_dir / "build.log",
            "step": global_step,
            "time": snapshot_time,
        }
        refresh.build_start_seconds = time.perf_counter() - started

    def start_builder(
        self, embedder, clones: dict, snapshot_dir: Path, version: int, argv: list[str] | None
    ) -> subprocess.Popen | ServedBuild:
        """(background thread) The snapshot module from the cloned tensors, saved; then the build handed to the
        builder process."""
        if snapshot_dir.exists():  # a failed build of the same step: start clean
            shutil.rmtree(snapshot_dir)
        snapshot_embedder(embedder, clones=clones).save_pretrained(snapshot_dir)
        return self.refresh.builder.start(snapshot_dir, version, argv)

    def builder_process(self, timeout: float | None = None) -> subprocess.Popen | None:
        """The running builder process (waits up to `timeout` s for the background start); None when none runs."""
        build = self.running
        return build["start"].result(timeout=timeout) if build is not None else None

    # -- every process decides the swap at a step boundary ------------------------------------------------------------

    def poll(self, global_step: int) -> bool:
        """The swap decision at a step boundary. True when a swap happened.

        The main process checks its builder; once it has exited 0, every process loads the new version (index,
        memory-mapped, and the query embedder snapshot) on a background thread; the processes swap at the first step
        boundary where all of them have it loaded (with `lag`: at the boundary `lag` steps after the snapshot, waiting
        there until the build has ended and every process has it loaded). The state is all-reduced (MAX) over the
        processes at every boundary, so every rank takes the same decision at the same step."""
        started = time.perf_counter()
        while True:
            swapped, waiting = self._poll_once(global_step, started)
            if swapped or not waiting:
                return swapped
            time.sleep(POLL_SECONDS)

    def _poll_once(self, global_step: int, started: float) -> tuple[bool, bool]:
        """One look at the build: (swapped, the run must wait for this build before the step)."""
        rank = rank_and_world()[0]
        if rank == 0 and self.running is not None and self.loading is None:
            self._check_build(global_step)
        announced, snapshot_step, snapshot_time, ready, failed, waiting = self._exchange(rank, global_step)
        if failed:
            self._drop_loading(global_step, "loading the new index version failed on some process")
            return False, False
        if announced < 0:
            return False, waiting
        if self.loading is None or self.loading["version"] != announced or "load" not in self.loading:
            self.loading = self._start_loading(int(announced), int(snapshot_step), snapshot_time)
            return False, waiting
        if ready != announced or (self.refresh.lag is not None and not waiting):
            return False, waiting
        loading, self.loading = self.loading, None
        snapshot, index = loading["load"].result()
        self.refresh.swap(snapshot, index, global_step, loading["step"], loading["time"], started)
        if rank == 0:  # deleting folders takes time on a loaded machine: off the training thread too
            self.background().submit(self._prune_after_swap)
        return True, False

    def _prune_after_swap(self) -> None:
        self.refresh.prune_versions()
        self.refresh.prune_snapshots()

    def _check_build(self, global_step: int) -> None:
        """(main process) When the builder has ended: announce its version (success) or record the failure."""
        build = self.running
        if not build["start"].done():
            return
        if build["start"].exception() is not None:
            self.running = None
            self._fail(build, global_step, f"starting the builder failed: {build['start'].exception()!r}")
            return
        process = build["start"].result()
        if process.poll() is None:
            return
        self.running = None
        version_dir = self.refresh.index_root / version_dir_name(build["version"])
        if process.returncode != 0 or not version_dir.is_dir():
            self._fail(build, global_step, f"exit status {process.returncode}")
            return
        self.loading = {"version": build["version"], "step": build["step"], "time": build["time"], "announced": True}

    def _lag_due(self, global_step: int) -> bool:
        """(main process) With `lag`: the build running or loading is due to be swapped in at this step."""
        build = self.running or self.loading
        lag = self.refresh.lag
        return lag is not None and build is not None and global_step >= build["step"] + lag

    def _exchange(self, rank: int, global_step: int) -> tuple[float, float, float, float, bool, bool]:
        """(announced version, its snapshot step and time, version every rank has loaded, a load failed, the build is
        due under `lag`), all-reduced.

        One float64 vector, MAX-reduced: the main process announces (others send -1); readiness is reduced as
        -min(ready) = max(-ready) so the swap waits for the slowest rank."""
        loading = self.loading
        announced = loading["version"] if loading is not None and loading.get("announced") else -1
        ready, failed = -1, False
        if loading is not None and "load" in loading and loading["load"].done():
            failed = loading["load"].exception() is not None
            ready = -1 if failed else loading["version"]
        local = [
            announced,
            loading["step"] if announced >= 0 else -1,
            loading["time"] if announced >= 0 else -1,
            -ready,
            float(failed),
            float(rank == 0 and self._lag_due(global_step)),
        ]
        announced, snapshot_step, snapshot_time, minus_ready, failed, waiting = self.refresh.agreement.max(local)
        return announced, snapshot_step, snapshot_time, -minus_ready, bool(failed), bool(waiting)

    def _start_loading(self, version: int, snapshot_step: int, snapshot_time: float) -> dict:
        """Start loading an announced version on the background thread: its index (memory-mapped) and its query
        embedder from the snapshot the builder embedded with, index_root/.snapshots/step-N."""
        refresh = self.refresh
        template = refresh.examples.query_embedder
        device = refresh.device or next(template.parameters()).device
        snapshot_dir = refresh.index_root / SNAPSHOTS_DIR / f"step-{snapshot_step}"

        def load():
            return load_snapshot(template, snapshot_dir, device), refresh.load_version(version)

        return {
            "version": version,
            "step": snapshot_step,
            "time": snapshot_time,
            "announced": rank_and_world()[0] == 0,
            "load": self.background().submit(load),  # future -> (query embedder, index)
        }

    # -- failures and the end -----------------------------------------------------------------------------------------

    def _drop_loading(self, global_step: int, reason: str) -> None:
        """A rank could not load the announced version: every rank keeps its index; the main process counts a failed
        build and starts a new one when due."""
        refresh = self.refresh
        loading, self.loading = self.loading, None
        if loading is not None and "load" in loading and loading["load"].exception() is not None:
            reason = f"{reason}: {loading['load'].exception()!r}"
        refresh.builds_failed += 1
        refresh.failures.append({"step": global_step, "version": loading and loading["version"], "reason": reason})
        logger.error("index refresh: %s; keeping index version %d", reason, refresh.index_version)

    def _fail(self, build: dict, global_step: int, reason: str) -> None:
        refresh = self.refresh
        refresh.builds_failed += 1
        tail = log_tail(build["log"])
        refresh.failures.append({"step": global_step, "version": build["version"], "reason": reason, "log_tail": tail})
        logger.error(
            "index refresh: the build of version %d (step-%d embedder) failed (%s); keeping index version %d and "
            "retrying at the next step. Builder log tail:\n%s",
            build["version"],
            build["step"],
            reason,
            refresh.index_version,
            tail,
        )
        shutil.rmtree(build["snapshot_dir"], ignore_errors=True)

    def close(self) -> None:
        """Stop a running build (training ended): its unfinished version is discarded."""
        build, self.running, self.loading = self.running, None, None
        if build is not None:
            self._stop_builder(build)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _stop_builder(self, build: dict) -> None:
        try:
            process = build["start"].result()
        except Exception:  # the start failed: nothing runs
            process = None
        if process is not None and self.refresh.builder.stop(process) == 0:
            return  # it finished: the version stays on disk for later use
        # its staging folder: its pid is dead
        clean_leftovers(self.refresh.index_root / version_dir_name(build["version"]))
        shutil.rmtree(build["snapshot_dir"], ignore_errors=True)

    def background(self) -> ThreadPoolExecutor:
        """The one background thread of the refresh (snapshot save + builder start, index loading, pruning)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index-refresh")
        return self._executor


__all__ = ["PendingSwaps"]
