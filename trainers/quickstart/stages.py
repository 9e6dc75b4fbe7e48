"""The stages of `openrealm quickstart` (trainers/jobs/quickstart.py): the whole REALM lifecycle on a generated world,
end to end.

    openrealm quickstart [--output realm-quickstart] [--seed 0] [--preset default|small] [--overwrite]

A seeded world of fictional entities (no pretrained model can know its facts) becomes a knowledge corpus; a WordPiece
vocabulary, ICT, the reading warm-up (the world's stand-in for BERT), REALM pre-training with its Table 2 ablations,
open-QA fine-tuning and evaluation on held-out entities follow, each with the code a user runs on Wikipedia; the report
and its figures are trainers/quickstart/report.py. What it writes and what it shows: docs/quickstart.md.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from openrealm.file_utils import check_replaceable
from openrealm.tokenization.jsonl import read_jsonl
from openrealm.trainers import cli, options
from openrealm.trainers.quickstart.report import (
    ABLATIONS,
    plot_comparison,
    plot_pretraining,
    table2_claims,
    write_report,
)


@dataclass(frozen=True)
class Preset:
    """Sizes and step counts of one quickstart run."""

    world: dict  # generate_world(**world)
    vocab_size: int
    block_length: int  # wordpieces per block: short blocks make each step cheap on CPU (Wikipedia: 288)
    model: str  # RealmConfig overrides of the tiny random models (k=v,...)
    reading_warmup_steps: int  # the encoder's "BERT stage" (trainers/world/reading_warmup.py)
    ict_steps: int
    ict_batch_size: int
    ict_learning_rate: float
    pretrain_steps: int
    pretrain_batch_size: int
    # K, null document included (Google: 8): more candidates per query give the retriever more signal
    # (benchmarks/research/more_candidates_per_query.md)
    pretrain_num_candidates: int
    # The encoder's: the paper's 3e-5, which keeps the warm-up's reading; the retriever's 10x higher, below where its
    # scores collapse onto the null document (benchmarks/research/reader_that_reads.md)
    pretrain_learning_rate: float
    pretrain_embedder_learning_rate: float
    refresh_every: int
    eval_every: int
    eval_queries: int
    finetune_steps: int
    finetune_batch_size: int
    # default preset 2e-4: higher rates made exact match swing with small differences between the starts
    # (benchmarks/research/quickstart_first_world.md#fine-tuning-lr-3e-4---2e-4-2026-11-24-after-a-red-ci-run);
    # the small preset, not re-measured, keeps 3e-4
    finetune_learning_rate: float
    searcher_beam_size: int
    reader_beam_size: int
    eval_reader_beam_size: int
    # The warm-up's loss paying a block without the span for predicting what the null document predicts (0: none);
    # with `copy_head=true` in `model`, 0.1 keeps the pointer's pull on the null document low
    # (benchmarks/research/reader_that_reads.md, "The copy head with the null-match loss through whole quickstarts")
    reading_warmup_null_match_weight: float = 0.0
    # REALM pre-training's linear lr warm-up; None: Google's min(10000, max(100, steps / 10)) (benchmarks/research/
    # reader_that_reads.md, "The retriever's schedule: its peak learning rate, its warm-up, a freeze, no refresh")
    pretrain_warmup_steps: int | None = None


MODEL = (
    "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=256,retriever_proj_size=32,"
    "hidden_dropout_prob=0,attention_probs_dropout_prob=0,max_position_embeddings=384,reader_seq_len=320,"
    "max_span_width=10"
)

# A world small enough that a fact's other mention is often among the ICT retriever's top 8 blocks: on a larger one
# the retriever's gradient was noise (benchmarks/research/reader_that_can_read.md).
WORLD = {
    "num_people": 40,
    "num_organizations": 12,
    "num_cities": 12,
    "num_rivers": 4,
    "num_mountains": 4,
    "num_regions": 3,
}

# The README's main command: its run time on 2 CPU cores is measured in docs/quickstart.md.
DEFAULT = Preset(
    world=WORLD,
    vocab_size=1000,
    block_length=64,
    model=MODEL,
    reading_warmup_steps=3600,
    ict_steps=100,
    ict_batch_size=32,
    ict_learning_rate=1e-3,
    pretrain_steps=400,
    pretrain_batch_size=16,
    pretrain_num_candidates=8,
    pretrain_learning_rate=3e-5,
    pretrain_embedder_learning_rate=3e-4,
    refresh_every=25,
    eval_every=50,
    eval_queries=256,
    finetune_steps=300,
    finetune_batch_size=8,
    finetune_learning_rate=2e-4,
    searcher_beam_size=64,
    reader_beam_size=5,
    eval_reader_beam_size=5,
)
PRESETS = {
    "default": DEFAULT,
    # a quicker look (run time: docs/quickstart.md): the same world, fewer steps; too few for the retriever to learn
    "small": replace(
        DEFAULT, reading_warmup_steps=1800, pretrain_steps=150, refresh_every=25, eval_every=25, finetune_steps=150
    ),
}


class Stages:
    """Runs the lifecycle stage by stage, printing what each did and how long it took."""

    def __init__(self, output: Path, preset: Preset, seed: int, progress: bool = True, max_threads: int | None = None):
        """max_threads: the most torch threads one process of the run may use (default: every core;
        share_cpu_cores's answer)."""
        self.output, self.preset, self.seed, self.progress = output, preset, seed, progress
        self.max_threads = max_threads or os.cpu_count() or 1
        self.timings: dict[str, float] = {}

    def path(self, name: str) -> Path:
        return self.output / name

    def run(self, name: str, function, *args, **kwargs):
        print(f"\n== quickstart: {name}", flush=True)
        started = time.perf_counter()
        result = function(*args, **kwargs)
        self.timings[name] = round(time.perf_counter() - started, 1)
        print(f"== quickstart: {name} done in {self.timings[name]:.1f} s", flush=True)
        return result

    def run_parallel(self, name: str, calls: dict[str, tuple[str, tuple, dict]], all_at_once: bool = False) -> dict:
        """Independent stages at once, each in a fresh spawned child process sharing the cores, its output written to
        OUTPUT/logs/KEY.log: {key: (Stages method, args, kwargs)} -> {key: result}. One timing for the group. What
        each computes does not depend on how the processes interleave (the async refresh swaps each index at a fixed
        step: `--refresh-lag`). By default as many run at once as there are cores; all_at_once: every call at once (for
        runs of unequal length or a count that does not divide among the cores). Each process gets cores // (how
        many run at once) torch threads, at least one, at most max_threads."""
        import multiprocessing

        # As many at once as there are cores: on 2 cores faster than one after another, and than all at once for the
        # four equal fine-tuning runs (docs/quickstart.md gives the stages' times).
        cores = os.cpu_count() or 1
        workers = len(calls) if all_at_once else max(1, min(len(calls), cores))
        threads = max(1, min(self.max_threads, cores // workers))
        logs = self.path("logs")
        logs.mkdir(parents=True, exist_ok=True)
        child = copy.copy(self)
        child.progress = False  # bars in a log file are noise
        print(f"\n== quickstart: {name} ({len(calls)} runs, {workers} at a time; their output in {logs})", flush=True)
        started = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
            pending = {
                key: pool.apply_async(_stage_in_child, (child, method, args, kwargs, logs / f"{key}.log", threads))
                for key, (method, args, kwargs) in calls.items()
            }
            results = {}
            for key, result in pending.items():
                try:
                    results[key] = result.get()
                except Exception as error:
                    raise RuntimeError(f"quickstart: {name}: {key} failed; its log: {logs / f'{key}.log'}") from error
        self.timings[name] = round(time.perf_counter() - started, 1)
        print(f"== quickstart: {name} done in {self.timings[name]:.1f} s", flush=True)
        return results

    # -- data ---------------------------------------------------------------------------------------------------------
    def world(self):
        from openrealm.trainers.world.synthetic_world import generate_world

        world = generate_world(seed=self.seed, **self.preset.world)
        world.write(self.path("world"))
        counts = world.config["num_questions"]
        print(
            f"{world.config['num_articles']} articles, {world.config['num_facts']} facts, questions: "
            + ", ".join(f"{split} {count}" for split, count in counts.items())
        )
        return world

    def corpus(self, world) -> Path:
        from datasets import Dataset

        from openrealm.tokenization.corpus import build_corpus
        from openrealm.tokenization.vocab import train_wordpiece_vocab

        tokenizer = train_wordpiece_vocab(world.texts(), self.path("tokenizer"), vocab_size=self.preset.vocab_size)
        articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
        blocks = build_corpus(
            articles,
            self.path("corpus"),
            tokenizer,
            max_block_length=self.preset.block_length,
            span_annotator=world.span_annotator(),
        )
        print(f"vocabulary of {len(tokenizer)} wordpieces; {len(blocks)} blocks")
        return self.path("corpus")

    # -- training -----------------------------------------------------------------------------------------------------
    def ict(self, corpus: Path) -> Path:
        preset = self.preset
        argv = [
            "--corpus", str(corpus), "--init", "random", "--output", str(self.path("ict")),
            "--config-overrides", preset.model, "--max-steps", str(preset.ict_steps),
            "--batch-size", str(preset.ict_batch_size), "--learning-rate", str(preset.ict_learning_rate),
            "--save-steps", "0", "--seed", str(self.seed), "--eval-queries", "256", "--logging-steps", "50",
            "--embedding-dropout", "0", "--overwrite",
        ]  # fmt: skip
        cli.run_in_process(["train", "ict"], argv + ([] if self.progress else ["--quiet"]))
        return self.path("ict")

    def initial_tower(self, corpus: Path, tower: str = "encoder") -> Path:
        """A randomly initialised tower ("encoder" or "embedder") sized by the preset, saved as OUTPUT/initial-<tower>
        (benchmarks/research/bench_learning.py's random starts)."""
        from transformers import AutoTokenizer

        from openrealm.trainers.stage_utils import parse_config_overrides
        from openrealm.trainers.towers import load_embedder, load_encoder, save_tower

        tokenizer = AutoTokenizer.from_pretrained(corpus)
        load = {"encoder": load_encoder, "embedder": load_embedder}[tower]
        model = load("random", tokenizer, parse_config_overrides(self.preset.model), self.seed)
        return save_tower(model, self.path(f"initial-{tower}"), tokenizer)

    def reading_warmup(self, corpus: Path) -> Path:
        """The encoder's "BERT stage": a random encoder learns to copy a masked span from a block stating it in REALM's
        own input, and to share its probability where a block does not (names renamed in every example, so it reads
        rather than memorises), saved as OUTPUT/reading-warmup; every run's encoder starts there, as REALM's and
        ORQA's start from BERT. It runs alone, on every core."""
        from openrealm.trainers.stage_utils import all_cpu_cores
        from openrealm.trainers.world.reading_warmup import warm_up_encoder

        with all_cpu_cores(self.max_threads):
            return warm_up_encoder(
                self.path("world"), corpus, self.path("reading-warmup"), config_overrides=self.preset.model,
                steps=self.preset.reading_warmup_steps, seed=self.seed,
                null_match_weight=self.preset.reading_warmup_null_match_weight,
            )  # fmt: skip

    def reader(self, corpus: Path, encoders: dict[str, Path]) -> dict[str, dict]:
        """How well each encoder reads on the world as it is (trainers/world/reading_tasks.py's probe): {name:
        reading_probe}, e.g. the warm-up's encoder ("start") and REALM pre-training's ("end")."""
        from openrealm.trainers.world.reading_tasks import probe_encoders

        return probe_encoders(self.path("world"), corpus, encoders)

    def pretrain(
        self,
        corpus: Path,
        embedder: Path | str,
        encoder: Path | str,
        mode: str = "async",
        name: str = "pretrain",
        k: int = 5,
        spans: str = "salient",
        extra_argv: Sequence[str] = (),
        queries: dict | None = None,
        evaluate: bool = True,
    ) -> dict:
        """REALM pre-training into OUTPUT/name with the index refresh `mode` ("off": the stale-index ablation) and the
        masking `spans` ("random_span": the random-span ablation); Figure 4's points (utility, recall@k) come from a
        PretrainingEvalCallback on the same fixed queries in every run (`queries`, default fixed_masked_queries of
        the preset); evaluate=False: none (an empty history), for a run whose curve nothing reads. extra_argv: more
        `train pretrain` flags (benchmarks/research/bench_learning.py)."""
        from transformers import AutoTokenizer

        from openrealm.tokenization.corpus_folder import load_corpus
        from openrealm.trainers.pretraining.evaluation import PretrainingEvalCallback, fixed_masked_queries

        preset = self.preset
        argv = [
            "--corpus", str(corpus), "--embedder", str(embedder), "--encoder", str(encoder),
            "--output", str(self.path(name)),
            "--max-steps", str(preset.pretrain_steps), "--refresh-every", str(preset.refresh_every),
            "--refresh-mode", mode, "--batch-size", str(preset.pretrain_batch_size),
            "--num-candidates", str(preset.pretrain_num_candidates),
            "--learning-rate", str(preset.pretrain_learning_rate), "--seed", str(self.seed),
            "--embedder-learning-rate", str(preset.pretrain_embedder_learning_rate),
            "--logging-steps", str(preset.eval_every), "--embedding-dropout", "0", "--spans", spans,
        ]  # fmt: skip
        if mode == "async":  # each index swapped in exactly refresh_every steps after its snapshot: reproducible
            argv += ["--refresh-lag", str(preset.refresh_every)]
        if preset.pretrain_warmup_steps is not None:
            argv += ["--warmup-steps", str(preset.pretrain_warmup_steps)]
        argv += [*extra_argv, *([] if self.progress else ["--quiet"])]
        if not evaluate:
            cli.run_in_process(["train", "pretrain"], argv)
            return {"history": [], "summary": self.path(name) / "pretraining.json"}
        tokenizer = AutoTokenizer.from_pretrained(corpus)
        blocks = load_corpus(corpus)
        if queries is None:
            queries = fixed_masked_queries(tokenizer, blocks, num_queries=preset.eval_queries, seed=self.seed + 1)
        evaluation = PretrainingEvalCallback(queries, tokenizer, blocks, eval_steps=preset.eval_every, k=k)
        cli.run_in_process(["train", "pretrain"], argv, callbacks=[evaluation])
        return {"history": evaluation.history, "summary": self.path(name) / "pretraining.json"}

    def retriever_bound(self, corpus: Path, embedder: Path) -> Path:
        """The world's perfect-reader bound: the ICT embedder trained alone on REALM's retriever objective with a
        perfect reader and every block a candidate (trainers/pretraining/retriever_bound.py), for the pre-training
        runs' steps at their batch size and embedder lr; saved as OUTPUT/retriever-bound. Its zero-shot recall is what
        REALM's signal could at most teach the retriever on this world."""
        from transformers import AutoTokenizer

        from openrealm.tokenization.corpus_folder import load_corpus
        from openrealm.trainers.pretraining.retriever_bound import train_retriever_bound
        from openrealm.trainers.towers import load_embedder, save_tower

        preset, tokenizer = self.preset, AutoTokenizer.from_pretrained(corpus)
        model = load_embedder(embedder, tokenizer, seed=self.seed)
        losses = train_retriever_bound(
            model, tokenizer, load_corpus(corpus), steps=preset.pretrain_steps,
            batch_size=preset.pretrain_batch_size, learning_rate=preset.pretrain_embedder_learning_rate,
            seed=self.seed,
        )  # fmt: skip
        if losses:
            print(f"perfect-reader bound: loss {losses[0]:.3f} -> {sum(losses[-20:]) / len(losses[-20:]):.3f}")
        return save_tower(model, self.path("retriever-bound"), tokenizer)

    def finetune(self, name: str, embedder: Path, encoder: Path | str) -> Path:
        """Open-QA fine-tuning on the world's training questions; dev questions evaluated before and after."""
        from openrealm.trainers.openqa import (
            OpenQAArguments,
            finetune_openqa,
            openqa_model_from_pretraining,
            openqa_training_arguments,
        )

        preset = self.preset
        output = self.path(f"{name}-openqa")
        model = openqa_model_from_pretraining(embedder, encoder, self.path("corpus"))
        world = self.path("world")
        training_args = openqa_training_arguments(
            output,
            preset.finetune_steps,
            per_device_train_batch_size=preset.finetune_batch_size,
            learning_rate=preset.finetune_learning_rate,
            seed=self.seed,
            disable_tqdm=not self.progress,
        )
        openqa_args = OpenQAArguments(
            searcher_beam_size=preset.searcher_beam_size,
            reader_beam_size=preset.reader_beam_size,
            eval_reader_beam_size=preset.eval_reader_beam_size,
        )
        summary = finetune_openqa(
            model,
            str(world / "questions_train.jsonl"),
            str(world / "questions_dev.jsonl"),
            training_args,
            openqa_args,
            summary_extras={"model": f"{embedder} + {encoder}", "corpus": str(self.path("corpus")), "train": "world"},
        )
        print(f"{name}: dev exact match {summary['dev_before']} -> {summary['dev_after']}")
        return output

    # -- evaluation and report ----------------------------------------------------------------------------------------
    def zero_shot_recall(self, embedder: Path, encoder: Path, k: int = 5) -> float:
        """Table 2's zero-shot retrieval recall@k (%): the pre-trained embedder as the question encoder, before any
        fine-tuning; a test question counts when one of its top-k blocks holds an answer."""
        from openrealm.trainers.evaluation import evaluate_openqa, load_qa_dataset
        from openrealm.trainers.openqa import openqa_model_from_pretraining

        test = load_qa_dataset(str(self.path("world") / "questions_test.jsonl"))
        model = openqa_model_from_pretraining(embedder, encoder, self.path("corpus")).eval()
        results = evaluate_openqa(model, test, num_blocks=1, recall_ks=(k,))
        print(f"zero-shot recall@{k} of {embedder}: {results[f'recall@{k}']:.1f} ({results['count']} questions)")
        return results[f"recall@{k}"]

    def evaluate(self, models: dict[str, Path]) -> dict[str, dict]:
        """EM and recall@k on the held-out test entities: each model with its own retrieval, and REALM's reader over
        BM25 retrieval; each result also written as JSON next to the model."""
        from openrealm import RealmForOpenQA
        from openrealm.trainers.bm25 import Bm25BlockSearcher
        from openrealm.trainers.evaluation import evaluate_openqa, load_qa_dataset, write_results

        test = load_qa_dataset(str(self.path("world") / "questions_test.jsonl"))
        runs = {}
        for name, folder in models.items():
            model = RealmForOpenQA.from_pretrained(folder).eval()
            searchers = {name: None}
            if name == "realm":
                searchers["realm-reader-bm25"] = Bm25BlockSearcher.from_retriever(model.retriever)
            for label, searcher in searchers.items():
                results = evaluate_openqa(
                    model, test, num_blocks=self.preset.eval_reader_beam_size, recall_ks=RECALL_KS,
                    block_searcher=searcher,
                )  # fmt: skip
                results.update(dataset="world held-out test entities", split="test")
                write_results(results, self.path(f"results-{label}.json"))
                runs[label] = {key: value for key, value in results.items() if key != "predictions"}
                print(
                    f"{label}: exact match {results['exact_match']:.1f}, recall@5 {results['recall@5']:.1f} "
                    f"({results['count']} questions)"
                )
        return runs

    def model_card(self, folder: Path, evaluation_json: Path) -> None:
        """Rewrite the fine-tuned folder's model card with its held-out test results next to its dev results."""
        from openrealm.hub_cards.model_card import openqa_model_card, write_model_card
        from openrealm.trainers.evaluation import read_results

        evaluations = [read_results(evaluation_json)]
        if (folder / options.OPENQA_DEV_RESULTS_NAME).is_file():
            evaluations.insert(0, read_results(folder / options.OPENQA_DEV_RESULTS_NAME))
        summary = json.loads((folder / options.OPENQA_SUMMARY_NAME).read_text())
        card = openqa_model_card(evaluations, model_name=folder.name, training_summary=summary, corpus=None)
        write_model_card(folder, card)

    def demo(self, folder: Path, num_questions: int = 3) -> list[dict]:
        """Answer a few held-out questions through pipeline("question-answering"), with provenance."""
        from transformers import pipeline

        import openrealm  # noqa: F401 - registers the pipeline

        questions = read_jsonl(self.path("world") / "questions_test.jsonl")
        questions = questions[:num_questions]
        qa = pipeline("question-answering", model=str(folder))
        answers = qa([q["question"] for q in questions], top_k=1)
        shown = []
        for question, answer in zip(questions, answers):
            answer = answer[0] if isinstance(answer, list) else answer
            shown.append({"question": question["question"], "expected": question["answers"], **answer})
            print(f"Q: {question['question']}   (expected: {', '.join(question['answers'])})")
            print(f"  A: {answer['answer']}  (score {answer['score']:.3f})")
            print(f"     from block {answer['block_id']} [{answer['title']}]: {answer['text'][:160]}")
        return shown


RECALL_KS = (1, 5, 10)


PRETRAINING_STAGE = "REALM pre-training with async index refresh, and its ablations"
BOUND = "retriever-bound"  # the perfect-reader bound's run (Stages.retriever_bound)


# What a quickstart writes at the top of its output folder (fnmatch patterns); --overwrite replaces only such a folder.
OUTPUT_ENTRIES = (
    "world", "tokenizer", "corpus", "ict", "reading-warmup", "initial-*", "pretrain", "pretrain-*", BOUND,
    "*-openqa", "logs", "report.md", "figure_*.png", "results.json", "results-*.json",
    ".DS_Store",  # what macOS's Finder leaves in a folder it showed
)  # fmt: skip


def _foreign_entries(folder: str) -> str | None:
    """check_replaceable's test for --overwrite: None when every entry of `folder` is one a quickstart writes (a
    finished or an interrupted run), else the reason naming the others (a folder of the user's own files)."""
    foreign = sorted(
        name for name in os.listdir(folder) if not any(fnmatch.fnmatch(name, pattern) for pattern in OUTPUT_ENTRIES)
    )
    if not foreign:
        return None
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return f"it holds what a quickstart does not write ({shown}); choose another --output, or remove them"


def _stage_in_child(stages: Stages, method: str, args: tuple, kwargs: dict, log: Path, threads: int):
    """(child process of Stages.run_parallel) One stage with its output, C level included, in `log`."""
    import torch

    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the async index builders this stage starts
    try:
        return getattr(stages, method)(*args, **kwargs)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def share_cpu_cores() -> int:
    """On CPU, give the trainer and the async index builder (a child process) half of the cores each: more threads
    than cores slows every step severalfold. Returns the most threads one process may use: the cores, or fewer where
    the user's OMP_NUM_THREADS says so (e.g. other work running beside, as tests side by side)."""
    import torch

    cores = os.cpu_count() or 1
    requested = os.environ.get("OMP_NUM_THREADS", "")
    limit = min(cores, int(requested)) if requested.isdigit() and int(requested) > 0 else cores
    if torch.cuda.is_available():
        return limit
    threads = max(1, min(limit, cores // 2))
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # read by the builder processes at their start
    return limit


def quickstart(output: str | os.PathLike, preset: str = "default", seed: int = 0, overwrite: bool = False,
               progress: bool = True) -> dict:  # fmt: skip
    """Run the whole lifecycle into `output`; returns results.json's content."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{output} is not empty: pass --overwrite to replace it, or choose another --output")
        # never the working directory or a folder holding it, nor one holding anything a quickstart does not write
        check_replaceable(output, overwrite=True, replaceable=_foreign_entries)
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)
    stages = Stages(output, PRESETS[preset], seed, progress, max_threads=share_cpu_cores())
    world = stages.run("world of fictional entities", stages.world)
    corpus = stages.run("vocabulary, blocks and salient spans", stages.corpus, world)
    embedder = stages.run("ICT warm start of the retriever", stages.ict, corpus)
    encoder = stages.run("reading warm-up of the encoder", stages.reading_warmup, corpus)
    # REALM and Table 2's ablations that apply here, from the same ICT embedder and warmed-up encoder, the same steps;
    # Figure 4's curve is REALM's own (the ablations' would be read by nothing).
    pretraining_runs = {
        ablation.pretraining: (
            "pretrain", (corpus, embedder, encoder, ablation.refresh_mode, ablation.pretraining),
            {"spans": ablation.spans, "evaluate": ablation.name == "realm"},
        )
        for ablation in ABLATIONS
        if ablation.pretraining is not None
    }  # fmt: skip
    # The world's ceiling on what REALM's signal can teach the retriever, from the same ICT embedder (the shortest
    # run, queued last so that it shares a core with a pre-training run).
    pretraining_runs[BOUND] = ("retriever_bound", (corpus, embedder), {})
    # all at once: three runs and a shorter one divide unevenly between two cores (docs/quickstart.md)
    pretrained = stages.run_parallel(PRETRAINING_STAGE, pretraining_runs, all_at_once=True)
    history = pretrained["pretrain"]["history"]
    reader = stages.run(
        "how well the encoder reads, before and after REALM pre-training",
        stages.reader, corpus, {"start": encoder, "end": stages.path("pretrain") / "encoder"},
    )  # fmt: skip
    towers = {
        ablation.name: (embedder, encoder)
        if ablation.pretraining is None
        else (stages.path(ablation.pretraining) / "embedder", stages.path(ablation.pretraining) / "encoder")
        for ablation in ABLATIONS
    }
    towers[BOUND] = (pretrained[BOUND], encoder)
    zero_shot = stages.run(
        "zero-shot retrieval recall@5", lambda: {name: stages.zero_shot_recall(*pair) for name, pair in towers.items()}
    )
    finetuning = {ablation.run: ("finetune", (ablation.run, *towers[ablation.name]), {}) for ablation in ABLATIONS}
    models = stages.run_parallel("open-QA fine-tuning of every start", finetuning)
    runs = stages.run("evaluation on held-out entities", stages.evaluate, models)
    realm = models["realm"]
    stages.model_card(realm, stages.path("results-realm.json"))
    demo = stages.run("answers through the pipeline", stages.demo, realm)
    plot_pretraining(history, output / "figure_pretraining.png")
    plot_comparison(runs, output / "figure_comparison.png")
    ablations = [
        {
            "name": ablation.name,
            "zero_shot_recall_at_5": zero_shot[ablation.name],
            "exact_match": runs[ablation.run]["exact_match"],
            # the first log at which its retriever ran onto the null document (train pretrain's NullDocumentWatch)
            "null_document_collapse": None
            if ablation.pretraining is None
            else json.loads(pretrained[ablation.pretraining]["summary"].read_text("utf-8"))["null_document_collapse"],
        }
        for ablation in ABLATIONS
    ]
    results = {
        "preset": preset,
        "settings": asdict(PRESETS[preset]),
        "seed": seed,
        "timings_s": stages.timings,
        "pretraining": history,
        "pretraining_curve": {
            "step": [entry["step"] for entry in history],
            "retrieval_utility": [entry["eval_retrieval_utility"] for entry in history],
            "recall_at_5": [100.0 * entry["eval_recall@5"] for entry in history],
        },
        "ablations": ablations,
        "reader": reader,
        "world": {
            "ict_start_recall_at_5": zero_shot["no_realm_pretraining"],
            "bm25_recall_at_5": runs["realm-reader-bm25"]["recall@5"],
            "perfect_reader_bound_recall_at_5": zero_shot[BOUND],
        },
        "open_qa": runs,
        "demo": demo,
    }
    results["claims"] = table2_claims(results)
    (output / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    report = write_report(
        output,
        preset,
        stages.seed,
        stages.timings,
        history,
        runs,
        demo,
        ablations,
        results["world"],
        results["claims"],
        reader,
    )
    print(f"\nquickstart: done in {sum(stages.timings.values()):.0f} s. Report: {report}; model: {realm}")
    return results


__all__ = [
    "PRESETS",
    "PRETRAINING_STAGE",
    "WORLD",
    "quickstart",
    "share_cpu_cores",
    "Stages",
]
