"""The `openrealm evaluate` job: evaluate an open-QA model on a QA dataset and write the results JSON
(trainers/evaluation.py holds the metrics, the dataset loading and evaluate_openqa).

    openrealm evaluate --model MODEL --dataset FILE_OR_NAME --output FILE.json [--num-blocks N] [--limit N]
                       [--batch-size B] [--retrieval dense|bm25] [--split SPLIT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from openrealm.file_utils import check_apart
from openrealm.trainers.evaluation import (
    dataset_identity,
    evaluate_openqa,
    load_qa_dataset,
    local_dataset_file,
    write_results,
)
from openrealm.trainers.towers import check_model_folder


def check_output(output: str, dataset: str, split: str | None, model: str | None = None) -> None:
    """Refuse a results path that is the dataset file itself (after resolving the paths), an existing folder, or one
    inside the model or dataset folder (it would replace a file the model or another split is read from)."""
    target = Path(output).expanduser()
    if target.is_dir():
        raise IsADirectoryError(f"--output {output} is a folder; give the results JSON file to write")
    local = local_dataset_file(str(dataset), split)
    if local is not None and target.resolve() == local.resolve():
        raise ValueError(f"--output {output} is the dataset file {local}; writing the results would replace it")
    check_apart(target, [("--model", model), ("--dataset", dataset)], "--output")


def run(args: argparse.Namespace) -> int:
    """`openrealm evaluate`: evaluate a model on a QA dataset and write the results JSON."""
    from openrealm import RealmForOpenQA

    for flag, value in (("--limit", args.limit), ("--batch-size", args.batch_size), ("--num-blocks", args.num_blocks)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    check_output(args.output, args.dataset, args.split, args.model)  # before anything runs: nothing lost or wasted
    check_model_folder(str(args.model))
    dataset = load_qa_dataset(args.dataset, split=args.split)
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = RealmForOpenQA.from_pretrained(args.model).to(device).eval()
    searcher = None
    if args.retrieval == "bm25":
        from openrealm.trainers.bm25 import Bm25BlockSearcher

        searcher = Bm25BlockSearcher.from_retriever(model.retriever)
    results = evaluate_openqa(
        model,
        dataset,
        batch_size=args.batch_size,
        num_blocks=args.num_blocks,
        recall_ks=args.recall_k,
        block_searcher=searcher,
        progress=not args.quiet,
    )
    dataset_name, split = dataset_identity(args.dataset, args.split)
    results = {
        "model": str(args.model),
        "dataset": str(args.dataset),
        "dataset_name": args.dataset_name or dataset_name,
        "split": split,
        "retrieval": args.retrieval,
        **results,
    }
    write_results(results, args.output)
    for note in results.get("notes", ()):
        print(f"note: {note}", file=sys.stderr)
    summary = ", ".join(f"{key} {results[key]:.2f}" for key in results if key == "exact_match" or "@" in key)
    print(f"{results['count']} questions: {summary}, reader_oracle {results['reader_oracle']:.2f} -> {args.output}")
    return 0


__all__ = ["check_output", "run"]
