"""`openrealm corpus add | remove | update`: write the next version of a corpus folder and say what changed
(trainers/living_corpus.py holds the machinery, `edit_corpus`).

    openrealm corpus add    --corpus DIR --input FILE_OR_FOLDER
    openrealm corpus update --corpus DIR --input FILE_OR_FOLDER
    openrealm corpus remove --corpus DIR --titles TITLE ... | --ids ID ...
"""

from __future__ import annotations

import argparse
import sys

from openrealm.tokenization.blocks import MAX_BLOCK_LENGTH, articles_left_out_note, passages_cut_note
from openrealm.tokenization.duplicates import duplicates_note, duplicates_warning
from openrealm.tokenization.sources import InputOptions
from openrealm.trainers.living_corpus import edit_corpus


def run(args: argparse.Namespace) -> int:
    """`openrealm corpus add | remove | update`: write the next version and print what changed."""
    command = args.corpus_command
    kwargs = {}
    if command in ("add", "update"):
        span_annotator = None
        if args.spans != "none":
            from openrealm.tokenization.salient_spans import make_span_annotator

            span_annotator = make_span_annotator(args.spans)
        kwargs = dict(
            add=args.input if len(args.input) > 1 else args.input[0],
            replace=command == "update",
            embedder=args.embedder,
            span_annotator=span_annotator,
            batch_size=args.batch_size,
            device=args.device,
            progress=not args.quiet,
            deduplicate=args.deduplicate,
            input_options=InputOptions.from_args(args),
        )
    else:
        kwargs = dict(remove_titles=args.titles or (), remove_ids=args.ids or ())
    summary = edit_corpus(args.corpus, **kwargs)
    parts = []
    if "added_block_ids" in summary:
        first, stop = summary["added_block_ids"]
        parts.append(f"added blocks {first}..{stop - 1}")
    if summary["removed_block_ids"]:
        parts.append(f"removed {len(summary['removed_block_ids'])} block(s)")
    print(
        f"{summary['folder']}: {', '.join(parts)}; {summary['num_blocks']} blocks"
        + (
            f", {summary['num_searchable']} searchable (index version {summary['index_version']})"
            if summary["index_version"] is not None
            else (f", {summary['num_live']} not removed" if summary["num_live"] != summary["num_blocks"] else "")
            + " (no index yet)"
        )
        + articles_left_out_note(summary.get("num_pages_filtered", 0), summary.get("num_articles_without_text", 0))
        + duplicates_note(summary.get("num_duplicates", 0) if summary.get("duplicates_dropped") else 0)
        + passages_cut_note(summary.get("num_passages_cut", 0), summary.get("max_block_length", MAX_BLOCK_LENGTH))
    )
    if summary.get("num_duplicates") and not summary["duplicates_dropped"]:  # kept: --no-deduplicate
        held = summary.get("num_duplicate_blocks", summary["num_duplicates"])  # a corpus folder's count: all live
        live = summary.get("num_live", summary["num_searchable"] or summary["num_blocks"])  # not those removed
        print(f"openrealm corpus {command}: warning: {duplicates_warning(held, live)}", file=sys.stderr)
    if summary["needs_rebuild"]:
        print(
            f"openrealm corpus {command}: warning: the approximate index changed by {summary['drift']:.0%} since it "
            "was trained; recall may drop until it is rebuilt (openrealm index build)",
            file=sys.stderr,
        )
    return 0


__all__ = ["run"]
