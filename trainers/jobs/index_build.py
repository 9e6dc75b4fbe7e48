"""The `openrealm index build` job: embed every block of a corpus and write an index version (trainers/indexing.py
holds the machinery: versions, build_index, the embedding of trainers/embedding.py).

    openrealm index build --embedder MODEL --corpus DIR --output DIR [--index-type exact|flat|ivf|hnsw|ivfpq|pq]
    accelerate launch -m openrealm index build ...          # each process embeds a contiguous share of the blocks
"""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from pathlib import Path

from openrealm.file_utils import check_apart, path_within, writer_lock
from openrealm.trainers.indexing import (
    beside_versions,
    build_from_args,
    check_num_shards,
    exit_with_parent,
    is_index_output,
    latest_index_dir,
    process_state,
    version_dir_name,
)
from openrealm.trainers.stage_utils import leave_process_group


def run(args: argparse.Namespace) -> int:
    """`openrealm index build`: embed the corpus and write the index (under accelerate launch, sharded)."""
    if getattr(args, "parent_pid", None) is not None:
        exit_with_parent(args.parent_pid)
    state, device = process_state(args.device)
    try:  # before the embedder loads: a refused combination costs nothing
        check_num_shards(args.num_shards, state.num_processes, args.index_type, args.layout)
    except ValueError as error:
        raise ValueError(f"--num-shards {args.num_shards}: {error}") from None
    # An index may live inside the corpus folder (CORPUS/block_index, where RealmRetriever.from_pretrained(CORPUS)
    # finds it, or any other new name there): then only the corpus's own entries are inputs, and the build holds the
    # corpus's writer lock, so that a `corpus add` waits for it, or it for the add, instead of one replacing the
    # other's work.
    inside_corpus = path_within(args.output, args.corpus) and not path_within(args.corpus, args.output)
    corpus_inputs = [("--corpus", args.corpus)]
    if inside_corpus:  # what the build reads there: every entry but an index it replaces (it wrote that one)
        entries = [os.path.join(args.corpus, name) for name in sorted(os.listdir(args.corpus))]
        corpus_inputs = [
            ("--corpus", entry)
            for entry in entries
            if not (path_within(entry, args.output) and is_index_output(entry))
        ]
    inputs = [*corpus_inputs, ("--embedder", args.embedder)]
    if args.layout == "versioned":  # writes (and prunes) OUTPUT/vNNNNNN only: what lies beside them is left alone
        inputs = [item for item in inputs if not beside_versions(item[1], args.output)]
    check_apart(args.output, inputs, "--output")
    with writer_lock(args.corpus) if inside_corpus and state.is_main_process else nullcontext():
        index = build_from_args(args, state, device, args.embedder, args.version, args.layout, args.keep)
    if state.is_main_process:
        where = Path(args.output).absolute()
        if args.layout == "versioned":
            newest, where = latest_index_dir(where).parent, where / version_dir_name(index.version)
        line = f"Wrote {index.index_type} index version {index.version} of {index.num_blocks} x {index.dim} to {where}"
        if args.layout == "versioned" and newest != where:
            line += f" ({newest} is newer: loaders of the index root take that one)"
        print(line)
    leave_process_group(state)
    return 0


__all__ = ["run"]
