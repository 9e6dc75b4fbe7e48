"""`openrealm train ict`: the ICT warm start of the retriever (trainers/ict.py holds the machinery).

openrealm train ict --corpus DIR --init MODEL --output DIR --max-steps N [options]
"""

from __future__ import annotations

import argparse
import json

from openrealm.trainers.checkpoints import (
    resolve_resume,
)
from openrealm.trainers.dropped import check_dropped
from openrealm.trainers.ict import (
    BLOCK_SEQ_LEN,
    CORPUS_COLUMNS,
    QUERY_SEQ_LEN,
    build_trainer,
    evaluate_retrieval,
    expected_dropped,
    load_blocks,
    summary_line,
    training_summary,
)
from openrealm.trainers.options import MAX_DROPPED_SHARE
from openrealm.trainers.stage_utils import (
    holding_output,
    leave_process_group,
    parse_config_overrides,
    prepare_output,
    refuse,
)
from openrealm.trainers.towers import check_tokenizer, fit_length, load_embedder, save_tower

RECALL_K = 5  # --eval-queries: recall@5 of a sentence's own block


@holding_output
def run(args: argparse.Namespace) -> int:
    """`openrealm train ict`: train, save the embedder in args.output, optionally evaluate and push."""
    from transformers import AutoTokenizer

    inputs = [("--corpus", args.corpus), ("--init", args.init), ("--tokenizer", args.tokenizer)]
    clear_output = prepare_output(args.output, args.overwrite, args.resume_from_checkpoint is not None, inputs)
    blocks = load_blocks(args.corpus).select_columns(list(CORPUS_COLUMNS))
    if args.eval_queries and len(blocks) < RECALL_K:
        raise ValueError(
            f"--eval-queries measures recall@{RECALL_K} over the corpus, but {args.corpus} has {len(blocks)} blocks: "
            "pass --eval-queries 0, or use a larger corpus"
        )
    # Before the model loads: a corpus of one-sentence blocks trains (nearly) nothing at Google's mask rate.
    refusal, warning = check_dropped(
        *expected_dropped(blocks, args.mask_rate),
        getattr(args, "max_dropped_share", MAX_DROPPED_SHARE),
        "examples an epoch",
    )
    if refusal is not None:
        raise ValueError(refusal)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    embedder = load_embedder(args.init, tokenizer, parse_config_overrides(args.config_overrides), args.seed, "--init")
    check_tokenizer(embedder, tokenizer, args.init, "--init")
    for name, default in (("query_seq_len", QUERY_SEQ_LEN), ("block_seq_len", BLOCK_SEQ_LEN)):
        chosen = getattr(args, name)
        setting = "--" + name.replace("_", "-")
        setattr(
            args, name, fit_length(embedder, chosen or default, f"--init {args.init}", setting, chosen is not None)
        )
    trainer = build_trainer(args, embedder, tokenizer, blocks)
    resume = resolve_resume(args.resume_from_checkpoint, args.output)
    clear_output()  # every check passed: --overwrite removes the earlier run's checkpoints now
    result = trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    if result.training_loss == 0.0:  # the same on every process (Trainer averages the logged loss over them)
        return refuse(trainer.accelerator.state, trained_nothing(args, blocks, trainer.state.global_step))
    if trainer.is_world_process_zero():
        summary = training_summary(args, trainer, result.training_loss)
        embedder = trainer.accelerator.unwrap_model(trainer.model).embedder
        if args.eval_queries:
            summary["retrieval"] = evaluate_retrieval(
                embedder,
                blocks,
                tokenizer,
                args.eval_queries,
                k=RECALL_K,
                seed=args.seed,
                query_seq_len=args.query_seq_len,
                block_seq_len=args.block_seq_len,
            )
        save_tower(embedder, args.output, tokenizer, {"ict_training.json": json.dumps(summary, indent=2) + "\n"})
        print(
            f"ICT: saved the RealmEmbedder to {args.output} ({summary_line(trainer, summary)})"
            + (f"; warning: {warning}" if warning else "")
        )
        if args.push_to_hub:
            embedder.push_to_hub(args.push_to_hub)
            tokenizer.push_to_hub(args.push_to_hub)
    leave_process_group(trainer.accelerator.state)  # Trainer logs through callbacks: no accelerate trackers
    return 0


def trained_nothing(args: argparse.Namespace, blocks, steps: int) -> str:
    """Why a run whose loss was exactly 0 at every step trained nothing, and how to fix it. The in-batch softmax loss
    of a query scored against another block is never exactly 0: every query of the run was dropped, or had no other
    block left in its global batch, whatever share the corpus drops on average."""
    num_blocks, dropped, _ = expected_dropped(blocks, args.mask_rate)
    share = sum(dropped.values()) / num_blocks
    return (
        f"train ict trained nothing: its loss was exactly 0 at each of its {steps} step(s), as no query had another "
        f"block of its batch to be scored against. About {sum(dropped.values()):,} of the {num_blocks:,} examples an "
        f"epoch ({share:.0%}) are dropped (a block of one sentence loses it with probability --mask-rate "
        f"{args.mask_rate:g}), and a dropped example leaves the loss, as query and as block. Use articles of several "
        "sentences per block, a lower --mask-rate or a larger --batch-size. No model was saved."
    )


__all__ = ["run"]
