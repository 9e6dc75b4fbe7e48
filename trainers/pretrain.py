"""REALM pre-training job: retrieval-augmented salient-span MLM on transformers' `Trainer` (Google §2-§4).

    openrealm train pretrain --corpus DIR --embedder MODEL --encoder MODEL --output DIR --max-steps N \
        --refresh-every N [--refresh-mode async|sync|off] [options]

MODEL: a folder or Hub id of a REALM checkpoint (RealmEmbedder / RealmKnowledgeAugEncoder) or of any BERT checkpoint
(new REALM heads), or `random` sized by `--config-overrides`. Google starts the embedder from ICT and the encoder from
BERT.

The loop is the stock `Trainer`; the REALM parts are a data collator (`SalientSpanCollator` -> masked queries, then
`RealmPretrainingExamples` -> top-K candidates from the current index, null document first), the model
(`RealmPretrainingModel`: marginal MLM loss over the K candidates) and the `IndexRefreshCallback`, which shares the
examples object with the collator and swaps its (query embedder, index) pair. Before training, index version 0 is built
from the initial embedder into OUTPUT/index (or `--index ROOT` is loaded; it must have been built from --embedder).

Logged with the loss: retrieval_utility, null_doc_prob, top/oracle candidate log-probs (Google §3.6), the examples'
counters (trivial retrievals, examples dropped for duplicate uids, queries skipped by the masker), the batches' index
version and the refresh metrics (index_version, index_staleness_steps/seconds, refresh_stall_seconds, builds).

OUTPUT at the end: `embedder/` (RealmEmbedder), `encoder/` (RealmKnowledgeAugEncoder), each with the tokenizer, the
tokenizer at the top too, `pretraining.json` (settings and final metrics), and `index/` (the newest index versions).

Departures from Google's code: the DataLoader runs in the training process (dataloader_num_workers=0) because the
collator's examples object is the one the refresh callback updates (Google runs separate example-generator servers);
no intermediate checkpoints yet (a resumed run would also need the index state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import Trainer

from openrealm import RealmConfig, RealmKnowledgeAugEncoder
from openrealm.tokenization.corpus import load_corpus
from openrealm.tokenization.masking import STRATEGIES, SalientSpanCollator
from openrealm.trainers.ict import google_warmup_steps, load_embedder, parse_config_overrides
from openrealm.trainers.index_builder import build_index, load_index
from openrealm.trainers.pretraining import (
    CANDIDATE_SEQ_LEN,
    COUNTERS,
    EMBEDDING_DROPOUT,
    JOINT_SEQ_LEN,
    NUM_CANDIDATES,
    QUERY_SEQ_LEN,
    RealmPretrainingExamples,
    RealmPretrainingModel,
)
from openrealm.trainers.refresh import MODES, IndexRefreshCallback, snapshot_embedder

LEARNING_RATE = 3e-5  # Google's --learning_rate default
OUTPUT_METRICS = ("retrieval_utility", "null_doc_prob", "top_candidate_log_prob", "oracle_candidate_log_prob")
BATCH_EXTRAS = ("uid", "stats", "index_version", "block_id", "candidate_block_ids", "num_skipped")


class PretrainingCollator:
    """Corpus rows -> masked queries (SalientSpanCollator) -> REALM examples (RealmPretrainingExamples); adds the
    masker's skip counts of the batch as `num_skipped`."""

    def __init__(self, masker: SalientSpanCollator, examples: RealmPretrainingExamples):
        self.masker, self.examples = masker, examples

    def __call__(self, rows: list[dict]) -> dict:
        queries = self.masker(rows)
        batch = self.examples(queries)
        batch["num_skipped"] = sum(queries["num_skipped"].values())
        return batch


class RealmPretrainingTrainer(Trainer):
    """`Trainer` whose compute_loss drops the batch's bookkeeping keys and accumulates REALM's metrics, which `log`
    adds (averaged since the previous log) to the loss entry, with the refresh callback's metrics."""

    def __init__(self, *args, refresh: IndexRefreshCallback | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.refresh = refresh
        # The model returns a token-mean loss; it takes no num_items_in_batch.
        self.model_accepts_loss_kwargs = False
        self._sums: Counter = Counter()
        self._steps = 0
        self._batch_index_version = -1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        extras = {name: inputs.pop(name, None) for name in BATCH_EXTRAS}
        self._sums.update(extras["stats"] or {})
        self._sums["num_skipped_queries"] += extras["num_skipped"] or 0
        if extras["index_version"] is not None:
            self._batch_index_version = extras["index_version"]
        if not bool((inputs["labels"] != -100).any()):
            # Every query of the batch was dropped or skipped: no token to predict, a zero loss keeps the step.
            self._sums["num_empty_batches"] += 1
            loss = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            return (loss, None) if return_outputs else loss
        outputs = model(**inputs)
        self._steps += 1
        for name in OUTPUT_METRICS:
            self._sums[name] += float(getattr(outputs, name).detach())
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(self.pretraining_metrics())
        super().log(logs, start_time)

    def pretraining_metrics(self) -> dict[str, float]:
        """REALM's metrics since the previous call (means of the model's, sums of the counters), then reset."""
        metrics: dict[str, float] = {}
        for name in OUTPUT_METRICS:
            if self._steps:
                metrics[name] = round(self._sums[name] / self._steps, 5)
        for name in (*COUNTERS, "num_skipped_queries", "num_empty_batches"):
            metrics[name] = self._sums[name]
        metrics["batch_index_version"] = self._batch_index_version
        if self.refresh is not None:
            metrics.update(self.refresh.metrics(self.state.global_step))
        self._sums, self._steps = Counter(), 0
        return metrics


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


def load_encoder(
    init: str, tokenizer, config_overrides: dict | None = None, seed: int = 0
) -> RealmKnowledgeAugEncoder:
    """`init`: a RealmKnowledgeAugEncoder folder / Hub id, any BERT checkpoint (MLM head loaded when it has one), or
    "random" (a fresh encoder sized by config_overrides, with the tokenizer's vocabulary)."""
    from transformers import AutoConfig, set_seed

    overrides = dict(config_overrides or {})
    set_seed(seed)
    if init == "random":
        overrides.setdefault("vocab_size", len(tokenizer))
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
        return RealmKnowledgeAugEncoder(RealmConfig(**overrides))
    if not os.path.isdir(init) and (os.path.isabs(init) or init.startswith((".", "~")) or init.count("/") > 1):
        raise FileNotFoundError(f"encoder folder {init} does not exist")
    config = AutoConfig.from_pretrained(init)
    if config.model_type == "bert":
        return RealmKnowledgeAugEncoder.from_bert_pretrained(init, **overrides)
    if config.model_type != "realm":
        raise ValueError(f"{init} is a {config.model_type!r} checkpoint; --encoder takes REALM or BERT checkpoints")
    return RealmKnowledgeAugEncoder.from_pretrained(init, **overrides)


def check_models(embedder, encoder, tokenizer, embedder_name: str, encoder_name: str) -> None:
    """Both towers read the corpus token ids and the sequence lengths REALM feeds them."""
    for model, name, length in ((embedder, embedder_name, CANDIDATE_SEQ_LEN), (encoder, encoder_name, JOINT_SEQ_LEN)):
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(
                f"the corpus tokenizer has {len(tokenizer)} tokens but {name} embeds only {model.config.vocab_size}"
            )
        if length > model.config.max_position_embeddings:
            raise ValueError(
                f"{name} reads {model.config.max_position_embeddings} positions; REALM feeds it up to {length}"
            )


# ---------------------------------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------------------------------


def initial_index(args: argparse.Namespace, embedder, index_root: Path):
    """`--index ROOT` (newest version) or version 0 built from the initial embedder into index_root."""
    if args.index:
        return load_index(args.index)
    return build_index(
        embedder, args.corpus, index_root, version=0, keep=3, batch_size=args.index_batch_size, progress=False
    )


def build_trainer(args: argparse.Namespace, embedder, encoder, tokenizer, blocks, index) -> RealmPretrainingTrainer:
    """The Trainer with its collator, model and refresh callback (Google's optimiser, as trainers/ict.py)."""
    from transformers import TrainingArguments

    embedder.to("cuda" if torch.cuda.is_available() else "cpu")
    examples = RealmPretrainingExamples(
        tokenizer, blocks, snapshot_embedder(embedder), index, num_candidates=args.num_candidates
    )
    masker = SalientSpanCollator(tokenizer, strategy=args.spans, seed=args.seed, query_seq_len=QUERY_SEQ_LEN)
    index_root = Path(args.index_root or Path(args.output) / "index")
    refresh = IndexRefreshCallback(
        examples,
        args.corpus,
        index_root,
        args.refresh_every,
        args.refresh_mode,
        snapshot_time=time.time(),
        build_kwargs={"batch_size": args.index_batch_size},
    )
    warmup = google_warmup_steps(args.max_steps) if args.warmup_steps is None else args.warmup_steps
    training_args = TrainingArguments(
        output_dir=args.output,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=warmup,
        logging_steps=args.logging_steps,
        save_strategy="no",
        seed=args.seed,
        data_seed=args.seed,
        dataloader_drop_last=True,
        # The collator must run in this process: its examples object is the one the refresh callback updates.
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        remove_unused_columns=False,  # the collator reads corpus columns the model does not take
        label_names=["labels"],
        bf16=args.bf16,
        report_to=args.report_to,
        disable_tqdm=args.no_progress,
    )
    model = RealmPretrainingModel(embedder, encoder, embedding_dropout=args.embedding_dropout)
    return RealmPretrainingTrainer(
        model=model,
        args=training_args,
        train_dataset=blocks,
        data_collator=PretrainingCollator(masker, examples),
        callbacks=[refresh],
        refresh=refresh,
    )


def save_models(model: RealmPretrainingModel, tokenizer, output: str | os.PathLike, summary: dict) -> None:
    """OUTPUT/embedder/, OUTPUT/encoder/ (each with the tokenizer), the tokenizer and pretraining.json at the top; each
    entry replaces its namesake by rename (index/ and other folders beside them are kept)."""
    from openrealm.modeling_realm import move_into

    output = Path(output).absolute()
    output.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pretrain-saving-", dir=output.parent))
    try:
        for name, tower in (("embedder", model.embedder), ("encoder", model.encoder)):
            tower.save_pretrained(staging / name)
            tokenizer.save_pretrained(staging / name)
        tokenizer.save_pretrained(staging)
        (staging / "pretraining.json").write_text(json.dumps(summary, indent=2) + "\n")
        for name in ("embedder", "encoder"):  # move_into moves files; whole folders are replaced here
            if (output / name).exists():
                shutil.rmtree(output / name)
            os.rename(staging / name, output / name)
        move_into(str(staging), str(output))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm train pretrain`."""
    parser.add_argument("--corpus", required=True, help="knowledge-corpus folder (openrealm corpus build)")
    parser.add_argument("--embedder", required=True, help="RealmEmbedder (e.g. ICT output) or BERT folder, or random")
    parser.add_argument("--encoder", required=True, help="RealmKnowledgeAugEncoder or BERT folder, or random")
    parser.add_argument("--output", required=True, help="folder for embedder/, encoder/, the tokenizer and index/")
    parser.add_argument("--max-steps", type=int, required=True, help="optimiser steps (paper: 200000 at batch 512)")
    parser.add_argument("--refresh-every", type=int, required=True, help="index refresh period in steps (paper ~500)")
    parser.add_argument("--refresh-mode", choices=MODES, default="async", help="async (default), sync or off")
    parser.add_argument("--index", default=None, help="existing index root built from --embedder (default: build v0)")
    parser.add_argument("--index-root", default=None, help="where index versions go (default OUTPUT/index)")
    parser.add_argument("--index-batch-size", type=int, default=128, help="blocks per forward pass when indexing")
    parser.add_argument("--batch-size", type=int, default=4, help="queries per step (Google local: 4, paper: 512)")
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE, help="peak AdamW lr (default 3e-5)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default min(10000, max(100, steps / 10))")
    parser.add_argument("--num-candidates", type=int, default=NUM_CANDIDATES, help="K incl. the null doc (8)")
    parser.add_argument("--spans", choices=STRATEGIES, default="salient", help="masking strategy (default salient)")
    parser.add_argument("--embedding-dropout", type=float, default=EMBEDDING_DROPOUT, help="(default 0.1)")
    parser.add_argument("--config-overrides", default=None, help="RealmConfig fields k=v,... (for random models)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer of the corpus ids (default: the corpus's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, data order and masks (default 0)")
    parser.add_argument("--logging-steps", type=int, default=50, help="log every N steps (default 50)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--report-to", default="none", help="Trainer loggers, e.g. tensorboard, wandb (default none)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """`openrealm train pretrain`: build index v0, train with refreshes, save embedder/ and encoder/."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    blocks = load_corpus(args.corpus)
    overrides = parse_config_overrides(args.config_overrides)
    embedder = load_embedder(args.embedder, tokenizer, overrides, args.seed)
    encoder = load_encoder(args.encoder, tokenizer, overrides, args.seed)
    check_models(embedder, encoder, tokenizer, args.embedder, args.encoder)
    index = initial_index(args, embedder, Path(args.index_root or Path(args.output) / "index"))
    trainer = build_trainer(args, embedder, encoder, tokenizer, blocks, index)
    result = trainer.train()
    final = trainer.pretraining_metrics()
    summary = {
        "corpus": str(args.corpus),
        "embedder": args.embedder,
        "encoder": args.encoder,
        "max_steps": args.max_steps,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "refresh_mode": args.refresh_mode,
        "refresh_every": args.refresh_every,
        "num_candidates": args.num_candidates,
        "spans": args.spans,
        "seed": args.seed,
        "train_loss": result.training_loss,
        "index_swaps": trainer.refresh.swaps,
        "index_build_failures": len(trainer.refresh.failures),
        "final": final,
        "log_history": trainer.state.log_history,
    }
    save_models(trainer.accelerator.unwrap_model(trainer.model), tokenizer, args.output, summary)
    print(f"REALM pre-training: saved embedder/ and encoder/ to {args.output} (train loss {result.training_loss:.4f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="openrealm train pretrain", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
