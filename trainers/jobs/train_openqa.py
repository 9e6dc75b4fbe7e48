"""The `openrealm train openqa` job: open-QA fine-tuning of RealmForOpenQA (trainers/openqa.py holds the
machinery: the collator, the Trainer, the model from pre-trained towers, finetune_openqa).

    openrealm train openqa --model MODEL --train FILE --dev FILE --output DIR --max-steps N [--corpus DIR] [options]
"""

from __future__ import annotations

import argparse

from openrealm.trainers.evaluation import load_qa_dataset
from openrealm.trainers.openqa import (
    OpenQAArguments,
    finetune_openqa,
    load_openqa_model,
    openqa_training_arguments,
    read_gold_passages,
)
from openrealm.trainers.stage_utils import holding_output, prepare_output


@holding_output
def run(args: argparse.Namespace) -> int:
    """`openrealm train openqa`: load or assemble the model, fine-tune, save the folder and the summary."""
    from transformers import set_seed

    set_seed(args.seed)
    inputs = [("--model", args.model), ("--embedder", args.embedder), ("--encoder", args.encoder),
              ("--corpus", args.corpus), ("--index", args.index), ("--train", args.train), ("--dev", args.dev),
              ("--gold-passages", args.gold_passages)]  # fmt: skip
    prepare_output(args.output, args.overwrite, False, inputs, earlier_run=(), resumable=False)
    # The data first: a bad line is reported before the model loads, and before anything is written.
    gold_passages = read_gold_passages(args.gold_passages) if args.gold_passages else None
    train_dataset = load_qa_dataset(args.train, split=args.train_split)
    dev_dataset = load_qa_dataset(args.dev, split=args.dev_split) if args.dev else None
    model = load_openqa_model(
        args.model, embedder=args.embedder, encoder=args.encoder, corpus=args.corpus, index=args.index
    )
    training_args = openqa_training_arguments(
        args.output,
        args.max_steps,
        warmup_steps=args.warmup_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        eval_steps=args.eval_steps,
        per_device_eval_batch_size=args.eval_batch_size,
        logging_steps=args.logging_steps,
        seed=args.seed,
        bf16=args.bf16,
        report_to=args.report_to,
        disable_tqdm=args.quiet,
    )
    openqa_args = OpenQAArguments(
        searcher_beam_size=args.searcher_beam_size,
        reader_beam_size=args.reader_beam_size,
        eval_reader_beam_size=args.eval_reader_beam_size,
        passage_supervision=args.passage_supervision,
        min_passage_overlap=args.min_passage_overlap,
        max_dropped_share=args.max_dropped_share,
    )
    summary = finetune_openqa(
        model,
        train_dataset,
        dev_dataset,
        training_args,
        openqa_args,
        gold_passages=gold_passages,
        print_logs=args.verbose,
        summary_extras={
            "model": args.model or f"{args.embedder} + {args.encoder}",
            "corpus": args.corpus,
            "train": args.train,
            "dev": args.dev,
        },
    )
    after = summary["dev_after"]
    if after is not None:
        print(f"dev exact match {summary['dev_before']['exact_match']:.2f} -> {after['exact_match']:.2f}")
    warning = f"; warning: {summary['dropped_warning']}" if summary["dropped_warning"] else ""
    print(f"Saved the fine-tuned RealmForOpenQA to {args.output}{warning}")
    return 0


__all__ = ["run"]
