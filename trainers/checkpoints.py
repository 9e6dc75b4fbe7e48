"""Training checkpoints that appear whole or not at all, for every Trainer-based job (`train ict`, `train mlm`,
`train pretrain`).

transformers' Trainer writes OUTPUT/checkpoint-N/ file by file under its final name: a run killed (or out of disk)
mid-save leaves a checkpoint-N holding some of its files, which `get_last_checkpoint` then picks and resuming fails on
(or, without trainer_state.json, silently restarts from step 0). `StagedCheckpointTrainer` writes each checkpoint into
OUTPUT/.staging-checkpoint-N/checkpoint-N/ and renames it into place once complete (file_utils.replace_folder); a
failed save removes its staging folder, and a killed one's is removed by `remove_stale_staging` at the next start.
`resolve_resume` turns `--resume-from-checkpoint [PATH|last]` into the newest whole checkpoint (see
docs/guarantees.md).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from openrealm.file_utils import apply_umask_modes, replace_folder

STAGING_PREFIX = ".staging-"
CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


class StagedCheckpointTrainer(Trainer):
    """A `Trainer` whose checkpoints appear whole or not at all (see the module docstring).

    towers: {attribute of the model: class} for a model that wraps REALM towers (e.g. {"encoder":
    RealmKnowledgeAugEncoder}): the model is saved as one folder per tower (CHECKPOINT/encoder/, by save_pretrained,
    which keeps tied weights that a single safetensors file of the wrapper cannot hold) and resumed from them. None:
    the Trainer's own save (the model is a PreTrainedModel). checkpoint_extras(folder): writes more files into a
    checkpoint before it appears."""

    def __init__(
        self,
        *args,
        towers: dict[str, type] | None = None,
        checkpoint_extras: Callable[[Path], None] | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.towers = towers
        self.checkpoint_extras = checkpoint_extras

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        if self.towers is None:
            return super()._save(output_dir, state_dict)
        if not self.args.should_save:  # Trainer.save_model calls _save on every process; one writes
            return None
        output_dir = Path(output_dir or self.args.output_dir)
        model = self.accelerator.unwrap_model(self.model)
        for name in self.towers:
            getattr(model, name).save_pretrained(output_dir / name)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if self.towers is None:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.accelerator.unwrap_model(model if model is not None else self.model)
        for name, cls in self.towers.items():
            folder = Path(resume_from_checkpoint) / name
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"{folder} holds no saved {cls.__name__} (config.json)")
            getattr(model, name).load_state_dict(cls.from_pretrained(folder).state_dict())

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint plus checkpoint_extras, written into OUTPUT/.staging-checkpoint-N/ and renamed to
        OUTPUT/checkpoint-N once complete; then rotation (`rotate_checkpoints`) and `checkpoint_saved`. A failure
        removes the staging folder.

        Several processes: the staging folder has a fixed name, so every rank writes into the same one (each rank its
        rng_state_R.pth); the main process alone writes the rest and renames, between barriers."""
        run_dir = Path(self._get_output_dir(trial=trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = run_dir / f"{STAGING_PREFIX}{name}"
        main = self.args.should_save
        if main:
            shutil.rmtree(staging, ignore_errors=True)  # left by a run killed while saving this step
            staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        try:
            output_dir, limit = self.args.output_dir, self.args.save_total_limit
            try:
                # Trainer saves into _get_output_dir(trial)/checkpoint-N: point it at the staging folder for this
                # call (rotation is off there; it runs below on the real folder).
                self.args.output_dir, self.args.save_total_limit = str(staging), None
                super()._save_checkpoint(model, trial)
            finally:
                self.args.output_dir, self.args.save_total_limit = output_dir, limit
            self.accelerator.wait_for_everyone()
            if main:
                if self.checkpoint_extras is not None:
                    self.checkpoint_extras(staging / name)
                apply_umask_modes(staging / name)  # safetensors writes 0600
                # a run resumed before this step: the newer state replaces the old one, all at once
                replace_folder(staging / name, run_dir / name)
                protected = {run_dir / name, Path(self.state.best_model_checkpoint or run_dir / name)}
                rotate_checkpoints(run_dir, self.args.save_total_limit, protected)
                self.checkpoint_saved(run_dir)
        finally:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def checkpoint_saved(self, run_dir: Path) -> None:
        """Called on the main process after a checkpoint appeared under run_dir and rotation ran (nothing here)."""


def rotate_checkpoints(run_dir: Path, limit: int | None, protected: Iterable[Path] = ()) -> list[Path]:
    """Delete the oldest run_dir/checkpoint-N (by N) beyond `limit` (None or < 1: none), never a protected one (the
    checkpoint just written, which a run resumed from an older checkpoint writes below the newest; the best) nor the
    newest. transformers' rotate_checkpoints protects only the newest and the best. Returns the deleted folders."""
    found = sorted((int(m[1]), path) for path in run_dir.iterdir() if (m := CHECKPOINT_PATTERN.match(path.name)))
    if not limit or limit < 1 or len(found) <= limit:
        return []
    protected = {path.absolute() for path in protected} | {found[-1][1].absolute()}
    deletable = [path for _, path in found if path.absolute() not in protected]
    deleted = deletable[: max(0, len(found) - max(limit, len(found) - len(deletable)))]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted


def is_staging_leftover(name: str) -> bool:
    """Whether an entry of OUTPUT is a checkpoint's staging folder (`StagedCheckpointTrainer`)."""
    return name.startswith(f"{STAGING_PREFIX}{PREFIX_CHECKPOINT_DIR}-")


def remove_stale_staging(output: str | os.PathLike) -> None:
    """Delete the staging folders of checkpoints that a killed run left half-written under output. Call it on the
    main process before training starts (a running job's save would be deleted)."""
    output = Path(output)
    if output.is_dir():
        for path in output.iterdir():
            if is_staging_leftover(path.name):
                shutil.rmtree(path, ignore_errors=True)


def missing_files(folder: Path, required: Iterable[str]) -> list[str]:
    return [name for name in required if not (folder / name).is_file()]


def last_checkpoint(output: str | os.PathLike, required: Iterable[str] = (TRAINER_STATE_NAME,)) -> Path | None:
    """The newest OUTPUT/checkpoint-N (highest N) holding every `required` file, or None. A staged checkpoint is whole
    by construction; the check also passes over a partial one that an earlier, unstaged save left."""
    output, required = Path(output), tuple(required)
    if not output.is_dir():
        return None
    found = [(int(match[1]), path) for path in output.iterdir() if (match := CHECKPOINT_PATTERN.match(path.name))]
    for _, path in sorted(found, reverse=True):
        if path.is_dir() and not missing_files(path, required):
            return path
    return None


def resolve_resume(
    value: str | None, output: str | os.PathLike, required: Iterable[str] = (TRAINER_STATE_NAME,)
) -> Path | None:
    """`--resume-from-checkpoint [PATH|last]`: None (not resuming), the newest whole OUTPUT/checkpoint-N for "last",
    or the folder given, which must hold every `required` file (the Trainer's trainer_state.json by default)."""
    if value is None:
        return None
    required = tuple(required)
    if value == "last":
        path = last_checkpoint(output, required)
        if path is None:
            raise FileNotFoundError(
                f"--resume-from-checkpoint last: {output} holds no whole checkpoint-N folder (with "
                f"{', '.join(required)})"
            )
        return path
    path = Path(value)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume-from-checkpoint {value}: no such checkpoint folder")
    missing = missing_files(path, required)
    if missing:
        raise FileNotFoundError(f"{path} is not a whole checkpoint: it has no {', '.join(missing)}")
    return path


__all__ = [
    "STAGING_PREFIX",
    "is_staging_leftover",
    "remove_stale_staging",
    "resolve_resume",
    "StagedCheckpointTrainer",
]
