"""Open-QA fine-tuning of `RealmForOpenQA` on transformers' `Trainer` (ORQA as REALM used it, Google's
language/orqa/models/orqa_model.py, with the REALM++ options): the machinery of `openrealm train openqa`
(trainers/jobs/train_openqa.py).

    openrealm train openqa --model MODEL --train FILE --dev FILE --output DIR --max-steps N [--corpus DIR] [options]

MODEL: a RealmForOpenQA folder or Hub id, or the towers of a pre-training output with `--corpus`. The query tower and
the reader train; the block embeddings stay frozen (ORQA). Loss: the retriever loss over the top `searcher_beam_size`
blocks plus the reader loss over the top `reader_beam_size`, by distant supervision (answer wordpieces, or regex
answers). What it writes and the REALM++ options: docs/openqa.md.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

from openrealm import RealmBlockIndex, RealmEmbedder, RealmForOpenQA, RealmRetriever
from openrealm.file_utils import atomic_directory
from openrealm.modeling_realm import kept_beside_model
from openrealm.tokenization.jsonl import JsonlError, iter_jsonl, json_type
from openrealm.trainers.dropped import DroppedExamplesGuard, check_dropped
from openrealm.trainers.evaluation import evaluate_openqa, load_qa_dataset, write_results
from openrealm.trainers.options import (
    EVAL_READER_BEAM_SIZE,
    MAX_DROPPED_SHARE,
    MIN_PASSAGE_OVERLAP,
    READER_BEAM_SIZE,
    SEARCHER_BEAM_SIZE,
)
from openrealm.trainers.options import OPENQA_DEV_RESULTS_NAME as DEV_RESULTS_NAME
from openrealm.trainers.options import OPENQA_LEARNING_RATE as LEARNING_RATE
from openrealm.trainers.options import OPENQA_SUMMARY_NAME as SUMMARY_NAME
from openrealm.trainers.output import quiet_trainer_logs
from openrealm.trainers.stage_utils import google_warmup_steps
from openrealm.trainers.towers import (
    check_corpus_ids,
    check_same_architecture,
    fit_length,
    load_embedder,
    load_encoder,
)

QUESTIONS_READ = "training questions read"  # what the drop messages count

# ---------------------------------------------------------------------------------------------------------------------
# The model from pre-trained towers
# ---------------------------------------------------------------------------------------------------------------------


def frozen_corpus_index(embedder: RealmEmbedder, corpus: str | os.PathLike) -> RealmBlockIndex:
    """An exact index of the embedder's embeddings of every block of the corpus folder, holding a frozen copy of the
    embedder (the block tower) and the corpus's removed block ids."""
    from openrealm.tokenization.corpus_folder import load_corpus, read_corpus_config, read_removed_block_ids
    from openrealm.trainers.embedding import exact_index

    blocks = load_corpus(corpus)
    check_corpus_ids(blocks, embedder, corpus, "the embedder")
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    max_length = read_corpus_config(corpus)["max_block_length"]  # the blocks' `[CLS] title [SEP] body [SEP]` length
    index = exact_index(
        embedder, blocks, tokenizer, fit_length(embedder, max_length, "the embedder", "the block length")
    )
    # A frozen copy: the block tower as it embedded these blocks (blocks added later, `corpus add`, are embedded
    # alike), while the embedder itself goes on training as the question tower.
    index.embedder = copy.deepcopy(embedder).eval().requires_grad_(False)
    index.removed_ids = torch.from_numpy(read_removed_block_ids(corpus))
    return index


def load_block_index(index: RealmBlockIndex | str | os.PathLike) -> RealmBlockIndex:
    """An index as given, a block_index folder (index_config.json) or an index root of versions (the newest)."""
    if isinstance(index, RealmBlockIndex):
        return index
    if (Path(index) / "index_config.json").is_file():
        return RealmBlockIndex.from_pretrained(index)
    from openrealm.trainers.indexing import load_index

    return load_index(index)


def openqa_model_from_pretraining(
    embedder: str | os.PathLike | RealmEmbedder,
    encoder: str | os.PathLike | torch.nn.Module,
    corpus: str | os.PathLike,
    index: RealmBlockIndex | str | os.PathLike | None = None,
    **config_overrides,
) -> RealmForOpenQA:
    """A RealmForOpenQA from REALM pre-training towers (orqa_model.py).

    embedder: RealmEmbedder (folder, Hub id or model; e.g. OUTPUT/embedder of `openrealm train pretrain`): the query
    tower, and the document tower of the index. encoder: RealmKnowledgeAugEncoder or BERT (folder, Hub id or model;
    e.g. OUTPUT/encoder): its `realm.*` BERT initialises the reader; the span scorer is new. corpus: the knowledge
    corpus folder (`openrealm corpus build`). index: the index of the embedder's block embeddings (a RealmBlockIndex
    or a folder); default: built here (exact MIPS). config_overrides: RealmConfig fields (e.g. reader_beam_size).
    """
    if not isinstance(embedder, torch.nn.Module):
        embedder = load_embedder(embedder)
    if not isinstance(encoder, torch.nn.Module):
        encoder = load_encoder(encoder, warn_untrained_head=False)  # the reader uses no MLM head
    check_same_architecture(embedder, encoder)
    index = frozen_corpus_index(embedder, corpus) if index is None else load_block_index(index)
    if index.dim != embedder.config.retriever_proj_size:
        raise ValueError(
            f"The index holds {index.dim}-d embeddings but the embedder makes {embedder.config.retriever_proj_size}-d"
        )
    retriever = RealmRetriever.from_pretrained(os.fspath(corpus), index=index)
    config = embedder.config.__class__.from_dict(
        {**embedder.config.to_dict(), "architectures": ["RealmForOpenQA"], **config_overrides}
    )
    config.num_block_records = index.num_blocks
    config.reader_seq_len = fit_length(encoder, config.reader_seq_len, "the reader", "reader_seq_len")
    model = RealmForOpenQA(config, retriever=retriever)
    model.embedder.load_state_dict(embedder.state_dict())
    reader_bert = encoder.realm if hasattr(encoder, "realm") else encoder
    model.reader.realm.load_state_dict(reader_bert.state_dict())
    return model


def load_openqa_model(
    model: str | os.PathLike | None = None,
    *,
    embedder: str | None = None,
    encoder: str | None = None,
    corpus: str | os.PathLike | None = None,
    index: str | os.PathLike | None = None,
) -> RealmForOpenQA:
    """The model to fine-tune: a RealmForOpenQA folder / Hub id, a pre-training output folder (embedder/ + encoder/)
    with a corpus, or explicit embedder + encoder with a corpus."""
    if model is not None and (Path(model) / "embedder").is_dir() and (Path(model) / "encoder").is_dir():
        embedder, encoder = embedder or Path(model) / "embedder", encoder or Path(model) / "encoder"
        model = None
    if model is not None:
        if embedder or encoder:
            raise ValueError("Give either --model (a RealmForOpenQA) or --embedder and --encoder, not both.")
        return RealmForOpenQA.from_pretrained(model)
    if not (embedder and encoder):
        raise ValueError("Give --model (a RealmForOpenQA or a pre-training output) or both --embedder and --encoder.")
    if corpus is None:
        raise ValueError("Starting from pre-trained towers needs the knowledge corpus: pass --corpus DIR.")
    return openqa_model_from_pretraining(embedder, encoder, corpus, index=index)


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def read_gold_passages(path: str | os.PathLike) -> dict[str, str]:
    """{id: text} of a JSONL file of passages ({"id", "text", ...} per line, e.g. nq_open/dev_gold_passages.jsonl).

    id: a string or an integer; text: a string. Blank lines are skipped; a bad line is a JsonlError naming the file
    and the 1-based line."""
    passages = {}
    for number, row in iter_jsonl(path):
        for field, types, expected in (("id", (str, int), "a string or an integer"), ("text", str, "a string")):
            if field not in row:
                raise JsonlError(path, number, f"missing field {field!r} (fields: {', '.join(sorted(row)) or 'none'})")
            if isinstance(row[field], bool) or not isinstance(row[field], types):
                raise JsonlError(path, number, f"field {field!r} must be {expected}, got {json_type(row[field])}")
        passages[str(row["id"])] = row["text"]
    if not passages:
        raise ValueError(f"{path} holds no passages (empty file)")
    return passages


class OpenQACollator:
    """QA rows ({question, answers, match, gold_passage_id?}) -> RealmForOpenQA inputs.

    input_ids / attention_mask / token_type_ids [B, Lq] of the questions (cut to max_question_length); answer_ids:
    per question the wordpieces of each answer string (none for regex rows); answer_patterns: per question its
    patterns (regex rows) or None; with passage supervision, gold_block_ids (a gold_passage_id that is a block id),
    gold_passages (the text of a gold_passage_id found in `gold_passages`) and min_passage_overlap.
    """

    def __init__(
        self,
        tokenizer,
        max_question_length: int = 64,
        passage_supervision: bool = False,
        gold_passages: Mapping[str, str] | None = None,
        num_blocks: int | None = None,
        min_passage_overlap: float = MIN_PASSAGE_OVERLAP,
    ):
        self.tokenizer = tokenizer
        self.max_question_length = max_question_length
        self.passage_supervision = passage_supervision
        self.gold_passages = dict(gold_passages or {})
        self.num_blocks = num_blocks
        self.min_passage_overlap = min_passage_overlap

    def __call__(self, rows: Sequence[Mapping]) -> dict:
        questions = [row["question"] for row in rows]
        batch = dict(
            self.tokenizer(
                questions, padding=True, truncation=True, max_length=self.max_question_length, return_tensors="pt"
            )
        )
        is_regex = [row.get("match", "string") == "regex" for row in rows]
        batch["answer_ids"] = [
            [] if regex else self.tokenizer(list(row["answers"]), add_special_tokens=False)["input_ids"]
            for row, regex in zip(rows, is_regex)
        ]
        if any(is_regex):
            batch["answer_patterns"] = [list(row["answers"]) if regex else None for row, regex in zip(rows, is_regex)]
        if self.passage_supervision:
            gold = [self.gold_of(row.get("gold_passage_id")) for row in rows]
            batch["gold_block_ids"] = [[block_id] if block_id is not None else [] for block_id, _ in gold]
            batch["gold_passages"] = [text for _, text in gold]
            batch["min_passage_overlap"] = self.min_passage_overlap
        return batch

    def gold_of(self, passage_id: str | None) -> tuple[int | None, str | None]:
        """(gold block id, gold passage text) of a row's gold_passage_id; (None, None) without one."""
        if passage_id is None or passage_id == "":
            return None, None
        passage_id = str(passage_id)
        if passage_id in self.gold_passages:
            return None, self.gold_passages[passage_id]
        if passage_id.isdigit() and (self.num_blocks is None or int(passage_id) < self.num_blocks):
            return int(passage_id), None
        raise ValueError(
            f"gold_passage_id {passage_id!r} is neither a block id of the corpus nor the id of a passage in the gold "
            "passages file (--gold-passages)."
        )


def as_dataset(data):
    """A QA dataset: a `datasets.Dataset`, a list of rows, or a JSONL path / Hub name (load_qa_dataset)."""
    if data is None:
        return None
    if isinstance(data, (str, os.PathLike)):
        return load_qa_dataset(os.fspath(data))
    if isinstance(data, list):
        import datasets

        rows = [{"match": "string", "gold_passage_id": None, **row} for row in data]
        return datasets.Dataset.from_list(rows)
    return data


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


def summarize_evaluation(results: dict) -> dict:
    """The metrics of an evaluate_openqa result (without the per-question predictions)."""
    return {key: value for key, value in results.items() if key != "predictions"}


class OpenQATrainer(Trainer):
    """The Trainer, counting the training questions read (`num_questions`) and those none of whose retrieved blocks
    holds an answer, nor a gold passage with passage supervision (`num_unanswered`): ORQA zeroes their losses, so
    they train nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_questions = self.num_unanswered = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        reader, batch_size = outputs.reader_output, inputs["input_ids"].shape[0]
        trained = reader.retriever_correct.reshape(batch_size, -1).any(-1)
        if reader.passage_correct is not None:
            trained |= reader.passage_correct.reshape(batch_size, -1).any(-1)
        self.num_questions += batch_size
        self.num_unanswered += int((~trained).sum())
        return (loss, outputs) if return_outputs else loss

    def drops(self) -> tuple[int, dict[str, int]]:
        """(training questions read, those that train nothing by cause), for trainers.dropped."""
        return self.num_questions, {"no_answer_retrieved": self.num_unanswered}


def unanswered_causes(searcher_beam_size: int, passage_supervision: bool) -> dict[str, tuple[str, str]]:
    """Why a training question trains nothing, and the fix, for trainers.dropped."""
    gold = " nor their gold passage" if passage_supervision else ""
    return {
        "no_answer_retrieved": (
            f"none of the {searcher_beam_size} blocks retrieved for them holds one of their answers{gold}, so "
            "ORQA's losses are zero for them",
            "check that the corpus holds the answers of the training questions as they are written (their wordpieces "
            "are matched in the blocks), or raise --searcher-beam-size",
        )
    }


class DevEvaluationCallback(TrainerCallback):
    """Evaluates on the dev set every `eval_steps` optimiser steps (and records the metrics with their step)."""

    def __init__(self, dev_dataset, eval_steps: int | None, evaluate):
        self.dev_dataset = dev_dataset
        self.eval_steps = eval_steps
        self.evaluate = evaluate
        self.history: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        if self.dev_dataset is not None and self.eval_steps and state.global_step % self.eval_steps == 0:
            metrics = self.evaluate()
            self.history.append({"step": state.global_step, **metrics})
            state.log_history.append({"step": state.global_step, **{f"dev_{k}": v for k, v in metrics.items()}})


@dataclass
class OpenQAArguments:
    """What open-QA fine-tuning adds to transformers' `TrainingArguments` (ORQA's beams and supervision, REALM++'s
    options; docs/openqa.md): the retriever loss scores the top `searcher_beam_size` blocks, the reader reads the top
    `reader_beam_size` in training and `eval_reader_beam_size` at inference; `passage_supervision` counts a block as
    gold when it holds `min_passage_overlap` of the gold passage's words; more than `max_dropped_share` of the
    questions read without an answer in their blocks stops the run (trainers/dropped.py)."""

    searcher_beam_size: int = SEARCHER_BEAM_SIZE
    reader_beam_size: int = READER_BEAM_SIZE
    eval_reader_beam_size: int = EVAL_READER_BEAM_SIZE
    passage_supervision: bool = False
    min_passage_overlap: float = MIN_PASSAGE_OVERLAP
    max_question_length: int = 64
    max_dropped_share: float = MAX_DROPPED_SHARE


def openqa_training_arguments(
    output_dir: str | os.PathLike, max_steps: int = 1000, *, warmup_steps: int | None = None, **arguments
) -> TrainingArguments:
    """`TrainingArguments` with ORQA's defaults where transformers' differ: learning rate 1e-5, weight decay 0.01,
    Google's warm-up (min(10000, max(100, max_steps / 10)) steps when `warmup_steps` is None), a log every 10 steps,
    no reporting, the CPU without CUDA. `arguments`: any other field (per_device_train_batch_size,
    gradient_accumulation_steps, eval_steps (dev evaluation period; default: before and after training only),
    per_device_eval_batch_size, seed, bf16, disable_tqdm, ...). output_dir: where the fine-tuned model is saved."""
    defaults = dict(
        learning_rate=LEARNING_RATE,
        weight_decay=0.01,
        logging_steps=10,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
    )
    warmup = google_warmup_steps(max_steps) if warmup_steps is None else warmup_steps
    return TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, warmup_steps=warmup, **{**defaults, **arguments}
    )


def finetune_openqa(
    model: RealmForOpenQA,
    train_dataset,
    dev_dataset=None,
    args: TrainingArguments | None = None,
    openqa_args: OpenQAArguments | None = None,
    *,
    gold_passages: Mapping[str, str] | None = None,
    save: bool = True,
    summary_extras: dict | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    print_logs: bool = False,
) -> dict:
    """Fine-tune `model` (a RealmForOpenQA with its retriever) on QA rows and save it into `args.output_dir`.

    train_dataset / dev_dataset: `load_qa_dataset` results, lists of rows, or JSONL paths. args: transformers'
    TrainingArguments (default `openqa_training_arguments("openqa-output")`): per_device_train_batch_size questions
    per step and device, times gradient_accumulation_steps per optimiser step; eval_steps: the dev evaluation period.
    The Trainer itself saves nothing: the folder is written once, at the end (save_finetuned). openqa_args: ORQA's and
    REALM++'s options (OpenQAArguments). gold_passages: passage id -> text, for passage supervision. callbacks: more
    TrainerCallbacks (e.g. the quickstart's plots). print_logs: also print the Trainer's dict of metrics at each
    logging step (they are in the summary's log history either way). A ValueError, and nothing saved, when more than
    `max_dropped_share` of the training questions read had no answer in their retrieved blocks (trainers.dropped;
    checked at logging steps and at the end); above WARN_DROPPED_SHARE the summary's `dropped_warning` says so.
    Returns the training summary (also written to output_dir/openqa_training.json when save).
    """
    args = openqa_training_arguments("openqa-output") if args is None else args
    options = OpenQAArguments() if openqa_args is None else openqa_args
    train_dataset, dev_dataset = as_dataset(train_dataset), as_dataset(dev_dataset)
    if train_dataset is None or len(train_dataset) == 0:
        raise ValueError("The training set holds no questions.")
    if args.max_steps < 1:
        raise ValueError(f"max_steps must be positive, got {args.max_steps}")
    beams = (options.searcher_beam_size, options.reader_beam_size, options.eval_reader_beam_size)
    if min(args.per_device_train_batch_size, args.gradient_accumulation_steps, *beams) < 1:
        raise ValueError("batch sizes, accumulation steps and beam sizes must be positive")
    if options.passage_supervision and "gold_passage_id" not in train_dataset.column_names:
        raise ValueError("passage_supervision needs a gold_passage_id column in the training set.")
    retriever = model._require_retriever()
    num_blocks, searchable = retriever.index.num_blocks, retriever.index.num_searchable  # removed: never retrieved
    model.config.searcher_beam_size = min(options.searcher_beam_size, searchable)
    model.config.reader_beam_size = min(options.reader_beam_size, searchable)
    eval_beam = min(options.eval_reader_beam_size, searchable)
    output_dir = Path(args.output_dir)

    latest = {}  # the newest dev evaluation, predictions included

    def evaluate() -> dict:
        latest["results"] = evaluate_openqa(
            model, dev_dataset, batch_size=args.per_device_eval_batch_size, num_blocks=eval_beam
        )
        return summarize_evaluation(latest["results"])

    callback = DevEvaluationCallback(dev_dataset, args.eval_steps, evaluate)
    collator = OpenQACollator(
        retriever.tokenizer,
        options.max_question_length,
        options.passage_supervision,
        gold_passages,
        num_blocks=num_blocks,
        min_passage_overlap=options.min_passage_overlap,
    )
    with tempfile.TemporaryDirectory(prefix="openqa-trainer-") as scratch:
        # The Trainer writes into a scratch folder (it saves nothing); the model is saved once, at the end.
        arguments = dataclasses.replace(
            args, output_dir=scratch, save_strategy="no", remove_unused_columns=False, dataloader_num_workers=0
        )
        causes = unanswered_causes(model.config.searcher_beam_size, options.passage_supervision)
        guard = DroppedExamplesGuard(lambda: trainer.drops(), causes, options.max_dropped_share, QUESTIONS_READ)
        trainer = OpenQATrainer(
            model=model,
            args=arguments,
            train_dataset=train_dataset,
            data_collator=collator,
            callbacks=[callback, guard, *callbacks],
        )
        quiet_trainer_logs(trainer, verbose=print_logs)
        model.block_embedding_to(arguments.device)
        dev_before = evaluate() if dev_dataset is not None else None
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    refusal, warning = check_dropped(*trainer.drops(), causes, options.max_dropped_share, QUESTIONS_READ)
    refusal = guard.final_refusal("open-QA fine-tuning", args.max_steps, refusal)
    if refusal is not None:
        raise ValueError(refusal)
    model.config.reader_beam_size = eval_beam  # REALM++: read more blocks at inference than in training
    dev_after = evaluate() if dev_dataset is not None else None
    losses = [{"step": row["step"], "loss": row["loss"]} for row in trainer.state.log_history if "loss" in row]
    summary = {
        **(summary_extras or {}),
        "max_steps": args.max_steps,
        "batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "warmup_steps": arguments.warmup_steps,
        "searcher_beam_size": model.config.searcher_beam_size,
        "reader_beam_size_train": min(options.reader_beam_size, searchable),
        "reader_beam_size_eval": eval_beam,
        "passage_supervision": options.passage_supervision,
        "num_blocks": num_blocks,
        "num_train_questions": len(train_dataset),
        "num_questions_read": trainer.num_questions,
        "num_questions_unanswered": trainer.num_unanswered,
        "dropped_warning": warning,
        "train_seconds": round(seconds, 2),
        "train_loss": losses,
        "dev_before": dev_before,
        "dev_after": dev_after,
        "dev_history": callback.history,
    }
    if save:
        save_finetuned(model, output_dir, summary, latest.get("results"))
    return summary


def save_finetuned(model: RealmForOpenQA, output_dir: Path, summary: dict, dev_results: dict | None) -> None:
    """The Hub-ready RealmForOpenQA folder, its model card, the summary JSON and the dev results, replacing the old
    ones all at once (file_utils.atomic_directory): a save that fails part-way leaves the previous folder whole, and
    an earlier save's card, summary or dev results never stay beside new weights. Other entries are kept."""
    from openrealm.hub_cards.model_card import card_text, openqa_model_card

    output_dir = Path(output_dir).absolute()
    written_here = ("README.md", SUMMARY_NAME, DEV_RESULTS_NAME)
    with atomic_directory(
        output_dir, keep=lambda name: kept_beside_model(name) and name not in written_here
    ) as staging:
        staging = Path(staging)
        model.save_pretrained(staging)
        evaluations = []
        if dev_results is not None:
            dev_results = {**dev_results, "dataset": summary.get("dev") or "dev", "split": "dev"}
            write_results(dev_results, staging / DEV_RESULTS_NAME)
            evaluations.append(dev_results)
        card = openqa_model_card(
            evaluations, model_name=output_dir.name, training_summary=summary, num_blocks=summary["num_blocks"]
        )
        (staging / "README.md").write_text(card_text(card), encoding="utf-8")
        (staging / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


__all__ = [
    "finetune_openqa",
    "load_openqa_model",
    "openqa_model_from_pretraining",
    "openqa_training_arguments",
    "OpenQAArguments",
    "OpenQACollator",
    "read_gold_passages",
    "save_finetuned",
]
