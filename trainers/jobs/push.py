"""`openrealm push`: upload an open-QA folder with its model card (trainers/publishing.py holds the machinery).

    openrealm push --model DIR --repo-id ID [--eval-results FILE.json ...] [--private]
                   [--training-summary FILE.json] [--corpus NAME] [--datasets ID ...] [--with-demo]
    openrealm push --model MODEL --corpus CORPUS [--index INDEX] --repo-id ID ...   # a model with your corpus

With --corpus naming a corpus folder other than the model's own (e.g. your documents, indexed with the model), the
upload is the model (a folder or Hub id) with that corpus and index in place of its own, staged beside the corpus.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from openrealm.retrieval_realm import BLOCK_RECORDS_NAME
from openrealm.trainers.publishing import push_openqa_model


def is_other_corpus(model: str, corpus: str | None) -> bool:
    """Whether --corpus names a corpus folder (block records) that is not the model folder itself."""
    if corpus is None or not (Path(corpus) / BLOCK_RECORDS_NAME).is_file():
        return False
    return not (Path(model).is_dir() and Path(model).resolve() == Path(corpus).resolve())


def save_model_with_corpus(model: str, corpus: str, index: str | None, folder: str | os.PathLike) -> None:
    """Save the open-QA model `model` (folder or Hub id) into `folder` with the corpus folder `corpus` and its index
    (default CORPUS/block_index) as its retriever; refused when the corpus or index does not fit the model."""
    from openrealm import RealmForOpenQA

    RealmForOpenQA.from_pretrained(model, corpus=corpus, index=index).save_pretrained(folder)


def run(args: argparse.Namespace) -> int:
    """`openrealm push`: card + upload (of the model with --corpus, when that is a corpus of the user's)."""
    other_corpus = is_other_corpus(args.model, args.corpus)
    if args.index is not None and not other_corpus:
        raise ValueError("--index is the index of a corpus folder: give that corpus with --corpus")
    if other_corpus:
        staging = tempfile.mkdtemp(prefix=".push-", dir=Path(args.corpus).resolve().parent)  # records hard-linked
        try:
            save_model_with_corpus(args.model, args.corpus, args.index, staging)
            return push_folder(args, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return push_folder(args, args.model)


def push_folder(args: argparse.Namespace, folder: str | os.PathLike) -> int:
    url = push_openqa_model(
        folder,
        args.repo_id,
        eval_results=args.eval_results,
        training_summary=args.training_summary,
        corpus=args.corpus,
        datasets=args.datasets,
        private=args.private,
        with_demo=args.with_demo,
        readme=args.readme,
    )
    kept = args.readme == "keep" and (Path(folder) / "README.md").exists()
    kept = " (with the folder's own README.md, not openrealm's card)" if kept else ""
    print(f"Pushed {args.model} to {args.repo_id}{kept}: {url}")
    return 0


__all__ = ["run"]
