"""Does the encoder read? How well a quickstart run's encoders predict a masked span from a block that states the fact,
in REALM's own joint input, before and after REALM pre-training.

    python benchmarks/bench_reader_copy.py --run realm-quickstart [--encoders reading-warmup pretrain/encoder]

For every corpus block's masked query (`fixed_masked_queries`, seed 0) whose span is stated elsewhere, the encoder
reads `[CLS] query [SEP] block [SEP]` with four kinds of block: one that states the fact (it holds the span and
another name of the query sentence), one that only mentions the span (it holds the span, no other name of the
sentence), one without the span, and the null document. Per masked wordpiece it reports the mean and median of
log p(y|z,x) and the share of wordpieces given p > 0.5 ("copies"). REALM's retriever is trained by the difference
between these rows: a reader for which a stating block is worth little more than any other block gives it no signal
towards the fact (benchmarks/RESULTS.md, "Table 2 on the quickstart").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

KINDS = ("stating", "mentioning", "without span", "null document")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="an `openrealm quickstart` OUTPUT folder")
    parser.add_argument(
        "--encoders",
        nargs="+",
        default=["reading-warmup", "pretrain/encoder"],
        help="encoder folders under --run (default: the warm-up's and REALM pre-training's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining import NULL_BLOCK_ID, RealmPretrainingExamples, RealmPretrainingModel
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, query_rows
    from openrealm.trainers.towers import load_embedder, load_encoder

    run = Path(args.run)
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    blocks = load_corpus(str(run / "corpus"))
    entities = [json.loads(line) for line in (run / "world" / "entities.jsonl").read_text().splitlines()]
    names = [entity["name"] for entity in entities]
    names_by_kind: dict[str, list[str]] = {}
    for entity in entities:
        names_by_kind.setdefault(entity["kind"], []).append(entity["name"])
    texts = blocks["text"]
    queries = fixed_masked_queries(tokenizer, blocks, num_queries=len(blocks), seed=args.seed)
    rng = np.random.default_rng(args.seed)
    chosen = []  # (query row, [null, stating, mentioning, without span]) for queries with all three kinds of block
    for row, (text, span, holding) in enumerate(
        zip(queries["query_text"], queries["span_text"], queries["answer_block_ids"], strict=True)
    ):
        others = [name for name in names if name in text and name not in span and span not in name]
        stating = [b for b in holding if any(name in texts[b] for name in others)]
        mentioning = sorted(set(holding) - set(stating))
        without = [b for b in range(len(texts)) if span not in texts[b] and b != int(queries["block_id"][row])]
        if stating and mentioning and without:
            picks = [int(rng.choice(stating)), int(rng.choice(mentioning)), int(rng.choice(without))]
            chosen.append((row, [NULL_BLOCK_ID, *picks]))
    embedder = load_embedder(run / "ict", tokenizer).eval()
    examples = RealmPretrainingExamples(
        tokenizer, blocks, embedder, exact_index(embedder, blocks, tokenizer), num_candidates=4
    )
    print(f"{args.run}: {len(chosen)} of {len(queries['uid'])} masked queries have all three kinds of block\n")
    print("| encoder | block | wordpieces | mean log p(y|z,x) | median | share with p > 0.5 |")
    print("|---|---|---|---|---|---|")
    results = {}
    for folder in args.encoders:
        encoder = load_encoder(run / folder, tokenizer).eval()
        model = RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0).eval()
        log_probs = []
        for start in range(0, len(chosen), 16):
            rows = [row for row, _ in chosen[start : start + 16]]
            batch = examples.with_candidates(query_rows(queries, rows), [ids for _, ids in chosen[start : start + 16]])
            with torch.no_grad():
                log_probs.append(model(**batch).token_log_prob)  # [N, 4]: null, stating, mentioning, without
        token_log_prob = torch.cat(log_probs).numpy()
        order = {"null document": 0, "stating": 1, "mentioning": 2, "without span": 3}
        results[folder] = {}
        for kind in KINDS:
            values = token_log_prob[:, order[kind]]
            results[folder][kind] = {
                "mean": float(values.mean()),
                "median": float(np.median(values)),
                "copies": float((values > np.log(0.5)).mean()),
            }
            print(
                f"| {folder} | {kind} | {len(values)} | {values.mean():.2f} | {np.median(values):.2f} "
                f"| {(values > np.log(0.5)).mean():.3f} |"
            )
        results[folder]["null document rank"] = rank_among_kind(model, examples, queries, tokenizer, names_by_kind)
    print(
        "\nWithout a block: the masked name's first wordpiece ranked among the first wordpieces of the other names of"
    )
    print("its kind (0 = above all of them; 0.5 = no better than guessing the kind; dates left out)\n")
    print("| encoder | masked names | mean rank | ranked first |")
    print("|---|---|---|---|")
    for folder in args.encoders:
        rank = results[folder]["null document rank"]
        print(f"| {folder} | {rank['count']} | {rank['mean_rank']:.3f} | {rank['first']:.3f} |")
    print("\n" + json.dumps({"run": args.run, "num_queries": len(chosen), "encoders": results}))
    return 0


@torch.no_grad()
def rank_among_kind(model, examples, queries, tokenizer, names_by_kind: dict[str, list[str]]) -> dict[str, float]:
    """With the null document: where the encoder ranks the masked name's first wordpiece among the distinct first
    wordpieces of the other names of the same kind. An encoder that only learned which kind of name a sentence asks
    for ranks it near 0.5; one that learned the fact itself near 0."""
    from openrealm.trainers.pretraining import NULL_BLOCK_ID
    from openrealm.trainers.pretraining.evaluation import query_rows

    kind_of = {name: kind for kind, names in names_by_kind.items() for name in names}
    first = {name: tokenizer(name, add_special_tokens=False)["input_ids"][0] for name in kind_of}
    ranks = []
    for row, span in enumerate(queries["span_text"]):
        if span not in kind_of:
            continue
        others = {first[name] for name in names_by_kind[kind_of[span]]} - {first[span]}
        if not others:
            continue
        batch = examples.with_candidates(query_rows(queries, [row]), [[NULL_BLOCK_ID] * examples.num_candidates])
        hidden = model.encoder.realm(
            batch["joint_input_ids"][:, 0],
            attention_mask=batch["joint_attention_mask"][:, 0],
            token_type_ids=batch["joint_token_type_ids"][:, 0],
        ).last_hidden_state
        position = int((batch["labels"][0] != -100).nonzero()[0, 0])
        log_prob = model.encoder.cls(hidden[0, position]).log_softmax(-1)
        true = log_prob[first[span]]
        ranks.append((log_prob[sorted(others)] > true).float().mean().item())
    ranks = np.array(ranks)
    return {"count": len(ranks), "mean_rank": float(ranks.mean()), "first": float((ranks == 0).mean())}


if __name__ == "__main__":
    raise SystemExit(main())
