"""What REALM pre-training checks and prepares before it trains: the corpus (salient spans, distinct blocks), the
sequence lengths the towers take, the process layout, the initial index (version 0), and the causes of corpus rows
that give no example (trainers/dropped.py words them). Shared by `train pretrain` and its `--preflight`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

from openrealm.tokenization.corpus_folder import read_corpus_config, read_removed_block_ids, without_rows
from openrealm.tokenization.duplicates import count_duplicate_blocks, duplicates_warning
from openrealm.tokenization.masking import SKIP_REASONS
from openrealm.trainers.dropped import check_dropped
from openrealm.trainers.indexing import build_index, load_index
from openrealm.trainers.options import MAX_DROPPED_SHARE
from openrealm.trainers.pretraining.evaluation import held_out_query_blocks
from openrealm.trainers.pretraining.examples import CANDIDATE_SEQ_LEN, COUNTERS, JOINT_SEQ_LEN, QUERY_SEQ_LEN
from openrealm.trainers.towers import check_tokenizer, fit_length

# Logged counters: the examples' (COUNTERS), queries the masker skipped (in all, and by reason), per-process batches
# left with no example (a zero-loss step, see RealmPretrainingModel._skipped_batch_output).
SKIPPED_COUNTERS = tuple(f"num_skipped_{reason}" for reason in SKIP_REASONS)


RUN_COUNTERS = (*COUNTERS, "num_skipped_queries", *SKIPPED_COUNTERS, "num_skipped_batches")
# The counters of corpus rows that gave no example, by cause.
DROP_COUNTERS = ("num_dropped_duplicate_uids", *SKIPPED_COUNTERS)


ROWS_READ = "corpus rows read"  # what the drop messages count


def dropped_examples(counts) -> int:
    """Corpus rows that gave no training example: skipped by the masker or dropped for duplicate uids (Google)."""
    return int(counts["num_skipped_queries"] + counts["num_dropped_duplicate_uids"])


def drop_causes(query_seq_len: int) -> dict[str, tuple[str, str]]:
    """Each DROP_COUNTERS name -> (why a corpus row gave no example, how to fix it), for trainers.dropped."""
    random_masking = "or pre-train with random masking (`--spans random_span`)"
    return {
        "num_dropped_duplicate_uids": (
            "their retrieved blocks held two copies of one block (the same title and text), and Google's example "
            "generator drops such an example",
            "rebuild the corpus with `openrealm corpus build` (without --no-deduplicate), which drops duplicate "
            "blocks",
        ),
        "num_skipped_no_valid_spans": (
            "their block has no salient span (--spans salient masks salient spans only)",
            "build the corpus with named entities (`openrealm corpus build ... --spans spacy` or `--spans MODEL`), "
            + random_masking,
        ),
        "num_skipped_span_covers_no_wordpiece": (
            "their salient span covers no whole wordpiece",
            "build the corpus with other salient spans (`openrealm corpus build ... --spans`), " + random_masking,
        ),
        "num_skipped_mask_out_of_range": (
            f"the words to mask lie past the first {query_seq_len - 2} wordpieces of their sentence, the query length "
            "the embedder reads",
            "use an embedder that reads longer inputs (max_position_embeddings)",
        ),
        "num_skipped_no_wordpieces": (
            "their sentences hold no wordpiece",
            "remove such blocks from the corpus (`openrealm corpus remove`)",
        ),
    }


def fit_sequence_lengths(args: argparse.Namespace, embedder, encoder, tokenizer) -> None:
    """Both towers read the corpus token ids; the query (96), block (288) and query + block (384) lengths REALM feeds
    them are lowered, with a log line, to what each tower reads: args.query_seq_len, candidate_seq_len and
    joint_seq_len (a model of 128 positions trains on a corpus of 288-wordpiece blocks, reading their beginnings)."""
    check_tokenizer(embedder, tokenizer, args.embedder, "--embedder")
    check_tokenizer(encoder, tokenizer, args.encoder, "--encoder")
    embedder_name, encoder_name = f"--embedder {args.embedder}", f"--encoder {args.encoder}"
    args.candidate_seq_len = fit_length(embedder, CANDIDATE_SEQ_LEN, embedder_name, "the block length")
    args.joint_seq_len = fit_length(encoder, JOINT_SEQ_LEN, encoder_name, "the query + block length")
    query = fit_length(embedder, QUERY_SEQ_LEN, embedder_name, "the query length")
    args.query_seq_len = min(query, args.joint_seq_len - 4)  # room for a block's [SEP] title-or-body [SEP]


def index_shards(args: argparse.Namespace, world: int) -> int:
    """Shards each index version is written in: one per process with --shard-index (else 1: one shared file)."""
    return world if getattr(args, "shard_index", False) and world > 1 else 1


def initial_index(args: argparse.Namespace, embedder, index_root: Path, accelerator=None):
    """`--index ROOT` (newest version) or version 0 built from the initial embedder into index_root, on the device
    training will use (the GPU when there is one: the towers are still on the CPU here). accelerator: the
    PartialState of several processes: each embeds its share on its own device, the main one writes, every one gets
    the index (with --shard-index: each writes its shard and holds only it)."""
    world = accelerator.num_processes if accelerator is not None else 1
    if args.index:
        return load_index(args.index, sharded=index_shards(args, world) > 1, device=shard_device(args, world))
    return build_index(
        embedder,
        args.corpus,
        index_root,
        version=0,
        keep=3,
        batch_size=args.index_batch_size,
        max_length=getattr(args, "candidate_seq_len", CANDIDATE_SEQ_LEN),
        progress=False,
        accelerator=accelerator,
        device=None if accelerator is not None else ("cuda" if torch.cuda.is_available() else "cpu"),
        num_shards=index_shards(args, world),
    )


def shard_device(args: argparse.Namespace, world: int) -> str | None:
    """Where a rank's index shard lives: the training device (NCCL collectives need GPU tensors); None unsharded."""
    if index_shards(args, world) == 1:
        return None
    return "cuda" if torch.cuda.is_available() else "cpu"


def runs_on_cpu_processes() -> bool:
    """Several processes launched (accelerate launch / torchrun) on a machine without a GPU: DDP over gloo on CPU.
    (`accelerate launch --cpu` starts a single process; `--multi_gpu` with no GPU visible starts N CPU processes.)"""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()


def distributed_state():
    """accelerate's PartialState of this launch (initialises torch.distributed: gloo on CPU, NCCL on GPUs)."""
    from accelerate import PartialState

    return PartialState(cpu=runs_on_cpu_processes())


def count_blocks_with_spans(blocks) -> int:
    """How many blocks have at least one salient span (a datasets.Dataset is counted in Arrow, rows undecoded)."""
    if hasattr(blocks, "with_format"):
        import pyarrow.compute as pc

        lengths = pc.list_value_length(blocks.with_format("arrow")["span_char_starts"])
        return int(pc.sum(pc.greater(lengths, 0)).as_py() or 0)
    return sum(1 for row in blocks if len(row["span_char_starts"]) > 0)


def salient_span_refusal(with_spans: int, num_blocks: int, corpus: str | os.PathLike) -> str | None:
    """Why salient-span pre-training (--spans salient) cannot start on a corpus of which `with_spans` blocks have a
    span, or None. With none, every query would be dropped (as Google's code drops a record without a span) and
    every batch would be empty; with some, the others' queries are dropped and counted. Random masking needs none."""
    if with_spans:
        return None
    annotators = read_corpus_config(corpus).get("span_annotators")
    built = f" (span annotators: {', '.join(annotators) or 'none'})" if annotators is not None else ""
    return (
        f"{with_spans:,} of {num_blocks:,} blocks of {corpus} have a salient span{built}, and --spans salient "
        "(the default) masks salient spans only. Rebuild the corpus with named entities: `openrealm corpus build "
        "... --spans spacy` or `--spans MODEL` (a token-classification model; the date regex runs with either, and "
        "alone by default), or pre-train with random masking: `openrealm train pretrain ... --spans random_span` "
        "(or `--spans random_token`)."
    )


def distinct_blocks_refusal(num_live: int, num_duplicates: int, num_candidates: int, corpus) -> str | None:
    """Why pre-training cannot start when the corpus's searchable blocks hold fewer distinct ones (title and text) than
    the K blocks each query retrieves, or None. Then every retrieved set holds two copies of one block (or the search
    cannot fill K), and Google's generator drops every such example."""
    distinct = num_live - num_duplicates
    if distinct >= num_candidates:
        return None
    held = f"{num_live:,} searchable blocks" + (
        f", of which {num_duplicates:,} duplicate another" if num_duplicates else ""
    )
    return (
        f"--num-candidates {num_candidates} retrieves {num_candidates} blocks per query, but {corpus} holds only "
        f"{distinct:,} distinct ones ({held}): every query would be dropped. Lower --num-candidates (at least 2), or "
        "use a larger corpus (`openrealm corpus build` drops duplicate blocks unless --no-deduplicate)"
    )


def check_corpus(args: argparse.Namespace, blocks, main_process: bool = True) -> tuple[str | None, int]:
    """(why pre-training cannot start on this corpus, or None; the number of duplicate blocks it holds): with
    `--spans salient`, no block with a salient span (`salient_span_refusal`) or more than --max-dropped-share without
    one; fewer distinct searchable blocks than --num-candidates (`distinct_blocks_refusal`). The main process prints
    how many blocks have a span and warns of duplicate blocks. --hold-out-queries N is drawn among the blocks with a
    span (training_queries); a run that trains (not --preflight, which only measures) must keep one of them, and the
    rows it holds out are no rows read. Decided alike on every rank."""
    held_out = getattr(args, "hold_out_queries", 0)
    trained = 0 if getattr(args, "preflight", False) else held_out  # held-out blocks a training run leaves out
    removed = read_removed_block_ids(args.corpus)
    live = without_rows(blocks, removed)  # the rows that give queries: `corpus remove` took the others out
    with_spans = count_blocks_with_spans(live) if args.spans == "salient" or held_out else 0
    if held_out > with_spans:
        return (
            f"--hold-out-queries {held_out} asks for more held-out query blocks than the {with_spans:,} blocks of "
            f"{args.corpus} with a salient span (they are drawn among those): lower it"
        ), 0
    if args.spans == "salient":
        refusal = salient_span_refusal(with_spans, len(live), args.corpus)
        if refusal is None and trained == with_spans:
            refusal = (
                f"--hold-out-queries {held_out} holds out every block of {args.corpus} with a salient span, and "
                "--spans salient masks salient spans only: no query would train; lower it"
            )
        if refusal is None:  # the rows without a span are dropped whatever is retrieved
            without = {"num_skipped_no_valid_spans": len(live) - with_spans}
            max_share = getattr(args, "max_dropped_share", MAX_DROPPED_SHARE)
            rows = len(live) - trained  # the rows that give training queries
            refusal, _ = check_dropped(rows, without, drop_causes(QUERY_SEQ_LEN), max_share, "corpus rows")
        if refusal is not None:
            return refusal, 0
        if with_spans < len(live) and main_process:
            print(
                f"REALM pre-training: {with_spans:,} of {len(live):,} blocks have a salient span; the queries of "
                "the others are dropped (num_skipped_no_valid_spans in the logs)"
            )
    num_duplicates = count_duplicate_blocks(blocks.with_format("arrow")["uid"], removed)
    refusal = distinct_blocks_refusal(len(live), num_duplicates, args.num_candidates, args.corpus)
    if refusal is not None:
        return refusal, num_duplicates
    if num_duplicates and main_process:
        warning = duplicates_warning(num_duplicates, len(live))
        print(f"REALM pre-training: warning: {warning} (num_dropped_duplicate_uids in the logs)", file=sys.stderr)
    return None, num_duplicates


def run_drops(totals) -> tuple[int, dict[str, int]]:
    """(corpus rows read, those that gave no example by cause) of a run's totals (run_totals)."""
    return totals["num_examples"] + dropped_examples(totals), {name: totals[name] for name in DROP_COUNTERS}


def held_out_blocks(
    blocks, args: argparse.Namespace, num_blocks: int | None = None, removed: np.ndarray | None = None
) -> list[int]:
    """The run's held-out query blocks: held_out_query_blocks of its seed among the blocks `corpus remove` left
    (`removed`: read from the corpus unless given), N = --hold-out-queries unless given."""
    num_blocks = getattr(args, "hold_out_queries", 0) if num_blocks is None else num_blocks
    removed = read_removed_block_ids(args.corpus) if removed is None else removed
    return held_out_query_blocks(blocks, num_blocks, args.seed, removed)


def training_queries(blocks, args: argparse.Namespace):
    """The corpus rows that give training queries: every block, less those `corpus remove` removed (never trained on,
    as never retrieved) and the --hold-out-queries ones (held_out_blocks), which stay in the index as candidates."""
    removed = read_removed_block_ids(args.corpus)
    return without_rows(blocks, np.union1d(removed, held_out_blocks(blocks, args, removed=removed)))


def run_inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(flag, path) of what a run reads, which its --output must stay apart from."""
    return [("--corpus", args.corpus), ("--embedder", args.embedder), ("--encoder", args.encoder),
            ("--tokenizer", args.tokenizer), ("--index", args.index)]  # fmt: skip


__all__ = [
    "DROP_COUNTERS",
    "ROWS_READ",
    "RUN_COUNTERS",
    "SKIPPED_COUNTERS",
    "check_corpus",
    "count_blocks_with_spans",
    "distinct_blocks_refusal",
    "distributed_state",
    "drop_causes",
    "dropped_examples",
    "fit_sequence_lengths",
    "held_out_blocks",
    "index_shards",
    "initial_index",
    "run_drops",
    "run_inputs",
    "runs_on_cpu_processes",
    "salient_span_refusal",
    "shard_device",
    "training_queries",
]
