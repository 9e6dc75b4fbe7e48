"""The most REALM's masked-span signal can teach a retriever on a corpus: its ceiling, measured by training for it.

    losses = train_retriever_bound(embedder, tokenizer, blocks, steps=400, batch_size=16, learning_rate=3e-4)

REALM's retriever gradient comes from log p(y | x) = log sum_z p(y | z, x) p(z | x) over the K retrieved candidates
(paper section 2.3). With a perfect reader, p(y | z, x) is 1 for a block z that holds the masked span y and 0 for any
other, so the objective becomes log sum over the answer blocks of p(z | x); with every block a candidate instead of
the top K, nothing a stale index or a small K hides is missing. This trains the embedder alone on that objective: no
encoder, no index, the whole corpus embedded at every step (small corpora only), the query's own block excluded as
Google's trivial-candidate mask excludes it (model.py). A REALM run with a learned reader and top-K candidates gets
at most this signal, so a retriever trained here, scored on questions, is the bound a world sets on what REALM can
show: benchmarks/research/world_where_topic_is_not_enough.md explains why the in-batch bound (one answer
block against the batch's other positives) is not that bound on a world where many blocks name the same entity.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from openrealm import RealmEmbedder
from openrealm.tokenization.masking import SalientSpanCollator
from openrealm.tokenization.retriever_inputs import block_retriever_inputs
from openrealm.trainers.pretraining.evaluation import answer_block_ids
from openrealm.trainers.pretraining.examples import CANDIDATE_SEQ_LEN


def perfect_reader_loss(scores: torch.Tensor, own_block_ids: Sequence[int], answers: Sequence[Sequence[int]]):
    """-log sum over answer blocks of p(z | x), p the softmax of `scores` [B, num_blocks] without each query's own
    block; answers: per query, the ids of the other blocks holding its masked span (none may be empty). Mean over
    the batch."""
    rows = torch.arange(len(own_block_ids))
    scores = scores.index_put((rows, torch.as_tensor(own_block_ids)), torch.tensor(float("-inf")))
    is_answer = torch.zeros_like(scores, dtype=torch.bool)
    for row, ids in enumerate(answers):
        is_answer[row, list(ids)] = True
    marginal = torch.logsumexp(scores.masked_fill(~is_answer, float("-inf")), dim=-1)
    return (torch.logsumexp(scores, dim=-1) - marginal).mean()


def answerable_queries(masker: SalientSpanCollator, records: list, texts: Sequence[str]) -> tuple[dict, list, list]:
    """One masked query per record (`masker`'s batch) and, per query, the other blocks whose text holds its masked span
    (texts: every block's text). Returns (batch, answers, rows), rows: the queries with at least one such block."""
    batch = masker(records)
    spans = [text[start:end] for text, (start, end) in zip(batch["query_text"], batch["span"].tolist())]
    answers = answer_block_ids(texts, batch["block_id"].tolist(), spans)
    return batch, answers, [row for row, ids in enumerate(answers) if ids]


def embed_query_rows(embedder: RealmEmbedder, batch: dict, rows: list[int]) -> torch.Tensor:
    """The retrieval embeddings [len(rows), P] of the batch's queries `rows`, with their gradient (training)."""
    query_ids = batch["query_input_ids"][rows]
    return embedder(
        query_ids, attention_mask=batch["query_attention_mask"][rows], token_type_ids=torch.zeros_like(query_ids)
    ).projected_score


def train_retriever_bound(
    embedder: RealmEmbedder,
    tokenizer,
    blocks,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    exclude_block_ids: Sequence[int] = (),
    callback: Callable[[int, RealmEmbedder], None] | None = None,
    callback_every: int = 0,
) -> list[float]:
    """Train `embedder` in place for `steps` steps of `batch_size` masked queries (salient spans, one sentence of a
    random block each, as pre-training draws them) on `perfect_reader_loss` over every block of `blocks` (a corpus
    blocks dataset); AdamW at `learning_rate`, weight decay 0.01 as pre-training's. Queries are not drawn from
    `exclude_block_ids` (held-out evaluation blocks); a step whose queries have no answer block elsewhere is
    skipped. callback(step, embedder) runs in eval mode at step 0, every `callback_every` steps (0: never) and at the
    end. Returns the loss of each step taken."""
    if steps < 0 or batch_size < 1:
        raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {steps} and {batch_size}")
    excluded = set(exclude_block_ids)
    sources = [i for i in range(len(blocks)) if i not in excluded]
    if len(sources) < batch_size:
        raise ValueError(f"{len(sources)} blocks to draw queries from, fewer than a batch of {batch_size}")
    texts = blocks["text"]
    candidates = [block_retriever_inputs(b["title_ids"], b["token_ids"], tokenizer, CANDIDATE_SEQ_LEN) for b in blocks]
    candidates = tokenizer.pad(candidates, return_tensors="pt")
    masker, rng = SalientSpanCollator(tokenizer, seed=seed), random.Random(seed)
    optimizer = torch.optim.AdamW(embedder.parameters(), lr=learning_rate, weight_decay=0.01)
    losses = []

    def report(step: int) -> None:
        if callback is not None:
            embedder.eval()
            callback(step, embedder)

    report(0)
    for step in range(1, steps + 1):
        embedder.train()
        batch, answers, rows = answerable_queries(masker, [blocks[i] for i in rng.sample(sources, batch_size)], texts)
        if rows:
            scores = embed_query_rows(embedder, batch, rows) @ embedder(**candidates).projected_score.T
            own = batch["block_id"][rows].tolist()
            loss = perfect_reader_loss(scores, own, [answers[row] for row in rows])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        if step == steps or (callback_every and step % callback_every == 0):
            report(step)
    embedder.eval()
    return losses


__all__ = ["answerable_queries", "embed_query_rows", "perfect_reader_loss", "train_retriever_bound"]
