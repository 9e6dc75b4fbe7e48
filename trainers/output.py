"""What the `openrealm` jobs print: one progress bar and one summary line per stage by default; `--quiet` drops the
bars; `--verbose` shows everything transformers and datasets report.

By default the bars of the libraries' inner steps (transformers' "Loading weights" and "Writing model shards",
datasets' "Generating train split" and "Saving the dataset") are off, and so are the Trainer's dicts of logged
metrics: a stage's own bar and its summary line are what a user reads. Warnings still print (a checkpoint with missing
weights says so in every mode but --quiet's errors-only).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Callable, Iterator

from transformers import ProgressCallback, Trainer
from transformers.trainer_callback import PrinterCallback


@contextlib.contextmanager
def configured(args: argparse.Namespace) -> Iterator[None]:
    """Inside the block, transformers', datasets' and huggingface_hub's logging and progress bars follow the job's
    --quiet/--verbose; after it they are as they were (a job run in-process, e.g. by a test, leaves nothing behind)."""
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    level = logging.INFO if verbose else logging.ERROR if quiet else logging.WARNING
    settings = _library_settings()
    before = [read() for read, _ in settings]
    for (_, write), value in zip(settings, (level, level, verbose, verbose, verbose)):
        write(value)  # the libraries' own bars only when verbose: a job's stage bar is its own
    try:
        yield
    finally:
        for (_, write), value in zip(settings, before):
            write(value)


def _library_settings() -> list[tuple[Callable[[], object], Callable[[object], None]]]:
    """(read, write) of each setting --quiet/--verbose change: transformers' and datasets' log levels, then whether
    transformers', datasets' and huggingface_hub's progress bars show."""
    import datasets
    import huggingface_hub
    import transformers

    def switch(enable, disable):
        return lambda on: (enable if on else disable)()

    hub = huggingface_hub.utils
    return [
        (transformers.logging.get_verbosity, transformers.logging.set_verbosity),
        (datasets.logging.get_verbosity, datasets.logging.set_verbosity),
        (
            transformers.utils.logging.is_progress_bar_enabled,
            switch(transformers.logging.enable_progress_bar, transformers.logging.disable_progress_bar),
        ),
        (datasets.is_progress_bar_enabled, switch(datasets.enable_progress_bars, datasets.disable_progress_bars)),
        (lambda: not hub.are_progress_bars_disabled(), switch(hub.enable_progress_bars, hub.disable_progress_bars)),
    ]


class StageProgress(ProgressCallback):
    """The Trainer's progress bar without the dict of metrics it prints at every logging step (the job prints its
    summary line at the end; the metrics are in the Trainer's log history and the job's summary JSON)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None


def quiet_trainer_logs(trainer: Trainer, verbose: bool = False) -> Trainer:
    """Keep the Trainer's bar (or none, with disable_tqdm) but not its printed metrics, unless verbose."""
    if verbose:
        return trainer
    trainer.remove_callback(PrinterCallback)  # what disable_tqdm=True prints instead of a bar
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(StageProgress)
    return trainer


__all__ = [
    "configured",
    "quiet_trainer_logs",
]
