"""What every training stage shares: Google's optimisation and warm-up rule, `--config-overrides`, the output-folder
checks and lock, eval mode for a while, and the end of a multi-process run. No stage imports another stage's
module for these."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from openrealm.file_utils import check_apart, writer_lock
from openrealm.trainers.checkpoints import is_staging_leftover, remove_stale_staging

if TYPE_CHECKING:
    from accelerate import PartialState


def google_warmup_steps(max_steps: int) -> int:
    """Google's warm-up: min(10000, max(100, max_steps / 10)) steps (BERT optimisation, used by ICT and ORQA)."""
    return int(min(10000, max(100, max_steps // 10)))


def google_training_arguments(args: argparse.Namespace, **arguments):
    """transformers' TrainingArguments with BERT's optimisation as Google's REALM and ORQA code runs it
    (optimization.py: AdamW, weight decay 0.01 without LayerNorm and biases, eps 1e-6, clip 1.0, linear warm-up then
    linear decay to 0), filled from the options every training job shares (--output, --max-steps, --batch-size,
    --learning-rate, --warmup-steps, --logging-steps, --save-steps, --save-total-limit, --seed, --bf16, --report-to,
    --quiet). `arguments`: what a job adds or changes."""
    from transformers import TrainingArguments

    save_steps = getattr(args, "save_steps", None)
    shared = dict(
        output_dir=args.output,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=google_warmup_steps(args.max_steps) if args.warmup_steps is None else args.warmup_steps,
        logging_steps=args.logging_steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_total_limit=getattr(args, "save_total_limit", None),
        seed=args.seed,
        data_seed=args.seed,
        dataloader_pin_memory=torch.cuda.is_available(),
        remove_unused_columns=False,  # the collators read corpus columns the models do not take
        bf16=args.bf16,
        report_to=args.report_to,
        disable_tqdm=args.quiet,
    )
    return TrainingArguments(**{**shared, **arguments})


# The fields that size a tower, named when a --config-overrides key is close to no field.
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "retriever_proj_size",
               "max_position_embeddings", "vocab_size")  # fmt: skip


def parse_config_overrides(text: str | None) -> dict:
    """ "hidden_size=64,num_hidden_layers=2,hidden_act=gelu" -> {"hidden_size": 64, ...} (values read as JSON when
    they parse, else kept as strings). A ValueError names an item that is not key=value, a key given twice, and a key
    that is no field of RealmConfig, with the closest field: a misspelt key would otherwise be stored in config.json
    while the field it meant kept its default (a full-size model)."""
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"config override {item!r} is not key=value")
        if key in overrides:
            raise ValueError(f"config override {key!r} is given twice")
        check_config_field(key)
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value.strip()
    return overrides


@functools.cache
def config_fields() -> frozenset[str]:
    """The fields a --config-overrides key may name: RealmConfig's (BERT's, REALM's and PreTrainedConfig's)."""
    from openrealm import RealmConfig

    fields = {field.name for field in dataclasses.fields(RealmConfig)}
    return frozenset(fields | (set(RealmConfig().to_dict()) - {"model_type"}))


def check_config_field(key: str) -> None:
    """A ValueError for a --config-overrides key that is no field of RealmConfig, naming the closest one."""
    fields = config_fields()
    if key in fields:
        return
    closest = difflib.get_close_matches(key, sorted(fields), n=1)
    hint = f": did you mean {closest[0]}?" if closest else f" (the fields that size a model: {', '.join(SIZE_FIELDS)})"
    raise ValueError(f"config override {key!r} is not a field of RealmConfig{hint}")


def holding_output(run: Callable[..., int]) -> Callable[..., int]:
    """A training job's run(args, ...) holding the writer lock of args.output (file_utils.writer_lock) for the whole
    run, on the main process (RANK 0): a second job into the same --output while one runs is refused at once
    (WriterBusyError, exit 2) instead of both passing prepare_output's checks on a folder that is still empty and
    then replacing each other's checkpoints and model. The lock is taken before prepare_output's checks."""

    @functools.wraps(run)
    def locked(args: argparse.Namespace, *more, **kwargs) -> int:
        if int(os.environ.get("RANK", "0")) != 0:
            return run(args, *more, **kwargs)
        with writer_lock(args.output, wait=False):
            return run(args, *more, **kwargs)

    return locked


def prepare_output(
    output: str | os.PathLike,
    overwrite: bool,
    resume: bool,
    inputs: Iterable = (),
    earlier_run: Iterable[str] = ("checkpoint-*",),
    resumable: bool = True,
    kept: Iterable[str] = (),
) -> Callable[[], None]:
    """Refuse an OUTPUT that is, holds or lies inside one of `inputs` ((flag, path) pairs: the corpus, the model it
    starts from...), and a non-empty OUTPUT (an earlier run's) unless resuming or overwriting. Returns `clear`, which
    the job calls once every option and input has been checked, just before it first writes (a refused run leaves
    OUTPUT as it was): it removes the staging folders of checkpoints a killed run left half-written (which do not make
    OUTPUT non-empty) and, with --overwrite, the entries of OUTPUT matching the `earlier_run` patterns (the old
    checkpoint-* folders, which Trainer's rotation would otherwise count as this run's and `--resume-from-checkpoint
    last` would continue). resumable: whether the job takes --resume-from-checkpoint (the refusal suggests it). kept:
    names of entries that are no earlier run (e.g. what `train pretrain --preflight` writes) and do not make OUTPUT
    non-empty either; --overwrite keeps them."""
    check_apart(output, inputs, "--output")
    path = Path(output)
    main = int(os.environ.get("RANK", "0")) == 0
    kept = set(kept)
    earlier = not resume and path.is_dir()
    earlier = earlier and not all(is_staging_leftover(p.name) or p.name in kept for p in path.iterdir())
    if earlier and not overwrite:
        resuming = " or --resume-from-checkpoint to continue" if resumable else ""
        raise FileExistsError(
            f"output folder {path} is not empty: pass --overwrite to replace it{resuming}, or choose another --output"
        )

    def clear() -> None:
        if not main:
            return
        remove_stale_staging(path)
        for pattern in earlier_run if earlier else ():
            for entry in path.glob(pattern):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    return clear


# Seconds every rank sleeps (GIL released) before leaving the process group; see leave_process_group.
GLOO_DRAIN_SECONDS = 0.5


def leave_process_group(state: PartialState) -> None:
    """Every rank waits for the others, then leaves the process group without hanging or aborting.

    Two torch/gloo hazards at the end of a multi-process run. A rank that exits with gloo's threads still up aborts
    ("terminate called without an active exception"), so every rank destroys the group. And gloo's worker threads
    free a finished collective's work *after* the caller has returned from it; that drops Python tensors, which
    needs the GIL. When the last reference to the group goes (the DDP wrapper's Reducer as `run` returns, or the
    group itself), it joins those threads while holding the GIL: a worker still waiting for the GIL deadlocks the
    rank (1 two-process ICT run in 10-40 on 2 busy cores; py-spy: main thread in ~ProcessGroupGloo ->
    thread::join, worker in ~AsyncBarrierWork -> gil_scoped_acquire). Sleeping releases the GIL so the workers
    finish first; no collective follows, so they stay idle until joined. state: a PartialState or AcceleratorState.
    """
    state.wait_for_everyone()
    if state.num_processes > 1:
        time.sleep(GLOO_DRAIN_SECONDS)
    state.destroy_process_group()


def refuse(state: PartialState, message: str) -> int:
    """End a run that every process found it cannot do: the processes leave their group, then the main one raises
    ValueError(message) (the CLI prints `openrealm: error: MESSAGE` and exits 2) and the others return 2."""
    leave_process_group(state)
    if state.is_main_process:
        raise ValueError(message)
    return 2


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the torch.distributed job, (0, 1) outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DDP / torch.compile wrappers (the callback needs its `embedder`)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """eval() for the duration (no dropout), then the caller's mode back (the trainer's embedder is in train mode)."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@contextmanager
def all_cpu_cores(limit: int | None = None) -> Iterator[None]:
    """Every core for torch within the block, at most `limit` threads (a process may hold fewer, e.g.
    quickstart.share_cpu_cores's half), then as before."""
    threads = torch.get_num_threads()
    cores = os.cpu_count() or threads
    torch.set_num_threads(min(cores, limit) if limit else cores)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


__all__ = [
    "all_cpu_cores",
    "eval_mode",
    "google_training_arguments",
    "google_warmup_steps",
    "holding_output",
    "leave_process_group",
    "parse_config_overrides",
    "prepare_output",
    "rank_and_world",
    "refuse",
    "unwrap_model",
]
