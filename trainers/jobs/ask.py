"""`openrealm ask`: answer questions with an open-QA model, from its own corpus or a corpus of the user's.

openrealm ask --model MODEL "question" ...               # questions from stdin, one per line, when none is given
openrealm ask --model MODEL --corpus CORPUS [--index INDEX] "question"
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from openrealm.pipeline_realm import question_answerer
from openrealm.tokenization.jsonl import iter_lines
from openrealm.trainers.cli import printable
from openrealm.trainers.towers import check_model_folder


def run(args: argparse.Namespace) -> int:
    """`openrealm ask`: print each question's answers, with the block, title and document each came from."""
    stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes where it can: a line that is not UTF-8 is named
    questions = args.question or [line.strip() for _, line in iter_lines(stdin, "stdin") if line.strip()]
    if not questions:
        raise ValueError("no question given: pass one, or pipe them on stdin, one per line")
    if args.corpus is not None:
        check_model_folder(args.corpus, "--corpus")
        if not os.path.isdir(args.corpus) and args.corpus.count("/") != 1:  # neither a folder nor owner/name
            raise FileNotFoundError(f"--corpus {args.corpus}: no such folder")
        if args.index is not None and not os.path.exists(args.index):
            raise FileNotFoundError(f"--index {args.index}: no such folder")
    elif args.index is not None:
        raise ValueError("--index is the index of a corpus: give --corpus too")
    qa = question_answerer(args.model, corpus=args.corpus, index=args.index)
    results = qa(questions, top_k=args.top_k, num_blocks=args.num_blocks)
    for question, answers in zip(questions, results):
        answers = answers if isinstance(answers, list) else [answers]
        if args.json:
            print(json.dumps({"question": question, "answers": answers}, ensure_ascii=False))
            continue
        print(f"Q: {printable(question)}")
        for answer in answers:  # text of the corpus, which may come from anyone's Hub repo
            print(f"  A: {printable(answer['answer'])}  (score {answer['score']:.3f})")
            passage = ""
            if answer.get("passage_id") is not None:
                passage = f" (passage {printable(answer['passage_id'])})"
            elif answer.get("path") is not None:  # a corpus built from a folder of documents
                passage = f" (document {printable(answer['path'])})"
            print(
                f"     block {answer['block_id']}{passage} [{printable(answer['title'])}] retrieval score "
                f"{answer['retrieval_score']:.3f}"
            )
            print(f"     {printable(answer['text'][:300])}")
    return 0


__all__ = ["run"]
