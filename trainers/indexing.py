"""Embed every block of a knowledge corpus and write a versioned MIPS index: the machinery of `openrealm index build`
(trainers/jobs/index_build.py) and of the pre-training refresh.

    openrealm index build --embedder MODEL --corpus DIR --output DIR [--index-type exact|flat|ivf|hnsw|ivfpq|pq]
    accelerate launch -m openrealm index build ...          # each process embeds a contiguous share of the blocks

MODEL is a local folder or Hub repo id: a REALM checkpoint (RealmEmbedder, or the `embedder` tower of a RealmScorer /
RealmForOpenQA folder) or any BERT checkpoint (RealmEmbedder.from_bert_pretrained: new projection head). Each block is
embedded from `[CLS] title [SEP] body [SEP]` (<= 288 wordpieces, openrealm.tokenization.corpus.block_retriever_inputs),
as Google's refresher and encode_blocks.py do.

Output layout (`layout="versioned"`, the default) -- one immutable folder per version, like Google's refresher, which
renames export/temp/<ts> to export/encoded/<ts> and keeps the newest 3:

    OUTPUT/v000003/block_index/       RealmBlockIndex.write_files: index_config.json (records version 3),
                                      block_emb.safetensors, faiss.index
    OUTPUT/v000003/build_info.json    provenance: corpus path + fingerprint, embedder, dtype, timings
    OUTPUT/.v000004.saving-HOST-PID-x/  a build in progress (hidden; renamed to v000004 when complete; removed by the
                                      next write of v000004 if its process died, see file_utils.clean_leftovers)

The rename of the version folder is the one atomic commit: readers take the highest complete `vNNNNNN`
(`latest_index_dir`), so there is no pointer file that could disagree with the folders after a crash, and a slow
builder finishing an older version never moves "latest" backwards. `layout="plain"` instead writes OUTPUT itself as a
RealmBlockIndex folder (atomically replaced); `--output CORPUS/block_index` then makes
`RealmRetriever.from_pretrained(CORPUS)` load it directly.

The embedding itself (sorted by length, sharded over processes, bf16 on CUDA) is trainers/embedding.py.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from openrealm import RealmBlockIndex, ShardedBlockIndex
from openrealm.file_utils import atomic_directory, fsync_directory, write_text_atomic, writer_lock
from openrealm.index_realm import (
    BUILD_INFO_NAME,
    INDEX_SUBDIR,
    VERSION_PATTERN,
    latest_index_dir,
    list_versions,
    resolve_index_params,
    save_block_emb_shard,
    shard_file_name,
    version_dir_name,
    version_names,
    weights_fingerprint,
    write_sharded_index,
)
from openrealm.tokenization.corpus_folder import load_corpus, read_corpus_config, read_removed_block_ids
from openrealm.trainers.embedding import arrow_table, embed_corpus, gather_shards, resolve_dtype
from openrealm.trainers.options import MAX_BLOCK_LENGTH
from openrealm.trainers.towers import check_corpus_ids, fit_length, load_block_tower

if TYPE_CHECKING:
    from accelerate import PartialState


# ---------------------------------------------------------------------------------------------------------------------
# Inputs: the corpus and the embedder
# ---------------------------------------------------------------------------------------------------------------------


def corpus_fingerprint(blocks) -> str:
    """sha256 over the blocks' uids in block order: identifies the corpus content and the row order of an index."""
    digest = hashlib.sha256()
    for chunk in arrow_table(blocks).column("uid").chunks:
        digest.update("".join(f"{uid}\n" for uid in chunk.to_pylist()).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------------
# Versioned output
# ---------------------------------------------------------------------------------------------------------------------


def is_index_output(path: str | os.PathLike) -> bool:
    """Whether path is what `openrealm index build` writes: an index folder (index_config.json) or an index root of
    versions."""
    return (Path(path) / "index_config.json").is_file() or bool(list_versions(path))


def beside_versions(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path` lies inside the index root `root` but outside its version folders (vNNNNNN), which are all a
    versioned build writes or prunes: e.g. the embedder snapshot ROOT/.snapshots/step-N that a pre-training refresh
    builds the next version from (compared as real paths)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    if not path.startswith(root.rstrip(os.sep) + os.sep):
        return False
    return VERSION_PATTERN.match(os.path.relpath(path, root).split(os.sep)[0]) is None


def next_version(root: str | os.PathLike) -> int:
    """The version a new build under root takes by default: one past every version-like name there (0 for none), so
    that it is the newest and never collides with a folder already there."""
    return max(version_names(Path(root)), default=-1) + 1


def load_index(
    root: str | os.PathLike,
    version: int | None = None,
    device: str | torch.device | None = None,
    sharded: bool = False,
):
    """The RealmBlockIndex of `version` (default: the newest) under an index root written by build_index; sharded:
    this process's ShardedBlockIndex of it instead (its rows only, for a run with --shard-index)."""
    path = latest_index_dir(root) if version is None else Path(root) / version_dir_name(version) / INDEX_SUBDIR
    if sharded:
        return ShardedBlockIndex.from_pretrained(path, device=device)
    return RealmBlockIndex.from_pretrained(path, device=device)


def _read_index_config(index_dir: Path) -> dict | None:
    path = index_dir / "index_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _previous_index(output_dir: Path, layout: str) -> tuple[Path, dict] | None:
    """(folder, index_config) of the index a new build would follow, if any."""
    if layout == "plain":
        config = _read_index_config(output_dir)
        return (output_dir, config) if config else None
    versions = list_versions(output_dir)
    if not versions:
        return None
    index_dir = output_dir / version_dir_name(versions[-1]) / INDEX_SUBDIR
    config = _read_index_config(index_dir)
    return (index_dir, config) if config else None


def _write_version(
    write_files: Callable[[Path], None], version: int, output_dir: Path, build_info: dict, keep: int | None
) -> Path:
    """output_dir/vNNNNNN/{block_index/, build_info.json}, committed by one rename; then prune to the newest keep
    versions, never the one written (an explicit version may be older than the newest).
    write_files(folder) writes the index's files into block_index/ being staged."""
    name = version_dir_name(version)
    target = output_dir / name
    if target.exists():
        raise FileExistsError(f"index version {target} already exists; versions are immutable, pick a new --version")
    with atomic_directory(target) as staging:  # refuses a version that appears meanwhile
        (Path(staging) / INDEX_SUBDIR).mkdir()
        write_files(Path(staging) / INDEX_SUBDIR)
        write_text_atomic(Path(staging) / BUILD_INFO_NAME, json.dumps(build_info, indent=2, sort_keys=True) + "\n")
    fsync_directory(output_dir)
    if keep:
        for old in list_versions(output_dir)[:-keep]:
            if old != version:  # the version written is kept even when it is not among the newest
                shutil.rmtree(output_dir / version_dir_name(old), ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------------------------------
# The whole job
# ---------------------------------------------------------------------------------------------------------------------


def _default_versions_take_turns(build: Callable[..., RealmBlockIndex]) -> Callable[..., RealmBlockIndex]:
    """build_index holding the index root's writer lock (file_utils.writer_lock) for a single-process versioned build
    of the default version: builds started together on one root then take turns, each one past the version the
    previous one wrote, instead of choosing the same version and the later one failing as it commits. A build of an
    explicit version (the pre-training refresh's) takes no lock: a version that exists is refused. The processes of
    a multi-process build each choose the default version as before."""

    @functools.wraps(build)
    def locked(embedder, corpus_dir, output_dir, **kwargs) -> RealmBlockIndex:
        accelerator = kwargs.get("accelerator")
        if (
            kwargs.get("version") is not None
            or kwargs.get("layout", "versioned") != "versioned"
            or (accelerator is not None and accelerator.num_processes > 1)
        ):
            return build(embedder, corpus_dir, output_dir, **kwargs)
        with writer_lock(Path(output_dir).absolute()):
            return build(embedder, corpus_dir, output_dir, **kwargs)

    return locked


@_default_versions_take_turns
def build_index(
    embedder: torch.nn.Module | str | os.PathLike,
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    index_type: str = "exact",
    index_params: dict | None = None,
    version: int | None = None,
    layout: str = "versioned",
    keep: int | None = None,
    accelerator=None,
    batch_size: int = 128,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "auto",
    max_length: int = MAX_BLOCK_LENGTH,
    sort_by_length: bool = True,
    num_workers: int = 0,
    progress: bool = True,
    num_shards: int = 1,
):
    """Embed every block of corpus_dir and write the index; returns the RealmBlockIndex (on every process).

    embedder: a RealmEmbedder (e.g. the training model's; left in its mode) or a checkpoint name for
    load_block_tower (of an open-QA model, its document tower).
    version: default = one past the highest version under output_dir (0 for the first). layout 'versioned' writes
    output_dir/vNNNNNN/ and then keeps the newest `keep` versions and the one written (None: all; folders holding no
    index are neither versions nor removed); 'plain' writes output_dir itself.
    accelerator: an accelerate Accelerator or PartialState; every process embeds its share, the main process joins the
    shares in block order and writes, the others wait for it and load the written index (memory-mapped).
    num_shards > 1: an exact index written as that many files (ShardedBlockIndex.shard_range rows each), for a
    pre-training run with --shard-index. Under accelerate num_shards must equal the number of processes: each embeds
    and writes its own shard, nothing is gathered, and each gets its ShardedBlockIndex. In one process the shards are
    embedded and written one after the other (1/num_shards of the embeddings in memory at a time); it returns
    shard 0's ShardedBlockIndex. Sharded indexes use the versioned layout.
    """
    from transformers import AutoTokenizer

    if layout not in ("versioned", "plain"):
        raise ValueError(f"layout must be 'versioned' or 'plain', got {layout!r}")
    if version is not None and version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 (versions kept; None keeps all), got {keep}")
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    is_main = accelerator is None or accelerator.is_main_process
    check_num_shards(num_shards, world, index_type, layout)
    corpus_dir, output_dir = Path(corpus_dir), Path(output_dir).absolute()
    blocks = load_corpus(corpus_dir)
    embedder_name = os.fspath(embedder) if isinstance(embedder, (str, os.PathLike)) else _model_name(embedder)
    if isinstance(embedder, (str, os.PathLike)):
        embedder = load_block_tower(embedder)
    check_corpus_ids(blocks, embedder, corpus_dir, f"the embedder {embedder_name}")
    previous = _previous_index(output_dir, layout)
    dim = embedder.config.retriever_proj_size
    if previous is not None and previous[1].get("dim") != dim:
        raise ValueError(
            f"the embedder {embedder_name} makes {dim}-d embeddings but the existing index {previous[0]} is "
            f"{previous[1].get('dim')}-d: a retriever cannot swap between them; write to a new --output folder"
        )
    resolve_index_params(index_type, len(blocks), dim, index_params or {})  # refused now, not after embedding
    if version is None and layout == "versioned":
        version = next_version(output_dir)
    elif version is None:
        version = previous[1]["version"] + 1 if previous is not None else 0
    if device is None:
        device = accelerator.device if accelerator is not None else next(embedder.parameters()).device
    tokenizer = AutoTokenizer.from_pretrained(corpus_dir)

    def embed(shard: tuple[int, int]) -> torch.Tensor:
        return embed_corpus(
            embedder,
            blocks,
            tokenizer,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            max_length=max_length,
            shard=shard,
            sort_by_length=sort_by_length,
            num_workers=num_workers,
            progress=progress and is_main,
        )

    started = time.perf_counter()
    index_dir = output_dir if layout == "plain" else output_dir / version_dir_name(version) / INDEX_SUBDIR
    info = _build_info(index_type, version, len(blocks), dim, corpus_dir, blocks, embedder, embedder_name, device)
    info.update(dtype=str(resolve_dtype(dtype, torch.device(device))).removeprefix("torch."), max_length=max_length)
    info.update(world_size=world, num_shards=num_shards)
    removed_ids = torch.from_numpy(read_removed_block_ids(corpus_dir))  # never retrieved (corpus remove)
    if num_shards > 1:
        scratch = output_dir / f".{version_dir_name(version)}.shards"  # each rank's file, until the version commits
        scratch.mkdir(parents=True, exist_ok=True)
        for shard in [rank] if world > 1 else range(num_shards):
            path = scratch / shard_file_name(shard, num_shards)
            save_block_emb_shard(path.with_suffix(".tmp"), embed((shard, num_shards)))
            os.replace(path.with_suffix(".tmp"), path)
        if world > 1:
            accelerator.wait_for_everyone()
        if is_main:
            seconds = time.perf_counter() - started
            info.update(embed_seconds=round(seconds, 3), blocks_per_second=round(len(blocks) / seconds, 2))
            files = [scratch / shard_file_name(shard, num_shards) for shard in range(num_shards)]

            def write_files(folder: Path) -> None:
                write_sharded_index(
                    folder, files, len(blocks), version=version, metadata=info, removed_ids=removed_ids,
                    embedder=embedder,
                )  # fmt: skip

            try:
                _write_version(write_files, version, output_dir, info, keep)
            finally:  # committed (the files moved in) or failed (a rebuild of the version writes them again)
                shutil.rmtree(scratch, ignore_errors=True)
        if world > 1:
            accelerator.wait_for_everyone()
        if world == 1:
            return ShardedBlockIndex.from_pretrained(index_dir, shard=(0, num_shards))
        return ShardedBlockIndex.from_pretrained(index_dir, device=device)

    block_emb = gather_shards(embed((rank, world)), len(blocks), accelerator)
    seconds = time.perf_counter() - started
    index = None
    if is_main:
        index = RealmBlockIndex.build(block_emb, index_type=index_type, version=version, **(index_params or {}))
        index.embedder = embedder  # saved as block_index/embedder/: blocks added later are embedded alike
        index.removed_ids = removed_ids
        info.update(embed_seconds=round(seconds, 3), blocks_per_second=round(len(blocks) / seconds, 2))
        index.metadata.update(info)  # provenance travels inside index_config.json, whatever the layout
        if layout == "plain":
            index.save_pretrained(output_dir)
        else:
            _write_version(index.write_files, version, output_dir, info, keep)
    if accelerator is not None and world > 1:
        accelerator.wait_for_everyone()
    return index if index is not None else RealmBlockIndex.from_pretrained(index_dir)


def check_num_shards(num_shards: int, world: int, index_type: str, layout: str) -> None:
    """Refuse a sharded build that cannot be written: not exact, plain layout, or not one shard per process."""
    if num_shards == 1:
        return
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    if index_type != "exact":
        raise ValueError(f"a sharded index searches exactly: use index type 'exact', not '{index_type}'")
    if layout != "versioned":
        raise ValueError("a sharded index is written in the versioned layout (OUTPUT/vNNNNNN/), not 'plain'")
    if world > 1 and num_shards != world:
        raise ValueError(f"{world} processes write {world} shards (one each), not num_shards={num_shards}")


def _model_name(model: torch.nn.Module) -> str:
    return getattr(model.config, "_name_or_path", "") or type(model).__name__


def _build_info(index_type, version, num_blocks, dim, corpus_dir, blocks, embedder, embedder_name, device) -> dict:
    """build_info.json (also the index's metadata): what was embedded, by what, where, when."""
    import openrealm

    corpus_config = read_corpus_config(corpus_dir)
    return {
        "format": "openrealm.index_build",
        "format_version": 1,
        "version": version,
        "index_type": index_type,
        "num_blocks": num_blocks,
        "dim": dim,
        "corpus": str(Path(corpus_dir).absolute()),
        "corpus_fingerprint": corpus_fingerprint(blocks),
        "corpus_build_id": corpus_config.get("build_id"),
        "corpus_version": corpus_config.get("version", 0),
        "corpus_tokenizer": corpus_config.get("tokenizer"),
        "embedder": embedder_name,
        "embedder_class": type(embedder).__name__,
        "embedder_fingerprint": weights_fingerprint(embedder),
        "device": str(device),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "openrealm_version": openrealm.__version__,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def process_state(device: str | None) -> tuple[PartialState, torch.device]:
    """accelerate's PartialState of this process and the device to embed on."""
    from accelerate import PartialState

    # PartialState sets up a multi-process CPU run (gloo) only when told cpu=True; a CUDA-less multi-process launch
    # (`accelerate launch --multi_gpu --num_processes 2` or torchrun on a CPU machine) is one.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = device == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    state = PartialState(cpu=cpu or (world_size > 1 and not torch.cuda.is_available()))
    return state, torch.device(device) if device else state.device


def build_from_args(
    args: argparse.Namespace,
    state: PartialState,
    device: torch.device,
    embedder: str,
    version: int | None,
    layout: str = "versioned",
    keep: int | None = None,
) -> RealmBlockIndex:
    """What `openrealm index build` and each build of the served builder do once the process is set up."""
    num_workers = args.num_workers if args.num_workers is not None else (2 if device.type == "cuda" else 0)
    model = load_block_tower(embedder)
    name = f"--embedder {embedder}"
    max_length = fit_length(model, args.max_length or MAX_BLOCK_LENGTH, name, "--max-length", bool(args.max_length))
    return build_index(
        model,
        args.corpus,
        args.output,
        index_type=args.index_type,
        index_params=dict(args.index_param),
        version=version,
        layout=layout,
        keep=keep,
        accelerator=state,
        batch_size=args.batch_size,
        device=device,
        dtype=args.dtype,
        max_length=max_length,
        sort_by_length=not args.no_sort,
        num_workers=num_workers,
        progress=not args.quiet,
        num_shards=args.num_shards,
    )


# How often a builder started with --parent-pid checks that its parent still runs.
PARENT_POLL_SECONDS = 0.2


def exit_with_parent(parent: int, poll_seconds: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """Exit this process (code 3, nothing more written) once `parent`, the pid of the process that started it, is gone.

    A dead parent's children are re-parented at once, even while it is an unreaped zombie, so our parent pid differing
    from `parent` is the signal (also when the parent died before this was called); a thread polls it. (prctl's
    PR_SET_PDEATHSIG would not do: it fires when the parent *thread* that started this process ends, and the refresh
    callback starts builders from a short-lived thread.)"""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        print(f"index builder: parent process {parent} is gone; exiting without writing", file=sys.stderr)
        os._exit(3)

    watcher = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    watcher.start()
    return watcher


__all__ = [
    "build_from_args",
    "build_index",
    "check_num_shards",
    "exit_with_parent",
    "is_index_output",
    "latest_index_dir",
    "list_versions",
    "load_index",
    "next_version",
    "process_state",
    "version_dir_name",
]
