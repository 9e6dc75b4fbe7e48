"""The `openrealm corpus build` job: articles or passages (JSONL, Parquet, CSV/TSV, a saved or Hub dataset) into a
knowledge corpus of blocks (tokenization/corpus.py holds the machinery; docs/corpus.md shows each input layout).

    openrealm corpus build --input FILE --output DIR [--tokenizer NAME] [--spans regex|spacy|MODEL|none]
"""

from __future__ import annotations

import argparse
import os
import sys

from openrealm.tokenization.blocks import articles_left_out_note, passages_cut_note
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import read_corpus_config
from openrealm.tokenization.duplicates import duplicates_note, duplicates_warning
from openrealm.tokenization.sources import InputOptions


def run(args: argparse.Namespace) -> int:
    """`openrealm corpus build`: build the corpus and print a summary."""
    span_annotator = None
    if args.spans != "none":
        from openrealm.tokenization.salient_spans import make_span_annotator

        span_annotator = make_span_annotator(args.spans)  # picklable; loads its model lazily in each process
    if args.id_column is not None and not args.passages_as_blocks:
        raise ValueError("--id-column names the passage ids of --passages-as-blocks; pass both, or neither")
    blocks = build_corpus(  # errors: one line and the exit status from the command line (trainers/cli.py)
        args.input if len(args.input) > 1 else args.input[0],
        args.output,
        args.tokenizer,
        max_block_length=args.max_block_length,
        num_proc=args.num_proc,
        span_annotator=span_annotator,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        page_filter=not args.no_page_filter,
        progress=not args.quiet,
        deduplicate=args.deduplicate,
        input_options=InputOptions.from_args(args),
        passages_as_blocks=args.passages_as_blocks,
    )
    config = read_corpus_config(args.output)
    rows = "passages" if args.passages_as_blocks else "articles"
    used, given = config["num_articles"], config["num_input_articles"]
    print(
        f"Wrote {len(blocks)} blocks from {used}{f' of {given}' if used != given else ''} {rows} to "
        f"{os.path.abspath(args.output)}"
        + articles_left_out_note(config["num_pages_filtered"], config["num_articles_without_text"], rows[:-1])
        + duplicates_note(config["num_duplicates_dropped"])
        + passages_cut_note(config.get("num_passages_cut", 0), config["max_block_length"])
    )
    warning = duplicates_warning(config["num_duplicate_blocks"], len(blocks))
    if warning:
        print(f"openrealm corpus build: warning: {warning}", file=sys.stderr)
    return 0


__all__ = ["run"]
