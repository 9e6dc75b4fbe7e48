"""Does REALM pre-training learn on the synthetic world? Issue 4 §6's measurement, refresh on against refresh off.

    python benchmarks/bench_learning.py --output /tmp/realm-learning [--embedder ict|random] [--encoder random|FOLDER]
        [--steps 300] [--refresh-every 25] [--modes sync,off] [--seed 0]

Builds the quickstart's default world, vocabulary and corpus (64-wordpiece blocks), an ICT embedder (or a random one)
and a random encoder (or the RealmKnowledgeAugEncoder folder given), then runs REALM pre-training once per refresh
mode from the same start, scoring fixed masked queries every `--eval-every` steps with `evaluate_pretraining`:
recall@8 of a block holding the masked span (fresh exact index of the current embedder), retrieval utility against
the null document, MLM accuracy. The paper's claims (§4.5, Table 3 "stale MIPS") are utility > 0, recall rising far
above the initial index's, and less learning with the index never refreshed. Writes OUTPUT/results.json and prints
a markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

METRICS = ("recall@8", "retrieval_utility", "mlm_accuracy", "null_doc_prob", "answer_in_candidates")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="/tmp/openrealm-learning")
    parser.add_argument("--embedder", choices=("ict", "random"), default="ict")
    parser.add_argument("--encoder", default="random", help="random, or a RealmKnowledgeAugEncoder folder")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--refresh-every", type=int, default=25)
    parser.add_argument("--modes", default="sync,off", help="refresh modes to compare (sync is deterministic)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from openrealm.trainers.quickstart import PRESETS, Stages, share_cpu_cores

    share_cpu_cores()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    preset = dataclasses.replace(
        PRESETS["default"],
        pretrain_steps=args.steps,
        refresh_every=args.refresh_every,
        pretrain_batch_size=args.batch_size,
        pretrain_learning_rate=args.learning_rate,
        pretrain_embedder_learning_rate=args.learning_rate,  # one lr for both towers here
        eval_every=args.eval_every,
    )
    stages = Stages(output, preset, args.seed, progress=False)
    corpus = stages.run("corpus", stages.corpus, stages.run("world", stages.world))
    embedder = str(stages.run("ICT", stages.ict, corpus)) if args.embedder == "ict" else "random"
    encoder = (
        str(stages.run("initial encoder", stages.initial_encoder, corpus))
        if args.encoder == "random"
        else args.encoder
    )
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = stages.run(
            f"REALM pre-training, refresh {mode}",
            stages.pretrain,
            corpus,
            embedder,
            encoder,
            mode,
            f"pretrain-{mode}",
            8,
        )["history"]

    results = {
        "command": "python benchmarks/bench_learning.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "timings_s": stages.timings,
        "runs": runs,
    }
    (output / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n| refresh | step | {' | '.join(METRICS)} |\n|---|---|{'---|' * len(METRICS)}")
    for mode, history in runs.items():
        for entry in (history[0], history[-1]):
            values = " | ".join(f"{entry.get('eval_' + name, float('nan')):.3f}" for name in METRICS)
            print(f"| {mode} | {entry['step']} | {values} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
