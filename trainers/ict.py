"""ICT (Inverse Cloze Task) warm start of the REALM retriever (ORQA, Lee et al. 2019; Google's
language/orqa/models/ict_model.py).

    openrealm train ict --corpus DIR --init MODEL --output DIR --max-steps N [options]
    accelerate launch --num_processes P -m openrealm train ict ...      # negatives gathered across processes
    (CPU only: `accelerate launch --multi_gpu --num_processes P` or `torchrun --nproc-per-node P -m openrealm ...`;
    accelerate's `--cpu` starts a single process)

Each block of the knowledge corpus gives one example: a sentence chosen uniformly is the pseudo-query, and the block
(with that sentence removed, probability `mask_rate` = 0.9) is its positive; the blocks of the whole global batch are
the negatives. One `RealmEmbedder` embeds queries and blocks; the loss is softmax cross-entropy over q·bᵀ.

Training runs on transformers' `Trainer` (logging, checkpoints in OUTPUT/checkpoint-*, resume); the ICT logic lives in
`IctCollator` (examples built on the fly from corpus rows) and `IctModel` (embeddings, gathered negatives, loss). The
result is a `RealmEmbedder` folder (plus the corpus tokenizer) in OUTPUT: `RealmEmbedder.from_pretrained(OUTPUT)`.
The module is long because it is the whole stage in one file, as a transformers model file is: its collator, model,
loss, retrieval evaluation and job, none of which another stage uses (docs/ict.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from openrealm import RealmConfig, RealmEmbedder, RealmPreTrainedModel
from openrealm.tokenization.corpus_folder import load_corpus, read_removed_block_ids, without_rows
from openrealm.tokenization.retriever_inputs import block_retriever_inputs
from openrealm.trainers.checkpoints import (
    StagedCheckpointTrainer,
)
from openrealm.trainers.embedding import embed_corpus, embed_queries, exact_index
from openrealm.trainers.options import EMBEDDING_DROPOUT, MASK_RATE
from openrealm.trainers.output import quiet_trainer_logs
from openrealm.trainers.stage_utils import (
    google_training_arguments,
)
from openrealm.trainers.towers import freeze_unused_mlm_head

# Google's ORQA ICT defaults (orqa/experiments/ict_experiment.py, orqa/datasets/ict_dataset.py).
QUERY_SEQ_LEN = 64
BLOCK_SEQ_LEN = 288
CORPUS_COLUMNS = ("title_ids", "token_ids", "sentence_starts")
LABEL_NAMES = ["sentence_removed", "example_mask"]  # what Trainer hands compute_ict_metrics as label_ids


# ---------------------------------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------------------------------


def sentence_bounds(sentence_starts: Sequence[int], num_tokens: int, index: int) -> tuple[int, int]:
    """Wordpiece span [start, end) of sentence `index` in a block body of num_tokens wordpieces."""
    start = int(sentence_starts[index])
    end = int(sentence_starts[index + 1]) if index + 1 < len(sentence_starts) else num_tokens
    return start, end


def query_input_ids(sentence_ids: Sequence[int], tokenizer, max_length: int = QUERY_SEQ_LEN) -> list[int]:
    """`[CLS] sentence [SEP]`, the sentence truncated so the whole fits max_length (segment 0, no MLM masking)."""
    return [tokenizer.cls_token_id, *[int(i) for i in sentence_ids[: max_length - 2]], tokenizer.sep_token_id]


def block_inputs(title_ids: Sequence[int], token_ids: Sequence[int], tokenizer, max_length: int = BLOCK_SEQ_LEN):
    """`[CLS] title [SEP] body [SEP]` -> (input_ids, token_type_ids), lists of at most max_length (Google's
    featurization.py)."""
    encoded = block_retriever_inputs(title_ids, token_ids, tokenizer, max_length=max_length)
    return encoded["input_ids"], encoded["token_type_ids"]


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ragged rows -> (ids [B, L], attention_mask [B, L]) with L the longest row."""
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


@dataclass
class IctCollator:
    """Builds a batch of ICT examples from corpus rows (dicts with `title_ids`, `token_ids`, `sentence_starts`).

    Per row: a sentence chosen uniformly becomes `[CLS] sentence [SEP]` (query_seq_len); with probability mask_rate it
    is removed from the block, then `[CLS] title [SEP] block [SEP]` (block_seq_len). Google drops an example when
    the removal falls on a single-sentence block; here it stays in the batch with `example_mask` False and is left out
    of the loss, as query and as negative (so every process keeps the same batch shape for the gather).

    Returns tensors: query_input_ids, query_attention_mask [B, Lq]; block_input_ids, block_token_type_ids,
    block_attention_mask [B, Lb] (padded to the longest row); example_mask, sentence_removed [B] bool.
    Random choices come from a generator seeded with (seed, process_index), re-seeded inside each DataLoader worker;
    rows with `query_sentence` and `remove_sentence` columns (fixed_eval_examples) use those choices instead.
    """

    tokenizer: object
    query_seq_len: int = QUERY_SEQ_LEN
    block_seq_len: int = BLOCK_SEQ_LEN
    mask_rate: float = MASK_RATE
    seed: int = 0
    process_index: int = 0

    def __post_init__(self):
        if not 0.0 <= self.mask_rate <= 1.0:
            raise ValueError(f"mask_rate must be in [0, 1], got {self.mask_rate}")
        if self.query_seq_len < 3 or self.block_seq_len < 4:
            raise ValueError(
                f"query_seq_len must be >= 3 and block_seq_len >= 4, got {self.query_seq_len}, {self.block_seq_len}"
            )
        self.rng = np.random.default_rng([self.seed, self.process_index])
        self._worker_seed = None

    def _generator(self) -> np.random.Generator:
        worker = torch.utils.data.get_worker_info()
        if worker is not None and self._worker_seed != worker.seed:
            # Each worker holds a copy of this collator: without re-seeding they would all draw the same choices.
            self._worker_seed = worker.seed
            self.rng = np.random.default_rng([self.seed, self.process_index, worker.seed % 2**63])
        return self.rng

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        rng = self._generator()
        queries, blocks, segments, valid, removed = [], [], [], [], []
        for row in rows:
            token_ids, starts = row["token_ids"], row["sentence_starts"]
            num_sentences = len(starts)
            if "query_sentence" in row:  # choices fixed in advance (fixed_eval_examples)
                index, remove = int(row["query_sentence"]), bool(row["remove_sentence"])
            else:
                index = int(rng.integers(num_sentences)) if num_sentences else 0
                remove = bool(rng.random() < self.mask_rate)
            start, end = sentence_bounds(starts, len(token_ids), index) if num_sentences else (0, 0)
            body = list(token_ids)
            if remove and num_sentences > 1:
                body = body[:start] + body[end:]
            block_ids, block_segments = block_inputs(row["title_ids"], body, self.tokenizer, self.block_seq_len)
            queries.append(query_input_ids(token_ids[start:end], self.tokenizer, self.query_seq_len))
            blocks.append(block_ids)
            segments.append(block_segments)
            valid.append(num_sentences > 1 or (num_sentences == 1 and not remove))
            removed.append(remove and num_sentences > 1)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        query_ids, query_mask = pad_rows(queries, pad_id)
        block_ids, block_mask = pad_rows(blocks, pad_id)
        block_segments, _ = pad_rows(segments, 0)
        return {
            "query_input_ids": query_ids,
            "query_attention_mask": query_mask,
            "block_input_ids": block_ids,
            "block_token_type_ids": block_segments,
            "block_attention_mask": block_mask,
            "example_mask": torch.tensor(valid, dtype=torch.bool),
            "sentence_removed": torch.tensor(removed, dtype=torch.bool),
        }


# ---------------------------------------------------------------------------------------------------------------------
# Loss over the global batch
# ---------------------------------------------------------------------------------------------------------------------


def gather_across_processes(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This process's rows [n, ...] -> (every process's rows concatenated in rank order [N, ...], offset of ours).

    Gradients flow back to the rows of every process (an autograd-aware all_gather), as through Google's TPU
    `cross_shard_concat` of the block embeddings. Processes may hold different row counts (rows are padded for the
    collective, then cut). Without an initialised torch.distributed group this returns (tensor, 0).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor, 0
    world = dist.get_world_size()
    local_size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(local_size) for _ in range(world)]
    dist.all_gather(sizes, local_size)
    sizes = [int(size.item()) for size in sizes]
    padded = F.pad(tensor, (0,) * (2 * (tensor.dim() - 1)) + (0, max(sizes) - tensor.shape[0])).contiguous()
    if tensor.requires_grad:
        parts = _all_gather_with_grad(padded).view(world, *padded.shape)
    else:
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
    rank = dist.get_rank()
    return torch.cat([part[:size] for part, size in zip(parts, sizes)]), sum(sizes[:rank])


def _all_gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """[n, ...] on every process -> [world * n, ...] in rank order; backward sums each process's gradient back to
    its rows (reduce-scatter). torch's functional collectives where they exist (torch.distributed.nn.functional's
    all_gather is deprecated in recent torch), else that older autograd-aware all_gather."""
    try:
        from torch.distributed._functional_collectives import all_gather_single_autograd
    except ImportError:
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(tensor))
    return all_gather_single_autograd(tensor, 0, dist.group.WORLD)


def in_batch_softmax_loss(
    query_emb: torch.Tensor, block_emb: torch.Tensor, example_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query_emb, block_emb [B, P] (this process) -> (loss, logits [B, G], correct [B] bool).

    logits = q · bᵀ against the blocks of all G = sum of B over processes (no temperature, as Google); the target of
    query i is its own block, column offset + i. Examples with example_mask False are neither queries nor negatives.
    The loss is the mean over this process's valid queries (0 when it has none, still connected to the graph).
    """
    blocks, offset = gather_across_processes(block_emb)
    logits = query_emb @ blocks.T
    targets = torch.arange(query_emb.shape[0], device=logits.device) + offset
    if example_mask is None:
        example_mask = torch.ones(query_emb.shape[0], dtype=torch.bool, device=logits.device)
    example_mask = example_mask.to(logits.device, torch.bool)
    valid_blocks, _ = gather_across_processes(example_mask)
    logits = logits.masked_fill(~valid_blocks[None, :], torch.finfo(logits.dtype).min)
    per_example = F.cross_entropy(logits.float(), targets, reduction="none")
    per_example = torch.where(example_mask, per_example, torch.zeros_like(per_example))
    loss = per_example.sum() / example_mask.sum().clamp(min=1)
    correct = (logits.argmax(dim=-1) == targets) & example_mask
    return loss, logits, correct


@dataclass
class IctOutput(ModelOutput):
    """`loss` (scalar); `logits` [B, G]: this process's queries against the global batch's blocks; `correct` [B]
    (1.0 where the query's own block scored highest, 0.0 otherwise or for a dropped example)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    correct: torch.FloatTensor | None = None


class IctModel(RealmPreTrainedModel):
    """One `RealmEmbedder` for queries and blocks, trained with the in-batch softmax loss of ICT.

    Follows Google's ict_model: dropout (`embedding_dropout`, 0.1) on the projected embedding in train mode only; the
    RealmEmbedder itself has none, so the saved embedder is the published architecture.
    """

    main_input_name = "block_input_ids"

    def __init__(
        self, config: RealmConfig, embedder: RealmEmbedder | None = None, embedding_dropout: float = EMBEDDING_DROPOUT
    ):
        super().__init__(config)
        self.embedder = embedder if embedder is not None else RealmEmbedder(config)
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        freeze_unused_mlm_head(self.embedder)
        self.post_init()

    def embed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids [B, L] -> dropout(projected_score) [B, P]."""
        projected = self.embedder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.embedding_dropout(projected.projected_score)

    def forward(
        self,
        query_input_ids: torch.LongTensor,
        query_attention_mask: torch.Tensor,
        block_input_ids: torch.LongTensor,
        block_token_type_ids: torch.LongTensor,
        block_attention_mask: torch.Tensor,
        example_mask: torch.Tensor | None = None,
        sentence_removed: torch.Tensor | None = None,
    ) -> IctOutput:
        """Queries [B, Lq] and their blocks [B, Lb] -> IctOutput. `sentence_removed` [B] is not used by the loss: it is
        accepted because Trainer passes the evaluation labels (LABEL_NAMES) to the model."""
        query_emb = self.embed(query_input_ids, query_attention_mask)
        block_emb = self.embed(block_input_ids, block_attention_mask, block_token_type_ids)
        loss, logits, correct = in_batch_softmax_loss(query_emb, block_emb, example_mask)
        return IctOutput(loss=loss, logits=logits, correct=correct.float())


def keep_correct(predictions, labels) -> torch.Tensor:
    """Trainer's preprocess_logits_for_metrics: keep only `correct` [B] (not the [B, G] logits) for the metrics."""
    return predictions[-1] if isinstance(predictions, (tuple, list)) else predictions


def compute_ict_metrics(eval_prediction) -> dict[str, float]:
    """In-batch accuracy of the valid examples, also split by whether the query sentence was removed from its block
    (Google's "masked" / "unmasked" accuracy)."""
    correct = np.asarray(eval_prediction.predictions, dtype=np.float64)
    removed, valid = (np.asarray(label, dtype=bool) for label in eval_prediction.label_ids)
    metrics = {"accuracy": correct[valid].mean() if valid.any() else float("nan")}
    for name, subset in (("removed_accuracy", valid & removed), ("kept_accuracy", valid & ~removed)):
        metrics[name] = correct[subset].mean() if subset.any() else float("nan")
    return {name: float(value) for name, value in metrics.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Corpus, model and evaluation
# ---------------------------------------------------------------------------------------------------------------------


def load_blocks(corpus):
    """The corpus's blocks as a `datasets.Dataset`: a corpus folder (`openrealm corpus build`; the blocks `corpus
    remove` removed are left out: never retrieved, never trained on) or a Dataset."""
    import datasets

    removed = ()
    if isinstance(corpus, datasets.Dataset):
        blocks = corpus
    else:
        removed = read_removed_block_ids(corpus)
        blocks = without_rows(load_corpus(corpus), removed)
    missing = [name for name in CORPUS_COLUMNS if name not in blocks.column_names]
    if missing:
        raise ValueError(f"corpus {corpus} lacks the column(s) {missing} (has {blocks.column_names})")
    if len(blocks) == 0:
        left = f" left (`corpus remove` removed all {len(removed)})" if len(removed) else ""
        raise ValueError(f"corpus {corpus} has no blocks{left}")
    return blocks


def expected_dropped(blocks, mask_rate: float) -> tuple[int, dict[str, int], dict[str, tuple[str, str]]]:
    """What an epoch of ICT over `blocks` drops, on average: (examples, dropped by cause, causes for
    trainers.dropped). A block without a sentence gives no query; a one-sentence block loses its only sentence with
    probability mask_rate, which leaves no context (Google drops that example). Counted in Arrow, rows undecoded."""
    import pyarrow.compute as pc

    counts = pc.list_value_length(blocks.with_format("arrow")["sentence_starts"])
    single = int(pc.sum(pc.equal(counts, 1)).as_py() or 0)
    empty = int(pc.sum(pc.equal(counts, 0)).as_py() or 0)
    dropped = {"single_sentence": round(single * mask_rate), "no_sentence": empty}
    causes = {
        "single_sentence": (
            f"their block holds a single sentence, which ICT removes from it with probability --mask-rate "
            f"{mask_rate:g}, leaving no context, and Google's ICT drops such an example ({single:,} of the "
            f"{len(blocks):,} blocks hold one sentence)",
            "build the corpus from longer articles (several sentences per block), or lower --mask-rate",
        ),
        "no_sentence": ("their block holds no sentence", "rebuild the corpus with `openrealm corpus build`"),
    }
    return len(blocks), dropped, causes


def sample_sentence_queries(blocks, num_queries: int, seed: int, tokenizer, query_seq_len: int = QUERY_SEQ_LEN):
    """num_queries blocks (without replacement, at most all) and one sentence of each, uniformly, from `seed`.

    Returns (block ids [Q] int64, query input ids per block, removed: {"position": [R], "title_ids", "token_ids"}
    for the multi-sentence blocks, with the query sentence cut out of token_ids).
    """
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(len(blocks))[: min(num_queries, len(blocks))]
    queries, removed = [], {"position": [], "title_ids": [], "token_ids": []}
    for position, row in enumerate(blocks.select(chosen.tolist())):
        starts, token_ids = row["sentence_starts"], list(row["token_ids"])
        start, end = sentence_bounds(starts, len(token_ids), int(rng.integers(len(starts)))) if len(starts) else (0, 0)
        queries.append(query_input_ids(token_ids[start:end], tokenizer, query_seq_len))
        if len(starts) > 1:
            removed["position"].append(position)
            removed["title_ids"].append(row["title_ids"])
            removed["token_ids"].append(token_ids[:start] + token_ids[end:])
    return torch.as_tensor(chosen, dtype=torch.long), queries, removed


@torch.no_grad()
def evaluate_retrieval(
    embedder: RealmEmbedder,
    corpus,
    tokenizer,
    num_queries: int = 1000,
    k: int = 5,
    seed: int = 0,
    batch_size: int = 128,
    query_seq_len: int = QUERY_SEQ_LEN,
    block_seq_len: int = BLOCK_SEQ_LEN,
) -> dict:
    """Recall@k of a sentence's own block over the whole corpus (every block embedded, exact MIPS).

    corpus: a corpus folder or its blocks Dataset. Queries: see sample_sentence_queries. "sentence kept": the corpus
    is indexed as it is, so the own block contains the query. "sentence removed" (multi-sentence blocks, ICT's usual
    case): the own block is re-embedded without the sentence and is found when fewer than k other blocks score above
    it. Returns {"k", "recall_sentence_kept", "recall_sentence_removed", "chance" (= k / num_blocks), "num_blocks",
    "num_queries", "num_queries_removed"}.
    """
    import datasets

    blocks = load_blocks(corpus)
    num_blocks = len(blocks)
    if not 1 <= k <= num_blocks:
        raise ValueError(f"k must be in [1, {num_blocks}] (the corpus size), got {k}")
    embed = dict(batch_size=batch_size, max_length=block_seq_len, progress=False)
    index = exact_index(embedder, blocks, tokenizer, block_seq_len, batch_size)
    own, queries, removed = sample_sentence_queries(blocks, num_queries, seed, tokenizer, query_seq_len)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    query_emb = embed_queries(embedder, *pad_rows(queries, pad_id), batch_size).cpu()
    _, top_ids = index.search(query_emb, k)
    kept = (top_ids == own[:, None]).any(dim=1).float().mean().item()

    recall_removed = float("nan")
    if removed["position"]:
        positions = torch.tensor(removed.pop("position"))
        removed_emb = embed_corpus(embedder, datasets.Dataset.from_dict(removed), tokenizer, **embed)
        own_score = (query_emb[positions] * removed_emb).sum(-1)
        if num_blocks - 1 < k:  # fewer than k other blocks exist: the own block is always in the top k
            hits = torch.ones_like(own_score, dtype=torch.bool)
        else:
            # The own block's indexed (sentence-kept) row is no competitor: fetch k + 1, drop it, keep k others.
            scores, ids = index.search(query_emb[positions], k + 1)
            others = scores.masked_fill(ids == own[positions][:, None], float("-inf"))
            hits = own_score > others.topk(k, dim=1).values[:, -1]
        recall_removed = hits.float().mean().item()
    return {
        "k": k,
        "recall_sentence_kept": kept,
        "recall_sentence_removed": recall_removed,
        "chance": k / num_blocks,
        "num_blocks": num_blocks,
        "num_queries": len(queries),
        "num_queries_removed": len(removed["token_ids"]),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


def fixed_eval_examples(blocks, size: int, mask_rate: float = MASK_RATE, seed: int = 0):
    """`size` random blocks (Google evaluates ICT on its training data) with their query sentence and removal drawn
    once, so every evaluation scores the same examples in the same batches."""
    rng = np.random.default_rng(seed)
    chosen = blocks.select(rng.permutation(len(blocks))[: min(size, len(blocks))].tolist()).flatten_indices()
    counts = np.array([len(starts) for starts in chosen["sentence_starts"]])
    chosen = chosen.add_column("query_sentence", (rng.random(len(counts)) * counts).astype(np.int64).tolist())
    return chosen.add_column("remove_sentence", (rng.random(len(counts)) < mask_rate).tolist())


def build_trainer(args: argparse.Namespace, embedder: RealmEmbedder, tokenizer, blocks):
    """A transformers Trainer for ICT over `blocks`, with Google's optimiser (google_training_arguments)."""
    from transformers import TrainingArguments

    # accelerate sets up a multi-process CPU run (gloo), or CPU bf16, only when told to use the CPU; without it a
    # CUDA-less `torchrun` / `accelerate launch --multi_gpu` would run N unaware copies of a single-process job.
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    use_cpu = not torch.cuda.is_available() and (multi_process or args.bf16)
    # Recent transformers 5 releases renamed gradient_checkpointing (now a deprecated alias) activation_checkpointing.
    fields = TrainingArguments.__dataclass_fields__
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    training_args = google_training_arguments(
        args,
        use_cpu=use_cpu,
        per_device_eval_batch_size=args.batch_size,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        dataloader_drop_last=True,  # Google: batch(drop_remainder); full batches keep the negatives' count fixed
        dataloader_num_workers=args.num_workers,
        label_names=LABEL_NAMES,
        ddp_find_unused_parameters=False,  # IctModel freezes the one unused part (the MLM head)
        **{checkpointing: args.gradient_checkpointing},
    )
    world = training_args.world_size
    if len(blocks) < 2 or args.batch_size * world < 2:
        raise ValueError(
            f"ICT scores each query against the other blocks of its global batch (--batch-size {args.batch_size} x "
            f"{world} processes; corpus {args.corpus} has {len(blocks)} blocks): a batch of one block has none, its "
            "loss is 0 and nothing trains. Use a corpus of at least 2 blocks and a global batch of at least 2"
        )
    if len(blocks) < args.batch_size * world:
        raise ValueError(
            f"corpus {args.corpus} has {len(blocks)} blocks, fewer than one global batch "
            f"({args.batch_size} x {world} processes): lower --batch-size"
        )
    if args.eval_steps and args.eval_blocks < args.batch_size * world:
        raise ValueError(
            f"--eval-blocks {args.eval_blocks} is fewer than one global batch ({args.batch_size} x {world} "
            "processes): the in-batch evaluation keeps whole batches only and would score nothing; raise "
            "--eval-blocks or lower --batch-size"
        )
    collator = IctCollator(
        tokenizer, args.query_seq_len, args.block_seq_len, args.mask_rate, args.seed, training_args.process_index
    )
    eval_blocks = None
    if args.eval_steps:
        eval_blocks = fixed_eval_examples(blocks, args.eval_blocks, args.mask_rate, args.seed)
    model = IctModel(embedder.config, embedder, embedding_dropout=args.embedding_dropout)
    trainer = StagedCheckpointTrainer(
        model=model,
        args=training_args,
        train_dataset=blocks,
        eval_dataset=eval_blocks,
        data_collator=collator,
        compute_metrics=compute_ict_metrics,
        preprocess_logits_for_metrics=keep_correct,
    )
    return quiet_trainer_logs(trainer, verbose=getattr(args, "verbose", False))


def summary_line(trainer, summary: dict) -> str:
    """The end of ICT's one summary line: train loss, the last in-batch accuracy, recall@5 of the query's block."""
    parts = [f"train loss {summary['train_loss']:.4f}"]
    evaluations = [log["eval_accuracy"] for log in trainer.state.log_history if "eval_accuracy" in log]
    if evaluations:
        parts.append(f"in-batch accuracy {evaluations[-1]:.3f}")
    if "retrieval" in summary:
        retrieval = summary["retrieval"]
        parts.append(
            f"recall@{retrieval['k']} of the query's block {retrieval['recall_sentence_removed']:.3f} with its "
            f"sentence removed, {retrieval['recall_sentence_kept']:.3f} kept"
        )
    return ", ".join(parts)


def training_summary(args: argparse.Namespace, trainer, train_loss: float) -> dict:
    """What ict_training.json records about the run."""
    return {
        "init": args.init,
        "corpus": str(args.corpus),
        "max_steps": args.max_steps,
        "global_batch_size": args.batch_size * trainer.args.world_size,
        "learning_rate": args.learning_rate,
        "warmup_steps": trainer.args.warmup_steps,
        "mask_rate": args.mask_rate,
        "embedding_dropout": args.embedding_dropout,
        "query_seq_len": args.query_seq_len,
        "block_seq_len": args.block_seq_len,
        "seed": args.seed,
        "train_loss": train_loss,
    }


__all__ = [
    "QUERY_SEQ_LEN",
    "compute_ict_metrics",
    "evaluate_retrieval",
    "fixed_eval_examples",
    "IctCollator",
    "IctModel",
    "in_batch_softmax_loss",
    "pad_rows",
    "query_input_ids",
    "sample_sentence_queries",
]
