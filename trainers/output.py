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
from collections.abc import Iterator

from transformers import ProgressCallback, Trainer
from transformers.trainer_callback import PrinterCallback


@contextlib.contextmanager
def configured(args: argparse.Namespace) -> Iterator[None]:
    """Inside the block, transformers', datasets' and huggingface_hub's logging and progress bars follow the job's
    --quiet/--verbose; after it they are as they were (a job run in-process, e.g. by a test, leaves nothing behind)."""
    import datasets
    import huggingface_hub
    import transformers

    before = (
        transformers.logging.get_verbosity(),
        transformers.utils.logging.is_progress_bar_enabled(),
        datasets.logging.get_verbosity(),
        datasets.is_progress_bar_enabled(),
        huggingface_hub.utils.are_progress_bars_disabled(),
    )
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    level = logging.INFO if verbose else logging.ERROR if quiet else logging.WARNING
    transformers.logging.set_verbosity(level)
    datasets.logging.set_verbosity(level)
    _show_bars(verbose)
    try:
        yield
    finally:
        transformers.logging.set_verbosity(before[0])
        datasets.logging.set_verbosity(before[2])
        (transformers.logging.enable_progress_bar if before[1] else transformers.logging.disable_progress_bar)()
        (datasets.enable_progress_bars if before[3] else datasets.disable_progress_bars)()
        (huggingface_hub.utils.disable_progress_bars if before[4] else huggingface_hub.utils.enable_progress_bars)()


def _show_bars(show: bool) -> None:
    """The libraries' own progress bars on or off (a job's stage bar is its own)."""
    import datasets
    import huggingface_hub
    import transformers

    (transformers.logging.enable_progress_bar if show else transformers.logging.disable_progress_bar)()
    (datasets.enable_progress_bars if show else datasets.disable_progress_bars)()
    (huggingface_hub.utils.enable_progress_bars if show else huggingface_hub.utils.disable_progress_bars)()


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
