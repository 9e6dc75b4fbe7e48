"""Does the encoder read? How well a quickstart run's encoders predict a masked span from each kind of block, in
REALM's own joint input, before and after REALM pre-training.

    python benchmarks/research/bench_reader_copy.py --run realm-quickstart [--encoders reading-warmup pretrain/encoder]

The probe is trainers/world/reading_tasks.py's `reading_probe` (what `openrealm quickstart` records in results.json's
"reader"): one masked query per block as REALM pre-training draws them, read with `[CLS] query [SEP] block [SEP]` for
one block of each kind the world's facts say it is: one that states the fact and determines the answer ("stating"),
one that states it beside another fact of the same form ("ambiguous"), one that only holds the span's words
("mentioning"), one without them, and the null document. Per masked wordpiece it reports the mean log p(y|z,x) and
the share given p > 0.5 ("copies"). REALM's retriever is trained by the differences between these rows; a second
table ranks the masked name among the names of its kind with the null document, to tell an encoder that learned only
the kind of name a sentence asks for (0.5) from one that learned the facts (0); a third compares the blocks without
the span that the ICT retriever puts in a query's top 7 (REALM's candidates) with random such blocks and with none,
to tell whether REALM's candidates cost the reader more than any block lacking the span; a fourth reads every block
without the span of every query, split into the distractors (`Query.distractors`: the same relation stated for
another entity) and the others, with the share of masked wordpieces given log p below -8 (p < 0.0003: a wrong name
copied with confidence); a fifth says where the probability goes from each kind of block: on the wordpieces that fit
the mask (the i-th wordpiece of each salient span of the masked span's length that the block holds), on the block's
other wordpieces, and how often the encoder puts more than half of it on the block ("copies"), with the mean log p
when it does and when it does not: a reader that hedges across the spans that fit, as the ideal readers of
bench_preflight_kinds.py do, from one that copies one span or none (benchmarks/research/reader_that_reads.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


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

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining import RealmPretrainingExamples, RealmPretrainingModel
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries
    from openrealm.trainers.towers import load_embedder, load_encoder
    from openrealm.trainers.world.reading_tasks import ReadingTasks, probe_examples, reading_probe
    from openrealm.trainers.world.synthetic_world import World

    run = Path(args.run)
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    blocks = load_corpus(str(run / "corpus"))
    world = World.read(run / "world")
    tasks = ReadingTasks(world, blocks, tokenizer)
    examples = probe_examples(tasks, args.seed)
    names_by_kind: dict[str, list[str]] = {}
    for entity in world.entities:
        names_by_kind.setdefault(entity["kind"], []).append(entity["name"])
    queries = fixed_masked_queries(tokenizer, blocks, num_queries=len(blocks), seed=args.seed)
    embedder = load_embedder(run / "ict", tokenizer).eval()
    index = exact_index(embedder, blocks, tokenizer)
    candidates = RealmPretrainingExamples(tokenizer, blocks, embedder, index, num_candidates=4)
    print(f"{args.run}: {len(queries['uid'])} masked queries, one per block\n")
    print("| encoder | block | wordpieces | mean log p(y|z,x) | share with p > 0.5 |")
    print("|---|---|---|---|---|")
    results = {}
    for folder in args.encoders:
        encoder = load_encoder(run / folder, tokenizer).eval()
        results[folder] = reading_probe(encoder, tasks, examples)
        for kind, value in results[folder]["kinds"].items():
            print(
                f"| {folder} | {kind} | {value['wordpieces']} | {value['mean_log_prob']:.2f} "
                f"| {value['copy_share']:.3f} |"
            )
        model = RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0).eval()
        results[folder]["null document rank"] = rank_among_kind(model, candidates, queries, tokenizer, names_by_kind)
        results[folder]["without blocks"] = without_blocks(encoder, embedder, index, tasks, queries, args.seed)
        results[folder]["misreads"] = misreads(encoder, tasks, queries)
        results[folder]["where p goes"] = where_p_goes(encoder, tasks, examples)
    print(
        "\nWithout a block: the masked name's first wordpiece ranked among the first wordpieces of the other names of"
    )
    print("its kind (0 = above all of them; 0.5 = no better than guessing the kind; dates left out)\n")
    print("| encoder | masked names | mean rank | ranked first |")
    print("|---|---|---|---|")
    for folder in args.encoders:
        rank = results[folder]["null document rank"]
        print(f"| {folder} | {rank['count']} | {rank['mean_rank']:.3f} | {rank['first']:.3f} |")
    print("\nBlocks without the span: mean log p(y|z,x) per masked wordpiece from the ICT retriever's top 7 (the")
    print("query's own block left out), from one drawn at random among all such blocks, and from no block\n")
    print("| encoder | retrieved without (blocks) | random without | null document |")
    print("|---|---|---|---|")
    for folder in args.encoders:
        value = results[folder]["without blocks"]
        print(f"| {folder} | {value['retrieved']:.2f} ({value['retrieved_blocks']}) | {value['random']:.2f} "
              f"| {value['null']:.2f} |")  # fmt: skip
    print("\nEvery block without the span of every query: mean and median log p(y|z,x) per masked wordpiece, and the")
    print(f"share below {MISREAD}, from the distractors (the same relation for another entity) and the others\n")
    print("| encoder | blocks | wordpieces | mean | median | share below -8 |")
    print("|---|---|---|---|---|---|")
    for folder in args.encoders:
        for name, value in results[folder]["misreads"].items():
            print(f"| {folder} | {name} | {value['wordpieces']} | {value['mean']:.2f} | {value['median']:.2f} "
                  f"| {value['misread_share']:.3f} |")  # fmt: skip
    print("\nWhere the probability goes, per masked wordpiece: on the wordpieces that fit (the i-th of each salient")
    print("span of the masked length the block holds; how many), on the block's other wordpieces; the share on which")
    print("the block gets p > 0.5 (copies), and the mean log p(y|z,x) when it copies and when it does not\n")
    print("| encoder | block | p on fitting (how many) | p, rest of block | copies | log p, copying | log p, not |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.encoders:
        for kind, value in results[folder]["where p goes"].items():
            copying, not_copying = (
                "-" if value[key] is None else f"{value[key]:.2f}" for key in ("log_prob_copying", "log_prob_not")
            )
            print(f"| {folder} | {kind} | {value['fitting']:.3f} ({value['fitting_pieces']:.1f}) "
                  f"| {value['rest_of_block']:.3f} | {value['copies']:.3f} | {copying} | {not_copying} |")  # fmt: skip
    print("\n" + json.dumps({"run": args.run, "encoders": results}))
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


@torch.no_grad()
def without_blocks(encoder, embedder, index, tasks, queries, seed: int = 0, k: int = 7) -> dict[str, float]:
    """Mean log p(y|z,x) per masked wordpiece of `queries` (fixed_masked_queries) from the blocks lacking the span
    among the top k of `index` (the embedder's blocks; own block left out), from one such block drawn at random, and
    from no block."""
    from openrealm.trainers.embedding import embed_queries
    from openrealm.trainers.world.reading_tasks import examples_log_prob

    query_emb = embed_queries(embedder, queries["query_input_ids"], queries["query_attention_mask"])
    top = index.search(query_emb, k + 1)[1].tolist()
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {"retrieved": [], "random": [], "null": []}
    for i, (block_id, sentence, span) in enumerate(
        zip(queries["block_id"].tolist(), queries["query_text"], queries["span"].tolist(), strict=True)
    ):
        query = tasks.query(block_id, sentence, tuple(span))
        without = set(query.blocks["without"])
        ranked = [b for b in top[i] if b != block_id][:k]
        rows["retrieved"] += [tasks.example(query, b) for b in ranked if b in without]
        if without:
            rows["random"].append(tasks.example(query, int(rng.choice(sorted(without)))))
        rows["null"].append(tasks.example(query, None))
    means = {}
    for name, examples in rows.items():
        means[name] = float(examples_log_prob(encoder, examples).mean())
    return {**means, "retrieved_blocks": len(rows["retrieved"])}


MISREAD = -8.0  # log p(y|z,x) of a masked wordpiece below which the encoder copied another name with confidence


@torch.no_grad()
def misreads(encoder, tasks, queries) -> dict[str, dict[str, float]]:
    """Over every (query, block without its span) of `queries`: {"distractors" | "others": {"wordpieces", "mean",
    "median", "misread_share"}}, per masked wordpiece, log p(y|z,x); misread_share: the share below MISREAD."""
    from openrealm.trainers.world.reading_tasks import examples_log_prob

    rows: dict[str, list] = {"distractors": [], "others": []}
    for block_id, sentence, span in zip(
        queries["block_id"].tolist(), queries["query_text"], queries["span"].tolist(), strict=True
    ):
        query = tasks.query(block_id, sentence, tuple(span))
        distractors = set(query.distractors)
        for block in query.blocks["without"]:
            rows["distractors" if block in distractors else "others"].append(tasks.example(query, block))
    out = {}
    for name, examples in rows.items():
        if not examples:
            continue
        values = examples_log_prob(encoder, examples)
        out[name] = {
            "wordpieces": len(values),
            "mean": float(values.mean()),
            "median": float(values.median()),
            "misread_share": float((values < MISREAD).float().mean()),
        }
    return out


@torch.no_grad()
def where_p_goes(encoder, tasks, examples: dict[str, list]) -> dict[str, dict[str, float]]:
    """Over the probe's `examples` ({kind: [example, ...]}, probe_examples), per masked wordpiece at place i of a span
    of n wordpieces: {kind: {"fitting": mean p on the i-th wordpieces of the salient spans of n wordpieces the block
    holds (the corpus's spans, read off its span offsets), "fitting_pieces": how many such wordpieces, "rest_of_block":
    mean p on the block's other wordpieces, "copies": the share with p on the block > 0.5, "log_prob_copying" /
    "log_prob_not": mean log p(y|z,x) on those and on the others (None where none)}}."""
    from openrealm.trainers.world.reading_tasks import collate, masked_vocab_log_prob

    tokenizer = tasks.tokenizer
    spans: dict[int, set[tuple[int, ...]]] = {}  # wordpiece count -> the corpus's salient spans of that length
    for row in tasks.blocks:
        for start, end in zip(row["span_char_starts"], row["span_char_ends"]):
            ids = tuple(tokenizer(row["text"][start:end], add_special_tokens=False)["input_ids"])
            spans.setdefault(len(ids), set()).add(ids)
    special = set(tokenizer.all_special_ids)
    out = {}
    for kind, rows in examples.items():
        if not rows:  # a kind the world gives no query (as reading_probe skips it)
            continue
        log_prob = torch.cat(  # [N, V] over the kind's masked wordpieces, in order
            [masked_vocab_log_prob(encoder, collate(rows[i : i + 64])).cpu() for i in range(0, len(rows), 64)]
        )
        fitting, pieces, rest, copying, not_copying = [], [], [], [], []
        row = 0
        for ids, labels, types in rows:
            body = [piece for piece, type_id in zip(ids, types) if type_id == 1 and piece not in special]
            span = [label for label in labels if label != -100]
            n = len(span)
            held = {tuple(body[j : j + n]) for j in range(len(body) - n + 1)} & spans.get(n, set())
            in_block = sorted(set(body))
            for place, target in enumerate(span):
                p = log_prob[row].exp()
                fit = sorted({name[place] for name in held})
                on_fit = float(p[fit].sum()) if fit else 0.0
                on_block = float(p[in_block].sum()) if in_block else 0.0
                fitting.append(on_fit)
                pieces.append(len(fit))
                rest.append(on_block - on_fit)
                (copying if on_block > 0.5 else not_copying).append(float(log_prob[row, target]))
                row += 1
        count = len(fitting)
        out[kind] = {
            "wordpieces": count,
            "fitting": float(np.mean(fitting)),
            "fitting_pieces": float(np.mean(pieces)),
            "rest_of_block": float(np.mean(rest)),
            "copies": len(copying) / count,
            "log_prob_copying": float(np.mean(copying)) if copying else None,
            "log_prob_not": float(np.mean(not_copying)) if not_copying else None,
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
