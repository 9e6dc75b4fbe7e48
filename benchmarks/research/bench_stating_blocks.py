"""Where is REALM's own reader paid? Held-out queries whose fact another block states, and how often a retriever
puts such a block (or merely one holding the masked words) among its top k.

    python benchmarks/research/bench_stating_blocks.py --starts-from START --seed 4 [--run-seed 100]
        [--runs BENCH_OUTPUT ...] [--hold-out 30] [--queries-per-block 4]

START is a `bench_learning.py` start (world/, corpus/, ict/); the held-out queries are those bench_learning.py scores
with the same --seed, --run-seed, --hold-out and --queries-per-block. For each query, the world's facts
(trainers/world/reading_tasks.py, `ReadingTasks`) say which other blocks *state* its fact; held-out recall counts any
block that *holds* the masked words, which is what the oracle reader pays for, while a reader that reads copies only
from a stating block. Printed for the ICT start and every `pretrain-*/embedder` under each --runs folder: recall@5 of
a holding block and of a stating block, and both among the top K - 1 = 7 and 23 (the candidates of K = 8 and 24)
(benchmarks/research/reader_that_reads.md, "REALM's own signal on the quickstart's world").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

TOP = (5, 7, 23)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts-from", required=True, help="a bench_learning.py start: world/, corpus/, ict/")
    parser.add_argument("--seed", type=int, required=True, help="the world's seed")
    parser.add_argument("--run-seed", type=int, default=None, help="bench_learning.py's --run-seed (default: --seed)")
    parser.add_argument("--runs", nargs="*", default=[], help="bench_learning.py OUTPUT folders to score")
    parser.add_argument("--hold-out", type=int, default=30)
    parser.add_argument("--queries-per-block", type=int, default=4)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from openrealm import RealmEmbedder
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining.evaluation import embed_queries, fixed_masked_queries, held_out_query_blocks
    from openrealm.trainers.world.reading_tasks import ReadingTasks
    from openrealm.trainers.world.synthetic_world import World

    start = Path(args.starts_from)
    run_seed = args.seed if args.run_seed is None else args.run_seed
    tokenizer, blocks = AutoTokenizer.from_pretrained(start / "corpus"), load_corpus(start / "corpus")
    held_out = held_out_query_blocks(blocks, args.hold_out, run_seed)
    queries = fixed_masked_queries(
        tokenizer,
        blocks,
        num_queries=args.hold_out,
        seed=run_seed + 1,
        block_ids=held_out,
        queries_per_block=args.queries_per_block,
    )
    tasks = ReadingTasks(World.read(start / "world"), blocks, tokenizer)
    by_span = {(t.block_id, t.sentence.strip(), t.sentence[slice(*t.span)]): t for t in tasks.queries}
    keys = list(zip(queries["block_id"].tolist(), [t.strip() for t in queries["query_text"]], queries["span_text"]))
    stating = []  # per query: the blocks stating its fact (query_text is the masked sentence, span its offsets)
    for block, sentence, span_text in zip(queries["block_id"].tolist(), queries["query_text"], queries["span_text"]):
        task = by_span.get((block, sentence.strip(), span_text))
        stating.append(set(task.blocks["stating"]) if task else set())
    count = len(stating)
    holding, found = sum(map(len, queries["answer_block_ids"])) / count, sum(key in by_span for key in keys)
    print(
        f"world {args.seed}, run seed {run_seed}: {count} held-out queries ({found} among the world's); "
        f"{sum(map(bool, stating)) / count:.3f} with a stating block; per query {holding:.1f} holding blocks, "
        f"{sum(map(len, stating)) / count:.2f} stating"
    )

    @torch.no_grad()
    def shares(folder: Path) -> dict[tuple[str, int], float]:
        embedder = RealmEmbedder.from_pretrained(folder).eval()
        index = exact_index(embedder, blocks, tokenizer)
        query = embed_queries(embedder, queries["query_input_ids"], queries["query_attention_mask"])
        _, ids = index.search(query, max(TOP) + 1)
        found = {(kind, k): 0 for kind in ("holding", "stating") for k in TOP}
        for own, row, holding, states in zip(
            queries["block_id"].tolist(), ids.tolist(), queries["answer_block_ids"], stating
        ):
            others = [i for i in row if i != own]
            for k in TOP:
                found["holding", k] += bool(set(others[:k]) & set(holding))
                found["stating", k] += bool(set(others[:k]) & states)
        return {key: value / count for key, value in found.items()}

    columns = [f"{kind} in top {k}" for kind in ("holding", "stating") for k in TOP]
    print(f"\n| embedder | {' | '.join(columns)} |\n|---|{'---|' * len(columns)}")
    folders = [start / "ict"] + [f for run in args.runs for f in sorted(Path(run).glob("pretrain-*/embedder"))]
    for folder in folders:
        values = shares(folder)
        name = "ICT start" if folder == start / "ict" else f"{folder.parent.parent.name}/{folder.parent.name}"
        print(
            f"| {name} | "
            + " | ".join(f"{values[kind, k]:.3f}" for kind in ("holding", "stating") for k in TOP)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
