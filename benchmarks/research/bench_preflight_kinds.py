"""The pre-flight's reader utility taken apart by what each holding candidate is to the query, and its ceiling for a
reader that copies every stating block perfectly.

    python benchmarks/research/bench_preflight_kinds.py --run RUN --encoders NAME=FOLDER [NAME=FOLDER ...]
        --seed S [--embedder RUN/ict] [--num-candidates 8]

RUN holds a quickstart's world/ and corpus/ (and ict/, the default --embedder). The queries and candidates are those
of `openrealm train pretrain --corpus RUN/corpus --embedder EMBEDDER --encoder FOLDER --seed S --num-candidates K
--preflight` (trainers/pretraining/preflight.py: the held-out masked queries; per query the null document, one block
holding the masked span, K - 2 random blocks without it), and `retrieval_utility` / `_best_match` are recomputed the
same way (checked against `reader_utility` itself). The world's facts (trainers/world/reading_tasks.py,
`ReadingTasks`) then say what each holding candidate is to its query: *stating* (states the masked fact: a reader
copies from it), *ambiguous* (states it beside another value), *mentioning* (holds the masked words without stating
the fact); a candidate that holds a masked wordpiece but not the whole span counts as *a wordpiece only*.

Printed per encoder and choice of holder (a random one, as `retrieval_utility`; the best match, as `_best_match`):
the utility, the holders by kind (share of the masked wordpieces' holding columns, mean log p), the mean log p from
the candidates lacking the wordpiece, the *ceiling* (the utility with log p 0 wherever the candidate states the fact,
everything else as the encoder gives it) and the mean log p the holders would need for 4 nats (§1 of the reader's
issue; benchmarks/research/reader_that_reads.md, "What 4 nats of the pre-flight ask of a reader").

Then the same measures for a family of *ideal* readers that know what the world's text allows and no fact: the kind of
the masked span (person, city, organization, river, mountain, region, date, year: `span_kinds`) and its wordpiece
count; from a stating block they copy it (p = 1); from any other block they put a share q of the probability on the
names of that kind and length the block holds, uniformly, and 1 - q on the others; from the null document, uniform
over the kind. Each masked wordpiece's p is the mass of the names that have it at its place. q trades the two things
the pre-flight measures: the utility (holders against the rest) and `null_pull` (no block against a block without the
span), printed for each q.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import torch

QS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # the ideal readers' share of p on the names a block holds
KINDS = ("stating", "ambiguous", "mentioning", "wordpiece")  # of a holding candidate; "wordpiece": a piece only
TARGET = 4.0  # nats: §1's pre-flight utility


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="a quickstart run: world/, corpus/ (and ict/)")
    parser.add_argument("--encoders", nargs="+", required=True, help="NAME=FOLDER: the readers to score")
    parser.add_argument("--embedder", type=Path, default=None, help="default: RUN/ict")
    parser.add_argument("--seed", type=int, required=True, help="the pre-flight's --seed")
    parser.add_argument("--num-candidates", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining import RealmPretrainingExamples, RealmPretrainingModel
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries
    from openrealm.trainers.pretraining.preflight import (
        BATCH_SIZE,
        QUERIES_PER_BLOCK,
        default_hold_out,
        likeliest_stating_blocks,
        reader_utility,
    )
    from openrealm.trainers.pretraining.preparation import fit_sequence_lengths, held_out_blocks
    from openrealm.trainers.towers import load_embedder, load_encoder
    from openrealm.trainers.world.reading_tasks import ReadingTasks
    from openrealm.trainers.world.synthetic_world import World

    corpus, embedder_folder = args.run / "corpus", args.embedder or args.run / "ict"
    tokenizer, blocks = AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    tasks = ReadingTasks(World.read(args.run / "world"), blocks, tokenizer)
    by_span = {(t.block_id, t.sentence.strip(), t.sentence[slice(*t.span)]): t for t in tasks.queries}
    embedder = load_embedder(str(embedder_folder), tokenizer, seed=args.seed).eval()
    index = exact_index(embedder, blocks, tokenizer)
    results = {}
    for name, folder in (item.split("=", 1) for item in args.encoders):
        encoder = load_encoder(folder, tokenizer, seed=args.seed).eval()
        run = argparse.Namespace(corpus=str(corpus), seed=args.seed, embedder=str(embedder_folder), encoder=folder)
        fit_sequence_lengths(run, embedder, encoder, tokenizer)
        hold_out = default_hold_out(blocks)
        queries = fixed_masked_queries(
            tokenizer, blocks, num_queries=hold_out, seed=args.seed, query_seq_len=run.query_seq_len,
            block_ids=held_out_blocks(blocks, run, hold_out), queries_per_block=QUERIES_PER_BLOCK,
        )  # fmt: skip
        examples = RealmPretrainingExamples(
            tokenizer, blocks, embedder, index, num_candidates=args.num_candidates,
            candidate_seq_len=run.candidate_seq_len, joint_seq_len=run.joint_seq_len,
        )  # fmt: skip
        model = RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0, oracle_reader_weight=0.0).eval()
        kinds = []  # per query: block id -> its kind for the query (stating, ambiguous, mentioning, without)
        for block, sentence, span_text in zip(
            queries["block_id"].tolist(), queries["query_text"], queries["span_text"]
        ):
            task = by_span.get((block, sentence.strip(), span_text))
            kinds.append({b: kind for kind, ids in task.blocks.items() for b in ids} if task else {})
        best = likeliest_stating_blocks(blocks, tokenizer, queries)
        for family, blind in (("ideal", False), ("ideal, kind-blind", True)):
            if family in results:
                continue
            pools = span_pools(tasks.world, tokenizer, blind)
            texts = list(blocks["text"])
            results[family] = {
                choice: ideal_readers(examples, queries, args.seed, answer_blocks, kinds, pools, texts, tokenizer)
                for choice, answer_blocks in (("random holder", None), ("best match", best))
            }
        results[name] = {}
        for choice, answer_blocks, suffix in (("random holder", None, ""), ("best match", best, "_best_match")):
            expected = reader_utility(model, examples, queries, args.seed, answer_blocks, suffix)
            numbers = taken_apart(model, examples, queries, args.seed, answer_blocks, kinds, batch=BATCH_SIZE)
            numbers |= {"num_queries": len(queries["uid"]), "unknown_queries": sum(not k for k in kinds)}
            if abs(numbers["utility"] - expected[f"retrieval_utility{suffix}"]) > 1e-4:
                raise AssertionError(f"{name}, {choice}: {numbers['utility']} != reader_utility's {expected}")
            results[name][choice] = numbers
            print_row(name, choice, numbers)
    print(
        "\n| ideal reader | q | utility, random holder | null_pull | log p, null | log p, mentioning or ambiguous "
        "holder | utility, best match |"
    )
    print("|---|---|---|---|---|---|---|")
    for family in ("ideal", "ideal, kind-blind"):
        for q in QS:
            random_holder, best_match = results[family]["random holder"][q], results[family]["best match"][q]
            print(
                f"| {family} | {q} | {random_holder['utility']:.2f} | {random_holder['null_pull']:.2f} | "
                f"{random_holder['log_prob_null']:.2f} | {random_holder['log_prob_mentioning']:.2f} | "
                f"{best_match['utility']:.2f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


@torch.no_grad()
def taken_apart(model, examples, queries, seed: int, answer_blocks, kinds: list[dict], batch: int) -> dict:
    """reader_utility's sums, the holding columns split by kind, and the same utility with log p 0 wherever the
    candidate states the query's fact (the ceiling)."""
    from openrealm.trainers.pretraining.evaluation import query_rows
    from openrealm.trainers.pretraining.examples import batch_on
    from openrealm.trainers.pretraining.preflight import utility_candidates

    device = next(model.parameters()).device
    kept, candidates = utility_candidates(queries, len(examples.blocks), examples.num_candidates, seed, answer_blocks)
    sums, ceiling, other, tokens = 0.0, 0.0, 0.0, 0
    by_kind = defaultdict(lambda: [0.0, 0.0])  # kind -> [sum of log p, count] over holding columns
    for start in range(0, len(kept), batch):
        rows = kept[start : start + batch]
        chosen = candidates[start : start + batch]
        inputs = examples.with_candidates(query_rows(queries, rows), chosen)
        log_prob = model(**batch_on(inputs, device)).token_log_prob.cpu()  # [N, K]
        token_rows = (inputs["labels"] != -100).nonzero(as_tuple=True)[0]
        holds = inputs["holds_answer"][token_rows]  # [N, K]
        for lp, hold, row in zip(log_prob, holds, token_rows.tolist()):
            if not bool(hold.any()):
                continue
            kind_of = kinds[rows[row]]
            column_kinds = [
                "null" if k == 0 else kind_of.get(chosen[row][k], "unknown") for k in range(len(chosen[row]))
            ]
            stating = torch.tensor([kind == "stating" for kind in column_kinds])
            lifted = torch.where(stating, torch.zeros_like(lp), lp)
            mean_other = float((lp * ~hold).sum() / (~hold).sum())
            sums += float((lp * hold).sum() / hold.sum()) - mean_other
            ceiling += float((lifted * hold).sum() / hold.sum()) - float((lifted * ~hold).sum() / (~hold).sum())
            other += mean_other
            tokens += 1
            for k in hold.nonzero(as_tuple=True)[0].tolist():
                kind = column_kinds[k]
                kind = "wordpiece" if kind == "without" else kind
                by_kind[kind][0] += float(lp[k])
                by_kind[kind][1] += 1
    columns = sum(count for _, count in by_kind.values())
    return {
        "utility": sums / tokens,
        "ceiling": ceiling / tokens,
        "log_prob_other": other / tokens,
        "holder_log_prob_needed": other / tokens + TARGET,
        "tokens": tokens,
        "holders": {
            kind: {"share": count / columns, "log_prob": total / count} for kind, (total, count) in by_kind.items()
        },
    }


YEAR = re.compile(r"[12]\d{3}")


def span_kinds(world) -> dict[str, str]:
    """Every salient span text of the world -> its kind: the entity's kind for a name, else "year" or "date"."""
    kinds = {entity["name"]: entity["kind"] for entity in world.entities}
    for _, _, sentence, spans in world.sentences():
        for start, end, _ in spans:
            text = sentence[start:end]
            if text not in kinds:
                kinds[text] = "year" if YEAR.fullmatch(text) else "date"
    return kinds


def span_pools(world, tokenizer, blind: bool = False) -> dict[str, dict[tuple[int, ...], str]]:
    """kind -> {wordpieces: text} of every salient span of that kind, and "_kind_of" -> the text's kind; blind: one
    kind for every span (a reader that does not know which kind of name the sentence asks for)."""
    pools: dict[str, dict] = defaultdict(dict)
    kinds = {text: "any" if blind else kind for text, kind in span_kinds(world).items()}
    for text, kind in kinds.items():
        pools[kind][tuple(tokenizer(text, add_special_tokens=False)["input_ids"])] = text
    pools["_kind_of"] = kinds
    return pools


def ideal_log_prob(span: tuple[int, ...], pool: list[tuple[int, ...]], held: set, q: float | None) -> list[float]:
    """Per wordpiece of `span`: log of the mass of the pool's names (of span's length) with that wordpiece there,
    q spread over those in `held` and 1 - q over the rest (q None: uniform, the null document)."""
    names = [name for name in pool if len(name) == len(span)]
    inside = [name for name in names if name in held]
    outside = [name for name in names if name not in held]
    if q is None or not inside or not outside:
        weights = {name: 1.0 / len(names) for name in names}
    else:
        weights = {name: q / len(inside) for name in inside} | {name: (1 - q) / len(outside) for name in outside}
    return [math.log(sum(w for name, w in weights.items() if name[i] == piece)) for i, piece in enumerate(span)]


def ideal_readers(examples, queries, seed: int, answer_blocks, kinds, pools, texts, tokenizer) -> dict:
    """{q: {"utility", "null_pull"}} of the ideal readers (module docstring) on the pre-flight's candidates."""
    from openrealm.trainers.pretraining.evaluation import query_rows
    from openrealm.trainers.pretraining.preflight import utility_candidates

    kept, candidates = utility_candidates(queries, len(examples.blocks), examples.num_candidates, seed, answer_blocks)
    holds_rows = []  # per kept query: [K] whether each candidate's body holds the masked span (holds_masked_span)
    for start in range(0, len(kept), 16):
        inputs = examples.with_candidates(
            query_rows(queries, kept[start : start + 16]), candidates[start : start + 16]
        )
        holds_rows += inputs["holds_answer"].tolist()
    out = {}
    for q in QS:
        utility, pull, tokens, pulls, null = 0.0, 0.0, 0, 0, 0.0
        mentioning = [0.0, 0]  # log p summed over the columns that hold the span without stating the fact, count
        for row, chosen, hold in zip(kept, candidates, holds_rows):
            text = queries["span_text"][row]
            if not any(hold):
                continue
            kind = pools["_kind_of"].get(text)
            if kind is None:
                continue
            span = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
            pool = list(pools[kind])
            columns = []  # per candidate: per wordpiece log p
            for k, block in enumerate(chosen):
                if k == 0:
                    columns.append(ideal_log_prob(span, pool, set(), None))
                elif kinds[row].get(block) == "stating":
                    columns.append([0.0] * len(span))
                else:
                    held = {name for name in pool if pools[kind][name] in texts[block]}
                    columns.append(ideal_log_prob(span, pool, held, q))
            for i in range(len(span)):
                lp = [column[i] for column in columns]
                answer = [v for v, h in zip(lp, hold) if h]
                rest = [v for v, h in zip(lp, hold) if not h]
                utility += sum(answer) / len(answer) - sum(rest) / len(rest)
                null += lp[0]
                tokens += 1
                for k, (v, h) in enumerate(zip(lp, hold)):
                    if h and kinds[row].get(chosen[k]) in ("mentioning", "ambiguous"):
                        mentioning[0] += v
                        mentioning[1] += 1
                without = [v for v, h in zip(lp[1:], hold[1:]) if not h]
                if without:
                    pull += lp[0] - sum(without) / len(without)
                    pulls += 1
        out[q] = {
            "utility": utility / tokens,
            "null_pull": pull / pulls,
            "log_prob_null": null / tokens,
            "log_prob_mentioning": mentioning[0] / max(1, mentioning[1]),
        }
    return out


def print_row(name: str, choice: str, numbers: dict) -> None:
    holders = numbers["holders"]
    parts = [
        f"{kind} {holders[kind]['share']:.2f} ({holders[kind]['log_prob']:.2f})" for kind in KINDS if kind in holders
    ] + [f"{kind} {v['share']:.2f} ({v['log_prob']:.2f})" for kind, v in holders.items() if kind not in KINDS]
    print(
        f"| {name} | {choice} | {numbers['utility']:.2f} | {', '.join(parts)} | {numbers['log_prob_other']:.2f} | "
        f"{numbers['ceiling']:.2f} | {numbers['holder_log_prob_needed']:.2f} | {numbers['num_queries']} "
        f"({numbers['unknown_queries']} not the world's) |",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
