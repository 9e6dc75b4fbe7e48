"""Embedding with a REALM embedder, one function of each kind: every block of a corpus (`embed_corpus`, sorted by
length, sharded over processes, bf16 autocast on CUDA), query input ids (`embed_queries`), and an exact index over a
whole corpus (`exact_index`). `openrealm index build`, the pre-training refresh, ICT's evaluation, open-QA and the
benchmarks all embed through these.

Departures from Google's encoder (refresh_doc_embeds.py; same embeddings, faster): blocks are sorted by length and
each batch is padded to its longest block instead of to 288 (padding is masked, so a row's embedding does not depend
on its batch), and bf16/fp16 autocast is used where the device supports it (default on CUDA; float32 on CPU).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch

from openrealm import RealmBlockIndex, ShardedBlockIndex
from openrealm.tokenization.retriever_inputs import batch_retriever_inputs
from openrealm.trainers.options import DTYPE_NAMES, MAX_BLOCK_LENGTH
from openrealm.trainers.stage_utils import eval_mode

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


# On CUDA a half-precision dtype runs a copy of the embedder cast to it rather than autocast, under which LayerNorm
# and the residual sums run in float32 and every linear layer casts its input again: half the activation bytes.
CAST_WEIGHTS_ON_CUDA = True
GATHER_CHUNK_ROWS = 2**18  # rows all-gathered at a time: peak extra memory world_size * 2^18 * dim floats


def arrow_table(blocks):
    """The pyarrow table behind a blocks dataset (row i = block i), or blocks itself if it is a pyarrow table."""
    if hasattr(blocks, "_indices") and blocks._indices is not None:  # a select()/shuffle() view: rows != block ids
        raise ValueError("pass the corpus blocks dataset itself (corpus.load_corpus), not a select()/shuffle() view")
    return blocks.data.table if hasattr(blocks, "data") else blocks


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

    table = arrow_table(blocks)
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


def embed_corpus(
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
    mode under inference_mode, with autocast to dtype unless float32 ('auto': bf16 on CUDA, float32 elsewhere); on
    CUDA a half dtype runs a copy of the embedder cast to it (CAST_WEIGHTS_ON_CUDA).
    """
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else next(embedder.parameters()).device
    compute_dtype = resolve_dtype(dtype, device)
    start, stop = shard_range(len(arrow_table(blocks)), *shard)
    dim = embedder.config.retriever_proj_size
    out = torch.empty(stop - start, dim, dtype=torch.float32)
    if stop == start:
        return out
    table = arrow_table(blocks)
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
    if compute_dtype != torch.float32 and device.type == "cuda" and CAST_WEIGHTS_ON_CUDA:
        embedder, autocast = copy.deepcopy(embedder).to(dtype=compute_dtype), nullcontext()
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    name = "embedding" if shard[1] == 1 else f"embedding shard {shard[0] + 1}/{shard[1]}"
    bar = tqdm(total=stop - start, unit="block", desc=name, disable=not progress)
    with eval_mode(embedder), torch.inference_mode(), autocast:
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


def gather_shards(local: torch.Tensor, num_blocks: int, state=None) -> torch.Tensor | None:
    """Join every rank's embed_corpus output [N_shard, P] into [num_blocks, P] in block order (on the main process;
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


@torch.no_grad()
def embed_queries(
    embedder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, batch_size: int | None = None
) -> torch.Tensor:
    """Query inputs [Q, Lq] (`[CLS] query [SEP]`, right-padded) -> embeddings [Q, P] float32 on the embedder's device,
    in eval mode (no dropout: Google's example generator runs the inference graph), `batch_size` rows at a time (all
    at once by default). Padding past the longest query of a batch is cut first (it changes nothing)."""
    device = next(embedder.parameters()).device
    step = batch_size or max(len(input_ids), 1)
    out = []
    with eval_mode(embedder):
        for start in range(0, len(input_ids), step):
            ids, mask = input_ids[start : start + step], attention_mask[start : start + step]
            length = max(int(mask.sum(1).max()), 1)
            ids, mask = ids[:, :length].to(device), mask[:, :length].to(device)
            out.append(embedder(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).projected_score)
    if not out:
        return torch.zeros(0, embedder.config.retriever_proj_size, device=device)
    return torch.cat(out).float()


def exact_index(
    embedder: torch.nn.Module, blocks, tokenizer, max_length: int = MAX_BLOCK_LENGTH, batch_size: int = 128
) -> RealmBlockIndex:
    """An exact index of every block of `blocks` (a corpus blocks dataset) embedded by the embedder as it is now,
    blocks cut to min(max_length, the embedder's max_position_embeddings) wordpieces."""
    max_length = min(embedder.config.max_position_embeddings, max_length)
    emb = embed_corpus(embedder, blocks, tokenizer, batch_size=batch_size, max_length=max_length, progress=False)
    return RealmBlockIndex.build(emb, "exact")


__all__ = [
    "arrow_table",
    "block_lengths",
    "embed_corpus",
    "embed_queries",
    "exact_index",
    "gather_shards",
    "length_batches",
    "resolve_dtype",
    "shard_range",
]
