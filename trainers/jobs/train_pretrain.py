"""The `openrealm train pretrain` job: REALM's retrieval-augmented salient-span MLM on transformers' `Trainer`.

    openrealm train pretrain --corpus DIR --embedder MODEL --encoder MODEL --output DIR --max-steps N \
        --refresh-every N [--refresh-mode async|sync|off] [options]

This module wires the parts of trainers/pretraining/ together: the collator (masked queries -> top-K candidates from
the current index), `RealmPretrainingModel` (the marginal likelihood that trains the retriever), `IndexRefreshCallback`
(the index refresh) and the checks before training (a run that would train nothing is refused or stopped). What a run
writes, logs and checkpoints, the refresh, several processes and the departures from Google's train_realm.py:
docs/pretraining.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from openrealm.file_utils import atomic_directory, check_apart
from openrealm.hub_cards.model_card import realm_model_card
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.masking import SalientSpanCollator
from openrealm.trainers.checkpoints import resolve_resume
from openrealm.trainers.dropped import DroppedExamplesGuard, check_dropped
from openrealm.trainers.indexing import list_versions
from openrealm.trainers.options import MAX_DROPPED_SHARE
from openrealm.trainers.output import quiet_trainer_logs
from openrealm.trainers.pretraining import (
    CANDIDATE_SEQ_LEN,
    JOINT_SEQ_LEN,
    QUERY_SEQ_LEN,
    RealmPretrainingExamples,
    RealmPretrainingModel,
)
from openrealm.trainers.pretraining.builder import snapshot_embedder
from openrealm.trainers.pretraining.examples import COUNTERS
from openrealm.trainers.pretraining.preparation import (
    ROWS_READ,
    check_corpus,
    distributed_state,
    drop_causes,
    fit_sequence_lengths,
    held_out_blocks,
    index_shards,
    initial_index,
    run_drops,
    run_inputs,
    runs_on_cpu_processes,
    shard_device,
    training_queries,
)
from openrealm.trainers.pretraining.refresh import IndexRefreshCallback, check_refresh_settings
from openrealm.trainers.pretraining.trainer import (
    CHECKPOINT_FILES,
    PRIOR_SAMPLE_QUERIES,
    RANK_RECORDS_DIR,
    TOWERS,
    NullDocumentWatch,
    PretrainingCollator,
    RealmPretrainingTrainer,
    RetrieverFreeze,
    checkpoint_extras,
    checkpoint_index,
    checkpoint_index_versions,
    restore_refresh_state,
    save_towers,
    set_initial_prior_entropy,
    write_rank_record,
)
from openrealm.trainers.stage_utils import (
    google_training_arguments,
    holding_output,
    leave_process_group,
    parse_config_overrides,
    prepare_output,
    refuse,
)
from openrealm.trainers.towers import (
    load_embedder,
    load_encoder,
)

# What --overwrite removes of an earlier run in OUTPUT: its checkpoints, its index versions (the default --index-root,
# OUTPUT/index, whose versions this run's would collide with) and its rank records.
EARLIER_RUN = (f"{PREFIX_CHECKPOINT_DIR}-*", "index", RANK_RECORDS_DIR)
# What `--preflight` writes in OUTPUT (trainers/pretraining/preflight.py): no earlier run, so a run into OUTPUT may
# follow it.
PREFLIGHT_ENTRIES = ("preflight.json", "preflight")


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------------------------------


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
    training_args = google_training_arguments(
        args,
        dataloader_drop_last=True,
        # The collator must run in this process: its examples object is the one the refresh callback updates.
        dataloader_num_workers=0,
        label_names=["labels"],
        gradient_accumulation_steps=getattr(args, "gradient_accumulation_steps", 1),
        use_cpu=runs_on_cpu_processes(),  # DDP over gloo when several processes run without a GPU
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
    null_watch = NullDocumentWatch()
    trainer = RealmPretrainingTrainer(
        model=model,
        args=training_args,
        train_dataset=queries,
        data_collator=PretrainingCollator(masker, examples),
        callbacks=[refresh, guard, null_watch, *(callbacks or ())],
        refresh=refresh,
    )
    trainer.guard, trainer.null_watch = guard, null_watch
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
        from openrealm.trainers.pretraining.preflight import run_preflight

        return run_preflight(args)
    resuming = getattr(args, "resume_from_checkpoint", None) is not None
    lag = getattr(args, "refresh_lag", None)
    try:  # before anything is checked on disk, loaded or built
        check_refresh_settings(args.refresh_mode, args.refresh_every, lag)
    except ValueError as error:
        raise ValueError(f"{error} (--refresh-mode, --refresh-every, --refresh-lag)") from None
    entropy = getattr(args, "initial_prior_entropy", None)
    if entropy is not None and not 0.0 < entropy < math.log(args.num_candidates):
        raise ValueError(
            f"--initial-prior-entropy {entropy} must lie between 0 and log K = {math.log(args.num_candidates):.3f} "
            f"nats (K = --num-candidates {args.num_candidates})"
        )
    # before anything loads: an output apart from the inputs, holding no earlier run unless resumed or overwritten
    clear_output = prepare_output(
        args.output, getattr(args, "overwrite", False), resuming, run_inputs(args), EARLIER_RUN, kept=PREFLIGHT_ENTRIES
    )
    check_apart(args.index_root or Path(args.output) / "index", run_inputs(args), "--index-root")
    if args.index_root and not resuming and list_versions(args.index_root):
        raise FileExistsError(
            f"--index-root {args.index_root} already holds index versions of another run, which this run's would "
            "collide with: choose an empty --index-root, or pass --resume-from-checkpoint to continue that run"
        )
    state = distributed_state()
    world = state.num_processes
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    blocks = load_corpus(args.corpus)  # memory-mapped Arrow: the ranks share its pages
    # Before any model is loaded or index built, every rank deciding alike: runs that would drop (nearly) everything.
    refusal, _ = check_corpus(args, blocks, state.is_main_process)
    num_queries = len(training_queries(blocks, args)) if refusal is None else 0
    if refusal is None and num_queries < args.batch_size * world:  # whole batches only: none would be drawn
        refusal = (
            f"corpus {args.corpus} gives {num_queries} training queries (its blocks less those removed and held out), "
            f"fewer than one global batch ({args.batch_size} x {world} processes): lower --batch-size"
        )
    if refusal is not None:
        return refuse(state, refusal)
    max_share = getattr(args, "max_dropped_share", MAX_DROPPED_SHARE)
    overrides = parse_config_overrides(args.config_overrides)
    embedder = load_embedder(args.embedder, tokenizer, overrides, args.seed, "--embedder")
    encoder = load_encoder(args.encoder, tokenizer, overrides, args.seed, "--encoder")
    fit_sequence_lengths(args, embedder, encoder, tokenizer)
    state.wait_for_everyone()
    checkpoint = resolve_resume(getattr(args, "resume_from_checkpoint", None), args.output, CHECKPOINT_FILES)
    clear_output()  # every check passed: --overwrite removes the earlier run now, before index v0 is written
    if checkpoint is None:
        index_root = Path(args.index_root or Path(args.output) / "index")
        index = initial_index(args, embedder, index_root, accelerator=state if world > 1 else None)
    else:
        index = checkpoint_index(checkpoint, index_shards(args, world) > 1, shard_device(args, world))
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
            "held_out_query_blocks": held_out_blocks(blocks, args),
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
            "null_document_collapse": trainer.null_watch.first,
            "log_history": trainer.state.log_history,
        }
        save_models(trainer.accelerator.unwrap_model(trainer.model), tokenizer, args.output, summary)
        print(
            f"REALM pre-training: saved embedder/, encoder/ and scorer/ to {args.output} "
            f"(train loss {result.training_loss:.4f})"
            + "".join(f"; warning: {text}" for text in (warning, trainer.null_watch.message()) if text)
        )
        if getattr(args, "push_to_hub", None):
            pushed = push_to_hub(args.output, args.push_to_hub, private=args.hub_private)
            print("REALM pre-training: pushed " + ", ".join(f"{k} -> {v}" for k, v in pushed.items()))
    leave_process_group(state)
    return 0


__all__ = [
    "build_trainer",
    "run",
]
