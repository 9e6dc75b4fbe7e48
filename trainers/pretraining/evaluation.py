"""Does REALM pre-training learn? Retrieval utility and recall on a fixed set of masked queries (paper section 4.5,
Figure 4).

    queries = fixed_masked_queries(tokenizer, blocks, num_queries=256, seed=0)
    metrics = evaluate_pretraining(model, tokenizer, blocks, queries)   # a fresh exact index from model.embedder
    trainer.add_callback(PretrainingEvalCallback(queries, tokenizer, blocks, eval_steps=50))

A query is one masked sentence drawn from a corpus block, as in training (`SalientSpanCollator`, seeded once, so every
evaluation scores the same queries). Its answer blocks are the other blocks whose text contains the masked span: the
knowledge the encoder could copy the span from (the query's own block is the trivial retrieval, excluded as in
training).

Metrics (`evaluate_pretraining`):
- `recall@k`: fraction of queries with an answer block among the top k blocks retrieved (own block excluded).
- `retrieval_utility` (Google's model.py, per masked token): log p(y|x) marginalised over the K candidates minus
  log p(y|null document, x); > 0 when the retrieved documents help the encoder.
- `mlm_loss` (-mean marginal log p(y|x)), `mlm_accuracy` (argmax of the marginal p(y|x) = the masked token),
  `null_doc_prob` (mean p(null|x)), `retrieval_entropy` (mean entropy of p(z|x) over the K candidates, nats),
  `answer_in_candidates` (fraction of examples whose K candidates hold an answer block), `num_queries`,
  `num_answerable` (queries with an answer block somewhere), `num_tokens`.

By default the candidates come from a fresh exact index of the current embedder (what a refresh would give); pass
`index` and `query_embedder` (e.g. the pair a training run is using) to score the candidates a stale index gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from openrealm import RealmBlockIndex
from openrealm.tokenization.masking import SalientSpanCollator
from openrealm.trainers.embedding import embed_queries, exact_index
from openrealm.trainers.pretraining import NUM_CANDIDATES, QUERY_SEQ_LEN, RealmPretrainingExamples
from openrealm.trainers.stage_utils import eval_mode

RECALL_K = 8
QUERY_KEYS = ("query_input_ids", "query_attention_mask", "labels", "block_id")


def held_out_query_blocks(blocks, num_blocks: int, seed: int = 0, removed: Sequence[int] = ()) -> list[int]:
    """`num_blocks` block ids drawn (seeded) among the blocks with a salient span, ascending: blocks whose sentences
    pre-training never uses as queries (`train pretrain --hold-out-queries`) while they stay retrievable, so that
    `fixed_masked_queries(..., block_ids=...)` scores the retriever on queries it never trained on. removed: the ids
    `corpus remove` removed (never retrievable), which are not drawn."""
    if num_blocks < 0:
        raise ValueError(f"the number of held-out query blocks must be >= 0, got {num_blocks}")
    starts = blocks.with_format("arrow")["span_char_starts"] if hasattr(blocks, "with_format") else None
    if starts is not None:
        import pyarrow.compute as pc

        with_spans = np.flatnonzero(pc.greater(pc.list_value_length(starts), 0).to_numpy(zero_copy_only=False))
    else:
        with_spans = np.asarray([i for i, row in enumerate(blocks) if len(row["span_char_starts"])], dtype=np.int64)
    if len(removed):
        with_spans = np.setdiff1d(with_spans, np.asarray(removed, dtype=np.int64))
    if num_blocks > len(with_spans):
        raise ValueError(
            f"{num_blocks} held-out query blocks asked for, but only {len(with_spans)} have a salient span"
        )
    chosen = np.random.default_rng(seed).permutation(with_spans)[:num_blocks]
    return sorted(int(i) for i in chosen)


def fixed_masked_queries(
    tokenizer,
    blocks,
    num_queries: int = 256,
    seed: int = 0,
    strategy: str = "salient",
    query_seq_len: int = QUERY_SEQ_LEN,
    block_ids: Sequence[int] | None = None,
    queries_per_block: int = 1,
) -> dict[str, Any]:
    """One masked query from each of `num_queries` blocks drawn without replacement (at most all), masks drawn once;
    `block_ids`: draw from these blocks only (e.g. `held_out_query_blocks`); `queries_per_block`: that many draws of
    each block (other sentences and spans; a draw repeating an earlier one of its block is dropped).

    Returns `SalientSpanCollator`'s batch (`query_input_ids`, `query_attention_mask`, `labels` [Q, Lq], `block_id`
    [Q], `uid`, `query_text`, `span`...) for the Q <= num_queries blocks that gave a query, plus `span_text` (the
    masked text) and `answer_block_ids` (per query: the other blocks whose text contains span_text).
    """
    pool = np.arange(len(blocks)) if block_ids is None else np.asarray(block_ids, dtype=np.int64)
    order = pool[np.random.default_rng(seed).permutation(len(pool))[: min(num_queries, len(pool))]]
    order = np.repeat(np.sort(order), queries_per_block)
    rows = blocks.select(order.tolist()) if hasattr(blocks, "select") else [blocks[i] for i in order]
    queries = SalientSpanCollator(tokenizer, strategy=strategy, seed=seed, query_seq_len=query_seq_len)(list(rows))
    if queries_per_block > 1:
        queries = _first_of_each_draw(queries)
    if not queries["uid"]:
        raise ValueError(f"none of the {len(order)} sampled blocks gave a masked query (no salient spans?)")
    texts = blocks["text"] if hasattr(blocks, "column_names") else [row["text"] for row in blocks]
    queries["span_text"] = [text[s:e] for text, (s, e) in zip(queries["query_text"], queries["span"].tolist())]
    queries["answer_block_ids"] = answer_block_ids(texts, queries["block_id"].tolist(), queries["span_text"])
    return queries


def _first_of_each_draw(queries: dict[str, Any]) -> dict[str, Any]:
    """The collator's batch without the queries that repeat an earlier one (same block, sentence and span)."""
    seen, keep = set(), []
    for row, key in enumerate(zip(queries["block_id"].tolist(), queries["query_text"], queries["span"].tolist())):
        if (key[0], key[1], tuple(key[2])) not in seen:
            seen.add((key[0], key[1], tuple(key[2])))
            keep.append(row)
    return {
        name: value[keep]
        if isinstance(value, torch.Tensor)
        else [value[row] for row in keep]
        if isinstance(value, list) and len(value) == len(queries["uid"])
        else value
        for name, value in queries.items()
    }


def answer_block_ids(texts: Sequence[str], own_block_ids: Sequence[int], spans: Sequence[str]) -> list[list[int]]:
    """Per query: the blocks other than its own whose text contains its masked span (what the encoder could copy the
    span from). texts: every block's text; own_block_ids, spans: one per query."""
    return [
        [i for i, text in enumerate(texts) if i != own and span in text] for own, span in zip(own_block_ids, spans)
    ]


def query_rows(queries: dict[str, Any], rows: slice | Sequence[int]) -> dict[str, Any]:
    """The queries `rows` (a slice, or row numbers in any order) of `fixed_masked_queries` output, as
    `RealmPretrainingExamples` takes them."""
    if isinstance(rows, slice):
        uids = queries["uid"][rows]
    else:
        rows = list(rows)
        uids = [queries["uid"][row] for row in rows]
    return {key: queries[key][rows] for key in QUERY_KEYS} | {"uid": uids}


@torch.no_grad()
def recall_at_k(query_embedder, index: RealmBlockIndex, queries: dict[str, Any], k: int = RECALL_K) -> float:
    """Fraction of queries with an answer block among the k best blocks of `index`, the query's own block excluded."""
    query_emb = embed_queries(query_embedder, queries["query_input_ids"], queries["query_attention_mask"])
    _, ids = index.search(query_emb, min(k + 1, index.num_blocks))
    hits = 0
    for own, retrieved, answers in zip(queries["block_id"].tolist(), ids.tolist(), queries["answer_block_ids"]):
        top = [i for i in retrieved if i != own][:k]
        hits += bool(set(top) & set(answers))
    return hits / len(ids)


@torch.no_grad()
def evaluate_pretraining(
    model,
    tokenizer,
    blocks,
    queries: dict[str, Any],
    *,
    index: RealmBlockIndex | None = None,
    query_embedder=None,
    k: int = RECALL_K,
    num_candidates: int = NUM_CANDIDATES,
    batch_size: int = 32,
) -> dict[str, float]:
    """Retrieval utility, recall@k and MLM metrics of a `RealmPretrainingModel` on `fixed_masked_queries` output.

    index / query_embedder: the (index, embedder it was built with) choosing the candidates; default a fresh exact
    index of model.embedder. The model runs in eval mode (no dropout) and is put back in its mode.
    """
    if index is None:
        index, query_embedder = exact_index(model.embedder, blocks, tokenizer), model.embedder
    elif query_embedder is None:
        raise ValueError("pass the query_embedder the index was built with along with the index")
    with eval_mode(model):
        metrics = {f"recall@{k}": recall_at_k(query_embedder, index, queries, k)}
        examples = RealmPretrainingExamples(tokenizer, blocks, query_embedder, index, num_candidates=num_candidates)
        metrics.update(_mlm_metrics(model, examples, queries, batch_size))
    metrics["num_queries"] = len(queries["uid"])
    metrics["num_answerable"] = sum(bool(ids) for ids in queries["answer_block_ids"])
    return metrics


def _mlm_metrics(model, examples: RealmPretrainingExamples, queries: dict[str, Any], batch_size: int) -> dict:
    answers = dict(zip(queries["uid"], queries["answer_block_ids"]))
    sums = {
        "utility": 0.0,
        "log_prob": 0.0,
        "correct": 0,
        "tokens": 0,
        "null_prob": 0.0,
        "entropy": 0.0,
        "found": 0,
        "examples": 0,
    }
    device = next(model.parameters()).device
    for start in range(0, len(queries["uid"]), batch_size):
        batch = examples(query_rows(queries, slice(start, start + batch_size)))
        if not batch["uid"]:
            continue
        batch = {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
        output = model(**batch, return_predictions=True)
        predicted = output.predicted_tokens
        mask = batch["labels"] != -100
        sums["utility"] += float((output.marginal_log_prob - output.token_log_prob[:, 0]).sum())
        sums["log_prob"] += float(output.marginal_log_prob.sum())
        sums["correct"] += int((predicted == batch["labels"][mask]).sum())
        sums["tokens"] += int(mask.sum())
        sums["null_prob"] += float(output.candidate_log_prob[:, 0].exp().sum())
        sums["entropy"] += float(output.retrieval_entropy) * len(batch["uid"])
        for uid, candidates in zip(batch["uid"], batch["candidate_block_ids"].tolist()):
            sums["found"] += bool(set(candidates) & set(answers[uid]))
        sums["examples"] += len(batch["uid"])
    tokens, count = max(sums["tokens"], 1), max(sums["examples"], 1)
    return {
        "retrieval_utility": sums["utility"] / tokens,
        "mlm_loss": -sums["log_prob"] / tokens,
        "mlm_accuracy": sums["correct"] / tokens,
        "null_doc_prob": sums["null_prob"] / count,
        "retrieval_entropy": sums["entropy"] / count,
        "answer_in_candidates": sums["found"] / count,
        "num_tokens": sums["tokens"],
    }


class PretrainingEvalCallback(TrainerCallback):
    """Every `eval_steps` steps (and before the first), `evaluate_pretraining` on fixed queries, logged into
    `state.log_history` as {"step", "eval_<metric>"...} entries (the paper's Figure 4 curves: utility, recall vs step).

    stale: also score the candidates of the index the run is using (`refresh.examples`: its index and query embedder),
    logged as `eval_stale_<metric>`; pass the `IndexRefreshCallback` as `refresh`.
    """

    def __init__(
        self,
        queries: dict[str, Any],
        tokenizer,
        blocks,
        eval_steps: int,
        refresh=None,
        k: int = RECALL_K,
        batch_size: int = 32,
    ):
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be a positive number of steps, got {eval_steps}")
        self.queries, self.tokenizer, self.blocks = queries, tokenizer, blocks
        self.eval_steps, self.refresh, self.k, self.batch_size = eval_steps, refresh, k, batch_size
        self.history: list[dict[str, float]] = []

    def evaluate(self, model, step: int) -> dict[str, float]:
        model = getattr(model, "module", model)
        entry = {"step": step}
        options = {"k": self.k, "batch_size": self.batch_size}
        metrics = evaluate_pretraining(model, self.tokenizer, self.blocks, self.queries, **options)
        entry.update({f"eval_{name}": round(value, 5) for name, value in metrics.items()})
        if self.refresh is not None:
            examples = self.refresh.examples
            stale = evaluate_pretraining(
                model,
                self.tokenizer,
                self.blocks,
                self.queries,
                index=examples.index,
                query_embedder=examples.query_embedder,
                **options,
            )
            entry.update({f"eval_stale_{name}": round(value, 5) for name, value in stale.items()})
        self.history.append(entry)
        return entry

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            state.log_history.append(self.evaluate(model, 0))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.eval_steps == 0:
            state.log_history.append(self.evaluate(model, state.global_step))


def curves(log_history: Sequence[dict], metric: str = "eval_retrieval_utility") -> tuple[list[int], list[float]]:
    """(steps, values) of one logged eval metric, e.g. to plot utility or recall against the step."""
    points = [(entry["step"], entry[metric]) for entry in log_history if metric in entry]
    return [step for step, _ in points], [value for _, value in points]


__all__ = [
    "PretrainingEvalCallback",
    "answer_block_ids",
    "curves",
    "evaluate_pretraining",
    "fixed_masked_queries",
    "held_out_query_blocks",
    "query_rows",
    "recall_at_k",
]
