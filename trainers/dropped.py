"""Examples a training job drops, and when that means the run would train (nearly) nothing.

Every job drops some of what it reads, each for a reason Google's code has too (a block without a salient span, a
retrieved set holding two copies of one block, an ICT query removed from a one-sentence block...). A run that drops
almost everything still takes its steps, so without a check it ends "done" with a model that learnt next to nothing.
The jobs count what they drop by cause and call `check_dropped`:

- more than WARN_DROPPED_SHARE (half) dropped: the summary line warns, with the counts by cause and the fixes;
- more than `--max-dropped-share` (default MAX_DROPPED_SHARE, 0.9: under one example in ten trains) dropped: the job
  stops with an error that names the causes and their fixes, and saves no model. `--max-dropped-share 1` never stops.

docs/guarantees.md ("Runs that would train nothing") states the promise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from transformers import TrainerCallback

from openrealm.trainers.options import MAX_DROPPED_SHARE, WARN_DROPPED_SHARE

# The fewest examples read before a running job may stop on the share dropped so far (the end of a run is judged on
# whatever it read): at a true share of 0.8, 200 examples exceed 0.9 with a probability under 1e-4.
MIN_EXAMPLES_TO_STOP = 200


def describe_dropped(
    num_read: int, dropped: Mapping[str, int], causes: Mapping[str, tuple[str, str]], unit: str
) -> str:
    """`D of N UNIT (P%) give no training example: d1 because WHY1; d2 because WHY2. FIX1. FIX2.`

    dropped: count by cause name; causes: cause name -> (why, how to fix), for every name with a count. Causes are
    listed by count, largest first; each fix once."""
    total = sum(dropped.values())
    share = total / num_read if num_read else 0.0
    ranked = sorted(((count, name) for name, count in dropped.items() if count), reverse=True)
    reasons = "; ".join(f"{count:,} because {causes[name][0]}" for count, name in ranked)
    fixes = list(dict.fromkeys(causes[name][1] for _, name in ranked))
    return f"{total:,} of {num_read:,} {unit} ({share:.0%}) give no training example: {reasons}. " + " ".join(
        fix[0].upper() + fix[1:] + "." for fix in fixes
    )


def check_dropped(
    num_read: int,
    dropped: Mapping[str, int],
    causes: Mapping[str, tuple[str, str]],
    max_share: float = MAX_DROPPED_SHARE,
    unit: str = "examples",
) -> tuple[str | None, str | None]:
    """(refusal, warning) for a run that read num_read examples and dropped `dropped` (count by cause) of them.

    refusal: the error message when more than max_share was dropped (a run that read nothing counts as all dropped);
    warning: the summary line's warning when more than WARN_DROPPED_SHARE was dropped. Each is None otherwise."""
    total = sum(dropped.values())
    if not num_read:  # e.g. no whole batch: not a share of anything
        return f"0 {unit}: no batch held an example, so nothing trained", None
    share = total / num_read
    if share > max_share:
        described = describe_dropped(num_read, dropped, causes, unit)
        return (
            f"{described} That is more than --max-dropped-share {max_share:g} of them: too few to train on "
            "(--max-dropped-share 1 trains anyway)",
            None,
        )
    if share > WARN_DROPPED_SHARE:
        return None, describe_dropped(num_read, dropped, causes, unit)
    return None, None


class DroppedExamplesGuard(TrainerCallback):
    """Stops training at a logging step once more than `max_share` of the examples read so far (at least
    MIN_EXAMPLES_TO_STOP of them) gave none; `refusal` and `stopped_at` then say why and when.

    counts: () -> (examples read, dropped by cause), over every process; it may run a collective, as every process
    calls it at the same steps. causes and unit: as check_dropped's."""

    def __init__(
        self,
        counts: Callable[[], tuple[int, Mapping[str, int]]],
        causes: Mapping[str, tuple[str, str]],
        max_share: float = MAX_DROPPED_SHARE,
        unit: str = "examples",
    ):
        self.counts, self.causes, self.max_share, self.unit = counts, causes, max_share, unit
        self.refusal: str | None = None
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.logging_steps:
            return
        num_read, dropped = self.counts()
        if num_read < MIN_EXAMPLES_TO_STOP:
            return
        refusal, _ = check_dropped(num_read, dropped, self.causes, self.max_share, self.unit)
        if refusal is not None:
            self.refusal, self.stopped_at = refusal, state.global_step
            control.should_training_stop = True

    def final_refusal(self, job: str, max_steps: int, refusal: str | None) -> str | None:
        """The error ending `job` (its name in messages) once training is over: the guard's, or `refusal` (the
        check of the whole run), or None when the run may save its model."""
        if self.refusal is None and refusal is None:
            return None
        when = f"stopped after step {self.stopped_at} of {max_steps}" if self.stopped_at else "ended"
        return f"{job} {when}: {self.refusal or refusal}. No model was saved."


__all__ = ["MIN_EXAMPLES_TO_STOP", "DroppedExamplesGuard", "check_dropped", "describe_dropped"]
