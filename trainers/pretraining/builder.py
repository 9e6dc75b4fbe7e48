"""The async index builder of REALM pre-training, both ends of it: the process that embeds the corpus into each new
index version while training goes on, `BuilderProcess`, which the refresh callback uses to start and stop it, and the
embedder snapshots handed between them (`clone_tensors`, `snapshot_embedder`, `load_snapshot`).

    python -m openrealm.trainers.pretraining.builder serve --corpus DIR --output ROOT [index build options]
    python -m openrealm.trainers.pretraining.builder --embedder SNAPSHOT --corpus DIR --output ROOT --version N

`serve` builds one version per JSON line on its standard input (`build_request`) and reports each build's exit status
in the snapshot folder (`read_build_status`); it is one long-lived process, as Google's refresher is one long-running
job (refresh_doc_embeds.py), so a refresh does not pay the start-up of torch, transformers and a CUDA context. The
second form builds one version in a process of its own. Both write ROOT/vNNNNNN as `openrealm index build` does.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from openrealm.file_utils import write_text_atomic
from openrealm.trainers.cli import JOBS, run_job
from openrealm.trainers.indexing import build_from_args, check_num_shards, exit_with_parent, process_state
from openrealm.trainers.options import index_build

logger = logging.getLogger(__name__)

MODULE = "openrealm.trainers.pretraining.builder"  # what `python -m` runs
SNAPSHOTS_DIR = ".snapshots"  # index_root/.snapshots/step-N: the embedder snapshot each build embeds with
POLL_SECONDS = 0.02  # how often a wait for a build (served, or due under the refresh's lag) looks again


BUILD_LOG_NAME = "build.log"  # in the snapshot folder: that build's output


BUILD_STATUS_NAME = "build_status.json"  # in the snapshot folder, written (atomically) when the build has ended


def build_request(snapshot_dir: str | os.PathLike, version: int) -> str:
    """One line of the served builder's input: build index `version` with the embedder saved in `snapshot_dir`."""
    return json.dumps({"embedder": str(Path(snapshot_dir).absolute()), "version": int(version)}) + "\n"


def read_build_status(snapshot_dir: str | os.PathLike) -> int | None:
    """The exit status of the served build of `snapshot_dir` (0: written), or None while it has not ended."""
    path = Path(snapshot_dir) / BUILD_STATUS_NAME
    return int(json.loads(path.read_text())["returncode"]) if path.is_file() else None


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, C level included) into `path` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def serve(args: argparse.Namespace, requests=None) -> int:
    """`python -m openrealm.trainers.pretraining.builder serve --corpus DIR --output ROOT [build options]`: build index
    versions, one per line of `requests` (default standard input; see `build_request`) until it ends.

    Each build writes ROOT/vNNNNNN as `openrealm index build` does, its output goes to SNAPSHOT/build.log and its exit
    status (0, or 1 with the traceback in the log) to SNAPSHOT/build_status.json once it has ended; a failed build
    does not stop the builder. With --parent-pid the process exits, writing nothing more, once that process is gone."""
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    state, device = process_state(args.device)
    check_num_shards(args.num_shards, state.num_processes, args.index_type, "versioned")
    for line in sys.stdin if requests is None else requests:
        if not line.strip():
            continue
        request = json.loads(line)
        snapshot = Path(request["embedder"])
        with _output_to(snapshot / BUILD_LOG_NAME):
            try:
                index = build_from_args(args, state, device, str(snapshot), int(request["version"]))
                print(f"Wrote {index.index_type} index version {index.version} of {index.num_blocks} x {index.dim}")
                returncode = 0
            except Exception:
                traceback.print_exc()
                returncode = 1
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the trainer shares this GPU between builds
        write_text_atomic(snapshot / BUILD_STATUS_NAME, json.dumps({"returncode": returncode}) + "\n")
    return 0


def exit_on_terminate() -> None:
    """Make SIGTERM (the refresh stopping a build when training ends) raise SystemExit in this process, so that the
    build's cleanup runs as it does for an error: its staging folder and its lock file are removed."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> int:
    exit_on_terminate()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(
            prog=f"python -m {MODULE} serve",
            description="Build index versions, one per line of standard input (the refresh's long-lived builder).",
        )
        index_build(parser, served=True)
        return serve(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="Embed every block of a knowledge corpus and write a MIPS index."
    )
    index_build(parser)
    return run_job(JOBS[("index", "build")][0], parser.parse_args(argv))


LOG_TAIL_CHARS = 2000


# A builder process must not join the trainer's torch.distributed job (it is one process on its own).
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


BuilderCommand = Callable[[Path, int], Sequence[str]]


BUILDER_LOG_NAME = "builder.log"  # index_root/.snapshots/builder.log: the served builder's own output between builds


class ServedBuild:
    """One build of the long-lived builder process (`serve`), behind the part of `subprocess.Popen`'s
    interface the callback uses for a build process of its own: `pid`, `poll()`, `returncode`, `wait()`,
    `terminate()`, `kill()` (the last two stop the builder process, which only a training run's end does).

    The build has ended when its status file is in the snapshot folder; if the builder process dies first, the build
    fails with its exit status, and the builder's own log is appended to the build's log."""

    def __init__(self, server: subprocess.Popen, snapshot_dir: Path, server_log: Path):
        self.server, self.snapshot_dir, self.server_log = server, snapshot_dir, server_log
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.server.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = read_build_status(self.snapshot_dir)
        if self.returncode is None and self.server.poll() is not None:
            self.returncode = self.server.returncode or 1
            with open(self.snapshot_dir / BUILD_LOG_NAME, "a", encoding="utf-8") as log:
                log.write(f"the builder process exited with status {self.server.returncode}; its log:\n")
                log.write(log_tail(self.server_log))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("index builder", timeout)
            time.sleep(POLL_SECONDS)
        return self.returncode

    def terminate(self) -> None:
        self.server.terminate()

    def kill(self) -> None:
        self.server.kill()


def default_builder_device(num_gpus: int | None = None, local_world_size: int | None = None) -> str:
    """The async builder's device: with more visible GPUs than training processes on this machine (which use cuda:0 ..
    cuda:N-1), the first free one (cuda:N); else cuda:0, shared with local rank 0; cpu without a GPU."""
    num_gpus = torch.cuda.device_count() if num_gpus is None else num_gpus
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if num_gpus == 0:
        return "cpu"
    return f"cuda:{local_world_size}" if num_gpus > local_world_size else "cuda:0"


def _builder_env() -> dict[str, str]:
    """The environment of a builder process: the trainer's, without its torch.distributed variables."""
    return {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_ENV}


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no builder log)"


class BuilderProcess:
    """The training side of the async builder: starts each build and stops what runs when training ends.

    By default every build goes to one long-lived process (`python -m openrealm.trainers.pretraining.builder serve`,
    started at the first build, restarted if it died); `command` (snapshot folder, version) -> argv instead starts a
    process of its own per build (e.g. `build_command`). corpus_dir, index_root: the corpus embedded and where versions
    are written; device: the builder's `--device`; build_kwargs: index_type, batch_size, max_length, num_shards."""

    def __init__(
        self,
        corpus_dir: Path,
        index_root: Path,
        device: str,
        build_kwargs: dict | None = None,
        command: BuilderCommand | None = None,
    ):
        self.corpus_dir, self.index_root, self.device = corpus_dir, index_root, device
        self.build_kwargs, self.command = dict(build_kwargs or {}), command
        self.server: subprocess.Popen | None = None  # the long-lived builder, once started

    @property
    def server_log(self) -> Path:
        """index_root/.snapshots/builder.log: the served builder's own output between builds."""
        return self.index_root / SNAPSHOTS_DIR / BUILDER_LOG_NAME

    def options(self) -> list[str]:
        """The build options of either kind of builder process."""
        options = ["--corpus", str(self.corpus_dir), "--output", str(self.index_root), "--device", self.device]
        # --parent-pid: a trainer killed with SIGKILL leaves no builder writing versions (or holding a GPU)
        options += ["--quiet", "--parent-pid", str(os.getpid())]
        for key in ("index_type", "batch_size", "max_length"):
            if key in self.build_kwargs:
                options += ["--" + key.replace("_", "-"), str(self.build_kwargs[key])]
        if self.build_kwargs.get("num_shards", 1) > 1:
            options += ["--num-shards", str(self.build_kwargs["num_shards"])]
        return options

    def build_command(self, snapshot_dir: Path, version: int) -> list[str]:
        """argv of a builder process of its own writing index_root/vNNNNNN from the embedder saved in snapshot_dir."""
        head = [sys.executable, "-m", MODULE, "--embedder", str(snapshot_dir)]
        return head + self.options() + ["--version", str(version)]

    def server_command(self) -> list[str]:
        """argv of the long-lived builder: one build per request line on its stdin (`serve`)."""
        return [sys.executable, "-m", MODULE, "serve", *self.options()]

    def argv(self, snapshot_dir: Path, version: int) -> list[str] | None:
        """The argv of a process of its own for this build (from `command`), or None: the long-lived builder builds
        it. Called on the training step, so that `command` sees the build in the order training asks for it."""
        return None if self.command is None else list(self.command(snapshot_dir, version))

    def start(self, snapshot_dir: Path, version: int, argv: list[str] | None = None) -> subprocess.Popen | ServedBuild:
        """Start building `version` from the embedder saved in snapshot_dir (does not wait): a process of its own runs
        `argv` (see `argv`), or, for None, the request goes to the long-lived builder (started if none runs)."""
        if argv is None:
            server = self._running_server()
            server.stdin.write(build_request(snapshot_dir, version))
            server.stdin.flush()
            logger.info(
                "index refresh: building version %d with %s (builder pid %d)", version, snapshot_dir, server.pid
            )
            return ServedBuild(server, snapshot_dir, self.server_log)
        with open(snapshot_dir / BUILD_LOG_NAME, "wb") as log:  # a file, not a pipe: a full pipe would block it
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=_builder_env())
        logger.info("index refresh: building version %s with %s (pid %d)", argv, snapshot_dir, process.pid)
        return process

    def stop(self, process: subprocess.Popen | ServedBuild) -> int:
        """Stop a build that still runs (terminated; killed after 30 s); its exit status."""
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def close(self) -> None:
        """End the long-lived builder: its input is closed, so it exits after the build it is running (if any); killed
        if it has not exited 30 s later."""
        server, self.server = self.server, None
        if server is None or server.poll() is not None:
            return
        try:
            server.stdin.close()
            server.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            server.kill()
            server.wait()

    def _running_server(self) -> subprocess.Popen:
        """The long-lived builder process, started if none runs (first build, or it died)."""
        if self.server is None or self.server.poll() is not None:
            with open(self.server_log, "ab") as log:
                self.server = subprocess.Popen(
                    self.server_command(),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=_builder_env(),
                    text=True,
                )
        return self.server


def clone_tensors(module: torch.nn.Module, into: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """id(parameter or buffer) -> a detached copy on its device (a tensor shared by two names is copied once).

    On a GPU the copies are queued on the current stream, before the next optimiser step: they hold this step's values
    without a host sync; `snapshot_embedder(..., clones=...)` builds the module around them, on any thread.
    into: what a previous call returned for the same module, no longer in use: its tensors are overwritten in place
    (on CPU, fresh memory for a large model costs page faults on the training step:
    benchmarks/performance.md#after-moving-the-snapshot-off-the-training-step-re-run-2026-11-22-1458-utc-quiet-machine)."""
    clones: dict[int, torch.Tensor] = {}
    with _one_intra_op_thread():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            key = id(tensor)
            if key in clones:
                continue
            target = (into or {}).get(key)
            if target is not None and target.shape == tensor.shape and target.dtype == tensor.dtype:
                with torch.no_grad():
                    clones[key] = target.copy_(tensor.detach())
                continue
            copy_ = tensor.detach().clone()
            is_parameter = isinstance(tensor, torch.nn.Parameter)
            clones[key] = torch.nn.Parameter(copy_, requires_grad=False) if is_parameter else copy_
    return clones


@contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """CPU copies with one intra-op thread. They are memory-bound, so more threads gain little; and with more runnable
    threads than cores each copy waits at an OpenMP barrier for a descheduled thread (a 6 MB clone: 36 ms with 2
    threads, 1 ms with 1, on a loaded 2-core machine). GPU copies do not use these threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def snapshot_embedder(
    embedder: torch.nn.Module, device: str | torch.device | None = None, clones: dict[int, torch.Tensor] | None = None
) -> torch.nn.Module:
    """A frozen copy of the embedder (eval mode, no gradients) on device (default: where the embedder is).

    clones: `clone_tensors(embedder)` taken earlier; the copy then holds those values (deepcopy's memo maps each
    original tensor to its clone, so the embedder's tensors, which may be changing meanwhile, are never read)."""
    snapshot = copy.deepcopy(embedder, dict(clones or {}))
    if device is not None:
        snapshot.to(device)
    snapshot.eval()
    snapshot.requires_grad_(False)
    return snapshot


def load_snapshot(
    template: torch.nn.Module, folder: str | os.PathLike, device: str | torch.device | None = None
) -> torch.nn.Module:
    """A frozen embedder with template's structure (deep-copied; its tensors are not read) and the weights saved in
    folder/*.safetensors, on device. Used on the refresh's background thread instead of `from_pretrained`, which
    changes process-wide torch state while it builds a model (default dtype, patched creation ops)."""
    from safetensors.torch import load_file

    saved: dict[str, torch.Tensor] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        saved.update(load_file(path))
    state = template.state_dict(keep_vars=True)
    clones: dict[int, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in saved and id(tensor) not in clones:  # tied tensors are saved under one of their names
            value = saved[name].to(tensor.dtype)
            is_parameter = isinstance(tensor, torch.nn.Parameter)
            clones[id(tensor)] = torch.nn.Parameter(value, requires_grad=False) if is_parameter else value
    missing = [name for name, tensor in state.items() if id(tensor) not in clones]
    if missing:
        raise ValueError(f"the snapshot in {folder} lacks {missing[:4]}: not saved from this embedder architecture")
    return snapshot_embedder(template, device, clones)


__all__ = [
    "clone_tensors",
    "load_snapshot",
    "snapshot_embedder",
    "BUILD_LOG_NAME",
    "BuilderProcess",
    "ServedBuild",
    "build_request",
    "default_builder_device",
    "log_tail",
    "read_build_status",
    "serve",
]

if __name__ == "__main__":
    sys.exit(main())
