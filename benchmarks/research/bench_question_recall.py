"""Table 2's question recall over REALM's steps, beside Figure 4's masked-query recall: tells apart why a quickstart's
REALM retriever can end under its ICT start on the test questions while Figure 4 rises
(benchmarks/research/reader_that_reads.md, "Why seed 2 ends under its ICT start: the null document").

    python benchmarks/research/bench_question_recall.py OUT SEED [--copy-head] [--reuse QUICKSTART]
        [--refresh-mode off] [-- FLAGS]

Runs the quickstart's first stages into OUT (world, corpus, ICT, reading warm-up; or copies them from --reuse, a
quickstart folder of the same seed), then REALM pre-training as the quickstart runs it (`Stages.pretrain`, one
process) with Figure 4's evaluation every `eval_every` steps (50) and a checkpoint at the same steps (`--save-steps`).
Then, for the ICT embedder and each checkpoint's, zero-shot recall@5 (`evaluate_openqa`, as the quickstart's
`zero_shot_recall`) of:
- the test questions (Table 2's number) and every question of the world (train + dev + test: about 4x as many);
- each question's entity name alone as the query, with the same answers: whether the retriever still finds an
  entity's blocks by its name, apart from the question's other words.
--refresh-mode off: the never-refreshed run (the quickstart's stale-index ablation) in place of REALM's.
FLAGS after `--`: more `train pretrain` flags, after the quickstart's (e.g. `-- --embedder-learning-rate 1e-4`).
--copy-head: the encoder with the pointer head warmed up with the null-match loss 0.1 (not a preset). Writes
OUT/question_recall.json ({"figure4": [...], "recalls": {step: {...}}}) and prints both curves.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from openrealm.trainers.quickstart import stages as quickstart_stages

REUSED = ("world", "tokenizer", "corpus", "ict", "reading-warmup")


def recalls(stages, embedder: Path, encoder: Path) -> dict[int, dict[str, float]]:
    """{step: {query set: recall@5 (%)}} for the starting `embedder` (step 0) and every checkpoint's."""
    from openrealm.tokenization.jsonl import read_jsonl
    from openrealm.trainers.evaluation import evaluate_openqa
    from openrealm.trainers.openqa import openqa_model_from_pretraining

    world = stages.path("world")
    rows = {split: list(read_jsonl(world / f"questions_{split}.jsonl")) for split in ("train", "dev", "test")}
    every = [row for split in rows.values() for row in split]
    sets = {
        "test_questions": [{"question": r["question"], "answers": r["answers"]} for r in rows["test"]],
        "all_questions": [{"question": r["question"], "answers": r["answers"]} for r in every],
        "test_entity_name": [{"question": r["entity"], "answers": r["answers"]} for r in rows["test"]],
        "all_entity_name": [{"question": r["entity"], "answers": r["answers"]} for r in every],
    }
    table = {}
    checkpoints = stages.path("pretrain").glob("checkpoint-*/embedder")
    saved = [(int(path.parent.name.split("-")[1]), path) for path in checkpoints]
    for step, folder in sorted([(0, embedder), *saved]):
        model = openqa_model_from_pretraining(folder, encoder, stages.path("corpus")).eval()
        table[step] = {
            name: evaluate_openqa(model, data, num_blocks=1, recall_ks=(5,))["recall@5"] for name, data in sets.items()
        }
        print(step, {name: round(value, 1) for name, value in table[step].items()}, flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("seed", type=int)
    parser.add_argument("--copy-head", action="store_true", help="the pointer head with the null-match loss 0.1")
    parser.add_argument("--reuse", type=Path, help="a quickstart folder of the same seed whose first stages to copy")
    parser.add_argument(
        "--refresh-mode", choices=("async", "off"), default="async", help="off: the never-refreshed run's retriever"
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, flags = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: more `train pretrain` flags
    preset = quickstart_stages.DEFAULT
    if args.copy_head:
        preset = replace(
            preset, model=quickstart_stages.MODEL + ",copy_head=true", reading_warmup_null_match_weight=0.1
        )
    args.output.mkdir(parents=True, exist_ok=True)
    stages = quickstart_stages.Stages(
        args.output, preset, args.seed, progress=False, max_threads=quickstart_stages.share_cpu_cores()
    )
    if args.reuse:
        for name in REUSED:
            if not (args.output / name).exists():
                shutil.copytree(args.reuse / name, args.output / name)
        corpus, embedder, encoder = (args.output / name for name in ("corpus", "ict", "reading-warmup"))
    else:
        corpus = stages.run("corpus", stages.corpus, stages.run("world", stages.world))
        embedder = stages.run("ICT", stages.ict, corpus)
        encoder = stages.run("reading warm-up", stages.reading_warmup, corpus)
    # `train pretrain`'s own checkpoints (they leave the run's random draws as they are), every one kept
    every, kept = preset.eval_every, preset.pretrain_steps // preset.eval_every
    checkpoints = ["--save-steps", str(every), "--save-total-limit", str(kept)]
    run = stages.run(
        "REALM pre-training",
        stages.pretrain,
        corpus,
        embedder,
        encoder,
        mode=args.refresh_mode,
        extra_argv=checkpoints + flags,
    )
    history = run["history"]
    table = stages.run("recall of the saved embedders", recalls, stages, embedder, encoder)
    (args.output / "question_recall.json").write_text(json.dumps({"figure4": history, "recalls": table}, indent=1))
    for entry in history:
        recall, utility = 100 * entry["eval_recall@5"], entry["eval_retrieval_utility"]
        print(f"step {entry['step']}: masked-query recall@5 {recall:.1f}, retrieval utility {utility:.2f}")


if __name__ == "__main__":
    main()
