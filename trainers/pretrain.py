"""REALM pre-training job: retrieval-augmented salient-span MLM on transformers' `Trainer` (Google §2-§4).

    openrealm train pretrain --corpus DIR --embedder MODEL --encoder MODEL --output DIR --max-steps N \
        --refresh-every N [--refresh-mode async|sync|off] [options]

MODEL: a folder or Hub id of a REALM checkpoint (RealmEmbedder / RealmKnowledgeAugEncoder) or of any BERT checkpoint
(new REALM heads), or `random` sized by `--config-overrides`. Google starts the embedder from ICT and the encoder from
BERT.

The loop is the stock `Trainer`; the REALM parts are a data collator (`SalientSpanCollator` -> masked queries, then
`RealmPretrainingExamples` -> top-K candidates from the current index, null document first), the model
(`RealmPretrainingModel`: marginal MLM loss over the K candidates) and the `IndexRefreshCallback`, which shares the
examples object with the collator and swaps its (query embedder, index) pair. Before training, index version 0 is built
from the initial embedder into OUTPUT/index (or `--index ROOT` is loaded; it must have been built from --embedder).

Logged with the loss: retrieval_utility, null_doc_prob, retrieval_entropy (of p(z|x): near 0 means a saturated retrieval
softmax), top/oracle candidate log-probs (Google §3.6), the examples' counters (trivial retrievals, examples dropped for
duplicate uids, queries skipped by the masker in all and by reason, their sum num_dropped_examples, and
num_skipped_batches: batches left with no example, which take a zero-loss step instead of crashing), the batches' index
version and the refresh metrics (index_version, index_staleness_steps/seconds, refresh_stall_seconds, builds).

A run that would train (nearly) nothing does not end "done" (trainers/dropped.py, docs/pretraining.md): it is refused
before anything is built when the corpus shows it (no block with a salient span, `salient_span_refusal`; more than
--max-dropped-share of the blocks without one; fewer distinct searchable blocks than --num-candidates,
`distinct_blocks_refusal`), and otherwise stopped with an error, saving no model, once more than --max-dropped-share of
the corpus rows read gave no example; above half, the summary line warns with the counts by cause.

OUTPUT at the end: `embedder/` (RealmEmbedder), `encoder/` (RealmKnowledgeAugEncoder), `scorer/` (RealmScorer holding
the embedder's weights), each with the tokenizer and a model card (README.md, `openrealm.hub_cards`), the tokenizer at
the top too, `pretraining.json` (settings, final metrics, and the run's skipped_batches / dropped_examples summed over
the processes), and `index/` (the newest index versions).

Checkpoints (`--save-steps N`, the newest `--save-total-limit` kept): OUTPUT/checkpoint-STEP/ holds the Trainer's files
(optimizer, scheduler, RNG, trainer_state.json) plus `embedder/`, `encoder/` (the weights), `scorer/`,
`query_embedder/` (the frozen snapshot the index in use was built from), the tokenizer and `refresh_state.json` (index
version in use, its snapshot step/time, index_root). A checkpoint appears whole or not at all (written into a hidden
staging folder and renamed into place when complete: trainers/checkpoints.py), and `--resume-from-checkpoint last`
takes the newest whole one. The index versions a kept checkpoint uses are never pruned.
`--resume-from-checkpoint [PATH|last]` restores the Trainer state and the (query embedder, index) pair of
refresh_state.json before training continues.

`--preflight` trains nothing into OUTPUT: trainers/preflight.py measures whether this run can train its retriever
(spans stated in other blocks, answers among the start's candidates, p(z|x)'s entropy, the reader's utility, a short
oracle-reader run of this job) and writes OUTPUT/preflight.json with a verdict and advice (docs/pretraining.md).

`--push-to-hub REPO` uploads embedder/, encoder/ and scorer/ to three repos REPO-embedder, REPO-encoder, REPO-scorer
(each loadable with `from_pretrained(repo)`), with their model cards.

Several processes (`accelerate launch --multi_gpu --num_processes N -m openrealm train pretrain ...`; on a CPU-only
machine too, as DDP over gloo): DDP through the Trainer; index v0 is embedded sharded and written by rank 0; the refresh
callback makes every rank swap to the same index version at the same step (see trainers/refresh.py); checkpoints go
through one staging folder shared by the ranks (each adds its rng state) and rank 0 alone writes the rest, as it alone
writes the output folders, the others waiting at barriers. Each rank writes OUTPUT/refresh/rank-R.json: the
(first step, index version) pairs it trained with and its batches were collated from, its swaps, peak memory.
With `--shard-index` (exact index) every version is written as one file per rank and each rank holds only its
rows as a ShardedBlockIndex on its device; each collate step's search is collective (index_realm.ShardedBlockIndex).

Departures from Google's code: the DataLoader runs in the training process (dataloader_num_workers=0) because the
collator's examples object is the one the refresh callback updates (Google runs separate example-generator servers).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.file_utils import atomic_directory, check_apart, write_text_atomic
from openrealm.hub_cards.model_card import realm_model_card
from openrealm.tokenization.corpus import (
    count_duplicate_blocks,
    duplicates_warning,
    load_corpus,
    read_corpus_config,
    read_removed_block_ids,
)
from openrealm.tokenization.masking import SKIP_REASONS, SalientSpanCollator
from openrealm.trainers.checkpoints import StagedCheckpointTrainer, resolve_resume
from openrealm.trainers.dropped import DroppedExamplesGuard, check_dropped
from openrealm.trainers.ict import google_warmup_steps, holding_output, parse_config_overrides, prepare_output
from openrealm.trainers.index_builder import build_index, leave_process_group, list_versions, load_index
from openrealm.trainers.options import MAX_DROPPED_SHARE, train_pretrain
from openrealm.trainers.output import quiet_trainer_logs
from openrealm.trainers.pretrain_eval import held_out_query_blocks
from openrealm.trainers.pretraining import (
    CANDIDATE_SEQ_LEN,
    COUNTERS,
    JOINT_SEQ_LEN,
    QUERY_SEQ_LEN,
    RealmPretrainingExamples,
    RealmPretrainingModel,
    batch_on,
    mean_entropy,
    scale_retrieval_embeddings,
    sharpness_for_entropy,
)
from openrealm.trainers.refresh import IndexRefreshCallback, check_refresh_settings, snapshot_embedder
from openrealm.trainers.towers import (
    check_tokenizer,
    fit_length,
    load_embedder,
    load_encoder,
    scorer_from_embedder,
)

OUTPUT_METRICS = (
    "retrieval_utility",
    "null_doc_prob",
    "retrieval_entropy",
    "top_candidate_log_prob",
    "oracle_candidate_log_prob",
    "answer_in_candidates",
    "answer_posterior_gain",
    "answer_reader_advantage",
)
BATCH_EXTRAS = ("uid", "stats", "index_version", "block_id", "candidate_block_ids", "num_skipped")
REFRESH_STATE_NAME = "refresh_state.json"
QUERY_EMBEDDER_DIR = "query_embedder"
CHECKPOINT_FILES = (TRAINER_STATE_NAME, REFRESH_STATE_NAME)  # what a whole pre-training checkpoint holds
TOWERS = ("embedder", "encoder", "scorer")
RANK_RECORDS_DIR = "refresh"  # OUTPUT/refresh/rank-R.json: the index versions each process used, by step
# What --overwrite removes of an earlier run in OUTPUT: its checkpoints, its index versions (the default --index-root,
# OUTPUT/index, whose versions this run's would collide with) and its rank records.
EARLIER_RUN = (f"{PREFIX_CHECKPOINT_DIR}-*", "index", RANK_RECORDS_DIR)
# Logged counters: the examples' (COUNTERS), queries the masker skipped (in all, and by reason), per-process batches
# left with no example (a zero-loss step, see RealmPretrainingModel._skipped_batch_output).
SKIPPED_COUNTERS = tuple(f"num_skipped_{reason}" for reason in SKIP_REASONS)
RUN_COUNTERS = (*COUNTERS, "num_skipped_queries", *SKIPPED_COUNTERS, "num_skipped_batches")
# The counters of corpus rows that gave no example, by cause.
DROP_COUNTERS = ("num_dropped_duplicate_uids", *SKIPPED_COUNTERS)
ROWS_READ = "corpus rows read"  # what the drop messages count
# What `--preflight` writes in OUTPUT (trainers/preflight.py): no earlier run, so a run into OUTPUT may follow it.
PREFLIGHT_ENTRIES = ("preflight.json", "preflight")


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


class PretrainingCollator:
    """Corpus rows -> masked queries (SalientSpanCollator) -> REALM examples (RealmPretrainingExamples); adds the
    masker's skip counts of the batch by reason as `num_skipped`."""

    def __init__(self, masker: SalientSpanCollator, examples: RealmPretrainingExamples):
        self.masker, self.examples = masker, examples

    def __call__(self, rows: list[dict]) -> dict:
        queries = self.masker(rows)
        batch = self.examples(queries)
        batch["num_skipped"] = dict(queries["num_skipped"])
        return batch


class RealmPretrainingTrainer(StagedCheckpointTrainer):
    """`Trainer` whose compute_loss drops the batch's bookkeeping keys and accumulates REALM's metrics, which `log`
    adds (averaged since the previous log) to the loss entry, with the refresh callback's metrics. Checkpoints are
    staged (StagedCheckpointTrainer) and hold the towers as CHECKPOINT/embedder/ and CHECKPOINT/encoder/;
    checkpoint_extras adds the REALM folders (see `checkpoint_extras` below)."""

    def __init__(
        self,
        *args,
        refresh: IndexRefreshCallback | None = None,
        checkpoint_extras: Callable[[Path], None] | None = None,
        **kwargs,
    ):
        towers = {"embedder": RealmEmbedder, "encoder": RealmKnowledgeAugEncoder}
        super().__init__(*args, towers=towers, checkpoint_extras=checkpoint_extras, **kwargs)
        self.refresh = refresh
        self.guard: DroppedExamplesGuard | None = None  # build_trainer's: stops a run that drops (nearly) everything
        # The model returns a token-mean loss; it takes no num_items_in_batch.
        self.model_accepts_loss_kwargs = False
        self._sums: Counter = Counter()
        self.totals: Counter = Counter()  # the counters over the whole run in this process (never reset)
        self._steps = 0
        self._batch_index_version = -1
        self.embedder_learning_rate: float | None = None  # None: the embedder trains at args.learning_rate
        self.batch_index_versions: list[tuple[int, int]] = []  # (first step whose batch used a version, version)

    def create_optimizer(self, model=None):
        """The Trainer's AdamW; with `embedder_learning_rate`, the retriever's parameters form their own groups at
        that peak rate (the schedule scales every group alike)."""
        optimizer = super().create_optimizer(model)
        if self.embedder_learning_rate is None:
            return optimizer
        embedder_params = {id(p) for p in self.accelerator.unwrap_model(self.model).embedder.parameters()}
        groups = []
        for group in optimizer.param_groups:
            for in_embedder, learning_rate in ((False, group["lr"]), (True, self.embedder_learning_rate)):
                params = [p for p in group["params"] if (id(p) in embedder_params) == in_embedder]
                if params:
                    groups.append({**group, "params": params, "lr": learning_rate})
        optimizer.param_groups.clear()  # no step taken yet: no optimizer state to carry over
        for group in groups:
            optimizer.add_param_group(group)
        return optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss; REALM's metrics and counters accumulate for `log`. A batch whose every example was
        dropped (no usable span, duplicate uids) still goes through `model`: its zero loss reaches every parameter
        through the DDP wrapper (see `RealmPretrainingModel._skipped_batch_output`); it is counted in
        num_skipped_batches and left out of the model metrics' means."""
        inputs = dict(inputs)
        extras = {name: inputs.pop(name, None) for name in BATCH_EXTRAS}
        counts = Counter(extras["stats"] or {})
        for reason, count in (extras["num_skipped"] or {}).items():
            counts[f"num_skipped_{reason}"] += count
            counts["num_skipped_queries"] += count
        skipped = not bool((inputs["labels"] != -100).any())
        counts["num_skipped_batches"] += int(skipped)
        self._sums.update(counts)
        self.totals.update(counts)
        if extras["index_version"] is not None:
            self._batch_index_version = extras["index_version"]
            if not self.batch_index_versions or self.batch_index_versions[-1][1] != self._batch_index_version:
                self.batch_index_versions.append((self.state.global_step + 1, self._batch_index_version))
        outputs = model(**inputs)
        if not skipped:
            self._steps += 1
            for name in OUTPUT_METRICS:
                self._sums[name] += float(getattr(outputs, name).detach())
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def _save_checkpoint(self, model, trial) -> None:
        """Save a checkpoint (StagedCheckpointTrainer) without touching the random number generators: building the
        scorer to save it initialises weights, which would shift every later dropout mask and masking draw, so a run
        that checkpoints would train differently from one that does not."""
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            super()._save_checkpoint(model, trial)

    def checkpoint_saved(self, run_dir: Path) -> None:
        """Prune the index versions no kept checkpoint resumes with (nor the refresh uses)."""
        if self.refresh is not None:
            self.refresh.protected_versions = checkpoint_index_versions(run_dir)
            self.refresh.prune_versions()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(self.pretraining_metrics())
        super().log(logs, start_time)

    def run_totals(self) -> dict[str, int]:
        """The counters over the whole run (since this process started or resumed), summed over the processes, and
        num_dropped_examples. A collective under several processes: every rank must call it."""
        counts = torch.tensor([self.totals[name] for name in RUN_COUNTERS], dtype=torch.long)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts.to(self.accelerator.device), reduction="sum").cpu()
        totals = dict(zip(RUN_COUNTERS, counts.tolist()))
        totals["num_dropped_examples"] = dropped_examples(totals)
        return totals

    def pretraining_metrics(self) -> dict[str, float]:
        """REALM's metrics since the previous call (means of the model's, sums of the counters), then reset."""
        metrics: dict[str, float] = {}
        for name in OUTPUT_METRICS:
            if self._steps:
                metrics[name] = round(self._sums[name] / self._steps, 5)
        for name in RUN_COUNTERS:
            metrics[name] = self._sums[name]
        metrics["num_dropped_examples"] = dropped_examples(self._sums)
        metrics["batch_index_version"] = self._batch_index_version
        if self.refresh is not None:
            metrics.update(self.refresh.metrics(self.state.global_step))
        self._sums, self._steps = Counter(), 0
        return metrics


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------------------------------


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
        return load_index(args.index, sharded=index_shards(args, world) > 1, device=_shard_device(args, world))
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


def _shard_device(args: argparse.Namespace, world: int) -> str | None:
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


def checkpoint_index_versions(run_dir: str | os.PathLike) -> set[int]:
    """The index versions the complete checkpoints under run_dir resume with."""
    versions = set()
    for path in Path(run_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*/{REFRESH_STATE_NAME}"):
        try:
            versions.add(int(json.loads(path.read_text())["index_version"]))
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"{path} is not a valid refresh state: {error}") from error
    return versions


def save_towers(model: RealmPretrainingModel, tokenizer, folder: Path, skip: tuple[str, ...] = ()) -> None:
    """folder/embedder/, encoder/, scorer/ (but those in skip: saved already), each with the tokenizer. folder is a
    staging folder (save_models', a checkpoint's), so each tower is written straight into it. The scorer is the
    embedder as a RealmScorer (shared query / document tower)."""
    towers = {"embedder": model.embedder, "encoder": model.encoder, "scorer": None}
    for name, tower in towers.items():
        if name not in skip:
            (tower or scorer_from_embedder(model.embedder)).save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)


def checkpoint_extras(trainer: RealmPretrainingTrainer, tokenizer) -> Callable[[Path], None]:
    """The writer of a checkpoint's REALM folders: towers, tokenizer, query embedder snapshot, refresh_state.json."""

    def write(folder: Path) -> None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        save_towers(model, tokenizer, folder, skip=("embedder", "encoder"))  # the Trainer's _save wrote them
        tokenizer.save_pretrained(folder)
        refresh = trainer.refresh
        refresh.examples.query_embedder.save_pretrained(folder / QUERY_EMBEDDER_DIR)
        state = {**refresh.checkpoint_state(), "step": trainer.state.global_step}
        write_text_atomic(folder / REFRESH_STATE_NAME, json.dumps(state, indent=2) + "\n")

    return write


def checkpoint_index(checkpoint: Path, sharded: bool = False, device: str | None = None):
    """The index version a checkpoint's refresh_state.json records, loaded from its index_root (sharded: this
    process's ShardedBlockIndex of it, on device)."""
    path = checkpoint / REFRESH_STATE_NAME
    state = json.loads(path.read_text())
    try:
        return load_index(state["index_root"], state["index_version"], sharded=sharded, device=device)
    except OSError as error:
        raise FileNotFoundError(
            f"{path} uses index version {state['index_version']} of {state['index_root']}, which cannot be loaded: "
            f"{error}"
        ) from error


def restore_refresh_state(checkpoint: Path, refresh: IndexRefreshCallback, index=None) -> dict:
    """Put the refresh callback and its examples back on the checkpoint's (query embedder, index version) pair;
    index: that version when already loaded (default: loaded here). Returns the checkpoint's refresh state."""
    state = json.loads((checkpoint / REFRESH_STATE_NAME).read_text())
    index = checkpoint_index(checkpoint) if index is None else index
    refresh.restore(state, RealmEmbedder.from_pretrained(checkpoint / QUERY_EMBEDDER_DIR), index)
    return state


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
    how many blocks have a span and warns of duplicate blocks. Decided alike on every rank."""
    if args.spans == "salient":
        with_spans = count_blocks_with_spans(blocks)
        refusal = salient_span_refusal(with_spans, len(blocks), args.corpus)
        if refusal is None:  # the rows without a span are dropped whatever is retrieved
            without = {"num_skipped_no_valid_spans": len(blocks) - with_spans}
            max_share = getattr(args, "max_dropped_share", MAX_DROPPED_SHARE)
            refusal, _ = check_dropped(len(blocks), without, drop_causes(QUERY_SEQ_LEN), max_share, "corpus rows")
        if refusal is not None:
            return refusal, 0
        if with_spans < len(blocks) and main_process:
            print(
                f"REALM pre-training: {with_spans:,} of {len(blocks):,} blocks have a salient span; the queries of "
                "the others are dropped (num_skipped_no_valid_spans in the logs)"
            )
    removed = read_removed_block_ids(args.corpus)
    num_duplicates = count_duplicate_blocks(blocks.with_format("arrow")["uid"], removed)
    refusal = distinct_blocks_refusal(len(blocks) - len(removed), num_duplicates, args.num_candidates, args.corpus)
    if refusal is not None:
        return refusal, num_duplicates
    if num_duplicates and main_process:
        warning = duplicates_warning(num_duplicates, len(blocks) - len(removed))
        print(f"REALM pre-training: warning: {warning} (num_dropped_duplicate_uids in the logs)", file=sys.stderr)
    return None, num_duplicates


def run_drops(totals) -> tuple[int, dict[str, int]]:
    """(corpus rows read, those that gave no example by cause) of a run's totals (run_totals)."""
    return totals["num_examples"] + dropped_examples(totals), {name: totals[name] for name in DROP_COUNTERS}


def refuse(state, message: str) -> int:
    """End a run that every process found it cannot do: the processes leave their group, then the main one raises
    ValueError(message) (the CLI prints `openrealm: error: MESSAGE` and exits 2) and the others return 2."""
    leave_process_group(state)
    if state.is_main_process:
        raise ValueError(message)
    return 2


def training_queries(blocks, args: argparse.Namespace):
    """The corpus rows that give training queries: every block, less the --hold-out-queries ones (held_out_query_blocks
    of the run's seed), which stay in the index as candidates."""
    held_out = held_out_query_blocks(blocks, getattr(args, "hold_out_queries", 0), args.seed)
    if not held_out:
        return blocks
    return blocks.select(np.setdiff1d(np.arange(len(blocks)), held_out))


class RetrieverFreeze(TrainerCallback):
    """The retriever takes no update in the first `steps` optimiser steps (Atlas's freeze_retriever_steps): its
    gradients are dropped before each of those steps, so AdamW leaves its weights, moments and decay untouched while
    the reader learns to read. The gradient norm clipped before is that of both towers."""

    def __init__(self, embedder: torch.nn.Module, steps: int):
        self.parameters, self.steps = list(embedder.parameters()), steps

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step < self.steps:
            for parameter in self.parameters:
                parameter.grad = None


PRIOR_SAMPLE_QUERIES = 128  # masked queries whose K candidates set --initial-prior-entropy's scale


@torch.no_grad()
def set_initial_prior_entropy(
    model: RealmPretrainingModel, examples: RealmPretrainingExamples, masker, rows, entropy: float
) -> dict[str, float]:
    """Scale the embedder's output (scale_retrieval_embeddings) so that p(z|x) over the K candidates of the masked
    queries of `rows` (corpus rows) has mean `entropy` nats; returns the entropy before, the factor and the entropy
    after. The candidates are the index's, whose ranking a scale does not change; so the index stays as built."""
    was_training, device = model.training, next(model.parameters()).device
    model.eval()
    try:
        scores = []
        for start in range(0, len(rows), 32):
            batch = examples(masker([rows[i] for i in range(start, min(start + 32, len(rows)))]))
            if len(batch["uid"]):
                query, candidates = model.embed_batch(**batch_on(batch, device))
                scores.append(torch.einsum("bp,bkp->bk", query, candidates).float().cpu())
    finally:
        model.train(was_training)
    if not scores:
        raise ValueError("--initial-prior-entropy: no sampled query gave an example to measure p(z|x) on")
    relevance = torch.cat(scores)
    sharpness = sharpness_for_entropy(relevance, entropy)
    scale_retrieval_embeddings(model.embedder, math.sqrt(sharpness))
    return {
        "entropy_before": mean_entropy(relevance),
        "embedding_scale": math.sqrt(sharpness),
        "entropy_after": mean_entropy(relevance, sharpness),
        "num_queries": int(relevance.shape[0]),
    }


def build_trainer(
    args: argparse.Namespace,
    embedder,
    encoder,
    tokenizer,
    blocks,
    index,
    callbacks: Sequence[TrainerCallback] | None = None,
) -> RealmPretrainingTrainer:
    """The Trainer with its collator, model and refresh callback (Google's optimiser, as trainers/ict.py); callbacks:
    more TrainerCallbacks, added after the refresh callback (so they see each step's index swap)."""
    from transformers import TrainingArguments

    embedder.to("cuda" if torch.cuda.is_available() else "cpu")
    examples = RealmPretrainingExamples(
        tokenizer,
        blocks,
        snapshot_embedder(embedder),
        index,
        num_candidates=args.num_candidates,
        candidate_seq_len=getattr(args, "candidate_seq_len", CANDIDATE_SEQ_LEN),
        joint_seq_len=getattr(args, "joint_seq_len", JOINT_SEQ_LEN),
    )
    query_seq_len = getattr(args, "query_seq_len", QUERY_SEQ_LEN)
    masker = SalientSpanCollator(tokenizer, strategy=args.spans, seed=args.seed, query_seq_len=query_seq_len)
    index_root = Path(args.index_root or Path(args.output) / "index")
    refresh = IndexRefreshCallback(
        examples,
        args.corpus,
        index_root,
        args.refresh_every,
        args.refresh_mode,
        snapshot_time=time.time(),
        builder_device=getattr(args, "builder_device", None),
        lag=getattr(args, "refresh_lag", None),
        build_kwargs={
            "batch_size": args.index_batch_size,
            "max_length": getattr(args, "candidate_seq_len", CANDIDATE_SEQ_LEN),
            "num_shards": index_shards(args, int(os.environ.get("WORLD_SIZE", "1"))),
        },
    )
    warmup = google_warmup_steps(args.max_steps) if args.warmup_steps is None else args.warmup_steps
    training_args = TrainingArguments(
        output_dir=args.output,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=warmup,
        logging_steps=args.logging_steps,
        save_strategy="steps" if getattr(args, "save_steps", None) else "no",
        save_steps=getattr(args, "save_steps", None) or 500,
        save_total_limit=getattr(args, "save_total_limit", None),
        seed=args.seed,
        data_seed=args.seed,
        dataloader_drop_last=True,
        # The collator must run in this process: its examples object is the one the refresh callback updates.
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        remove_unused_columns=False,  # the collator reads corpus columns the model does not take
        label_names=["labels"],
        gradient_accumulation_steps=getattr(args, "gradient_accumulation_steps", 1),
        bf16=args.bf16,
        use_cpu=runs_on_cpu_processes(),  # DDP over gloo when several processes run without a GPU
        report_to=args.report_to,
        disable_tqdm=args.quiet,
    )
    model = RealmPretrainingModel(
        embedder,
        encoder,
        embedding_dropout=args.embedding_dropout,
        oracle_reader_weight=getattr(args, "oracle_reader_weight", 0.0),
    )
    prior = None
    entropy = getattr(args, "initial_prior_entropy", None)
    queries = training_queries(blocks, args)
    if entropy is not None and getattr(args, "resume_from_checkpoint", None) is None:  # a checkpoint holds the scale
        sample = np.random.default_rng(args.seed).permutation(len(queries))[:PRIOR_SAMPLE_QUERIES]
        sampler = SalientSpanCollator(tokenizer, strategy=args.spans, seed=args.seed + 1, query_seq_len=query_seq_len)
        prior = set_initial_prior_entropy(model, examples, sampler, queries.select(np.sort(sample)), entropy)
        examples.counters = Counter({name: 0 for name in COUNTERS})  # the sample is no part of the run
    freeze_steps = getattr(args, "freeze_retriever_steps", 0)
    if freeze_steps:
        callbacks = [RetrieverFreeze(embedder, freeze_steps), *(callbacks or ())]
    guard = DroppedExamplesGuard(  # run_totals is a collective: every rank checks at the same logging steps
        lambda: run_drops(trainer.run_totals()),
        drop_causes(query_seq_len),
        getattr(args, "max_dropped_share", MAX_DROPPED_SHARE),
        ROWS_READ,
    )
    trainer = RealmPretrainingTrainer(
        model=model,
        args=training_args,
        train_dataset=queries,
        data_collator=PretrainingCollator(masker, examples),
        callbacks=[refresh, guard, *(callbacks or ())],
        refresh=refresh,
    )
    trainer.guard = guard
    trainer.initial_prior = prior
    if args.index:  # version 0 in use lives in --index, not in index_root
        refresh.index_in_use_root = Path(args.index).absolute()
    trainer.checkpoint_extras = checkpoint_extras(trainer, tokenizer)
    trainer.embedder_learning_rate = getattr(args, "embedder_learning_rate", None)
    return quiet_trainer_logs(trainer, verbose=getattr(args, "verbose", False))


def save_models(model: RealmPretrainingModel, tokenizer, output: str | os.PathLike, summary: dict) -> None:
    """OUTPUT/embedder/, OUTPUT/encoder/, OUTPUT/scorer/ (each with the tokenizer and its model card README.md), the
    tokenizer and pretraining.json at the top, all replacing OUTPUT's old ones at once (file_utils.replace_folder):
    a crash never leaves a new embedder beside an old encoder. index/, checkpoints and other entries are kept."""
    with atomic_directory(Path(output).absolute(), keep=lambda name: True) as staging:
        staging = Path(staging)
        save_towers(model, tokenizer, staging)
        for name in TOWERS:
            realm_model_card(name, summary).save(staging / name / "README.md")
        tokenizer.save_pretrained(staging)
        (staging / "pretraining.json").write_text(json.dumps(summary, indent=2) + "\n")


def push_to_hub(output: str | os.PathLike, repo: str, api=None, private: bool = False) -> dict[str, str]:
    """Upload OUTPUT/embedder, encoder and scorer (with their cards) to REPO-embedder, REPO-encoder, REPO-scorer;
    returns {folder name: repo id}."""
    from huggingface_hub import HfApi

    api = api or HfApi()
    pushed = {}
    for name in TOWERS:
        folder = Path(output) / name
        if not (folder / "README.md").is_file():
            raise FileNotFoundError(f"{folder} holds no saved model with its card (README.md)")
        repo_id = f"{repo}-{name}"
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=f"Upload REALM {name}")
        pushed[name] = repo_id
    return pushed


@holding_output
def run(args: argparse.Namespace, callbacks: Sequence[TrainerCallback] | None = None) -> int:
    """`openrealm train pretrain`: build index v0, train with refreshes, save embedder/ and encoder/.

    Under `accelerate launch` (N processes) every rank runs this: index v0 is embedded sharded and written by rank 0,
    every rank trains its share of each batch (DDP) and swaps index versions at the same steps; rank 0 alone writes
    checkpoints' shared files and the output folders, the others wait at barriers. Each rank writes
    OUTPUT/refresh/rank-R.json: the index versions it used, from which step (equal across ranks), its peak memory.
    callbacks: more TrainerCallbacks for the Trainer (build_trainer). Returns 0; the summary is in
    OUTPUT/pretraining.json."""
    from transformers import AutoTokenizer

    if getattr(args, "preflight", False):  # measure whether this run can train its retriever, instead of training
        from openrealm.trainers.preflight import run_preflight

        return run_preflight(args)
    resuming = getattr(args, "resume_from_checkpoint", None) is not None
    # before anything loads: an output apart from the inputs, holding no earlier run unless resumed or overwritten
    prepare_output(
        args.output, getattr(args, "overwrite", False), resuming, run_inputs(args), EARLIER_RUN, kept=PREFLIGHT_ENTRIES
    )
    check_apart(args.index_root or Path(args.output) / "index", run_inputs(args), "--index-root")
    if args.index_root and not resuming and list_versions(args.index_root):
        raise FileExistsError(
            f"--index-root {args.index_root} already holds index versions of another run, which this run's would "
            "collide with: choose an empty --index-root, or pass --resume-from-checkpoint to continue that run"
        )
    lag = getattr(args, "refresh_lag", None)
    try:  # before any index is built
        check_refresh_settings(args.refresh_mode, args.refresh_every, lag)
    except ValueError as error:
        print(f"openrealm: error: {error} (--refresh-mode, --refresh-every, --refresh-lag)", file=sys.stderr)
        return 2
    entropy = getattr(args, "initial_prior_entropy", None)
    if entropy is not None and not 0.0 < entropy < math.log(args.num_candidates):
        print(
            f"openrealm: error: --initial-prior-entropy {entropy} must lie between 0 and log K = "
            f"{math.log(args.num_candidates):.3f} nats (K = --num-candidates {args.num_candidates})",
            file=sys.stderr,
        )
        return 2
    state = distributed_state()
    world = state.num_processes
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    blocks = load_corpus(args.corpus)  # memory-mapped Arrow: the ranks share its pages
    # Before any model is loaded or index built, every rank deciding alike: runs that would drop (nearly) everything.
    refusal, _ = check_corpus(args, blocks, state.is_main_process)
    if refusal is not None:
        return refuse(state, refusal)
    max_share = getattr(args, "max_dropped_share", MAX_DROPPED_SHARE)
    overrides = parse_config_overrides(args.config_overrides)
    embedder = load_embedder(args.embedder, tokenizer, overrides, args.seed, "--embedder")
    encoder = load_encoder(args.encoder, tokenizer, overrides, args.seed, "--encoder")
    fit_sequence_lengths(args, embedder, encoder, tokenizer)
    state.wait_for_everyone()
    checkpoint = resolve_resume(getattr(args, "resume_from_checkpoint", None), args.output, CHECKPOINT_FILES)
    if checkpoint is None:
        index_root = Path(args.index_root or Path(args.output) / "index")
        index = initial_index(args, embedder, index_root, accelerator=state if world > 1 else None)
    else:
        index = checkpoint_index(checkpoint, index_shards(args, world) > 1, _shard_device(args, world))
    trainer = build_trainer(args, embedder, encoder, tokenizer, blocks, index, callbacks=callbacks)
    if checkpoint is not None:
        restored = restore_refresh_state(checkpoint, trainer.refresh, index)
        trainer.refresh.protected_versions = checkpoint_index_versions(args.output)
        if state.is_main_process:
            print(
                f"REALM pre-training: resuming from {checkpoint} (step {restored['step']}, "
                f"index v{restored['index_version']})"
            )
    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    final = trainer.pretraining_metrics()
    totals = trainer.run_totals()  # a collective: before the ranks part
    write_rank_record(trainer, args.output)
    refusal, warning = check_dropped(*run_drops(totals), drop_causes(args.query_seq_len), max_share, ROWS_READ)
    refusal = trainer.guard.final_refusal("REALM pre-training", args.max_steps, refusal)
    if refusal is not None:
        return refuse(state, refusal)
    state.wait_for_everyone()
    if state.is_main_process:
        summary = {
            "corpus": str(args.corpus),
            "embedder": args.embedder,
            "encoder": args.encoder,
            "max_steps": args.max_steps,
            "batch_size": args.batch_size,
            "num_processes": world,
            "learning_rate": args.learning_rate,
            "refresh_mode": args.refresh_mode,
            "refresh_every": args.refresh_every,
            "refresh_lag": lag,
            "num_candidates": args.num_candidates,
            "spans": args.spans,
            "oracle_reader_weight": getattr(args, "oracle_reader_weight", 0.0),
            "freeze_retriever_steps": getattr(args, "freeze_retriever_steps", 0),
            "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", 1),
            "initial_prior": trainer.initial_prior,
            "held_out_query_blocks": held_out_query_blocks(blocks, getattr(args, "hold_out_queries", 0), args.seed),
            "seed": args.seed,
            "num_blocks": len(blocks),
            "resumed_from": str(checkpoint) if checkpoint is not None else None,
            "train_loss": result.training_loss,
            "index_swaps": trainer.refresh.swaps,
            "index_build_failures": len(trainer.refresh.failures),
            "skipped_batches": totals["num_skipped_batches"],
            "dropped_examples": totals["num_dropped_examples"],
            "totals": totals,
            "final": final,
            "log_history": trainer.state.log_history,
        }
        save_models(trainer.accelerator.unwrap_model(trainer.model), tokenizer, args.output, summary)
        print(
            f"REALM pre-training: saved embedder/, encoder/ and scorer/ to {args.output} "
            f"(train loss {result.training_loss:.4f})" + (f"; warning: {warning}" if warning else "")
        )
        if getattr(args, "push_to_hub", None):
            pushed = push_to_hub(args.output, args.push_to_hub, private=args.hub_private)
            print("REALM pre-training: pushed " + ", ".join(f"{k} -> {v}" for k, v in pushed.items()))
    leave_process_group(state)
    return 0


def run_inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(flag, path) of what a run reads, which its --output must stay apart from."""
    return [("--corpus", args.corpus), ("--embedder", args.embedder), ("--encoder", args.encoder),
            ("--tokenizer", args.tokenizer), ("--index", args.index)]  # fmt: skip


def write_rank_record(trainer: RealmPretrainingTrainer, output: str | os.PathLike) -> Path:
    """OUTPUT/refresh/rank-R.json: this process's (first step, index version) pairs, as the refresh callback swapped
    them and as the batches were collated, its swaps and its peak resident memory (MiB)."""
    import resource

    refresh = trainer.refresh
    rank, world = trainer.args.process_index, trainer.args.world_size
    path = Path(output) / RANK_RECORDS_DIR / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "world_size": world,
        "index_versions": [list(pair) for pair in refresh.versions_by_step],
        "batch_index_versions": [list(pair) for pair in trainer.batch_index_versions],
        "swaps": [{k: v for k, v in swap.items() if k != "stall_seconds"} for swap in refresh.swaps],
        "stall_seconds": [round(swap["stall_seconds"], 5) for swap in refresh.swaps],
        "index_memory_mapped": bool(getattr(refresh.examples.index, "is_memory_mapped", False)),
        "index_rows": int(refresh.examples.index.block_emb.shape[0]),  # this process's rows: num_blocks / N if sharded
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="openrealm train pretrain", description=__doc__.split("\n\n")[0])
    train_pretrain(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
