"""REALM pre-training examples (Google's example_generator.py and featurization.py; paper section 3.2).

`RealmPretrainingExamples` turns a batch of masked queries (the output of `SalientSpanCollator`) into REALM examples:
it embeds the queries with the embedder snapshot the current index was built with, searches the top K, drops examples
whose K contain duplicate uids, removes the trivial candidate (the query's own block), prepends the null document and
cuts to K, then builds the candidates' retriever inputs and the joint (knowledge-augmented encoder) inputs.

Departures from Google's code: inputs are padded to the longest in the batch, not to Google's fixed 96 / 288 / 384
(TPUs need static shapes; padding is masked out of attention, so the numbers are the same); the query is embedded in
eval mode (no dropout), as Google's generator uses the inference graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from openrealm import RealmBlockIndex
from openrealm.tokenization.retriever_inputs import block_retriever_inputs
from openrealm.trainers.embedding import embed_queries
from openrealm.trainers.options import NUM_CANDIDATES

# Google's local_launcher.sh / model.py defaults.
QUERY_SEQ_LEN = 96


CANDIDATE_SEQ_LEN = 288


JOINT_SEQ_LEN = QUERY_SEQ_LEN + CANDIDATE_SEQ_LEN


NULL_BLOCK_ID = -1


COUNTERS = ("num_examples", "num_dropped_duplicate_uids", "num_trivial_retrieved")


def joint_inputs(
    query_ids: Sequence[int], body_ids: Sequence[int], tokenizer, max_length: int = JOINT_SEQ_LEN
) -> dict[str, list[int]]:
    """`[CLS] query [SEP] body [SEP]` (no title; Google's featurize_query_and_docs + pad_or_truncate_pair without
    the padding): the query (wordpieces, no special tokens) is cut first to max_length - 3, the body gets what
    remains. Segment 0 for `[CLS] query [SEP]`, 1 for `body [SEP]`. The null document gives `[CLS] query [SEP] [SEP]`.
    """
    return block_retriever_inputs(query_ids, body_ids, tokenizer, max_length)


def continuation_pieces(tokenizer) -> torch.Tensor:
    """[V] bool: which wordpiece ids continue a word ("##..."), for `holds_masked_span`'s word-boundary rule."""
    continuation = torch.zeros(max(len(tokenizer), 1), dtype=torch.bool)
    for piece, i in tokenizer.get_vocab().items():
        if piece.startswith("##") and i < len(continuation):
            continuation[i] = True
    return continuation


def _fetch_rows(blocks, ids: Sequence[int]) -> list[Mapping[str, Any]]:
    """Rows `title_ids`, `token_ids`, `uid` of the given block ids (a datasets.Dataset or a sequence of dicts)."""
    if not ids:
        return []
    if hasattr(blocks, "column_names"):  # datasets.Dataset: one batched read instead of one per row
        columns = blocks.select_columns(["title_ids", "token_ids", "uid"])[list(ids)]
        return [dict(zip(columns, values)) for values in zip(*columns.values())]
    return [blocks[i] for i in ids]


def _pad(rows: Sequence[Sequence[Sequence[int]]], value: int, num_candidates: int) -> torch.Tensor:
    """B lists of K id lists -> [B, K, longest] int64 filled with value."""
    length = max((len(ids) for example in rows for ids in example), default=1)
    out = torch.full((len(rows), num_candidates, length), value, dtype=torch.long)
    for b, example in enumerate(rows):
        for k, ids in enumerate(example):
            out[b, k, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


class RealmPretrainingExamples:
    """Masked queries + (query embedder snapshot, index, corpus blocks) -> REALM pre-training batches.

    `blocks`: the corpus rows (`load_corpus(DIR)` or a list of dicts with `title_ids`, `token_ids`, `uid`), in block-id
    order, matching `index`. `query_embedder` must be the embedder `index` was built with (Google's
    refresh_doc_embeds.py: the query and document embeddings of one snapshot choose the candidates); swap both together
    with `update_index`.

    `__call__(queries)` takes `SalientSpanCollator`'s batch (`query_input_ids`, `query_attention_mask`, `labels`
    [B, Lq], `uid` list, `block_id` [B]) and returns, for the B' <= B kept examples:
    `query_input_ids`, `query_token_type_ids`, `query_attention_mask` [B', Lq'];
    `candidate_input_ids`, `candidate_token_type_ids`, `candidate_attention_mask` [B', K, Ld] (null first);
    `joint_input_ids`, `joint_token_type_ids`, `joint_attention_mask` [B', K, Lj];
    `labels` [B', Lj] (-100 = not predicted), `mlm_mask` [B', Lj]; `holds_answer` [B', K] (`holds_masked_span`: the
    candidate's body holds the masked words); `candidate_block_ids` [B', K] (-1 = null);
    `block_id` [B'], `uid` list; `index_version` int; `stats` {counter: count} of this batch.
    Lengths are the longest in the batch (at most 96 / 288 / 384), not Google's fixed ones (see the module doc).
    Counters accumulate in `self.counters` too.
    """

    def __init__(
        self,
        tokenizer,
        blocks,
        query_embedder: nn.Module,
        index: RealmBlockIndex,
        num_candidates: int = NUM_CANDIDATES,
        candidate_seq_len: int = CANDIDATE_SEQ_LEN,
        joint_seq_len: int = JOINT_SEQ_LEN,
    ):
        if num_candidates < 2:
            raise ValueError(f"num_candidates must be at least 2 (the null document + one), got {num_candidates}")
        self.tokenizer = tokenizer
        self.blocks = blocks
        self.num_candidates = num_candidates
        self.candidate_seq_len = candidate_seq_len
        self.joint_seq_len = joint_seq_len
        self.counters: Counter = Counter({name: 0 for name in COUNTERS})
        # wordpieces that continue a word ("##..."): a span matched in a block must not end inside a word
        self.continuation = continuation_pieces(tokenizer)
        self.update_index(query_embedder, index)

    def update_index(self, query_embedder: nn.Module, index: RealmBlockIndex) -> None:
        """Swap to a new (embedder snapshot, index) pair, built from the same parameters."""
        if index.num_blocks != len(self.blocks):
            raise ValueError(f"the index holds {index.num_blocks} blocks but the corpus has {len(self.blocks)}")
        if index.num_blocks < self.num_candidates:
            raise ValueError(f"num_candidates={self.num_candidates} exceeds the {index.num_blocks} indexed blocks")
        self.query_embedder = query_embedder
        self.index = index

    @torch.no_grad()
    def embed_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, Lq] -> [B, P], in eval mode (Google's generator runs the inference graph: no dropout)."""
        return embed_queries(self.query_embedder, input_ids, attention_mask)

    def __call__(self, queries: Mapping[str, Any]) -> dict[str, Any]:
        stats: Counter = Counter({name: 0 for name in COUNTERS})
        input_ids, attention_mask = queries["query_input_ids"], queries["query_attention_mask"]
        if len(input_ids):
            _, retrieved = self.index.search(self.embed_queries(input_ids, attention_mask), self.num_candidates)
            retrieved = retrieved.cpu().tolist()
        else:
            retrieved = []
            if getattr(self.index, "collective", False):  # a sharded index: every rank joins each search
                self.index.search(torch.zeros(0, self.index.dim), self.num_candidates)
        unique_ids = sorted({i for ids in retrieved for i in ids})
        by_id = dict(zip(unique_ids, _fetch_rows(self.blocks, unique_ids)))
        kept, candidates = [], []
        for b, ids in enumerate(retrieved):
            chosen = self._candidates(ids, by_id, queries["uid"][b], stats)
            if chosen is not None:
                kept.append(b)
                candidates.append(chosen)
        stats["num_examples"] = len(kept)
        self.counters.update(stats)
        return self._featurize(queries, kept, candidates, by_id, dict(stats))

    def with_candidates(self, queries: Mapping[str, Any], candidate_block_ids: Sequence[Sequence[int]]) -> dict:
        """`__call__`'s batch for every query, with the K candidates given (block ids, NULL_BLOCK_ID for the null
        document) instead of the index's top K: e.g. a block known to hold the masked span beside others, to score the
        reader apart from the retriever (trainers/pretraining/preflight.py). Counters are not updated."""
        candidates = [list(map(int, ids)) for ids in candidate_block_ids]
        if len(candidates) != len(queries["uid"]) or any(len(ids) != self.num_candidates for ids in candidates):
            raise ValueError(
                f"give {self.num_candidates} candidate block ids for each of the {len(queries['uid'])} queries"
            )
        unique_ids = sorted({i for ids in candidates for i in ids if i != NULL_BLOCK_ID})
        by_id = dict(zip(unique_ids, _fetch_rows(self.blocks, unique_ids)))
        stats = {name: 0 for name in COUNTERS} | {"num_examples": len(candidates)}
        return self._featurize(queries, list(range(len(candidates))), candidates, by_id, stats)

    def _candidates(
        self, ids: list[int], by_id: Mapping[int, Mapping], query_uid: str, stats: Counter
    ) -> list[int] | None:
        """Google's postprocess_candidates: None when the K share a uid; else the null doc + the non-trivial ids, cut
        to K."""
        uids = [by_id[i]["uid"] for i in ids]
        if len(set(uids)) < len(uids):
            stats["num_dropped_duplicate_uids"] += 1
            return None
        # Uids are unique here, so at most one candidate is the trivial retrieval (Google asserts it).
        kept = [i for i, uid in zip(ids, uids) if uid != query_uid]
        stats["num_trivial_retrieved"] += len(ids) - len(kept)
        return [NULL_BLOCK_ID, *kept][: self.num_candidates]

    def _featurize(
        self,
        queries: Mapping[str, Any],
        kept: list[int],
        candidates: list[list[int]],
        by_id: Mapping[int, Mapping],
        stats: dict[str, int],
    ) -> dict[str, Any]:
        tok = self.tokenizer
        query_mask = queries["query_attention_mask"][kept].bool()
        query_length = int(query_mask.sum(1).max()) if kept else 1
        retriever, joint = [], []
        for row, (b, block_ids) in enumerate(zip(kept, candidates)):
            # The query's wordpieces without [CLS]/[SEP]: at most 94, so they are never cut in the joint input.
            query_ids = queries["query_input_ids"][b][query_mask[row]].tolist()[1:-1]
            empty = {"title_ids": [], "token_ids": []}
            docs = [by_id[i] if i != NULL_BLOCK_ID else empty for i in block_ids]
            retriever.append(
                [block_retriever_inputs(d["title_ids"], d["token_ids"], tok, self.candidate_seq_len) for d in docs]
            )
            joint.append([joint_inputs(query_ids, d["token_ids"], tok, self.joint_seq_len) for d in docs])
        batch: dict[str, Any] = {
            "query_input_ids": queries["query_input_ids"][kept, :query_length],
            "query_token_type_ids": torch.zeros((len(kept), query_length), dtype=torch.long),
            "query_attention_mask": queries["query_attention_mask"][kept, :query_length],
        }
        pads = {"input_ids": tok.pad_token_id, "token_type_ids": 0, "attention_mask": 0}
        for prefix, inputs in (("candidate", retriever), ("joint", joint)):
            for name, value in pads.items():
                ids = [[x[name] for x in example] for example in inputs]
                batch[f"{prefix}_{name}"] = _pad(ids, value, self.num_candidates)
        joint_length = batch["joint_input_ids"].shape[-1]
        labels = torch.full((len(kept), joint_length), -100, dtype=torch.long)
        # The query comes first in the joint input, so its label positions are valid there as they are.
        width = min(joint_length, queries["labels"].shape[1])
        labels[:, :width] = queries["labels"][kept, :width]
        batch.update(
            labels=labels,
            mlm_mask=(labels != -100).long(),
            holds_answer=holds_masked_span(
                batch["joint_input_ids"],
                batch["joint_token_type_ids"],
                labels,
                labels != -100,
                self.continuation,
                tok.unk_token_id,
            ),
            # Every kept example has exactly K candidates; a fixed width also shapes an all-dropped batch [0, K].
            candidate_block_ids=torch.tensor(candidates, dtype=torch.long).reshape(len(kept), self.num_candidates),
            block_id=torch.as_tensor(queries["block_id"])[kept],
            uid=[queries["uid"][b] for b in kept],
            index_version=self.index.version,
            stats=stats,
        )
        return batch


def batch_on(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A REALM batch with its tensors on `device` (its lists and counters as they are)."""
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


def holds_masked_span(
    joint_input_ids: torch.Tensor,
    joint_token_type_ids: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    continuation: torch.Tensor | None = None,
    unknown_id: int | None = None,
) -> torch.Tensor:
    """[B, K] bool: whether candidate k's body (segment 1 of the joint input) holds example b's masked wordpieces, each
    run of consecutive masked positions as consecutive wordpieces (a salient span is one run), not followed by a
    wordpiece that `continuation` [V] marks as continuing a word ("##..."): "paris" is not held by "parish". The null
    document, whose body is empty, never does, and `unknown_id` ([UNK]: any word out of the vocabulary) never matches.
    What the oracle reader reads: a reader can copy only what it is shown."""
    batch_size, num_candidates, length = joint_input_ids.shape
    unmatched = joint_token_type_ids != 1
    if unknown_id is not None:
        unmatched |= joint_input_ids == unknown_id
    body = joint_input_ids.masked_fill(unmatched, -1)  # [B, K, Lj]; -1 never matches a wordpiece
    if continuation is not None:  # [B, K, Lj]: the next wordpiece continues a word
        inside = continuation[joint_input_ids.clamp(0, len(continuation) - 1)] & (joint_token_type_ids == 1)
        ends_inside = torch.cat([inside[..., 1:], torch.zeros_like(inside[..., :1])], -1)
    found = torch.ones(batch_size, num_candidates, dtype=torch.bool, device=body.device)
    for b in range(batch_size):
        positions = mask[b].nonzero().flatten().tolist()
        if not positions:
            found[b] = False
            continue
        runs, start = [], 0
        for i in range(1, len(positions) + 1):
            if i == len(positions) or positions[i] != positions[i - 1] + 1:
                runs.append(labels[b, positions[start] : positions[i - 1] + 1])
                start = i
        for run in runs:
            if run.numel() > length:
                found[b] = False
                break
            windows = body[b].unfold(-1, run.numel(), 1)  # [K, Lj - n + 1, n]
            matches = (windows == run.to(body.device)).all(-1)  # [K, Lj - n + 1], by start position
            if continuation is not None:
                matches &= ~ends_inside[b, :, run.numel() - 1 :]
            found[b] &= matches.any(-1)
    return found


__all__ = [
    "CANDIDATE_SEQ_LEN",
    "COUNTERS",
    "JOINT_SEQ_LEN",
    "NULL_BLOCK_ID",
    "QUERY_SEQ_LEN",
    "RealmPretrainingExamples",
    "batch_on",
    "continuation_pieces",
    "holds_masked_span",
    "joint_inputs",
]
