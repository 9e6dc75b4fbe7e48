"""The Trainer side of REALM pre-training: the collator (masked queries -> REALM examples), `RealmPretrainingTrainer`
(REALM's metrics in the logs, checkpoints that carry the index in use), the retriever freeze and initial-prior
callbacks, and the per-rank record of index versions. `trainers/jobs/train_pretrain.py` wires them into the job."""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.file_utils import write_text_atomic
from openrealm.tokenization.masking import SalientSpanCollator
from openrealm.trainers.checkpoints import StagedCheckpointTrainer
from openrealm.trainers.dropped import DroppedExamplesGuard
from openrealm.trainers.indexing import load_index
from openrealm.trainers.pretraining.examples import RealmPretrainingExamples, batch_on
from openrealm.trainers.pretraining.model import (
    RealmPretrainingModel,
    mean_entropy,
    scale_retrieval_embeddings,
    sharpness_for_entropy,
)
from openrealm.trainers.pretraining.preparation import RUN_COUNTERS, dropped_examples
from openrealm.trainers.pretraining.refresh import IndexRefreshCallback
from openrealm.trainers.stage_utils import eval_mode
from openrealm.trainers.towers import scorer_from_embedder

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
        self.null_watch: NullDocumentWatch | None = None  # build_trainer's: warns when p(null|x) runs to 1
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


# The mean p(null|x) of a logging interval at which NullDocumentWatch warns: healthy quickstart runs stayed at or under
# 0.35, runs whose retriever collapsed reached 0.6-1.0 (benchmarks/research/reader_that_reads.md, sections "More
# updates at the same cost, and the null document" and "A reader that gives a block without the span its due").
NULL_DOC_WARNING = 0.5


class NullDocumentWatch(TrainerCallback):
    """Warns once when the logged `null_doc_prob` (mean p(null|x) since the previous log) reaches `threshold`: the
    retriever's scores are running onto the null document, because the reader predicts the masked words better from
    no block than from the blocks retrieved; past that point the retriever learns nothing from the reader. `first`:
    {"step", "null_doc_prob"} of the first such log (None if none), for the run's summary."""

    def __init__(self, threshold: float = NULL_DOC_WARNING):
        self.threshold = threshold
        self.first: dict[str, float] | None = None

    def message(self) -> str | None:
        """The warning's text once `first` is set, else None."""
        if self.first is None:
            return None
        return (
            f"p(null document | x) averaged {self.first['null_doc_prob']:.2f} in the steps logged at step "
            f"{self.first['step']}: the retriever is collapsing onto the null document and stops learning from the "
            "reader; lower --embedder-learning-rate or raise --batch-size (docs/pretraining.md)"
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        value = (logs or {}).get("null_doc_prob")
        if self.first is None and value is not None and value >= self.threshold:
            self.first = {"step": state.global_step, "null_doc_prob": value}
            if state.is_world_process_zero:
                print(f"REALM pre-training: warning: {self.message()}", file=sys.stderr)


PRIOR_SAMPLE_QUERIES = 128  # masked queries whose K candidates set --initial-prior-entropy's scale


@torch.no_grad()
def set_initial_prior_entropy(
    model: RealmPretrainingModel, examples: RealmPretrainingExamples, masker, rows, entropy: float
) -> dict[str, float]:
    """Scale the embedder's output (scale_retrieval_embeddings) so that p(z|x) over the K candidates of the masked
    queries of `rows` (corpus rows) has mean `entropy` nats; returns the entropy before, the factor and the entropy
    after. The candidates are the index's, whose ranking a scale does not change; so the index stays as built."""
    device = next(model.parameters()).device
    with eval_mode(model):
        scores = []
        for start in range(0, len(rows), 32):
            batch = examples(masker([rows[i] for i in range(start, min(start + 32, len(rows)))]))
            if len(batch["uid"]):
                query, candidates = model.embed_batch(**batch_on(batch, device))
                scores.append(torch.einsum("bp,bkp->bk", query, candidates).float().cpu())
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


__all__ = [
    "CHECKPOINT_FILES",
    "NULL_DOC_WARNING",
    "NullDocumentWatch",
    "PRIOR_SAMPLE_QUERIES",
    "PretrainingCollator",
    "QUERY_EMBEDDER_DIR",
    "RANK_RECORDS_DIR",
    "REFRESH_STATE_NAME",
    "RealmPretrainingTrainer",
    "RetrieverFreeze",
    "TOWERS",
    "checkpoint_extras",
    "checkpoint_index",
    "checkpoint_index_versions",
    "restore_refresh_state",
    "save_towers",
    "set_initial_prior_entropy",
    "write_rank_record",
]
