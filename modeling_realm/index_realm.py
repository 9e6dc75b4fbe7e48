"""Maximum-inner-product search (MIPS) over REALM block embeddings.

`RealmBlockIndex` holds the block embeddings [num_blocks, dim] and answers top-k inner-product queries, either exactly
with torch (`index_type="exact"`, any torch device, chunked over blocks so memory stays O(Q * chunk_size)) or with a
FAISS index ("flat" exact, "ivf" / "hnsw" / "ivfpq" / "pq" approximate). Whatever finds the candidates, the returned
scores are always recomputed exactly from the embeddings, as Google's ORQA code does after ScaNN.

This file is also shipped as Hugging Face custom code, so it needs only torch, numpy and safetensors; faiss is optional
and only required by the faiss index types. Nothing is pickled: embeddings are stored as safetensors (and memory-mapped
on load), faiss indexes in faiss's own binary format.

The module is long because it is the whole index: exact and faiss search, sharding, saving and loading.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .block_records import MAX_SAFETENSORS_HEADER
from .file_utils import atomic_directory, file_mapping, link_or_copy

try:
    import faiss
except ImportError:  # exact search must keep working with only torch installed
    faiss = None

INDEX_TYPES = ("exact", "flat", "ivf", "hnsw", "ivfpq", "pq")
INDEX_CONFIG_NAME = "index_config.json"
BLOCK_EMB_NAME = "block_emb.safetensors"
FAISS_INDEX_NAME = "faiss.index"
REMOVED_IDS_NAME = "removed_ids.safetensors"  # blocks removed from the corpus: never returned by a search
EMBEDDER_DIR = "embedder"  # the RealmEmbedder that made block_emb: it embeds blocks added later (corpus add)
APPROXIMATE_TYPES = ("ivf", "hnsw", "ivfpq", "pq")
DEFAULT_MAX_DRIFT = 0.1  # an approximate index changed by more than 10% since it was trained says it needs a rebuild
FORMAT_VERSION = 1
_GPU_MAX_K = 2048  # faiss GPU indexes return at most 2048 neighbours per query
# Candidates per wanted result that exact search over float16 / bfloat16 embeddings re-scores in float32.
HALF_PRECISION_RERANK = 4
# An index root of versions (`openrealm index build`'s default layout): ROOT/vNNNNNN/{build_info.json, block_index/}.
VERSION_PATTERN = re.compile(r"^v(\d{6,})$")
INDEX_SUBDIR = "block_index"
BUILD_INFO_NAME = "build_info.json"
# Rows per tile in tiled exact search (tiled_top_k_candidates): the scan keeps each tile's best score.
TILE_ROWS = 256

# Parameters each index type accepts (all ints). None = filled in by resolve_index_params from the data size, except
# chunk_size, which stays unset and is picked per device at search time (default_chunk_size).
_PARAM_DEFAULTS = {
    "exact": {"chunk_size": None},
    "flat": {},
    "ivf": {"nlist": None, "nprobe": 32, "train_size": None, "rerank": 1, "seed": 0},
    "hnsw": {"m": 32, "ef_construction": 80, "ef_search": 64, "rerank": 1},
    "ivfpq": {"nlist": None, "nprobe": 32, "pq_m": None, "pq_bits": 8, "train_size": None, "rerank": 10, "seed": 0},
    "pq": {"pq_m": None, "pq_bits": 8, "train_size": None, "rerank": 10, "seed": 0},
}
# faiss class each type must load as, so a config/index mix-up is caught at load time.
_FAISS_CLASSES = {
    "flat": "IndexFlat",
    "ivf": "IndexIVFFlat",
    "hnsw": "IndexHNSW",
    "ivfpq": "IndexIVFPQ",
    "pq": "IndexPQ",
}
# safetensors dtype -> (numpy dtype to memory-map, torch dtype to view it as); numpy has no bfloat16.
_ST_DTYPES = {
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.int16, torch.bfloat16),
}


def _require_faiss(index_type: str) -> None:
    if faiss is None:
        raise ImportError(f"index type '{index_type}' needs faiss: pip install faiss-cpu (or faiss-gpu)")


def default_chunk_size(device: torch.device, num_queries: int = 64) -> int:
    """Blocks scored per matmul in exact search. On CPU the [num_queries, chunk] float32 scores fill 4 MB, within
    [2^16, 2^17] rows: bigger chunks spill the scores out of cache before top-k reads them, smaller ones pay more
    per-chunk top-k merges (the sweep:
    benchmarks/performance.md#exact-search-at-13353718-blocks-the-chunk-size-against-the-port-issue-17-3-cpu).
    On GPU 2^20 rows amortise kernel launches. Memory: num_queries * chunk floats."""
    if device.type != "cpu":
        return 2**20
    rows = 2**20 // max(1, num_queries)
    return min(2**17, max(2**16, 1 << (rows.bit_length() - 1)))


def top_k_lowest_ids_first(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The min(k, N) best of scores [Q, N] -> (scores [Q, k'], column ids [Q, k']), ordered by score, then id: among
    equal scores the lowest id comes first and is the one kept at the cut. torch.topk orders ties as its kernel
    happens to, which differs with the shape, the device and the machine."""
    num_kept = min(k, scores.shape[1])
    top_scores, top_ids = scores.topk(min(num_kept + 1, scores.shape[1]), dim=1)
    if top_scores.shape[1] > num_kept:  # a score equal to the last kept one beyond the cut: choose the lowest ids
        tied_rows = (top_scores[:, num_kept - 1] == top_scores[:, num_kept]).nonzero().flatten().tolist()
        top_scores, top_ids = top_scores[:, :num_kept].contiguous(), top_ids[:, :num_kept].contiguous()
        for row in tied_rows:
            last = top_scores[row, -1]
            above = (scores[row] > last).nonzero().flatten()
            at = (scores[row] == last).nonzero().flatten()[: num_kept - above.numel()]  # ascending ids
            top_ids[row] = torch.cat([above, at])
            top_scores[row] = scores[row, top_ids[row]]
    by_id = top_ids.argsort(dim=1)
    top_scores, top_ids = top_scores.gather(1, by_id), top_ids.gather(1, by_id)
    order = top_scores.argsort(dim=1, descending=True, stable=True)
    return top_scores.gather(1, order), top_ids.gather(1, order)


def torch_exact_search(
    block_emb: torch.Tensor,
    query_emb: torch.Tensor,
    k: int,
    chunk_size: int | None = None,
    excluded: torch.Tensor | None = None,
    tiled: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k inner products. block_emb [N, D], query_emb [Q, D] -> (scores [Q, k] float32, ids [Q, k] int64).

    Runs on block_emb's device and returns on query_emb's device. Blocks are scored chunk_size rows at a time and the
    per-chunk top-k merged, so the [Q, N] score matrix (Q=64, N=13M: 3.4 GB) is never materialised. `excluded`: sorted
    row ids [R] never returned (removed blocks); k must not exceed the N - R others. Equal scores (duplicate blocks)
    go to the lowest id, at the cut too, so the result does not depend on the chunk size, the sharding or the kernel
    torch.topk uses for ties.

    float16 / bfloat16 block_emb (half the bytes to read): the scan scores in that precision, whose rounding (8 bits of
    mantissa in bf16) would reorder close blocks, so it keeps HALF_PRECISION_RERANK * k candidates and re-scores them
    in float32 (float32 query . stored row): the returned scores and order are those of the stored vectors.

    `tiled` (default: on any device but the CPU) selects without a per-chunk top-k: tiled_top_k_candidates keeps
    each tile's best score, then scores again only the rows of the best tiles. Same result; no host synchronisation
    in the scan, and the [Q, chunk] scores are read once by a reduction instead of by a radix select.
    """
    num_blocks = block_emb.shape[0]
    num_excluded = 0 if excluded is None else excluded.numel()
    if not 1 <= k <= num_blocks - num_excluded:
        raise ValueError(f"k must be in [1, {num_blocks - num_excluded} searchable blocks], got k={k}")
    if num_excluded:
        excluded = excluded.to(block_emb.device)
    half = block_emb.dtype in (torch.float16, torch.bfloat16)
    num_fetch = min(k * HALF_PRECISION_RERANK, num_blocks - num_excluded) if half else k
    chunk_size = chunk_size or default_chunk_size(block_emb.device, query_emb.shape[0])
    q = query_emb.detach().to(block_emb.device, block_emb.dtype)
    if tiled is None:
        tiled = block_emb.device.type != "cpu"
    if tiled:
        with torch.no_grad():
            best_scores, best_ids = tiled_top_k_candidates(block_emb, q, num_fetch, chunk_size, excluded)
            if half:
                query = query_emb.detach().to(block_emb.device)
                best_scores, best_ids = rescore_float32(block_emb, query, best_ids, k)
        return best_scores.to(query_emb.device), best_ids.to(query_emb.device)
    # One reusable score buffer: allocating (and page-faulting) a fresh one per chunk costs more than the top-k.
    buffer = torch.empty(q.shape[0] * min(chunk_size, num_blocks), dtype=block_emb.dtype, device=block_emb.device)
    best_scores = best_ids = None
    with torch.no_grad():
        for start in range(0, num_blocks, chunk_size):
            chunk = block_emb[start : start + chunk_size]
            scores = torch.mm(q, chunk.T, out=buffer[: q.shape[0] * chunk.shape[0]].view(q.shape[0], chunk.shape[0]))
            if num_excluded:
                lo, hi = torch.searchsorted(
                    excluded, torch.tensor([start, start + chunk.shape[0]], device=excluded.device)
                )
                scores[:, excluded[lo:hi] - start] = float("-inf")
            if half:  # ties among the rounded scores are settled by the float32 re-scoring below
                top_scores, top_ids = scores.topk(min(num_fetch, chunk.shape[0]), dim=1)
            else:
                top_scores, top_ids = top_k_lowest_ids_first(scores, num_fetch)
            top_scores, top_ids = top_scores.float(), top_ids + start
            if best_scores is not None:  # earlier chunks hold lower ids: a stable sort keeps them first among equals
                top_scores, top_ids = torch.cat([best_scores, top_scores], 1), torch.cat([best_ids, top_ids], 1)
                order = top_scores.argsort(dim=1, descending=True, stable=True)[:, :num_fetch]
                top_scores, top_ids = top_scores.gather(1, order), top_ids.gather(1, order)
            best_scores, best_ids = top_scores, top_ids
        if half:
            best_scores, best_ids = rescore_float32(block_emb, query_emb.detach().to(block_emb.device), best_ids, k)
    return best_scores.to(query_emb.device), best_ids.to(query_emb.device)


def tiled_top_k_candidates(
    block_emb: torch.Tensor,
    q: torch.Tensor,
    num_fetch: int,
    chunk_size: int,
    excluded: torch.Tensor | None = None,
    tile_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The num_fetch best rows of block_emb [N, D] for q [Q, D] (both in block_emb's dtype and device) -> (scores
    [Q, num_fetch] float32, ids [Q, num_fetch]), by score, then id, as top_k_lowest_ids_first orders them.

    Two stages. The scan keeps only the best score of each tile of tile_rows consecutive rows ([Q, N / tile_rows]).
    Then, per query, the num_fetch tiles ordered first by (best score descending, tile index ascending) hold the
    answer: a tile ordered before the tile of the r-th best row holds a row ordered before it (a higher score, or the
    same score and a lower id), so at most r - 1 tiles precede it. Their rows are scored again and the best kept. The
    scan does no top-k and no host synchronisation; `excluded` rows are scored -inf. tile_rows: TILE_ROWS by default.
    """
    num_blocks = block_emb.shape[0]
    tile_rows = tile_rows or TILE_ROWS
    chunk_size = -(-chunk_size // tile_rows) * tile_rows  # whole tiles, so tile t holds rows [t * rows, (t+1) * rows)
    bounds = None
    if excluded is not None and excluded.numel():
        excluded_cpu = excluded.cpu()
        starts = torch.arange(0, num_blocks, chunk_size)
        bounds = torch.searchsorted(excluded_cpu, torch.stack([starts, starts + chunk_size], 1)).tolist()
        excluded = excluded.to(block_emb.device)
    buffer = torch.empty(q.shape[0] * min(chunk_size, num_blocks), dtype=block_emb.dtype, device=block_emb.device)
    tile_best = []
    for number, start in enumerate(range(0, num_blocks, chunk_size)):
        chunk = block_emb[start : start + chunk_size]
        rows = chunk.shape[0]
        scores = torch.mm(q, chunk.T, out=buffer[: q.shape[0] * rows].view(q.shape[0], rows))
        if bounds is not None and bounds[number][1] > bounds[number][0]:
            scores[:, excluded[bounds[number][0] : bounds[number][1]] - start] = float("-inf")
        full = rows - rows % tile_rows
        tile_best.append(scores[:, :full].view(q.shape[0], -1, tile_rows).amax(dim=2))
        if full < rows:
            tile_best.append(scores[:, full:].amax(dim=1, keepdim=True))
    tile_best = torch.cat(tile_best, dim=1)  # [Q, ceil(N / tile_rows)]; a chunk is a whole number of tiles
    num_tiles = min(num_fetch, tile_best.shape[1])
    tiles = tile_best.float().argsort(dim=1, descending=True, stable=True)[:, :num_tiles]  # [Q, T]
    ids = (tiles.unsqueeze(2) * tile_rows + torch.arange(tile_rows, device=tiles.device)).flatten(1)  # [Q, T * rows]
    ids = ids.sort(dim=1).values  # by id, so that the stable sort below keeps the lowest id first among equals
    out_scores, out_ids = [], []
    step = max(1, 2**26 // (ids.shape[1] * block_emb.shape[1]))  # queries per gather of [step, T * rows, D] rows
    for first in range(0, q.shape[0], step):
        some = ids[first : first + step]
        candidates = block_emb[some.clamp(max=num_blocks - 1)]  # [step, C, D]
        scores = torch.bmm(candidates, q[first : first + step].unsqueeze(2)).squeeze(2).float()
        scores = scores.masked_fill(some >= num_blocks, float("-inf"))
        if bounds is not None:
            scores = scores.masked_fill(torch.isin(some, excluded), float("-inf"))
        order = scores.argsort(dim=1, descending=True, stable=True)[:, :num_fetch]
        out_scores.append(scores.gather(1, order))
        out_ids.append(some.gather(1, order))
    return torch.cat(out_scores), torch.cat(out_ids)


def rescore_float32(
    block_emb: torch.Tensor, query_emb: torch.Tensor, ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate ids [Q, C] (-1 = none: scored -inf) -> the best k by exact float32 inner product query . block,
    equal scores in id order, as exact search gives them: (scores [Q, k] float32, ids [Q, k]). Used after a
    half-precision scan and after a faiss search."""
    candidates = block_emb[ids.clamp(min=0)].float()  # [Q, C, D]
    scores = torch.bmm(candidates, query_emb.float().unsqueeze(2)).squeeze(2)
    scores = scores.masked_fill(ids < 0, float("-inf"))
    by_id = ids.argsort(dim=1)  # then by score, stably
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    order = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
    return scores.gather(1, order), ids.gather(1, order)


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def version_names(root: Path) -> dict[int, Path]:
    """{version: folder} of every entry under root named like a version (vNNNNNN), index or not."""
    if not root.is_dir():
        return {}
    return {int(m.group(1)): p for p in root.iterdir() if (m := VERSION_PATTERN.match(p.name))}


def is_index_version(folder: str | os.PathLike) -> bool:
    """Whether folder is a complete index version as _write_version commits it: build_info.json and
    block_index/index_config.json (a user's folder that merely has a version-like name is not one)."""
    folder = Path(folder)
    return (folder / BUILD_INFO_NAME).is_file() and (folder / INDEX_SUBDIR / "index_config.json").is_file()


def list_versions(root: str | os.PathLike) -> list[int]:
    """Complete versions under an index root, ascending (builds in progress are hidden temp folders; other folders
    with a version-like name are not versions: they are never loaded nor pruned)."""
    return sorted(v for v, folder in version_names(Path(root)).items() if is_index_version(folder))


def latest_index_dir(root: str | os.PathLike) -> Path:
    """The block_index/ folder of the newest complete version under root (load with
    RealmBlockIndex.from_pretrained)."""
    versions = list_versions(root)
    if not versions:
        raise FileNotFoundError(f"{root} holds no index version (expected {root}/v000000/{INDEX_SUBDIR}, ...)")
    return Path(root) / version_dir_name(versions[-1]) / INDEX_SUBDIR


def index_folder(path: str | os.PathLike) -> Path:
    """The index folder a path names: an index folder (index_config.json) as it is; an index root of versions
    (`openrealm index build`'s default layout) as its newest complete version's block_index/."""
    path = Path(path)
    if (path / INDEX_CONFIG_NAME).is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"index not found: {path} does not exist")
    if list_versions(path):
        return latest_index_dir(path)
    raise FileNotFoundError(
        f"{path} is not an index: it holds neither {INDEX_CONFIG_NAME} nor index versions ({path}/v000000/"
        f"{INDEX_SUBDIR}, ...); build one with `openrealm index build`"
    )


def weights_fingerprint(module: torch.nn.Module) -> str:
    """sha256 of a module's parameters (names, shapes, values rounded to bfloat16): the identity of the tower that made
    an index, the same whether its weights were loaded in float32 or bfloat16, from any checkpoint layout."""
    digest = hashlib.sha256()
    for name, parameter in sorted(module.named_parameters(remove_duplicate=False)):
        values = parameter.detach().to("cpu", torch.bfloat16).contiguous()
        digest.update(f"{name}:{tuple(values.shape)}\n".encode())
        digest.update(values.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


class RealmBlockIndex:
    """MIPS over block embeddings [num_blocks, dim]. index_type 'exact' = torch matmul + top-k (works on any torch
    device); 'flat' = faiss IndexFlatIP (exact); 'ivf', 'hnsw', 'ivfpq', 'pq' = approximate faiss indexes.

    A living corpus changes the index without re-embedding it: `add` appends rows (new blocks get the next ids),
    `remove` marks ids that no search returns again (`removed_ids`); block ids that stay never change. Approximate
    indexes take additions without retraining; once more than `max_drift` of their rows were added or removed since
    training, `needs_rebuild` says so. `embedder` is the RealmEmbedder (or the folder of one) that made block_emb,
    saved with the index so that blocks added later are embedded alike."""

    def __init__(
        self,
        block_emb: torch.Tensor,
        index_type: str = "exact",
        version: int = 0,
        faiss_index=None,
        params: dict | None = None,
        metadata: dict | None = None,
        removed_ids: torch.Tensor | None = None,
        trained_num_blocks: int | None = None,
        max_drift: float = DEFAULT_MAX_DRIFT,
        embedder=None,
    ):
        if index_type not in INDEX_TYPES:
            raise ValueError(f"unknown index_type '{index_type}', expected one of {INDEX_TYPES}")
        if not isinstance(block_emb, torch.Tensor) or block_emb.dim() != 2 or not block_emb.is_floating_point():
            shape = tuple(block_emb.shape) if hasattr(block_emb, "shape") else type(block_emb).__name__
            raise ValueError(f"block_emb must be a 2-D float tensor [num_blocks, dim], got {shape}")
        if block_emb.shape[0] < 1 or block_emb.shape[1] < 1:
            raise ValueError(f"block_emb must be non-empty, got shape {tuple(block_emb.shape)}")
        if index_type == "exact" and faiss_index is not None:
            raise ValueError("index_type 'exact' does not use a faiss index; pass faiss_index=None")
        if index_type != "exact":
            _require_faiss(index_type)
            if faiss_index is None:
                raise ValueError(f"index type '{index_type}' needs a faiss index: use RealmBlockIndex.build()")
            if faiss_index.ntotal != block_emb.shape[0] or faiss_index.d != block_emb.shape[1]:
                raise ValueError(
                    f"faiss index holds {faiss_index.ntotal} x {faiss_index.d} vectors but block_emb is "
                    f"{block_emb.shape[0]} x {block_emb.shape[1]}"
                )
        self.block_emb = block_emb
        self.index_type = index_type
        self.version = int(version)
        self.faiss_index = faiss_index
        self.params = dict(params or {})
        # Provenance saved with the index (corpus fingerprint, embedder, timings...): JSON-serialisable values only.
        self.metadata = dict(metadata or {})
        self.removed_ids = _check_removed_ids(removed_ids, block_emb.shape[0])
        self.trained_num_blocks = int(trained_num_blocks or block_emb.shape[0])  # rows the index was trained on
        self.max_drift = float(max_drift)
        self.embedder = embedder  # None, a RealmEmbedder or the Path of a saved one (see load_embedder)
        self._mmap = None  # the np.memmap behind block_emb when loaded by from_pretrained
        self._gpu_resources = None  # faiss StandardGpuResources; must outlive the GPU index
        self._faiss_gpu = None  # GPU ordinal of the faiss index, None on CPU
        self._apply_search_params()

    @property
    def num_blocks(self) -> int:
        return self.block_emb.shape[0]

    @property
    def dim(self) -> int:
        return self.block_emb.shape[1]

    @property
    def device(self) -> torch.device:
        return self.block_emb.device

    @property
    def num_searchable(self) -> int:
        """Blocks a search can return: all rows but the removed ones."""
        return self.num_blocks - self.removed_ids.numel()

    @property
    def drift(self) -> float:
        """Rows added or removed since the faiss index was trained, as a fraction of the rows it was trained on."""
        changed = abs(self.num_blocks - self.trained_num_blocks) + self.removed_ids.numel()
        return changed / self.trained_num_blocks

    @property
    def needs_rebuild(self) -> bool:
        """True for an approximate index changed by more than max_drift since training: its clusters or codes no
        longer fit the corpus well, so recall may have dropped (rebuild it: openrealm index build). Exact never."""
        return self.index_type in APPROXIMATE_TYPES and self.drift > self.max_drift

    def add(self, block_emb: torch.Tensor | np.ndarray) -> RealmBlockIndex:
        """A new index (version + 1) holding these rows too: new_emb [M, dim] get ids num_blocks .. num_blocks + M - 1.
        A faiss index gets them added to a copy, without retraining; this index is not changed (a retriever using it
        swaps to the new one whole)."""
        new = torch.as_tensor(block_emb).detach()
        if new.dim() != 2 or new.shape[1] != self.dim or not new.is_floating_point() or new.shape[0] < 1:
            raise ValueError(f"added embeddings must be [num_new >= 1, dim={self.dim}] floats, got {tuple(new.shape)}")
        new = new.to("cpu", self.block_emb.dtype).contiguous()
        _check_finite(new, source="the added embeddings")
        faiss_index = None
        if self.faiss_index is not None:
            on_cpu = faiss.index_gpu_to_cpu(self.faiss_index) if self._gpu_resources is not None else self.faiss_index
            faiss_index = faiss.clone_index(on_cpu)
            faiss_index.add(new.float().numpy())
        index = self._changed(torch.cat([self.block_emb.cpu(), new]), faiss_index, self.removed_ids)
        return index.to(self.device) if self.device.type != "cpu" else index

    def remove(self, ids) -> RealmBlockIndex:
        """A new index (version + 1) that never returns the blocks `ids` (any iterable of ints); rows and all other
        ids stay as they are. Removing a removed block again changes nothing."""
        ids = torch.as_tensor(list(ids) if not isinstance(ids, (torch.Tensor, np.ndarray)) else ids, dtype=torch.long)
        ids = ids.reshape(-1).cpu()
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise IndexError(f"block ids to remove must be in [0, {self.num_blocks}), got [{ids.min()}, {ids.max()}]")
        removed = torch.unique(torch.cat([self.removed_ids, ids]))
        if removed.numel() >= self.num_blocks:
            raise ValueError("removing these blocks would leave the index with no block to retrieve")
        index = self._changed(self.block_emb, self.faiss_index, removed)
        index._mmap, index._gpu_resources, index._faiss_gpu = self._mmap, self._gpu_resources, self._faiss_gpu
        return index

    def _changed(self, block_emb: torch.Tensor, faiss_index, removed_ids: torch.Tensor) -> RealmBlockIndex:
        return RealmBlockIndex(
            block_emb,
            self.index_type,
            self.version + 1,
            faiss_index,
            self.params,
            self.metadata,
            removed_ids=removed_ids,
            trained_num_blocks=self.trained_num_blocks,
            max_drift=self.max_drift,
            embedder=self.embedder,
        )

    def load_embedder(self, device: str | torch.device | None = None):
        """The RealmEmbedder that made block_emb, in eval mode (loaded from the index folder's embedder/ when saved
        there); None when the index holds none (e.g. converted from a 4.x checkpoint)."""
        embedder = self.embedder
        if isinstance(embedder, (str, os.PathLike)):
            from .modeling_realm import RealmEmbedder

            embedder = RealmEmbedder.from_pretrained(embedder)
        if embedder is not None:
            embedder = embedder.eval() if device is None else embedder.to(device).eval()
        return embedder

    @property
    def is_memory_mapped(self) -> bool:
        """True when block_emb lies in a memory-mapped file (pages read on demand, nothing copied into RAM): this
        index's block_emb.safetensors, or the weights file of a legacy 4.x checkpoint. Read from /proc on Linux;
        elsewhere only the file from_pretrained mapped is recognised."""
        if self.block_emb.device.type != "cpu":
            return False
        if os.path.exists("/proc/self/smaps"):
            return self._block_emb_mapping() is not None
        return self._mmap is not None and self.block_emb.data_ptr() == self._mmap.ctypes.data

    def _block_emb_mapping(self):
        return file_mapping(self.block_emb.data_ptr(), self.block_emb.numel() * self.block_emb.element_size())

    def _unchanged_block_emb_file(self) -> Path | None:
        """The block_emb.safetensors this index was loaded from, when block_emb still is exactly that file's data (the
        same tensor, no page written, the file not replaced since): a save can then hard-link it instead of rewriting
        it (6.8 GB at 13.35M blocks). None when that cannot be shown (e.g. no /proc: not Linux)."""
        if self._mmap is None or self.block_emb.device.type != "cpu":
            return None
        if self.block_emb.data_ptr() != self._mmap.ctypes.data or not self.block_emb.is_contiguous():
            return None
        mapping = self._block_emb_mapping()
        path = Path(self._mmap.filename)
        if mapping is None or mapping.written_bytes or not mapping.is_named(path):
            return None
        return path

    def __len__(self) -> int:
        return self.num_blocks

    def __repr__(self) -> str:
        return (
            f"RealmBlockIndex(index_type='{self.index_type}', num_blocks={self.num_blocks}, dim={self.dim}, "
            f"version={self.version}, device={self.device}, params={self.params})"
        )

    @classmethod
    def build(
        cls, block_emb: torch.Tensor | np.ndarray, index_type: str = "exact", version: int = 0, **params
    ) -> RealmBlockIndex:
        """Build an index over block_emb [num_blocks, dim]. See _PARAM_DEFAULTS for each type's parameters."""
        if index_type not in INDEX_TYPES:
            raise ValueError(f"unknown index_type '{index_type}', expected one of {INDEX_TYPES}")
        if isinstance(block_emb, np.ndarray):
            block_emb = torch.from_numpy(block_emb)
        if not isinstance(block_emb, torch.Tensor) or block_emb.dim() != 2 or not block_emb.is_floating_point():
            shape = tuple(block_emb.shape) if hasattr(block_emb, "shape") else type(block_emb).__name__
            raise ValueError(f"block_emb must be a 2-D float array [num_blocks, dim], got {shape}")
        block_emb = block_emb.detach().contiguous()
        _check_finite(block_emb)
        params = resolve_index_params(index_type, block_emb.shape[0], block_emb.shape[1], params)
        faiss_index = None if index_type == "exact" else _build_faiss(block_emb, index_type, params)
        return cls(block_emb, index_type=index_type, version=version, faiss_index=faiss_index, params=params)

    def set_search_params(self, **params) -> RealmBlockIndex:
        """Change search-time knobs (nprobe, ef_search, rerank, chunk_size) without rebuilding."""
        allowed = {"nprobe", "ef_search", "rerank", "chunk_size"} & set(_PARAM_DEFAULTS[self.index_type])
        for name, value in params.items():
            if name not in allowed:
                raise ValueError(f"'{name}' is not a search parameter of index type '{self.index_type}': {allowed}")
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.params.update(params)
        self._apply_search_params()
        return self

    def _apply_search_params(self) -> None:
        if self.faiss_index is None:
            return
        space = faiss.GpuParameterSpace() if self._gpu_resources is not None else faiss.ParameterSpace()
        if "nprobe" in self.params:
            space.set_index_parameter(self.faiss_index, "nprobe", self.params["nprobe"])
        if "ef_search" in self.params:
            space.set_index_parameter(self.faiss_index, "efSearch", self.params["ef_search"])

    def search(self, query_emb: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query_emb [Q, dim] -> (scores [Q, k] float32, ids [Q, k] int64), best first, on query_emb's device.

        Scores are always the exact inner products query_emb . block_emb[id], whatever index found the ids.
        """
        query_emb = _query_tensor(query_emb)
        k = _check_search_args(query_emb, k, self.dim, self.num_searchable)
        chunk_size = self.params.get("chunk_size")
        excluded = self.removed_ids if self.removed_ids.numel() else None
        on_gpu = self._gpu_resources is not None
        if self.faiss_index is None or (on_gpu and k > _GPU_MAX_K):
            return torch_exact_search(self.block_emb, query_emb, k, chunk_size=chunk_size, excluded=excluded)

        # Fetch k * rerank candidates, re-score them exactly and keep the best k.
        num_fetch = min(self.num_blocks, k * self.params.get("rerank", 1), _GPU_MAX_K if on_gpu else self.num_blocks)
        query_np = query_emb.detach().to("cpu", torch.float32).contiguous().numpy()
        ids = self._faiss_search(query_np, num_fetch)
        ids = torch.from_numpy(ids).to(self.device)
        q = query_emb.detach().to(self.device, torch.float32)
        scores, ids = rescore_float32(self.block_emb, q, ids, k)

        # faiss pads with -1 when it finds fewer than num_fetch blocks (e.g. IVF probing near-empty lists);
        # such queries fall back to exact search rather than returning made-up ids.
        short = (ids < 0).any(dim=1)
        if short.any():
            scores[short], ids[short] = torch_exact_search(self.block_emb, q[short], k, chunk_size, excluded)
        return scores.to(query_emb.device), ids.to(query_emb.device)

    def _faiss_search(self, query: np.ndarray, num_fetch: int) -> np.ndarray:
        """faiss candidate ids [Q, num_fetch] (-1 = none), removed blocks left out: faiss skips them itself where it
        can (an IDSelector: flat, IVF, HNSW on CPU); elsewhere (PQ, GPU) they are fetched, then blanked to -1."""
        if not self.removed_ids.numel():
            return self.faiss_index.search(query, num_fetch)[1]
        removed = self.removed_ids.numpy()
        if self._gpu_resources is None and self.index_type != "pq":
            selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(removed))
            if self.index_type in ("ivf", "ivfpq"):
                params = faiss.SearchParametersIVF(sel=selector, nprobe=self.params["nprobe"])
            elif self.index_type == "hnsw":
                params = faiss.SearchParametersHNSW(sel=selector, efSearch=self.params["ef_search"])
            else:
                params = faiss.SearchParameters(sel=selector)
            return self.faiss_index.search(query, num_fetch, params=params)[1]
        cap = _GPU_MAX_K if self._gpu_resources is not None else self.num_blocks
        ids = self.faiss_index.search(query, min(num_fetch + removed.size, cap))[1]
        ids[np.isin(ids, removed)] = -1
        return ids

    def embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of block_emb: ids of any shape [...] -> [..., dim], on ids' device."""
        ids = torch.as_tensor(ids)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise IndexError(f"block ids must be in [0, {self.num_blocks}), got [{ids.min()}, {ids.max()}]")
        return self.block_emb[ids.to(self.device, torch.long)].to(ids.device)

    def recall_at_k(self, query_emb: torch.Tensor, k: int, reference: RealmBlockIndex | None = None) -> float:
        """Fraction of the reference top-k ids (default: exact torch search) found in this index's top-k, averaged
        over the queries query_emb [Q, dim]."""
        if reference is None:
            excluded = self.removed_ids if self.removed_ids.numel() else None
            _, ref_ids = torch_exact_search(self.block_emb, query_emb, k, excluded=excluded)
        elif reference.num_blocks != self.num_blocks or reference.dim != self.dim:
            raise ValueError(
                f"reference index is {reference.num_blocks} x {reference.dim}, this one {self.num_blocks} x {self.dim}"
            )
        else:
            _, ref_ids = reference.search(query_emb, k)
        _, ids = self.search(query_emb, k)
        found = (ids.unsqueeze(2) == ref_ids.to(ids.device).unsqueeze(1)).any(dim=1)  # [Q, k] over ref ids
        return found.float().mean().item()

    def to(self, device: str | torch.device) -> RealmBlockIndex:
        """Move the index (block_emb and the faiss index) to device, in place; returns self."""
        device = torch.device(device)
        if self.faiss_index is not None:
            if device.type not in ("cpu", "cuda"):
                raise ValueError(f"faiss index type '{self.index_type}' runs on cpu or cuda, not {device}")
            target_gpu = None if device.type == "cpu" else device.index
            if device.type == "cuda" and target_gpu is None:
                target_gpu = torch.cuda.current_device() if torch.cuda.is_available() else 0
            if self._gpu_resources is not None and self._faiss_gpu != target_gpu:
                self.faiss_index, self._gpu_resources = faiss.index_gpu_to_cpu(self.faiss_index), None
                self._faiss_gpu = None
                self._apply_search_params()
            if target_gpu is not None and self._gpu_resources is None:
                self._to_faiss_gpu(target_gpu)
        self.block_emb = _on_device(self.block_emb, device)
        if self.block_emb.device.type != "cpu":
            self._mmap = None
        return self

    def _to_faiss_gpu(self, gpu: int) -> None:
        if faiss.get_num_gpus() == 0:
            raise RuntimeError(
                f"index type '{self.index_type}' on cuda needs a GPU build of faiss (pip install faiss-gpu) and a "
                "visible GPU, but faiss.get_num_gpus() == 0; use index_type='exact' for torch search on GPU"
            )
        resources = faiss.StandardGpuResources()
        options = faiss.GpuClonerOptions()
        options.useFloat16 = self.index_type == "ivfpq"  # fp16 PQ lookup tables: any pq_m fits; rerank fixes scores
        try:
            self.faiss_index = faiss.index_cpu_to_gpu(resources, gpu, self.faiss_index, options)
        except RuntimeError as error:
            raise RuntimeError(
                f"faiss cannot move index type '{self.index_type}' to cuda:{gpu} ({error}); "
                "faiss has GPU versions of 'flat', 'ivf' and 'ivfpq' only"
            ) from error
        self._gpu_resources, self._faiss_gpu = resources, gpu
        self._apply_search_params()

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write index_config.json, block_emb.safetensors (+ faiss.index) to directory, atomically: everything is
        written to a staging sibling which then replaces directory in one step (file_utils.replace_folder). A folder
        holding other files is refused: replacing it would delete them."""
        target = Path(directory).absolute()
        if target.exists() and not target.is_dir():
            raise NotADirectoryError(f"cannot save index to {target}: it exists and is not a directory")
        with atomic_directory(target, overwrite=True, replaceable=_index_folder_problem) as staging:
            self.write_files(staging)

    def write_files(self, directory: str | os.PathLike) -> None:
        """Write index_config.json, block_emb.safetensors (+ faiss.index) into `directory`, an existing folder being
        staged (save_pretrained's, or that of a retriever or an index version that holds the index), and fsync them."""
        directory = Path(directory)
        if isinstance(self.embedder, torch.nn.Module) and "embedder_fingerprint" not in self.metadata:
            self.metadata["embedder_fingerprint"] = weights_fingerprint(self.embedder)  # which tower made block_emb
        config = _index_config(
            self.index_type, self.version, self.num_blocks, self.dim, self.params, self.metadata, self.removed_ids
        )
        config.update(trained_num_blocks=self.trained_num_blocks, max_drift=self.max_drift)
        (directory / INDEX_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        unchanged = self._unchanged_block_emb_file()
        if unchanged is not None:
            link_or_copy(unchanged, directory / BLOCK_EMB_NAME)
        else:
            save_file({"block_emb": self.block_emb.detach().cpu().contiguous()}, str(directory / BLOCK_EMB_NAME))
        if self.faiss_index is not None:
            index = faiss.index_gpu_to_cpu(self.faiss_index) if self._gpu_resources is not None else self.faiss_index
            faiss.write_index(index, str(directory / FAISS_INDEX_NAME))
        _write_removed_and_embedder(directory, self.removed_ids, self.embedder)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike, device: str | torch.device | None = None
    ) -> RealmBlockIndex:
        """Load an index saved by save_pretrained. block_emb is memory-mapped, not read into RAM (a sharded folder,
        written by a pre-training run with --shard-index, is joined into one tensor in RAM)."""
        directory = Path(directory)
        config, block_emb, mmap = _open_index_folder(directory)
        faiss_index = None
        if config["index_type"] != "exact":
            faiss_index = _read_faiss(
                directory / FAISS_INDEX_NAME, config["index_type"], block_emb.shape, config["params"]
            )
        embedder_dir = directory / EMBEDDER_DIR
        index = cls(
            block_emb,
            config["index_type"],
            config["version"],
            faiss_index,
            config["params"],
            config.get("metadata"),
            removed_ids=_read_removed_ids(directory, config),
            trained_num_blocks=config.get("trained_num_blocks"),
            max_drift=config.get("max_drift", DEFAULT_MAX_DRIFT),
            embedder=embedder_dir.absolute() if embedder_dir.is_dir() else None,
        )
        index._mmap = mmap
        return index.to(device) if device is not None else index


class ShardedBlockIndex:
    """Exact MIPS over block embeddings split across the processes of a torch.distributed group: rank r of N holds
    the contiguous rows `shard_range(num_blocks, r, N)`, about 1/N of them (as Atlas shards its index over GPUs).

    `search` is collective: every rank calls it with its own queries [Q_r, dim] (Q_r may differ, even be 0). The
    queries are all-gathered, each rank scores all of them against its shard (chunked exact search), and the per-shard
    top-k are all-gathered and merged into each rank's global top-k: the same ids and scores as one RealmBlockIndex
    holding every row. Communication goes over the group's backend (gloo on CPU, NCCL on GPU); the shard stays on
    its device."""

    collective = True  # search() must be called by every rank of the group, the same number of times
    index_type = "exact"

    def __init__(
        self,
        block_emb_shard: torch.Tensor,
        offset: int,
        num_blocks: int,
        group: torch.distributed.ProcessGroup | None = None,
        chunk_size: int | None = None,
        num_searchable: int | None = None,
        excluded: torch.Tensor | None = None,
        version: int = 0,
    ):
        """excluded: sorted removed ids inside this shard, relative to offset; num_searchable: blocks of the whole
        index a search may return (num_blocks minus every shard's removed ones). Without an initialised process group
        the index is a single shard holding every block."""
        if block_emb_shard.dim() != 2 or not block_emb_shard.is_floating_point():
            raise ValueError(f"block_emb_shard must be a 2-D float tensor, got {tuple(block_emb_shard.shape)}")
        if not 0 <= offset <= offset + block_emb_shard.shape[0] <= num_blocks:
            raise ValueError(
                f"a shard of {block_emb_shard.shape[0]} rows at offset {offset} does not fit in {num_blocks} blocks"
            )
        self.block_emb = block_emb_shard
        self.offset, self.num_blocks, self.group, self.chunk_size = int(offset), int(num_blocks), group, chunk_size
        self.num_searchable = int(num_searchable if num_searchable is not None else num_blocks)
        self.excluded = excluded if excluded is not None and excluded.numel() else None
        self.version = int(version)

    @property
    def is_memory_mapped(self) -> bool:
        """True when this rank's rows are pages of a memory-mapped index file (Linux /proc), not a private copy."""
        if self.block_emb.device.type != "cpu" or not os.path.exists("/proc/self/smaps"):
            return False
        size = self.block_emb.numel() * self.block_emb.element_size()
        return file_mapping(self.block_emb.data_ptr(), size) is not None

    @staticmethod
    def shard_range(num_blocks: int, rank: int, world_size: int) -> tuple[int, int]:
        """Rows [start, stop) of rank `rank`: the first num_blocks % world_size ranks hold one row more."""
        base, extra = divmod(num_blocks, world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (rank < extra)

    @property
    def dim(self) -> int:
        return self.block_emb.shape[1]

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike,
        group: torch.distributed.ProcessGroup | None = None,
        device: str | torch.device | None = None,
        shard: tuple[int, int] | None = None,
    ) -> ShardedBlockIndex:
        """This rank's shard of an index folder (RealmBlockIndex.save_pretrained's, or a sharded build's). The files
        are memory-mapped and only the shard's rows are ever read (or copied to `device`); when the folder was written
        in as many shards as the group has ranks, a rank's rows are exactly its own shard file. shard: (rank,
        world_size) whose rows to hold, default this process's in `group` (search needs that group anyway)."""
        directory = Path(directory)
        config = _read_config(directory / INDEX_CONFIG_NAME)
        num_blocks = config["num_blocks"]
        rank, world = shard if shard is not None else _group_rank_and_size(group)
        start, stop = cls.shard_range(num_blocks, rank, world)
        pieces = [
            emb[max(start, first) - first : min(stop, first + emb.shape[0]) - first]
            for first, emb, _, _ in _open_shards(directory, config)
            if first < stop and first + emb.shape[0] > start
        ]
        shard = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        _check_finite(shard, source=f"{directory} rows [{start}, {stop})")
        if config["index_type"] != "exact":
            warnings.warn(f"{directory} holds a '{config['index_type']}' index; shards search exactly", stacklevel=2)
        removed = _read_removed_ids(directory, config)
        removed = torch.zeros(0, dtype=torch.long) if removed is None else removed
        mine = removed[(removed >= start) & (removed < stop)] - start
        shard = _on_device(shard, device) if device is not None else shard
        num_searchable = num_blocks - removed.numel()
        chunk_size = config["params"].get("chunk_size")
        return cls(shard, start, num_blocks, group, chunk_size, num_searchable, mine, version=config["version"])

    def search(self, query_emb: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Collective. query_emb [Q, dim] of this rank -> (scores [Q, k] float32, ids [Q, k] int64, global ids), best
        first, on query_emb's device."""
        import torch.distributed as dist

        query_emb = _query_tensor(query_emb)
        k = _check_search_args(query_emb, k, self.dim, self.num_searchable)
        rank, world = _group_rank_and_size(self.group)
        expected = self.shard_range(self.num_blocks, rank, world)
        if (self.offset, self.offset + self.block_emb.shape[0]) != expected:
            raise RuntimeError(
                f"this index holds rows [{self.offset}, {self.offset + self.block_emb.shape[0]}) but rank {rank} of "
                f"{world} processes searches rows {list(expected)}: load it in the group that searches it"
            )
        if world == 1:
            scores, ids = self._search_shard(query_emb.detach().to(self.block_emb.device, self.block_emb.dtype), k)
            return scores.to(query_emb.device), ids.to(query_emb.device)
        device = self.block_emb.device
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([query_emb.shape[0]], device=device), group=self.group)
        counts = [int(count) for count in counts]
        padded = torch.zeros(max(counts), self.dim, dtype=self.block_emb.dtype, device=device)
        padded[: query_emb.shape[0]] = query_emb.detach().to(device, self.block_emb.dtype)
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded, group=self.group)
        queries = torch.cat([part[:count] for part, count in zip(gathered, counts)])  # [sum Q, dim]
        scores, ids = self._search_shard(queries, k)
        all_scores = [torch.empty_like(scores) for _ in range(world)]
        all_ids = [torch.empty_like(ids) for _ in range(world)]
        dist.all_gather(all_scores, scores, group=self.group)
        dist.all_gather(all_ids, ids, group=self.group)
        mine = slice(sum(counts[:rank]), sum(counts[: rank + 1]))
        merged_scores = torch.cat([part[mine] for part in all_scores], dim=1)  # [Q, world * k], shard order
        merged_ids = torch.cat([part[mine] for part in all_ids], dim=1)
        # a stable sort keeps equal scores in shard (= id) order, as one process's chunked search does
        order = merged_scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        return merged_scores.gather(1, order).to(query_emb.device), merged_ids.gather(1, order).to(query_emb.device)

    def _search_shard(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k of this shard for queries [Q, dim] -> (scores [Q, k], global ids [Q, k]); slots past the shard's
        searchable rows hold -inf and id -1."""
        scores = torch.full((queries.shape[0], k), float("-inf"), device=queries.device)
        ids = torch.full((queries.shape[0], k), -1, dtype=torch.long, device=queries.device)
        local_k = min(k, self.block_emb.shape[0] - (0 if self.excluded is None else self.excluded.numel()))
        if local_k and queries.shape[0]:
            found_scores, found_ids = torch_exact_search(
                self.block_emb, queries, local_k, self.chunk_size, excluded=self.excluded
            )
            scores[:, :local_k], ids[:, :local_k] = found_scores, found_ids + self.offset
        return scores, ids


def _on_device(tensor: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """tensor on device; a CPU tensor stays itself for any CPU device ("cpu:0", as accelerate names it, included),
    since Tensor.to("cpu:0") copies, and a copy would turn memory-mapped embeddings into private memory."""
    device = torch.device(device)
    if device.type == "cpu" and tensor.device.type == "cpu":
        return tensor
    return tensor.to(device)


def _group_rank_and_size(group: torch.distributed.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in group; (0, 1) when no process group is initialised (a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def shard_file_name(rank: int, num_shards: int) -> str:
    """block_emb-00001-of-00002.safetensors: rank 0's rows of an index written in 2 shards (as transformers names
    the shards of a checkpoint)."""
    return f"block_emb-{rank + 1:05d}-of-{num_shards:05d}.safetensors"


def save_block_emb_shard(path: str | os.PathLike, shard_emb: torch.Tensor) -> None:
    """Write one shard's rows [rows, dim] (float) as a safetensors file holding 'block_emb', fsynced."""
    save_file({"block_emb": shard_emb.detach().cpu().contiguous()}, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_sharded_index(
    directory: str | os.PathLike,
    shard_files: list[str | os.PathLike],
    num_blocks: int,
    *,
    version: int = 0,
    metadata: dict | None = None,
    removed_ids: torch.Tensor | None = None,
    embedder=None,
) -> None:
    """Complete an exact index in `directory` (an existing folder being staged) from the shard files that ranks
    wrote (save_block_emb_shard; file r holds rows ShardedBlockIndex.shard_range(num_blocks, r, len(shard_files))):
    they are moved in (same file system) under shard_file_name, and the config, removed ids and embedder written.
    No process ever holds every row, and RealmBlockIndex.from_pretrained / ShardedBlockIndex.from_pretrained load
    it."""
    directory, num_shards = Path(directory), len(shard_files)
    dim = None
    for rank, path in enumerate(shard_files):
        start, stop = ShardedBlockIndex.shard_range(num_blocks, rank, num_shards)
        emb, _ = _mmap_safetensors(Path(path))
        if emb.shape[0] != stop - start or (dim is not None and emb.shape[1] != dim):
            raise ValueError(
                f"{path} holds {tuple(emb.shape)} rows; shard {rank} of {num_shards} needs {stop - start}"
            )
        dim = emb.shape[1]
        del emb
        os.replace(path, directory / shard_file_name(rank, num_shards))
    removed_ids = _check_removed_ids(removed_ids, num_blocks)
    config = _index_config("exact", version, num_blocks, dim, {}, metadata or {}, removed_ids)
    config["num_shards"] = num_shards
    (directory / INDEX_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_removed_and_embedder(directory, removed_ids, embedder)


def _index_config(index_type, version, num_blocks, dim, params, metadata, removed_ids) -> dict:
    """The index_config.json of an index (RealmBlockIndex.write_files adds its drift bookkeeping)."""
    return {
        "format_version": FORMAT_VERSION,
        "index_type": index_type,
        "version": version,
        "num_blocks": num_blocks,
        "dim": dim,
        "params": params,
        "metadata": metadata,
        "num_removed": removed_ids.numel(),
    }


def _write_removed_and_embedder(directory: Path, removed_ids: torch.Tensor, embedder) -> None:
    """Write removed_ids.safetensors (when any) and embedder/ (a module, or a saved folder linked in) into an index
    folder being staged, then fsync every file in it: on disk before the folder's rename commits it."""
    if removed_ids.numel():
        save_file({"removed_ids": removed_ids}, str(directory / REMOVED_IDS_NAME))
    if isinstance(embedder, (str, os.PathLike)):
        (directory / EMBEDDER_DIR).mkdir()
        for path in Path(embedder).iterdir():
            link_or_copy(path, directory / EMBEDDER_DIR / path.name)
    elif embedder is not None:
        embedder.save_pretrained(directory / EMBEDDER_DIR)
    for path in [*directory.iterdir(), *directory.glob(f"{EMBEDDER_DIR}/*")]:
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


_INDEX_FILES = (INDEX_CONFIG_NAME, BLOCK_EMB_NAME, FAISS_INDEX_NAME, REMOVED_IDS_NAME, EMBEDDER_DIR)
_SHARD_FILE = re.compile(r"block_emb-(\d{5})-of-(\d{5})\.safetensors")
_CONFIG_KEYS = {
    "format_version": int,
    "index_type": str,
    "version": int,
    "num_blocks": int,
    "dim": int,
    "params": dict,
}


def _check_finite(block_emb: torch.Tensor, chunk_size: int = 2**20, source: str = "block_emb") -> None:
    """Refuse embeddings with a NaN or inf, or a row so large that its squared norm overflows float32 (a score against
    any query could then be inf, and one NaN row turns every answer's score into NaN). Chunked: an isfinite over
    13M x 128 at once would need 1.7 GB."""
    for start in range(0, block_emb.shape[0], chunk_size):
        chunk = block_emb[start : start + chunk_size].float()
        bad = ~torch.isfinite(chunk).all(dim=1) | ~torch.isfinite(chunk.square().sum(dim=1))
        if bad.any():
            row = start + int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{source} contains NaN, inf or overflowing values (first at row {row}: {block_emb[row][:4].tolist()}"
                " ...); the index would score every block NaN. Rebuild it (openrealm index build)."
            )


# Files whose embeddings were found finite in this process: (path, size, mtime_ns, inode). A memory-mapped index is
# read through once per process and file version, not at every load (the refresh loads each version once anyway).
_FINITE_CHECKED: set[tuple[str, int, int, int]] = set()


def _check_finite_once(block_emb: torch.Tensor, path: Path) -> None:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _FINITE_CHECKED:
        _check_finite(block_emb, source=str(path))
        _FINITE_CHECKED.add(key)


def resolve_index_params(index_type: str, num_blocks: int, dim: int, params: dict) -> dict:
    """Check user params against the type's accepted ones and fill the data-dependent defaults -> the build's params.

    Needs only the corpus size and the embedding width, so a job can refuse bad parameters before it embeds every
    block (hours on Wikipedia) rather than after."""
    if index_type not in INDEX_TYPES:
        raise ValueError(f"unknown index_type '{index_type}', expected one of {INDEX_TYPES}")
    if index_type != "exact":
        _require_faiss(index_type)
    defaults = _PARAM_DEFAULTS[index_type]
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameters {unknown} for index type '{index_type}'; accepted: {sorted(defaults)}")
    resolved = {**defaults, **{name: value for name, value in params.items() if value is not None}}
    if "nlist" in resolved and resolved["nlist"] is None:
        # ~4 sqrt(N) lists, with >= 39 blocks per list (faiss' minimum for stable k-means)
        resolved["nlist"] = max(1, min(int(4 * math.sqrt(num_blocks)), num_blocks // 39))
    if "pq_m" in resolved and resolved["pq_m"] is None:
        # 2 dims per sub-quantizer (64 bytes/block at dim 128): coarser codes (4 dims) cap recall@5 near 0.93 on
        # clustered data even with rerank=10, because REALM's top scores are close together.
        resolved["pq_m"] = max(m for m in range(1, max(1, dim // 2) + 1) if dim % m == 0)
    if "train_size" in resolved and resolved["train_size"] is None:  # faiss wants 39..256 points per centroid
        resolved["train_size"] = max(40 * resolved.get("nlist", 1), 64 * 2 ** resolved.get("pq_bits", 0))
    if resolved.get("chunk_size", 0) is None:
        del resolved["chunk_size"]
    for name, value in resolved.items():
        minimum = 0 if name == "seed" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            kind = "a non-negative int" if minimum == 0 else "a positive int"
            raise ValueError(f"parameter {name} of index type '{index_type}' must be {kind}, got {value!r}")
    if "train_size" in resolved:
        resolved["train_size"] = min(resolved["train_size"], num_blocks)
    if "nprobe" in resolved:  # probing more lists than exist is the same as probing all of them
        resolved["nprobe"] = min(resolved["nprobe"], resolved["nlist"])
    training_blocks = min(num_blocks, resolved.get("train_size", num_blocks))
    if resolved.get("nlist", 1) > training_blocks:
        raise ValueError(f"nlist={resolved['nlist']} exceeds the {training_blocks} training blocks")
    if "pq_m" in resolved and dim % resolved["pq_m"]:
        raise ValueError(f"pq_m={resolved['pq_m']} must divide dim={dim}")
    if "pq_bits" in resolved and 2 ** resolved["pq_bits"] > resolved["train_size"]:
        raise ValueError(f"pq_bits={resolved['pq_bits']} needs >= {2 ** resolved['pq_bits']} training blocks")
    return resolved


def _build_faiss(block_emb: torch.Tensor, index_type: str, params: dict, add_chunk: int = 2**20):
    _require_faiss(index_type)
    dim, num_blocks = block_emb.shape[1], block_emb.shape[0]
    factory = {
        "flat": "Flat",
        "ivf": "IVF{nlist},Flat",
        "hnsw": "HNSW{m},Flat",
        "ivfpq": "IVF{nlist},PQ{pq_m}x{pq_bits}",
        "pq": "PQ{pq_m}x{pq_bits}",
    }[index_type].format(**params)
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if index_type == "hnsw":
        index.hnsw.efConstruction = params["ef_construction"]
    if index_type in ("ivfpq", "pq"):
        index.do_polysemous_training = False  # only serves Hamming pre-filtering, which we don't use; slow to train
    if not index.is_trained:
        # Seed both the training sample and faiss' k-means so builds are reproducible.
        if hasattr(index, "cp"):
            index.cp.seed = params["seed"]  # IVF coarse-quantizer k-means
        if hasattr(index, "pq"):
            index.pq.cp.seed = params["seed"]  # product-quantizer k-means
        rng = np.random.default_rng(params["seed"])
        sample = np.sort(rng.choice(num_blocks, size=params["train_size"], replace=False))
        index.train(block_emb[torch.from_numpy(sample)].to("cpu", torch.float32).numpy())
    for start in range(0, num_blocks, add_chunk):  # chunked: no full float32 copy of a memory-mapped corpus
        index.add(block_emb[start : start + add_chunk].to("cpu", torch.float32).contiguous().numpy())
    return index


def _index_folder_problem(folder: str) -> str | None:
    """Why `folder` may not be replaced by a saved index (it holds files of something else), or None."""
    foreign = sorted(
        name for name in os.listdir(folder) if name not in _INDEX_FILES and not _SHARD_FILE.fullmatch(name)
    )
    if foreign:
        return f"it holds files that are not part of a block index {foreign}; save the index into its own (sub)folder"
    return None


def _open_index_folder(directory: Path) -> tuple[dict, torch.Tensor, np.memmap | None]:
    """(index_config, block_emb [num_blocks, dim], its np.memmap) of a saved index folder, checked against each other
    and for non-finite values. block_emb is memory-mapped; a sharded folder's files are joined into RAM (memmap
    None)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"block index directory {directory} does not exist")
    config = _read_config(directory / INDEX_CONFIG_NAME)
    shards = _open_shards(directory, config)
    for _, emb, _, path in shards:
        _check_finite_once(emb, path)
    if len(shards) == 1:
        return config, shards[0][1], shards[0][2]
    return config, torch.cat([emb for _, emb, _, _ in shards]), None


def _open_shards(directory: Path, config: dict) -> list[tuple[int, torch.Tensor, np.memmap, Path]]:
    """(first row, memory-mapped rows, np.memmap, file) of each embeddings file of an index folder, in row order: its
    block_emb.safetensors, or the config's num_shards files shard_file_name(r, num_shards)."""
    num_shards = config.get("num_shards", 1)
    names = [BLOCK_EMB_NAME] if num_shards == 1 else [shard_file_name(r, num_shards) for r in range(num_shards)]
    shards = []
    for rank, name in enumerate(names):
        start, stop = ShardedBlockIndex.shard_range(config["num_blocks"], rank, num_shards)
        emb, mmap = _mmap_safetensors(directory / name)
        if tuple(emb.shape) != (stop - start, config["dim"]):
            raise ValueError(
                f"{directory / name} holds {emb.shape[0]} x {emb.shape[1]} embeddings but "
                f"{directory / INDEX_CONFIG_NAME}"
                f" says rows [{start}, {stop}) of num_blocks={config['num_blocks']}, dim={config['dim']}"
            )
        shards.append((start, emb, mmap, directory / name))
    return shards


def _check_removed_ids(removed_ids, num_blocks: int, source: str = "removed_ids") -> torch.Tensor:
    """Removed block ids as a sorted, unique int64 CPU tensor [R], each in [0, num_blocks), leaving one block at
    least."""
    if removed_ids is None:
        return torch.zeros(0, dtype=torch.long)
    ids = torch.as_tensor(removed_ids).reshape(-1)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{source} must hold integer block ids, got {ids.dtype}")
    ids = ids.to("cpu", torch.long)
    if ids.numel() and (ids.min() < 0 or ids.max() >= num_blocks):
        raise ValueError(f"{source} holds ids outside [0, {num_blocks}): [{int(ids.min())}, {int(ids.max())}]")
    ids = torch.unique(ids)
    if ids.numel() >= num_blocks:
        raise ValueError(f"{source} removes all {num_blocks} blocks")
    return ids


def _read_removed_ids(directory: Path, config: dict) -> torch.Tensor | None:
    """The removed block ids saved in an index folder (None when it has none), checked against its config."""
    path = directory / REMOVED_IDS_NAME
    expected = config.get("num_removed", 0)
    if not path.is_file():
        if expected:
            raise FileNotFoundError(
                f"{directory / INDEX_CONFIG_NAME} says {expected} blocks were removed but {path} is missing"
            )
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        ids = load_file(str(path)).get("removed_ids")
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error})") from error
    if ids is None:
        raise ValueError(f"{path} has no tensor 'removed_ids'")
    ids = _check_removed_ids(ids, config["num_blocks"], source=str(path))
    if ids.numel() != expected:
        raise ValueError(f"{path} holds {ids.numel()} removed ids but {directory / INDEX_CONFIG_NAME} says {expected}")
    return ids


def _query_tensor(query_emb) -> torch.Tensor:
    """A numpy query array as a tensor (sharing its memory); anything else as it is."""
    return torch.from_numpy(query_emb) if isinstance(query_emb, np.ndarray) else query_emb


def _check_search_args(query_emb: torch.Tensor, k, dim: int, num_blocks: int) -> int:
    """Refuse queries that are not a float tensor [num_queries, dim] and a k outside [1, num_blocks] -> k as an int
    (numpy and 0-d tensor ints accepted)."""
    if not isinstance(query_emb, torch.Tensor):
        raise TypeError(
            f"query_emb must be a torch.Tensor or numpy array [num_queries, dim={dim}], got {type(query_emb)}"
        )
    if query_emb.dim() != 2 or query_emb.shape[1] != dim or not query_emb.is_floating_point():
        raise ValueError(
            f"query_emb must be float [num_queries, dim={dim}], got {query_emb.dtype} {tuple(query_emb.shape)}"
        )
    if isinstance(k, (np.integer, torch.Tensor)) and not isinstance(k, bool):
        k = int(k)  # numpy / 0-d tensor ints from callers
    if not isinstance(k, int) or not 1 <= k <= num_blocks:
        raise ValueError(f"k must be an int in [1, num_blocks={num_blocks}], got k={k!r}")
    return k


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"missing index config {path}")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"corrupted index config {path}: not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"corrupted index config {path}: expected a JSON object")
    for key, kind in _CONFIG_KEYS.items():
        if not isinstance(config.get(key), kind):
            raise ValueError(f"corrupted index config {path}: '{key}' missing or not {kind.__name__}")
    if config["format_version"] > FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {config['format_version']}; this code reads <= {FORMAT_VERSION}")
    if config["index_type"] not in INDEX_TYPES:
        raise ValueError(f"{path} has unknown index_type '{config['index_type']}', expected one of {INDEX_TYPES}")
    unknown = sorted(set(config["params"]) - set(_PARAM_DEFAULTS[config["index_type"]]))
    if unknown:
        raise ValueError(f"{path} has unknown params {unknown} for index type '{config['index_type']}'")
    num_shards = config.get("num_shards", 1)
    if not isinstance(num_shards, int) or num_shards < 1 or (num_shards > 1 and config["index_type"] != "exact"):
        raise ValueError(f"corrupted index config {path}: num_shards={num_shards!r} (an int >= 1; > 1 only for exact)")
    return config


def _mmap_safetensors(path: Path) -> tuple[torch.Tensor, np.memmap]:
    """Memory-map the 'block_emb' tensor of a safetensors file: [N, D] tensor backed by the file's pages."""
    if not path.is_file():
        raise FileNotFoundError(f"missing block embeddings {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_len = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 < header_len <= min(MAX_SAFETENSORS_HEADER, size - 8):
            raise ValueError(
                f"{path} is not a safetensors file: header length {header_len} is not within 1 to "
                f"{min(MAX_SAFETENSORS_HEADER, size - 8)} (the file's size, and safetensors' limit)"
            )
        try:
            entry = json.loads(f.read(header_len)).get("block_emb")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
            raise ValueError(f"{path} has a corrupted safetensors header ({error})") from error
    if not isinstance(entry, dict) or entry.get("dtype") not in _ST_DTYPES:
        raise ValueError(f"{path} has no float tensor 'block_emb' (supported dtypes: {sorted(_ST_DTYPES)})")
    try:
        shape, (begin, end) = [int(n) for n in entry["shape"]], [int(n) for n in entry["data_offsets"]]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} has a corrupted safetensors header ({error!r})") from error
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"{path}: block_emb must be 2-D and non-empty [num_blocks, dim], got shape {shape}")
    np_dtype, torch_dtype = _ST_DTYPES[entry["dtype"]]
    offset = 8 + header_len + begin
    if end - begin != shape[0] * shape[1] * np.dtype(np_dtype).itemsize or 8 + header_len + end > size:
        raise ValueError(f"{path} is truncated or inconsistent: block_emb {shape} does not match its data range")
    # Copy-on-write mapping: pages are read lazily, shared with the page cache, and torch gets a writable array.
    mmap = np.memmap(path, dtype=np_dtype, mode="c", offset=offset, shape=tuple(shape))
    return torch.from_numpy(mmap).view(torch_dtype), mmap


# Least bytes a faiss index of each type stores per vector: float32 vectors (flat storage), or a code of >= 1 byte
# (PQ; IVF lists add an 8-byte id per vector).
_MIN_BYTES_PER_VECTOR = {
    "flat": lambda d: 4 * d,
    "hnsw": lambda d: 4 * d,
    "ivf": lambda d: 4 * d + 8,
    "ivfpq": lambda d: 1 + 8,
    "pq": lambda d: 1,
}


def _check_faiss_header(path: Path, index_type: str, shape: torch.Size) -> None:
    """Compare what the file's header claims with the index config and the file's size before faiss reads it: faiss
    allocates what a header claims (a 45-byte file claiming 3 << 28 vectors makes it allocate 3 GiB, a larger claim
    ends in a bare bad_alloc). Every faiss index starts with fourcc (4 bytes), d (int32) and ntotal (int64)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(16)
    if len(header) < 16:
        raise ValueError(f"{path} is not a faiss index (only {size} bytes)")
    d, ntotal = struct.unpack("<i", header[4:8])[0], struct.unpack("<q", header[8:16])[0]
    if (ntotal, d) != tuple(shape):
        raise ValueError(
            f"{path}'s header claims {ntotal} x {d} vectors but the block embeddings are {shape[0]} x {shape[1]}: "
            "the file is corrupted or belongs to another index"
        )
    least = shape[0] * _MIN_BYTES_PER_VECTOR[index_type](shape[1])
    if size < least:
        raise ValueError(f"{path} is truncated: {size} bytes cannot hold {shape[0]} {index_type} vectors ({least}+)")


_FAISS_LIMITS_LOCK = threading.Lock()  # the deserialization limits are process-wide settings of faiss


def _faiss_byte_limit(path: Path, index_type: str, dim: int, params: dict) -> int:
    """The most bytes faiss may allocate at once while reading `path`: a vector stored in the file cannot be longer
    than the file. One allocation is derived rather than read: an IVFPQ index's precomputed table (nlist x pq_m x
    2**pq_bits floats), which faiss checks against the same limit; its sizes come from the index config, each bounded
    by the file, which stores nlist coarse centroids and 2**pq_bits PQ centroids of `dim` floats."""
    size = path.stat().st_size
    if index_type != "ivfpq":
        return size
    try:
        nlist, pq_m, pq_bits = (int(params[name]) for name in ("nlist", "pq_m", "pq_bits"))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: the index config's ivfpq params lack nlist, pq_m or pq_bits ({error!r})") from error
    if not (0 < nlist and 0 < pq_m <= dim and 0 < pq_bits < 64) or max(nlist, 2**pq_bits) * dim * 4 > size:
        raise ValueError(
            f"{path} ({size:,} bytes) cannot hold the IVFPQ index its config describes (nlist={nlist}, pq_m={pq_m}, "
            f"pq_bits={pq_bits}, dim={dim}): the file or its index_config.json is corrupted"
        )
    return max(size, (nlist * pq_m * 2**pq_bits + 1) * 4)  # faiss wants the table's floats below limit / 4


def _read_faiss_bounded(path: Path, byte_limit: int):
    """faiss.read_index(path) with faiss's deserialization limits lowered for this read: no vector longer than
    byte_limit bytes, no loop over more entries (lists, levels) than the file has bytes. faiss's defaults (1 TiB per
    vector, no loop limit) let a crafted length inside the file decide what is allocated before the read fails. The
    limits in force before are restored afterwards; a faiss without a limit's setter reads without it."""
    size = path.stat().st_size
    limits = [
        (
            getattr(faiss, f"get_deserialization_{name}_limit"),
            getattr(faiss, f"set_deserialization_{name}_limit"),
            value,
        )
        for name, value in (("vector_byte", byte_limit + 1), ("loop", size + 1))
        if hasattr(faiss, f"set_deserialization_{name}_limit")
    ]
    with _FAISS_LIMITS_LOCK:
        before = [get() for get, _, _ in limits]
        for (_, set_limit, value), old in zip(limits, before):
            set_limit(min(old, value) if old else value)  # 0: no limit
        try:
            return faiss.read_index(str(path))
        except RuntimeError as error:
            reason = str(error).strip().splitlines()[-1]
            if "deserialization" in reason:
                raise ValueError(
                    f"{path} is corrupted: a length inside it exceeds what its {size:,} bytes can hold ({reason})"
                ) from error
            raise ValueError(f"{path} is not a readable faiss index ({reason})") from error
        except MemoryError as error:
            raise ValueError(f"{path} is not a readable faiss index (faiss ran out of memory reading it)") from error
        finally:
            for (_, set_limit, _), old in zip(limits, before):
                set_limit(old)


def _read_faiss(path: Path, index_type: str, shape: torch.Size, params: dict):
    _require_faiss(index_type)
    if not path.is_file():
        raise FileNotFoundError(f"missing faiss index {path} (needed by index type '{index_type}')")
    _check_faiss_header(path, index_type, shape)
    index = _read_faiss_bounded(path, _faiss_byte_limit(path, index_type, shape[1], params))
    if not isinstance(index, getattr(faiss, _FAISS_CLASSES[index_type])):
        raise ValueError(
            f"{path} holds a {type(index).__name__}, expected {_FAISS_CLASSES[index_type]} for '{index_type}'"
        )
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"{path} does not use the inner-product metric")
    if (index.ntotal, index.d) != tuple(shape):
        raise ValueError(
            f"{path} holds {index.ntotal} x {index.d} vectors but the block embeddings are {shape[0]} x {shape[1]}"
        )
    return index


__all__ = [
    "BLOCK_EMB_NAME",
    "BUILD_INFO_NAME",
    "INDEX_SUBDIR",
    "VERSION_PATTERN",
    "index_folder",
    "is_index_version",
    "latest_index_dir",
    "list_versions",
    "version_dir_name",
    "version_names",
    "weights_fingerprint",
    "FAISS_INDEX_NAME",
    "HALF_PRECISION_RERANK",
    "INDEX_CONFIG_NAME",
    "INDEX_TYPES",
    "REMOVED_IDS_NAME",
    "default_chunk_size",
    "RealmBlockIndex",
    "resolve_index_params",
    "save_block_emb_shard",
    "shard_file_name",
    "ShardedBlockIndex",
    "torch_exact_search",
    "write_sharded_index",
]
