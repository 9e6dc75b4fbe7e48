"""Embed every block of a knowledge corpus and write a versioned MIPS index: `openrealm index build`.

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

Departures from Google's encoder (same embeddings, faster): blocks are sorted by length and each batch is padded to its
longest block instead of to 288 (padding is masked, so a row's embedding does not depend on its batch), and bf16/fp16
autocast is used where the device supports it (default on CUDA; float32 on CPU).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from openrealm import RealmBlockIndex, ShardedBlockIndex
from openrealm.file_utils import atomic_directory, check_apart, write_text_atomic, writer_lock
from openrealm.index_realm import (
    resolve_index_params,
    save_block_emb_shard,
    shard_file_name,
    write_sharded_index,
)
from openrealm.retrieval_realm import BLOCK_INDEX_DIR
from openrealm.tokenization.corpus import (
    batch_retriever_inputs,
    load_corpus,
    read_corpus_config,
    read_removed_block_ids,
)
from openrealm.trainers.options import DTYPE_NAMES, MAX_BLOCK_LENGTH, index_build
from openrealm.trainers.towers import check_corpus_ids, fit_length, load_embedder

if TYPE_CHECKING:
    from accelerate import PartialState

INDEX_SUBDIR = "block_index"
BUILD_INFO_NAME = "build_info.json"
VERSION_PATTERN = re.compile(r"^v(\d{6,})$")
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
GATHER_CHUNK_ROWS = 2**18  # rows all-gathered at a time: peak extra memory world_size * 2^18 * dim floats


# ---------------------------------------------------------------------------------------------------------------------
# Inputs: the corpus and the embedder
# ---------------------------------------------------------------------------------------------------------------------


def corpus_fingerprint(blocks) -> str:
    """sha256 over the blocks' uids in block order: identifies the corpus content and the row order of an index."""
    digest = hashlib.sha256()
    for chunk in _arrow_table(blocks).column("uid").chunks:
        digest.update("".join(f"{uid}\n" for uid in chunk.to_pylist()).encode())
    return digest.hexdigest()


def _arrow_table(blocks):
    """The pyarrow table behind a blocks dataset (row i = block i), or blocks itself if it is a pyarrow table."""
    if hasattr(blocks, "_indices") and blocks._indices is not None:  # a select()/shuffle() view: rows != block ids
        raise ValueError("pass the corpus blocks dataset itself (corpus.load_corpus), not a select()/shuffle() view")
    return blocks.data.table if hasattr(blocks, "data") else blocks


# ---------------------------------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------------------------------


def shard_range(num_blocks: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous share [start, stop) of block ids for rank; share sizes differ by at most one."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return ShardedBlockIndex.shard_range(num_blocks, rank, world_size)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA (float16 where bf16 is unsupported), float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}, expected auto or one of {sorted(DTYPES)}")
    if DTYPES[dtype] == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{device} does not support bfloat16; use --dtype float16")
    return DTYPES[dtype]


def block_lengths(blocks, max_length: int = MAX_BLOCK_LENGTH) -> np.ndarray:
    """Retriever input length of every block [N]: min(max_length, 3 + len(title_ids) + len(token_ids))."""
    import pyarrow.compute as pc

    table = _arrow_table(blocks)
    title = pc.list_value_length(table.column("title_ids")).to_numpy(zero_copy_only=False)
    body = pc.list_value_length(table.column("token_ids")).to_numpy(zero_copy_only=False)
    return np.minimum(max_length, 3 + title.astype(np.int64) + body)


def length_batches(lengths: np.ndarray, batch_size: int, sort_by_length: bool = True) -> list[np.ndarray]:
    """Positions 0..len(lengths)-1 cut into batches; sorted longest first (an out-of-memory shows on the first batch,
    and each batch pads only to blocks of about its own length)."""
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(len(lengths))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class _BlockBatches(torch.utils.data.Dataset):
    """Batch i -> (positions [B] in the shard, padded inputs [B, L] with L = the batch's longest block)."""

    def __init__(self, table, batches: Sequence[np.ndarray], first_id: int, tokenizer, max_length: int):
        self.table, self.batches, self.first_id = table.select(["title_ids", "token_ids"]), batches, first_id
        self.tokenizer, self.max_length = tokenizer, max_length

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        positions = self.batches[i]
        rows = self.table.take(positions + self.first_id).to_pydict()
        return torch.from_numpy(positions), batch_retriever_inputs(rows, self.tokenizer, self.max_length)


@contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """eval() for the duration (no dropout), then the caller's mode back (the trainer's embedder is in train mode)."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def embed_blocks(
    embedder: torch.nn.Module,
    blocks,
    tokenizer,
    *,
    batch_size: int = 128,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "auto",
    max_length: int = MAX_BLOCK_LENGTH,
    shard: tuple[int, int] = (0, 1),
    sort_by_length: bool = True,
    num_workers: int = 0,
    progress: bool = True,
) -> torch.Tensor:
    """Embed the blocks of one shard -> float32 CPU tensor [N_shard, P], row i = block shard_start + i.

    blocks: the corpus `blocks` dataset (openrealm.tokenization.corpus.load_corpus) or its pyarrow table; tokenizer:
    the corpus tokenizer (its [CLS]/[SEP]/[PAD] ids); shard = (rank, world_size) takes the contiguous share
    shard_range(len(blocks), rank, world_size). The embedder is moved to device (default: where it is) and run in eval
    mode under inference_mode, with autocast to dtype unless float32 ('auto': bf16 on CUDA, float32 elsewhere).
    """
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else next(embedder.parameters()).device
    compute_dtype = resolve_dtype(dtype, device)
    start, stop = shard_range(len(_arrow_table(blocks)), *shard)
    dim = embedder.config.retriever_proj_size
    out = torch.empty(stop - start, dim, dtype=torch.float32)
    if stop == start:
        return out
    table = _arrow_table(blocks)
    lengths = block_lengths(table.slice(start, stop - start), max_length)
    _check_embedder_fits(embedder, int(lengths.max()), max_length)
    batches = length_batches(lengths, batch_size, sort_by_length)
    loader = torch.utils.data.DataLoader(
        _BlockBatches(table, batches, start, tokenizer, max_length),
        batch_size=None,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    autocast = torch.autocast(device.type, dtype=compute_dtype) if compute_dtype != torch.float32 else nullcontext()
    embedder.to(device)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    name = "embedding" if shard[1] == 1 else f"embedding shard {shard[0] + 1}/{shard[1]}"
    bar = tqdm(total=stop - start, unit="block", desc=name, disable=not progress)
    with _eval_mode(embedder), torch.inference_mode(), autocast:
        for positions, inputs in loader:
            inputs = {key: value.to(device, non_blocking=True) for key, value in inputs.items()}
            pending.append((positions, embedder(**inputs).projected_score))
            if len(pending) == 32:  # one device->host sync per 32 batches keeps the GPU queue full
                _flush(pending, out)
            bar.update(len(positions))
    _flush(pending, out)
    bar.close()
    return out


def _flush(pending: list[tuple[torch.Tensor, torch.Tensor]], out: torch.Tensor) -> None:
    if pending:
        out[torch.cat([p for p, _ in pending])] = torch.cat([e for _, e in pending]).to("cpu", torch.float32)
        pending.clear()


def _check_embedder_fits(embedder: torch.nn.Module, longest: int, max_length: int) -> None:
    """The longest block input (at most max_length) fits the embedder's positions (else it would fail mid-run)."""
    config = embedder.config
    if longest > config.max_position_embeddings:
        raise ValueError(
            f"blocks of {longest} wordpieces (max_length={max_length}) exceed the embedder's max_position_embeddings="
            f"{config.max_position_embeddings} ({getattr(config, '_name_or_path', '') or 'embedder'}): pass "
            f"--max-length {config.max_position_embeddings} (max_length=) to cut them"
        )


# How often a builder started with --parent-pid checks that its parent still runs.
PARENT_POLL_SECONDS = 0.2
# Seconds every rank sleeps (GIL released) before leaving the process group; see leave_process_group.
GLOO_DRAIN_SECONDS = 0.5


def leave_process_group(state: PartialState) -> None:
    """Every rank waits for the others, then leaves the process group without hanging or aborting.

    Two torch/gloo hazards at the end of a multi-process run. A rank that exits with gloo's threads still up aborts
    ("terminate called without an active exception"), so every rank destroys the group. And gloo's worker threads
    free a finished collective's work *after* the caller has returned from it; that drops Python tensors, which
    needs the GIL. When the last reference to the group goes (the DDP wrapper's Reducer as `run` returns, or the
    group itself), it joins those threads while holding the GIL: a worker still waiting for the GIL deadlocks the
    rank (1 two-process ICT run in 10-40 on 2 busy cores; py-spy: main thread in ~ProcessGroupGloo ->
    thread::join, worker in ~AsyncBarrierWork -> gil_scoped_acquire). Sleeping releases the GIL so the workers
    finish first; no collective follows, so they stay idle until joined. state: a PartialState or AcceleratorState.
    """
    state.wait_for_everyone()
    if state.num_processes > 1:
        time.sleep(GLOO_DRAIN_SECONDS)
    state.destroy_process_group()


def gather_shards(local: torch.Tensor, num_blocks: int, state=None) -> torch.Tensor | None:
    """Join every rank's embed_blocks output [N_shard, P] into [num_blocks, P] in block order (on the main process;
    None elsewhere). state: an accelerate Accelerator/PartialState, or None for a single process. The shares are
    all-gathered GATHER_CHUNK_ROWS rows at a time, padded to the same size (collectives need equal shapes)."""
    if state is None or state.num_processes == 1:
        return local
    from accelerate.utils import gather

    world = state.num_processes
    ranges = [shard_range(num_blocks, rank, world) for rank in range(world)]
    largest = max(stop - start for start, stop in ranges)
    out = torch.empty(num_blocks, local.shape[1], dtype=torch.float32) if state.is_main_process else None
    for offset in range(0, largest, GATHER_CHUNK_ROWS):
        rows = min(GATHER_CHUNK_ROWS, largest - offset)
        piece = torch.zeros(rows, local.shape[1], dtype=torch.float32, device=state.device)
        mine = local[offset : offset + rows]
        piece[: len(mine)] = mine.to(state.device)
        gathered = gather(piece)  # [world * rows, P], rank-major
        if out is not None:
            gathered = gathered.to("cpu").view(world, rows, -1)
            for rank, (start, stop) in enumerate(ranges):
                count = max(0, min(rows, stop - start - offset))
                out[start + offset : start + offset + count] = gathered[rank, :count]
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Versioned output
# ---------------------------------------------------------------------------------------------------------------------


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def _version_names(root: Path) -> dict[int, Path]:
    """{version: folder} of every entry under root named like a version (vNNNNNN), index or not."""
    if not root.is_dir():
        return {}
    return {int(m.group(1)): p for p in root.iterdir() if (m := VERSION_PATTERN.match(p.name))}


def is_index_version(folder: str | os.PathLike) -> bool:
    """Whether folder is a complete index version as _write_version commits it: build_info.json and
    block_index/index_config.json (a user's folder that merely has a version-like name is not one)."""
    folder = Path(folder)
    return (folder / BUILD_INFO_NAME).is_file() and (folder / INDEX_SUBDIR / "index_config.json").is_file()


def beside_versions(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path` lies inside the index root `root` but outside its version folders (vNNNNNN), which are all a
    versioned build writes or prunes: e.g. the embedder snapshot ROOT/.snapshots/step-N that a pre-training refresh
    builds the next version from (compared as real paths)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    if not path.startswith(root.rstrip(os.sep) + os.sep):
        return False
    return VERSION_PATTERN.match(os.path.relpath(path, root).split(os.sep)[0]) is None


def list_versions(root: str | os.PathLike) -> list[int]:
    """Complete versions under an index root, ascending (builds in progress are hidden temp folders; other folders
    with a version-like name are not versions: they are never loaded nor pruned)."""
    return sorted(v for v, folder in _version_names(Path(root)).items() if is_index_version(folder))


def next_version(root: str | os.PathLike) -> int:
    """The version a new build under root takes by default: one past every version-like name there (0 for none), so
    that it is the newest and never collides with a folder already there."""
    return max(_version_names(Path(root)), default=-1) + 1


def latest_index_dir(root: str | os.PathLike) -> Path:
    """The block_index/ folder of the newest complete version under root (load with RealmBlockIndex.from_pretrained)."""
    versions = list_versions(root)
    if not versions:
        raise FileNotFoundError(f"{root} holds no index version (expected {root}/v000000/{INDEX_SUBDIR}, ...)")
    return Path(root) / version_dir_name(versions[-1]) / INDEX_SUBDIR


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
        _write_json(Path(staging) / BUILD_INFO_NAME, build_info)
    _fsync_dir(output_dir)
    if keep:
        for old in list_versions(output_dir)[:-keep]:
            if old != version:  # the version written is kept even when it is not among the newest
                shutil.rmtree(output_dir / version_dir_name(old), ignore_errors=True)
    return target


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on every platform; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    embedder: a RealmEmbedder (e.g. the training model's; left in its mode) or a checkpoint name for load_embedder.
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
    _check_num_shards(num_shards, world, index_type, layout)
    corpus_dir, output_dir = Path(corpus_dir), Path(output_dir).absolute()
    blocks = load_corpus(corpus_dir)
    embedder_name = os.fspath(embedder) if isinstance(embedder, (str, os.PathLike)) else _model_name(embedder)
    if isinstance(embedder, (str, os.PathLike)):
        embedder = load_embedder(embedder)
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
        return embed_blocks(
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


def _check_num_shards(num_shards: int, world: int, index_type: str, layout: str) -> None:
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
        "corpus_tokenizer": corpus_config.get("tokenizer"),
        "embedder": embedder_name,
        "embedder_class": type(embedder).__name__,
        "device": str(device),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "openrealm_version": openrealm.__version__,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


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


def _process_state(device: str | None) -> tuple[PartialState, torch.device]:
    """accelerate's PartialState of this process and the device to embed on."""
    from accelerate import PartialState

    # PartialState sets up a multi-process CPU run (gloo) only when told cpu=True; a CUDA-less multi-process launch
    # (`accelerate launch --multi_gpu --num_processes 2` or torchrun on a CPU machine) is one.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = device == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    state = PartialState(cpu=cpu or (world_size > 1 and not torch.cuda.is_available()))
    return state, torch.device(device) if device else state.device


def _build_from_args(
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
    model = load_embedder(embedder)
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


def run(args: argparse.Namespace) -> int:
    """`openrealm index build`: embed the corpus and write the index (under accelerate launch, sharded)."""
    if getattr(args, "parent_pid", None) is not None:
        exit_with_parent(args.parent_pid)
    state, device = _process_state(args.device)
    try:  # before the embedder loads: a refused combination costs nothing
        _check_num_shards(args.num_shards, state.num_processes, args.index_type, args.layout)
    except ValueError as error:
        raise ValueError(f"--num-shards {args.num_shards}: {error}") from None
    # The one output inside an input: a plain index at CORPUS/block_index, where RealmRetriever.from_pretrained(CORPUS)
    # finds it (docs/corpus.md). Writing it changes the corpus folder: the build holds the corpus's writer lock, so
    # that a `corpus add` waits for it, or it for the add, instead of one replacing the other's blocks or index.
    own_index = args.layout == "plain" and os.path.realpath(args.output) == os.path.realpath(
        Path(args.corpus, BLOCK_INDEX_DIR)
    )
    inputs = [None if own_index else ("--corpus", args.corpus), ("--embedder", args.embedder)]
    if args.layout == "versioned":  # writes (and prunes) OUTPUT/vNNNNNN only: what lies beside them is left alone
        inputs = [item for item in inputs if item is None or not beside_versions(item[1], args.output)]
    check_apart(args.output, inputs, "--output")
    with writer_lock(args.corpus) if own_index and state.is_main_process else nullcontext():
        index = _build_from_args(args, state, device, args.embedder, args.version, args.layout, args.keep)
    if state.is_main_process:
        where = Path(args.output).absolute()
        if args.layout == "versioned":
            newest, where = latest_index_dir(where).parent, where / version_dir_name(index.version)
        line = f"Wrote {index.index_type} index version {index.version} of {index.num_blocks} x {index.dim} to {where}"
        if args.layout == "versioned" and newest != where:
            line += f" ({newest} is newer: loaders of the index root take that one)"
        print(line)
    leave_process_group(state)
    return 0


# The served builder: one long-lived process doing every asynchronous build of a pre-training run, as Google's
# refresher is one long-running job. A build per process paid the start-up (importing torch and transformers, about
# 8 s of CPU, and on a GPU a new CUDA context) for every refresh (benchmarks/RESULTS.md, issue 14).
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
    """`python -m openrealm.trainers.index_builder serve --corpus DIR --output ROOT [build options]`: build index
    versions, one per line of `requests` (default standard input; see `build_request`) until it ends.

    Each build writes ROOT/vNNNNNN as `openrealm index build` does, its output goes to SNAPSHOT/build.log and its exit
    status (0, or 1 with the traceback in the log) to SNAPSHOT/build_status.json once it has ended; a failed build
    does not stop the builder. With --parent-pid the process exits, writing nothing more, once that process is gone."""
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    state, device = _process_state(args.device)
    _check_num_shards(args.num_shards, state.num_processes, args.index_type, "versioned")
    for line in sys.stdin if requests is None else requests:
        if not line.strip():
            continue
        request = json.loads(line)
        snapshot = Path(request["embedder"])
        with _output_to(snapshot / BUILD_LOG_NAME):
            try:
                index = _build_from_args(args, state, device, str(snapshot), int(request["version"]))
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(
            prog="python -m openrealm.trainers.index_builder serve",
            description="Build index versions, one per line of standard input (the refresh's long-lived builder).",
        )
        index_build(parser, served=True)
        return serve(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(
        prog="openrealm index build", description="Embed every block of a knowledge corpus and write a MIPS index."
    )
    index_build(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
