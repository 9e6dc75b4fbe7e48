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

from openrealm.file_utils import check_apart, writer_lock
from openrealm.retrieval_realm import BLOCK_INDEX_DIR
from openrealm.trainers.indexing import (
    beside_versions,
    build_from_args,
    check_num_shards,
    exit_with_parent,
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
    # The one output inside an input: a plain index at CORPUS/block_index, where RealmRetriever.from_pretrained(CORPUS)
    # finds it (docs/corpus.md). Writing it changes the corpus folder: the build holds the corpus's writer lock, so
    # that a `corpus add` waits for it, or it for the add, instead of one replacing the other's blocks or index.
    own_index = args.layout == "plain" and os.path.realpath(args.output) == os.path.realpath(
        Path(args.corpus, BLOCK_INDEX_DIR)
    )
    inputs = [None if own_index else ("--corpus", args.corpus), ("--embedder", args.embedder)]
    if args.layout == "versioned":  # writes (and prunes) OUTPUT/vNNNNNN only: what lies beside them is left alone
        inputs = [item for item in inputs if item is None or not beside_versions(item[1], args.output)]
    check_apart(args.output, inputs, "--output")
    with writer_lock(args.corpus) if own_index and state.is_main_process else nullcontext():
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


# Re-exported from their earlier home until openrealm 0.2 (trainers/indexing.py now).
from openrealm.trainers.indexing import build_index, list_versions, load_index  # noqa: E402

__all__ = ["build_index", "latest_index_dir", "list_versions", "load_index", "run"]
