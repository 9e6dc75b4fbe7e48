"""Pre-flight check: can this REALM pre-training run train its retriever? (`openrealm train pretrain --preflight`)

REALM trains the retriever only through the marginal likelihood: the gradient on a candidate's score is
p(z|x,y) - p(z|x) (paper section 2.3). On the run's own corpus, towers and options this measures whether salient spans
are stated in other blocks (`spans_stated_elsewhere`), whether the starting index retrieves such a block
(`answer_in_candidates_at_start`), whether p(z|x) is near one-hot (`start_entropy`), whether the encoder reads
(`retrieval_utility`: not the logged metric of Google's model.py; `retrieval_utility_best_match` from the block
likeliest to state the fact) and whether a short oracle-reader run of this job trains the retriever (`oracle_gain`),
and writes OUTPUT/preflight.json with a verdict and advice. The measures, their thresholds and the verdicts:
docs/diagnostics.md ("Pre-flight check").
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from openrealm import RealmEmbedder
from openrealm.file_utils import check_apart, write_text_atomic
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.masking import pieces_inside
from openrealm.trainers.embedding import exact_index
from openrealm.trainers.pretraining import (
    NULL_BLOCK_ID,
    RealmPretrainingExamples,
    RealmPretrainingModel,
    continuation_pieces,
)
from openrealm.trainers.pretraining.evaluation import (
    fixed_masked_queries,
    query_rows,
    recall_at_k,
)
from openrealm.trainers.pretraining.examples import batch_on
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_embedder, load_encoder

REPORT_NAME = "preflight.json"
FOLDER = "preflight"  # OUTPUT/preflight/: index/ (the start's) and oracle/ (the oracle run's output)
MAX_SPANS = 5000  # salient spans drawn for spans_stated_elsewhere
MAX_HELD_OUT_BLOCKS = 200  # default held-out query blocks: a fifth of the blocks with a span, at most this many
QUERIES_PER_BLOCK = 2
RECALL_K = 5
ORACLE_REFRESHES = 10  # the oracle run refreshes its index this many times (or every --refresh-every, if more often)
BATCH_SIZE = 16  # queries per forward pass of the measurements


@dataclass(frozen=True)
class PreflightThresholds:
    """Where each number of the pre-flight check turns into a failed check and advice; the only place they are set.

    - min_spans_stated_elsewhere (0.3): a masked span no other block states gives the retriever no answer block to
      move towards, only noise; below 0.3, over two thirds of the queries train nothing but the encoder. A failed
      check means "no".
    - min_answer_in_candidates (0.1): REALM's gradient reaches an answer block only when it is among the K candidates;
      below one query in ten, the retriever learns slowly from the start, whatever the reader (advice only: the
      oracle run measures whether it still learns).
    - chance_factor (2): a starting index that finds answer blocks less than twice as often as K - 1 random blocks
      would is no better than an untrained one: warm-start it (ICT).
    - min_entropy_share (0.1): p(z|x) with an entropy below a tenth of log K is nearly one-hot; p(z|x,y) - p(z|x) is
      then near 0 for every candidate, so the retriever's gradient vanishes (advice only, as above).
    - min_reader_utility (3 nats per masked wordpiece): a reader that copies a span from a block gains several nats
      over guessing it among thousands of wordpieces. Reading a little is not enough: in the dose-response of
      benchmarks/research/oracle_reader_control.md#the-control-on-the-quickstarts-world-oracle-learned-reader-and-the-mixture-1-3
      encoders that gained 1.3-1.4 nats made the retriever worse, while the same encoders mixed with 5% of the oracle
      (4.2-5.4 nats) trained it; 3 lies between the two and is not measured more finely. A failed check means "reader
      first".
    - min_oracle_gain (0.05): held-out recall@5 raised by less than this with a perfect reader is within the noise of
      a few hundred queries; then REALM's path does not train this retriever at these settings. A failed check means
      "no".
    """

    min_spans_stated_elsewhere: float = 0.3
    min_answer_in_candidates: float = 0.1
    chance_factor: float = 2.0
    min_entropy_share: float = 0.1
    min_reader_utility: float = 3.0
    min_oracle_gain: float = 0.05


THRESHOLDS = PreflightThresholds()
VERDICT_CHECKS = ("spans_stated_elsewhere", "retrieval_utility", "oracle_gain")  # what "yes" needs (judge)
VERDICTS = {  # verdict -> what the printed report says of it
    "yes": "REALM pre-training can train this retriever",
    "reader first": "REALM pre-training can train this retriever once the encoder reads",
    "no": "REALM pre-training cannot train this retriever as set up",
    "unknown": "not every check could be measured",
}


# ---------------------------------------------------------------------------------------------------------------------
# (a) salient spans stated in another block
# ---------------------------------------------------------------------------------------------------------------------


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """A list column (Arrow) -> (its values flattened, each row's length)."""
    import pyarrow.compute as pc

    values = pc.list_flatten(column).to_numpy()
    return np.asarray(values, dtype=np.int64), np.asarray(pc.list_value_length(column).to_numpy(), dtype=np.int64)


def span_wordpieces(blocks, tokenizer, block_ids, starts, ends) -> list[list[int]]:
    """The wordpieces each salient span masks (those lying wholly inside it, `pieces_inside`), one list per span
    (block_ids, starts, ends: one per span, char offsets in the block's text); each block's text is encoded once."""
    wanted = sorted(set(int(b) for b in block_ids))
    texts = dict(zip(wanted, blocks.select(wanted)["text"]))
    encoded = {}
    pieces = []
    for block, start, end in zip(block_ids, starts, ends):
        if block not in encoded:
            encoded[block] = tokenizer(
                texts[block], add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
        encoding = encoded[block]
        inside = pieces_inside(encoding["offset_mapping"], int(start), int(end))
        pieces.append([encoding["input_ids"][i] for i in inside])
    return pieces


def blocks_stating(blocks, tokenizer, spans: list[list[int]]) -> list[set[int]]:
    """For each span (a list of wordpiece ids), the blocks whose body (`token_ids`) holds it as whole wordpieces: the
    run of ids not followed by a "##" piece (`holds_masked_span`'s rule; a span holding [UNK] is never held).

    One pass per span length present: every window of that length of the concatenated bodies is hashed (a random
    linear hash mod 2^64), the windows whose hash is a span's are compared exactly."""
    tokens, lengths = _flat(blocks.with_format("arrow")["token_ids"])
    owner = np.repeat(np.arange(len(lengths)), lengths)
    continuation = continuation_pieces(tokenizer).numpy()
    continues = continuation[np.clip(tokens, 0, len(continuation) - 1)]
    # ends_inside[i]: the next wordpiece continues the word of wordpiece i (within the same block)
    ends_inside = np.zeros(len(tokens), dtype=bool)
    ends_inside[:-1] = continues[1:] & (owner[1:] == owner[:-1])
    holders: list[set[int]] = [set() for _ in spans]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, span in enumerate(spans):
        if span and tokenizer.unk_token_id not in span and len(span) <= len(tokens):
            by_length[len(span)].append(i)
    rng = np.random.default_rng(0)
    for n, members in by_length.items():
        coefficients = rng.integers(1, 2**63, size=n, dtype=np.uint64) | np.uint64(1)
        count = len(tokens) - n + 1
        window_hash = np.zeros(count, dtype=np.uint64)
        for j in range(n):
            window_hash += tokens[j : j + count].astype(np.uint64) * coefficients[j]
        span_ids = np.asarray([spans[i] for i in members], dtype=np.int64).astype(np.uint64)
        span_hash = (span_ids * coefficients).sum(1)
        whole = (owner[:count] == owner[n - 1 :]) & ~ends_inside[n - 1 :]
        found: dict[tuple[int, ...], set[int]] = defaultdict(set)
        for position in np.flatnonzero(np.isin(window_hash, span_hash) & whole):
            found[tuple(tokens[position : position + n].tolist())].add(int(owner[position]))
        for i in members:
            holders[i] = found.get(tuple(spans[i]), set())
    return holders


def spans_stated_elsewhere(blocks, tokenizer, max_spans: int = MAX_SPANS, seed: int = 0) -> dict[str, Any]:
    """(a): of at most max_spans salient spans of the corpus (drawn with `seed`; all when fewer), the share stated as
    whole wordpieces in a block other than their own. Spans that cover no whole wordpiece (which masking skips) are
    left out of the share and counted. Returns `spans_stated_elsewhere` (None without spans) and `span_sample`."""
    columns = blocks.with_format("arrow")
    starts, per_block = _flat(columns["span_char_starts"])
    ends, _ = _flat(columns["span_char_ends"])
    span_block = np.repeat(np.arange(len(per_block)), per_block)
    chosen = np.arange(len(starts))
    if len(chosen) > max_spans:
        chosen = np.sort(np.random.default_rng(seed).choice(len(starts), max_spans, replace=False))
    pieces = span_wordpieces(blocks, tokenizer, span_block[chosen].tolist(), starts[chosen], ends[chosen])
    holders = blocks_stating(blocks, tokenizer, pieces)
    counted = [bool(holder - {int(own)}) for own, holder, span in zip(span_block[chosen], holders, pieces) if span]
    return {
        "spans_stated_elsewhere": float(np.mean(counted)) if counted else None,
        "span_sample": {
            "num_spans": len(starts),
            "num_sampled": len(chosen),
            "max_sampled": max_spans,
            "seed": seed,
            "num_without_whole_wordpiece": len(chosen) - len(counted),
        },
    }


# ---------------------------------------------------------------------------------------------------------------------
# (b), (c), (d) at the start
# ---------------------------------------------------------------------------------------------------------------------


def chance_of_answer(num_answers: int, num_blocks: int, num_candidates: int) -> float:
    """The probability that K - 1 blocks drawn at random among the num_blocks - 1 others (the null document takes
    the K-th place) include one of num_answers answer blocks."""
    others = num_blocks - 1
    miss = 1.0
    for j in range(min(num_candidates - 1, others)):
        miss *= max(others - num_answers - j, 0) / (others - j)
    return 1.0 - miss


@torch.no_grad()
def retrieval_at_start(model: RealmPretrainingModel, examples: RealmPretrainingExamples, queries) -> dict[str, Any]:
    """(b), (c): over the queries, the share whose K candidates from the index hold the masked span, and the mean
    entropy of p(z|x) over them. model: with oracle_reader_weight 1 (no encoder pass is needed here)."""
    device = next(model.parameters()).device
    found = entropy = count = 0.0
    for start in range(0, len(queries["uid"]), BATCH_SIZE):
        batch = examples(query_rows(queries, slice(start, start + BATCH_SIZE)))
        if not batch["uid"]:
            continue
        output = model(**batch_on(batch, device))
        size = len(batch["uid"])
        found += float(output.answer_in_candidates) * size
        entropy += float(output.retrieval_entropy) * size
        count += size
    blocks = len(examples.blocks)
    chance = [chance_of_answer(len(ids), blocks, examples.num_candidates) for ids in queries["answer_block_ids"]]
    return {
        "answer_in_candidates_at_start": found / count if count else None,
        "answer_in_candidates_by_chance": float(np.mean(chance)),
        "start_entropy": entropy / count if count else None,
        "log_num_candidates": math.log(examples.num_candidates),
        "num_start_queries": int(count),
    }


def likeliest_stating_blocks(blocks, tokenizer, queries) -> list[int | None]:
    """Per query: of the blocks holding its masked span (`answer_block_ids`), the one whose title and body share the
    most of the query's other wordpieces, each weighted by its BM25 idf over the corpus (ties: the lowest id); None
    when no other block holds the span.

    A block that states the masked fact names the sentence's other entities too; one that merely mentions the span
    (a city named in a stranger's biography) mostly does not, and a reader that reads rightly does not copy from it.
    Read from the corpus and the query alone, so it needs no facts and favours no reader."""
    holders = sorted({int(b) for answers in queries["answer_block_ids"] for b in answers})
    if not holders:
        return [None] * len(queries["answer_block_ids"])
    skip = torch.tensor(tokenizer.all_special_ids)
    words = [set(row[~torch.isin(row, skip)].tolist()) for row in queries["query_input_ids"]]
    vocab = np.asarray(sorted(set().union(*words)), dtype=np.int64)
    columns = blocks.with_format("arrow")
    size = max(len(tokenizer), int(vocab.max(initial=0)) + 1)
    pairs = []
    for column in ("title_ids", "token_ids"):
        tokens, lengths = _flat(columns[column])
        owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        keep = np.isin(tokens, vocab)
        pairs.append(owner[keep] * size + tokens[keep])
    pairs = np.unique(np.concatenate(pairs))  # (block, wordpiece) present, each once
    frequency = np.bincount(pairs % size, minlength=size)
    idf = np.log1p((len(blocks) - frequency + 0.5) / (frequency + 0.5))
    held = pairs[np.isin(pairs // size, np.asarray(holders, dtype=np.int64))]
    present: dict[int, set[int]] = defaultdict(set)
    for block, piece in zip((held // size).tolist(), (held % size).tolist()):
        present[block].add(piece)
    chosen: list[int | None] = []
    for query_words, answers in zip(words, queries["answer_block_ids"]):
        scores = [(-sum(idf[w] for w in query_words & present[int(b)]), int(b)) for b in answers]
        chosen.append(min(scores)[1] if scores else None)
    return chosen


def utility_candidates(
    queries, num_blocks: int, num_candidates: int, seed: int, answer_blocks: list[int | None] | None = None
) -> tuple[list[int], list[list[int]]]:
    """(the queries with an answer block, their K candidates): the null document, one answer block (answer_blocks'
    for the query, or drawn at random among its answer blocks when None) and K - 2 random blocks that are neither
    the query's own nor an answer block. The random draws are the same whatever answer_blocks is."""
    rng = np.random.default_rng(seed)
    kept, candidates = [], []
    for row, (own, answers) in enumerate(zip(queries["block_id"].tolist(), queries["answer_block_ids"])):
        excluded = {own, *answers}
        if not answers or num_blocks - len(excluded) < num_candidates - 2:
            continue
        others: list[int] = []
        while len(others) < num_candidates - 2:
            block = int(rng.integers(num_blocks))
            if block not in excluded and block not in others:
                others.append(block)
        drawn = int(rng.choice(answers))
        answer = drawn if answer_blocks is None else answer_blocks[row]
        kept.append(row)
        candidates.append([NULL_BLOCK_ID, answer, *others])
    return kept, candidates


@torch.no_grad()
def reader_utility(
    model: RealmPretrainingModel,
    examples: RealmPretrainingExamples,
    queries,
    seed: int,
    answer_blocks: list[int | None] | None = None,
    suffix: str = "",
) -> dict:
    """(d): the encoder's mean log p(y|z,x) per masked wordpiece from the candidates that hold the masked span minus
    from the others (null document included), over the queries given a block holding their span among K
    `utility_candidates` (answer_blocks: which one per query; None: one drawn at random). model:
    RealmPretrainingModel's reader (the encoder; mixed with the oracle when its oracle_reader_weight is above 0), in
    eval mode. Also the mean log p from the null document and from the K - 2 random blocks lacking the span, and
    `null_pull`, the first minus the second: a reader that predicts the span better from no block than from one
    lacking it pays the retriever to move towards the null document for every query whose candidates miss the
    span (docs/diagnostics.md; only when answer_blocks is None). The keys end with suffix."""
    device = next(model.parameters()).device
    kept, candidates = utility_candidates(queries, len(examples.blocks), examples.num_candidates, seed, answer_blocks)
    sums = {"answer": 0.0, "other": 0.0, "null": 0.0, "without": 0.0, "tokens": 0, "without_tokens": 0, "queries": 0}
    for start in range(0, len(kept), BATCH_SIZE):
        rows = kept[start : start + BATCH_SIZE]
        batch = examples.with_candidates(query_rows(queries, rows), candidates[start : start + BATCH_SIZE])
        output = model(**batch_on(batch, device))
        token_rows = (batch["labels"] != -100).nonzero(as_tuple=True)[0]
        holds = batch["holds_answer"][token_rows].to(device)  # [N, K]
        usable = holds.any(-1)
        if not bool(usable.any()):
            continue
        log_prob, holds = output.token_log_prob[usable], holds[usable]
        sums["answer"] += float(((log_prob * holds).sum(-1) / holds.sum(-1)).sum())
        sums["other"] += float(((log_prob * ~holds).sum(-1) / (~holds).sum(-1)).sum())
        # column 0 is the null document; the other blocks lacking the span are the K - 2 random ones
        sums["null"] += float(log_prob[:, 0].sum())
        without = ~holds[:, 1:]
        has_without = without.any(-1)
        sums["without"] += float(
            ((log_prob[:, 1:] * without).sum(-1)[has_without] / without.sum(-1)[has_without]).sum()
        )
        sums["without_tokens"] += int(has_without.sum())
        sums["tokens"] += int(usable.sum())
        sums["queries"] += int(batch["holds_answer"].any(-1).sum())
    tokens, without_tokens = sums["tokens"], sums["without_tokens"]
    null = sums["null"] / tokens if tokens else None
    without = sums["without"] / without_tokens if without_tokens else None
    report = {
        f"retrieval_utility{suffix}": (sums["answer"] - sums["other"]) / tokens if tokens else None,
        f"reader_log_prob_answer{suffix}": sums["answer"] / tokens if tokens else None,
        f"reader_log_prob_other{suffix}": sums["other"] / tokens if tokens else None,
        f"num_utility_queries{suffix}": sums["queries"],
    }
    if answer_blocks is None:  # the blocks lacking the span are the same draws whichever answer block is chosen
        report["reader_log_prob_null"], report["reader_log_prob_without"] = null, without
        report["null_pull"] = null - without if null is not None and without is not None else None
    return report


# ---------------------------------------------------------------------------------------------------------------------
# (4) the oracle run
# ---------------------------------------------------------------------------------------------------------------------


def oracle_args(args: argparse.Namespace, index: Path, output: Path, hold_out: int) -> argparse.Namespace:
    """The run's options for `train pretrain`'s oracle control: --oracle-reader-weight 1, --hold-out-queries N,
    --preflight-steps steps with the index refreshed (sync) ORACLE_REFRESHES times or every --refresh-every steps if
    more often, from the start's index; no checkpoints, no push."""
    steps = args.preflight_steps
    oracle = copy.copy(args)
    oracle.preflight = False
    oracle.oracle_reader_weight = 1.0
    oracle.hold_out_queries = hold_out
    oracle.max_steps = steps
    oracle.refresh_mode, oracle.refresh_lag = "sync", None
    oracle.refresh_every = min(args.refresh_every, max(1, steps // ORACLE_REFRESHES))
    oracle.output, oracle.index, oracle.index_root = str(output), str(index), None
    oracle.overwrite, oracle.resume_from_checkpoint, oracle.save_steps, oracle.push_to_hub = True, None, None, None
    oracle.logging_steps = steps
    return oracle


def oracle_recall(oracle: argparse.Namespace, tokenizer, blocks, queries) -> float:
    """Run the oracle control (`oracle_args`, through trainers/jobs/train_pretrain.py's run) and return the held-out
    recall@5 of the embedder it saved, over a fresh exact index of every block."""
    from openrealm.trainers.cli import JOBS, run_job

    run_job(JOBS[("train", "pretrain")][0], oracle)
    embedder = RealmEmbedder.from_pretrained(Path(oracle.output) / "embedder").eval()
    embedder.to("cuda" if torch.cuda.is_available() else "cpu")
    return recall_at_k(embedder, exact_index(embedder, blocks, tokenizer), queries, RECALL_K)


# ---------------------------------------------------------------------------------------------------------------------
# (5) verdict and advice
# ---------------------------------------------------------------------------------------------------------------------


def judge(report: dict[str, Any], thresholds: PreflightThresholds = THRESHOLDS) -> dict[str, Any]:
    """`checks` (each True, False, or None where it could not be measured), `verdict`, `can_train` and `advice` of a
    report holding the measured numbers. "no": spans not stated elsewhere, or no oracle gain (nothing the reader does
    helps then); "reader first": otherwise, when the encoder does not read; "yes": the VERDICT_CHECKS all pass;
    "unknown": one of them could not be measured (no oracle run, no span annotations, no held-out query with an
    answer block). The other checks give advice only: the oracle run shows whether the retriever learns despite
    them."""
    t, advice = thresholds, []
    k = report["num_candidates"]

    def at_least(value, minimum):
        return None if value is None else bool(value >= minimum)

    spans = report["spans_stated_elsewhere"]
    found, chance = report["answer_in_candidates_at_start"], report["answer_in_candidates_by_chance"]
    entropy, utility, gain = report["start_entropy"], report["retrieval_utility"], report["oracle_gain"]
    checks = {
        "spans_stated_elsewhere": at_least(spans, t.min_spans_stated_elsewhere),
        "answer_in_candidates_at_start": at_least(found, t.min_answer_in_candidates),
        "start_entropy": at_least(entropy, t.min_entropy_share * report["log_num_candidates"]),
        "retrieval_utility": at_least(utility, t.min_reader_utility),
        "oracle_gain": at_least(gain, t.min_oracle_gain),
    }
    if checks["spans_stated_elsewhere"] is False:
        advice.append(
            f"spans_stated_elsewhere {_f(spans)} < {t.min_spans_stated_elsewhere}: few masked spans are stated in "
            "another block, and the retriever learns only from those. Use a corpus in which facts recur (more "
            "articles on the same entities), salient spans that recur (`openrealm corpus build --spans spacy`: named "
            "entities, not dates alone), or shorter blocks (`corpus build --max-block-length`), which put an "
            "article's repeated facts in blocks of their own"
        )
    if checks["answer_in_candidates_at_start"] is False:
        advice.append(
            f"answer_in_candidates_at_start {_f(found)} < {t.min_answer_in_candidates}: few queries have a block "
            f"stating their span among the K = {k} candidates. Raise --num-candidates (e.g. {2 * k})"
        )
    if found is not None and found < t.chance_factor * chance:
        advice.append(
            f"answer_in_candidates_at_start {_f(found)} < {t.chance_factor:g} x chance ({_f(chance)}): the starting "
            "retriever finds answer blocks hardly better than random ones. Warm-start it with `openrealm train ict` "
            "(more ICT steps) and pass its output as --embedder"
        )
    if checks["start_entropy"] is False:
        advice.append(
            f"start_entropy {_f(entropy)} < {t.min_entropy_share:g} x log K ({report['log_num_candidates']:.3f}): "
            "p(z|x) is nearly one-hot, so p(z|x,y) - p(z|x) and the retriever's gradient vanish. Start from a less "
            "trained retriever (an earlier ICT checkpoint), whose scores are less peaked"
        )
    if checks["retrieval_utility"] is False:
        advice.append(
            f"retrieval_utility {_f(utility)} < {t.min_reader_utility} nats: the encoder predicts the masked words "
            "hardly better from a block that states them, and REALM's signal from such a reader has made retrievers "
            "worse, not better (docs/pretraining.md). Warm the reader up first: "
            "`openrealm train mlm --corpus ... --init ENCODER` (BERT's objective; an encoder without a trained MLM "
            "head needs it), then pass its output as --encoder"
        )
        best = report.get("retrieval_utility_best_match")
        if best is not None and best >= t.min_reader_utility:
            advice.append(
                f"retrieval_utility_best_match {_f(best)} >= {t.min_reader_utility} nats: from the block holding the "
                "masked words that shares most of the query's other words (the likeliest to state the fact) the "
                "encoder does read; it gains little from blocks that merely mention the words, which a perfect "
                "reader also pays for, so REALM's signal rewards fewer blocks (docs/diagnostics.md)"
            )
    if checks["oracle_gain"] is False:
        advice.append(
            f"oracle_gain {_f(gain)} < {t.min_oracle_gain}: even a perfect reader did not raise held-out recall@5 in "
            f"{report['oracle_steps']} steps. Raise --num-candidates, the retriever's learning rate "
            "(--embedder-learning-rate, --learning-rate) or --preflight-steps"
        )
    if gain is None:
        advice.append("the oracle run was skipped (--preflight-steps 0): the verdict does not say whether REALM's "
                      "retriever path learns on this corpus")  # fmt: skip
    if report["num_duplicate_blocks"]:
        advice.append(
            f"the corpus holds {report['num_duplicate_blocks']:,} duplicate blocks, whose examples are dropped: "
            "deduplicate it (`openrealm corpus build` without --no-deduplicate)"
        )
    if checks["spans_stated_elsewhere"] is False or checks["oracle_gain"] is False:
        verdict = "no"
    elif checks["retrieval_utility"] is False:
        verdict = "reader first"
    elif all(checks[name] for name in VERDICT_CHECKS):
        verdict = "yes"
    else:
        verdict = "unknown"
    return {"checks": checks, "verdict": verdict, "can_train": verdict == "yes", "advice": advice}


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


# ---------------------------------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------------------------------


def default_hold_out(blocks) -> int:
    """Held-out query blocks when --hold-out-queries is not given: a fifth of the blocks with a salient span, at
    least 1 and at most MAX_HELD_OUT_BLOCKS."""
    from openrealm.trainers.pretraining.preparation import count_blocks_with_spans

    return min(MAX_HELD_OUT_BLOCKS, max(1, count_blocks_with_spans(blocks) // 5))


def check_preflight_args(args: argparse.Namespace) -> None:
    """Bad input of --preflight, before anything loads: a ValueError naming the option."""
    if args.preflight_steps < 0:
        raise ValueError(f"--preflight-steps must be >= 0 (0: no oracle run), got {args.preflight_steps}")
    for flag, value in (
        ("--resume-from-checkpoint", args.resume_from_checkpoint),
        ("--push-to-hub", args.push_to_hub),
    ):
        if value is not None:
            raise ValueError(f"--preflight trains nothing to resume or push: drop {flag}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("--preflight runs in one process: run it without accelerate launch / torchrun")


def run_preflight(args: argparse.Namespace) -> int:
    """`openrealm train pretrain ... --preflight`: measure (a)-(d) and the oracle gain, print a short report and
    write OUTPUT/preflight.json. Returns 0 whatever the verdict (called by trainers/jobs/train_pretrain.py's run, which
    holds OUTPUT's writer lock)."""
    from transformers import AutoTokenizer

    from openrealm.trainers.pretraining.preparation import (
        check_corpus,
        fit_sequence_lengths,
        held_out_blocks,
        initial_index,
        run_inputs,
    )

    check_preflight_args(args)
    output = Path(args.output)
    check_apart(output, run_inputs(args), "--output")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.corpus)
    blocks = load_corpus(args.corpus)
    refusal, num_duplicates = check_corpus(args, blocks)
    if refusal is not None:
        raise ValueError(refusal)
    hold_out = args.hold_out_queries or default_hold_out(blocks)
    held_out = held_out_blocks(blocks, args, hold_out)  # the oracle run's: its seed, its N
    overrides = parse_config_overrides(args.config_overrides)
    embedder = load_embedder(args.embedder, tokenizer, overrides, args.seed, "--embedder")
    encoder = load_encoder(args.encoder, tokenizer, overrides, args.seed, "--encoder")
    fit_sequence_lengths(args, embedder, encoder, tokenizer)
    queries = fixed_masked_queries(
        tokenizer,
        blocks,
        num_queries=hold_out,
        seed=args.seed,
        strategy=args.spans,
        query_seq_len=args.query_seq_len,
        block_ids=held_out,
        queries_per_block=QUERIES_PER_BLOCK,
    )
    folder = output / FOLDER
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)  # an earlier pre-flight's
    report: dict[str, Any] = {
        "corpus": str(args.corpus),
        "embedder": args.embedder,
        "encoder": args.encoder,
        "num_blocks": len(blocks),
        "num_duplicate_blocks": num_duplicates,
        "num_candidates": args.num_candidates,
        "spans": args.spans,
        "seed": args.seed,
    }
    report |= spans_stated_elsewhere(blocks, tokenizer, MAX_SPANS, args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    embedder.to(device).eval()
    encoder.to(device).eval()
    index_root = Path(args.index) if args.index else folder / "index"
    index = initial_index(argparse.Namespace(**{**vars(args), "index_root": str(index_root)}), embedder, index_root)
    examples = RealmPretrainingExamples(
        tokenizer,
        blocks,
        embedder,
        index,
        num_candidates=args.num_candidates,
        candidate_seq_len=args.candidate_seq_len,
        joint_seq_len=args.joint_seq_len,
    )
    report |= {
        "held_out_query_blocks": hold_out,
        "queries_per_block": QUERIES_PER_BLOCK,
        "num_queries": len(queries["uid"]),
    }
    retrieval = RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0, oracle_reader_weight=1.0).eval()
    report |= retrieval_at_start(retrieval, examples, queries)
    # The reader this run would train with: the encoder, or its mixture with the oracle (--oracle-reader-weight).
    weight = getattr(args, "oracle_reader_weight", 0.0)
    reader = RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0, oracle_reader_weight=weight).eval()
    report |= reader_utility(reader, examples, queries, args.seed)
    stating = likeliest_stating_blocks(blocks, tokenizer, queries)
    report |= reader_utility(reader, examples, queries, args.seed, stating, "_best_match")
    start_recall = recall_at_k(embedder, index, queries, RECALL_K)
    report |= {f"recall@{RECALL_K}_at_start": start_recall, "oracle_steps": args.preflight_steps}
    gain = None
    if args.preflight_steps:
        oracle = oracle_args(args, index_root, folder / "oracle", hold_out)
        after = oracle_recall(oracle, tokenizer, blocks, queries)
        gain = after - start_recall
        report |= {
            f"recall@{RECALL_K}_after_oracle": after,
            "oracle_refresh_every": oracle.refresh_every,
            "oracle_output": str(folder / "oracle"),
        }
    report["oracle_gain"] = gain
    report |= judge(report)
    report["thresholds"] = asdict(THRESHOLDS)
    output.mkdir(parents=True, exist_ok=True)  # with --index and no oracle run, nothing else made it
    write_text_atomic(output / REPORT_NAME, json.dumps(report, indent=2) + "\n")
    print_report(report, output / REPORT_NAME)
    return 0


def print_report(report: dict[str, Any], path: Path, file=None) -> None:
    """The short report: each number with its check, the verdict and the advice."""
    file = file or sys.stdout
    checks = report["checks"]

    def line(name: str, text: str) -> str:
        return f"  [{ {True: 'ok', False: 'LOW', None: '--'}[checks[name]]:>3}] {text}"

    sample = report["span_sample"]
    lines = [
        f"REALM pre-flight check of {report['corpus']} ({report['num_blocks']:,} blocks, K = "
        f"{report['num_candidates']})",
        line(
            "spans_stated_elsewhere",
            f"spans stated in another block: {_f(report['spans_stated_elsewhere'])} "
            f"({sample['num_sampled']:,} of {sample['num_spans']:,} spans)",
        ),
        line(
            "answer_in_candidates_at_start",
            f"queries with an answer among the K at the start: {_f(report['answer_in_candidates_at_start'])} "
            f"(random blocks: {_f(report['answer_in_candidates_by_chance'])}; {report['num_queries']} queries)",
        ),
        line(
            "start_entropy",
            f"entropy of p(z|x): {_f(report['start_entropy'])} nats (log K = {report['log_num_candidates']:.3f})",
        ),
        line(
            "retrieval_utility",
            f"reader utility of an answer block: {_f(report['retrieval_utility'])} nats per masked wordpiece "
            f"({_f(report.get('retrieval_utility_best_match'))} from the best-matching one; no block against a "
            f"block without the words: {_f(report.get('null_pull'))})",
        ),
        line(
            "oracle_gain",
            f"oracle run: held-out recall@{RECALL_K} {_f(report[f'recall@{RECALL_K}_at_start'])} -> "
            f"{_f(report.get(f'recall@{RECALL_K}_after_oracle'))} in {report['oracle_steps']} steps "
            f"(gain {_f(report['oracle_gain'])})",
        ),
        f"verdict: {report['verdict']} ({VERDICTS[report['verdict']]}); report: {path}",
        *(f"  - {item}" for item in report["advice"]),
    ]
    print("\n".join(lines), file=file)


__all__ = [
    "THRESHOLDS",
    "VERDICTS",
    "PreflightThresholds",
    "blocks_stating",
    "judge",
    "likeliest_stating_blocks",
    "run_preflight",
    "spans_stated_elsewhere",
]
