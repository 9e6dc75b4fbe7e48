"""What the `openrealm` jobs print: one progress bar and one summary line per stage by default; `--quiet` drops the
bars; `--verbose` shows everything transformers and datasets report.

By default the bars of the libraries' inner steps (transformers' "Loading weights" and "Writing model shards",
datasets' "Generating train split" and "Saving the dataset") are off, and so are the Trainer's dicts of logged
metrics: a stage's own bar and its summary line are what a user reads. Warnings still print (a checkpoint with missing
weights says so in every mode but --quiet's errors-only).
"""

from __future__ import annotations

import argparse

from transformers import ProgressCallback, Trainer
from transformers.trainer_callback import PrinterCallback


def configure(args: argparse.Namespace) -> None:
    """Set transformers', datasets' and huggingface_hub's logging and progress bars for the job's --quiet/--verbose."""
    import datasets
    import huggingface_hub
    import transformers

    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    if verbose:
        transformers.logging.set_verbosity_info()
        datasets.logging.set_verbosity_info()
        transformers.logging.enable_progress_bar()
        datasets.enable_progress_bars()
        huggingface_hub.utils.enable_progress_bars()
        return
    (transformers.logging.set_verbosity_error if quiet else transformers.logging.set_verbosity_warning)()
    (datasets.logging.set_verbosity_error if quiet else datasets.logging.set_verbosity_warning)()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


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
