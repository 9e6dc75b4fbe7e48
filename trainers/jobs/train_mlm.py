"""`openrealm train mlm`: BERT's masked-LM objective on a corpus (trainers/masked_lm.py holds the machinery).

openrealm train mlm --corpus DIR --init MODEL --output DIR --max-steps N [options]
"""

from __future__ import annotations

import argparse
import json
import math

from openrealm.tokenization.blocks import MAX_BLOCK_LENGTH
from openrealm.tokenization.corpus_folder import load_corpus, read_removed_block_ids
from openrealm.trainers.checkpoints import resolve_resume
from openrealm.trainers.dropped import check_dropped
from openrealm.trainers.masked_lm import (
    MLM_PROBABILITY,
    CorpusBlocks,
    MaskedLmModel,
    build_trainer,
    eval_batches,
    evaluate,
    expected_dropped,
)
from openrealm.trainers.options import MAX_DROPPED_SHARE
from openrealm.trainers.stage_utils import (
    holding_output,
    leave_process_group,
    parse_config_overrides,
    prepare_output,
)
from openrealm.trainers.towers import check_tokenizer, fit_length, load_encoder, save_tower


@holding_output
def run(args: argparse.Namespace) -> int:
    """`openrealm train mlm`: measure, train, measure again, save the encoder (and mlm_training.json) in
    args.output."""
    from transformers import AutoTokenizer

    inputs = [("--corpus", args.corpus), ("--init", args.init), ("--tokenizer", args.tokenizer)]
    clear_output = prepare_output(args.output, args.overwrite, args.resume_from_checkpoint is not None, inputs)
    blocks = load_corpus(args.corpus).select_columns(["block_id", "title_ids", "token_ids"])
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    encoder = load_encoder(
        args.init,
        tokenizer,
        parse_config_overrides(args.config_overrides),
        args.seed,
        "--init",
        warn_untrained_head=False,
    )
    check_tokenizer(encoder, tokenizer, args.init, "--init")
    length = fit_length(
        encoder, args.max_seq_len or MAX_BLOCK_LENGTH, f"--init {args.init}", "--max-seq-len", bool(args.max_seq_len)
    )
    removed = set(read_removed_block_ids(args.corpus).tolist())
    dataset = CorpusBlocks(blocks, tokenizer, length, removed)
    refusal, warning = check_dropped(
        *expected_dropped(blocks.select(dataset.ids) if removed else blocks, length),
        getattr(args, "max_dropped_share", MAX_DROPPED_SHARE),
        "blocks an epoch",
    )
    if refusal is not None:
        raise ValueError(refusal)
    model = MaskedLmModel(encoder)
    trainer = build_trainer(args, model, tokenizer, dataset)
    held_out = eval_batches(dataset, tokenizer, args.eval_blocks, args.batch_size, args.seed + 1)
    model.to(trainer.args.device)
    before = evaluate(model, held_out) if held_out else None
    resume = resolve_resume(args.resume_from_checkpoint, args.output)
    clear_output()  # every check passed: --overwrite removes the earlier run's checkpoints now
    result = trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    if trainer.is_world_process_zero():
        model = trainer.accelerator.unwrap_model(trainer.model)
        after = evaluate(model, held_out) if held_out else None
        summary = {
            "init": args.init,
            "corpus": str(args.corpus),
            "blocks": len(dataset),
            "max_steps": args.max_steps,
            "global_batch_size": args.batch_size * trainer.args.world_size,
            "learning_rate": args.learning_rate,
            "warmup_steps": trainer.args.warmup_steps,
            "mlm_probability": MLM_PROBABILITY,
            "max_seq_len": length,
            "seed": args.seed,
            "train_loss": result.training_loss,
            "eval_blocks": min(args.eval_blocks, len(dataset)),
            "eval_before": before,
            "eval_after": after,
        }
        save_tower(model.encoder, args.output, tokenizer, {"mlm_training.json": json.dumps(summary, indent=2) + "\n"})
        line = f"train loss {result.training_loss:.4f}"
        if before and after:
            line += (
                f", masked-token accuracy on {summary['eval_blocks']} blocks {before['accuracy']:.3f} -> "
                f"{after['accuracy']:.3f} (perplexity {math.exp(before['loss']):.1f} -> {math.exp(after['loss']):.1f})"
            )
        print(
            f"masked LM: saved the RealmKnowledgeAugEncoder to {args.output} ({line})"
            + (f"; warning: {warning}" if warning else "")
        )
    leave_process_group(trainer.accelerator.state)
    return 0


__all__ = ["run"]
