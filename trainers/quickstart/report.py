"""The quickstart's report: its figures (the paper's Figure 4 and the open-QA comparison) and report.md, whose prose
is the template trainers/templates/quickstart_report.md filled with this run's numbers; the rows of Table 2 and the
orderings of the paper's Table 2 and Figure 4, checked on a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template


@dataclass(frozen=True)
class Ablation:
    """One row of the paper's Table 2 at toy scale: a way to pre-train (or not) from the shared ICT embedder and
    warmed-up encoder, then fine-tuned and evaluated like every other row."""

    name: str  # in results.json's "ablations"
    run: str  # the fine-tuned folder OUTPUT/<run>-openqa, its key in results.json's "open_qa"
    label: str  # in the open-QA table and figure
    row: str  # in Table 2
    pretraining: str | None  # folder under OUTPUT of its REALM pre-training run; None: no REALM pre-training
    paper: tuple[float, float]  # the paper's Table 2 row on NQ dev: (zero-shot recall@5, exact match)
    refresh_mode: str = "async"
    spans: str = "salient"


# The paper's rows: REALM; Baseline (ORQA); 30x stale MIPS (the paper refreshes 30 times less often, the quickstart
# never); REALM with random span masks.
ABLATIONS = (
    Ablation("realm", "realm", "REALM (pre-trained)", "REALM", "pretrain", (38.5, 38.2)),
    Ablation(
        "no_realm_pretraining", "no-pretraining", "no REALM pre-training",
        "Baseline (ICT retriever, no REALM pre-training)", None, (13.9, 31.3),
    ),
    Ablation(
        "stale_index", "stale-index", "stale index", "Stale MIPS (index never refreshed)", "pretrain-stale-index",
        (15.1, 28.7), refresh_mode="off",
    ),
    Ablation(
        "random_span_masks", "random-span-masks", "random span masks", "Random span masks",
        "pretrain-random-span-masks", (26.1, 35.3), spans="random_span",
    ),
)  # fmt: skip
LABELS = {ablation.run: ablation.label for ablation in ABLATIONS} | {"realm-reader-bm25": "REALM reader + BM25"}


def _row(results: dict, name: str) -> dict:
    for row in results["ablations"]:
        if row["name"] == name:
            return row
    names = [row["name"] for row in results["ablations"]]
    raise ValueError(f"results have no ablation row named {name!r} (rows: {names})")


def _recall(name: str) -> Callable[[dict], float]:
    return lambda results: _row(results, name)["zero_shot_recall_at_5"]


def _exact_match(name: str) -> Callable[[dict], float]:
    return lambda results: _row(results, name)["exact_match"]


def _curve(key: str, position: int) -> Callable[[dict], float]:
    return lambda results: results["pretraining_curve"][key][position]


@dataclass(frozen=True)
class Claim:
    """One ordering the paper's Table 2 or Figure 4 shows, as a test of a quickstart run: `holds(measured(results),
    baseline(results))`, both numbers read from results.json's "ablations" or "pretraining_curve"."""

    name: str  # in results.json's "claims"
    statement: str  # in the report
    measured: Callable[[dict], float]
    baseline: Callable[[dict], float]
    holds: Callable[[float, float], bool]
    paper: str  # the paper's numbers for it
    digits: int = 1  # decimals of its numbers in the report


_REALM = _recall("realm")
CLAIMS = (
    Claim(
        "recall_1.5x_ict_start", "zero-shot recall@5: REALM >= 1.5x its ICT start", _REALM,
        _recall("no_realm_pretraining"), lambda realm, start: realm >= 1.5 * start, "38.5 vs 13.9 (2.77x)",
    ),
    Claim(
        "recall_ict_start_plus_10", "zero-shot recall@5: REALM >= its ICT start + 10 points", _REALM,
        _recall("no_realm_pretraining"), lambda realm, start: realm >= start + 10, "38.5 vs 13.9 (+24.6)",
    ),
    Claim(
        "recall_stale_index_plus_5", "zero-shot recall@5: REALM >= the index never refreshed + 5 points", _REALM,
        _recall("stale_index"), lambda realm, stale: realm >= stale + 5, "38.5 vs 15.1, 30x stale (+23.4)",
    ),
    Claim(
        "recall_random_span_masks", "zero-shot recall@5: REALM >= random span masks", _REALM,
        _recall("random_span_masks"), lambda realm, spans: realm >= spans, "38.5 vs 26.1",
    ),
    Claim(
        "exact_match_no_realm_pretraining", "exact match after fine-tuning: REALM > no REALM pre-training",
        _exact_match("realm"), _exact_match("no_realm_pretraining"), lambda realm, baseline: realm > baseline,
        "38.2 vs 31.3",
    ),
    Claim(
        "figure4_recall_plus_10", "recall@5 on the fixed masked queries: last step >= step 0 + 10 points",
        _curve("recall_at_5", -1), _curve("recall_at_5", 0), lambda last, first: last >= first + 10,
        "not reported (Figure 4 plots utility)",
    ),
    Claim(
        "figure4_utility_rises", "retrieval utility (nats per masked token): last step > step 0",
        _curve("retrieval_utility", -1), _curve("retrieval_utility", 0), lambda last, first: last > first,
        "increases steadily (Figure 4)", digits=3,
    ),
)  # fmt: skip


def table2_claims(results: dict) -> dict[str, dict]:
    """results.json's "claims": for each of CLAIMS, REALM's number, the number it is compared with and whether the
    paper's ordering holds on this run. results: a quickstart's results.json ("ablations", "pretraining_curve")."""
    claims = {}
    for claim in CLAIMS:
        measured, baseline = claim.measured(results), claim.baseline(results)
        claims[claim.name] = {
            "measured": measured,
            "baseline": baseline,
            "holds": bool(claim.holds(measured, baseline)),
        }
    return claims


def plot_pretraining(history: list[dict], path: Path) -> None:
    """The paper's Figure 4 at toy scale: retrieval utility and recall@5 against the pre-training step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [entry["step"] for entry in history]
    figure, (utility_axis, recall_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    utility_axis.plot(steps, [entry["eval_retrieval_utility"] for entry in history], marker="o")
    utility_axis.axhline(0, color="grey", linewidth=0.8)
    utility_axis.set(xlabel="pre-training step", ylabel="retrieval utility (nats / token)", title="Retrieval utility")
    recall_axis.plot(steps, [100 * entry["eval_recall@5"] for entry in history], marker="o", color="tab:green")
    recall_axis.set(xlabel="pre-training step", ylabel="recall@5 (%)", title="Recall@5 of a block with the span")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_comparison(runs: dict[str, dict], path: Path) -> None:
    """EM and recall@5 on held-out entities: REALM, REALM's reader over BM25, no REALM pre-training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in LABELS if name in runs]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    for offset, (metric, label) in enumerate((("exact_match", "exact match"), ("recall@5", "recall@5"))):
        positions = [i + (offset - 0.5) * width for i in range(len(names))]
        bars = axis.bar(positions, [runs[name][metric] for name in names], width, label=label)
        axis.bar_label(bars, fmt="%.1f", fontsize=8)
    axis.set_xticks(range(len(names)), [LABELS[name] for name in names])
    axis.set(ylabel="% of held-out questions", ylim=(0, 105), title="Open-QA on held-out entities")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    output: Path,
    preset_name: str,
    seed: int,
    timings: dict[str, float],
    history: list[dict],
    runs: dict,
    demo: list,
    ablations: list[dict],
    world: dict[str, float],
    claims: dict[str, dict],
    reader: dict[str, dict],
) -> Path:
    """OUTPUT/report.md: what ran, the Figure 4 curve, Table 2's ablations beside the paper's, the paper's orderings
    checked on this run, the world's structure numbers, the open-QA comparison and a few answers. timings: stage name
    -> seconds; history: the REALM run's evaluations; runs: open-QA results by run name; demo: the pipeline's answers;
    ablations: Table 2's rows (in ABLATIONS' order; a row's "null_document_collapse", when set, is named as a retriever
    that ran onto the null document); world: results.json's "world" (zero-shot recall@5 of the ICT
    start, BM25 and the perfect-reader bound); claims: results.json's "claims" (table2_claims); reader: results.json's
    "reader" ({"start", "end"}: trainers/world/reading_tasks.py's `reading_probe` of the warmed-up and the pre-trained
    encoder)."""
    first, last = history[0], history[-1]
    scores = {row["name"]: row for row in ablations}
    realm_recall = scores["realm"]["zero_shot_recall_at_5"]
    ict_recall = scores["no_realm_pretraining"]["zero_shot_recall_at_5"]
    figure4_rows = [
        f"| {e['step']} | {e['eval_retrieval_utility']:.3f} | {100 * e['eval_recall@5']:.1f} "
        f"| {100 * e['eval_mlm_accuracy']:.1f} | {e['eval_null_doc_prob']:.2f} |"
        for e in history
    ]
    table2_rows = [
        f"| {ablation.row} | {row['zero_shot_recall_at_5']:.1f} | {row['exact_match']:.1f} "
        f"| {ablation.paper[0]:.1f} | {ablation.paper[1]:.1f} |"
        for ablation, row in zip(ABLATIONS, ablations, strict=True)
    ]
    collapsed = [
        f"{ablation.row} (p(null|x) {row['null_document_collapse']['null_doc_prob']:.2f} at step "
        f"{row['null_document_collapse']['step']})"
        for ablation in ABLATIONS
        if (row := scores[ablation.name]).get("null_document_collapse")
    ]
    null_document = "No pre-training run's retriever ran onto it (no training log reached train pretrain's warning)."
    if collapsed:
        null_document = (
            f"**The retriever ran onto the null document** in {', '.join(collapsed)}: past that point it learns "
            "little from the reader, so those rows say less about REALM's signal (docs/pretraining.md, \"A retriever "
            'that runs onto the null document").'
        )
    claim_rows = []
    for claim in CLAIMS:
        checked, digits = claims[claim.name], claim.digits
        claim_rows.append(
            f"| {claim.statement} | {checked['measured']:.{digits}f} vs {checked['baseline']:.{digits}f} "
            f"| {claim.paper} | {'yes' if checked['holds'] else '**no**'} |"
        )
    openqa_rows = [
        f"| {LABELS[name]} | {r['exact_match']:.1f} | {r['recall@1']:.1f} | {r['recall@5']:.1f} "
        f"| {r['recall@10']:.1f} | {r['reader_oracle']:.1f} |"
        for name, r in runs.items()
    ]
    start, end = reader["start"]["kinds"], reader["end"]["kinds"]
    reader_rows = [
        f"| {name} | {start[name]['mean_log_prob']:.2f} | {end[name]['mean_log_prob']:.2f} "
        f"| {start[name]['copy_share']:.3f} | {end[name]['copy_share']:.3f} |"
        for name in start
    ]
    answers = [
        f"- **{d['question']}** -> {d['answer']} (expected {', '.join(d['expected'])}; block {d['block_id']}, "
        f'"{d["title"]}")'
        for d in demo
    ]
    template = resources.files("openrealm.trainers").joinpath("templates/quickstart_report.md").read_text("utf-8")
    text = Template(template).substitute(
        preset=preset_name,
        seed=seed,
        total_seconds=f"{sum(timings.values()):.0f}",
        stage_seconds=", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items()),
        figure4_rows="\n".join(figure4_rows),
        utility_first=f"{first['eval_retrieval_utility']:.3f}",
        utility_last=f"{last['eval_retrieval_utility']:.3f}",
        recall_first=f"{100 * first['eval_recall@5']:.1f}",
        recall_last=f"{100 * last['eval_recall@5']:.1f}",
        num_queries=last["eval_num_queries"],
        null_document=null_document,
        table2_rows="\n".join(table2_rows),
        claim_rows="\n".join(claim_rows),
        claims_held=sum(claim["holds"] for claim in claims.values()),
        num_claims=len(claims),
        recall_ratio=f"{realm_recall / ict_recall if ict_recall else float('inf'):.2f}",
        ict_start_recall=f"{world['ict_start_recall_at_5']:.1f}",
        bm25_recall=f"{world['bm25_recall_at_5']:.1f}",
        bound_recall=f"{world['perfect_reader_bound_recall_at_5']:.1f}",
        openqa_rows="\n".join(openqa_rows),
        reader_rows="\n".join(reader_rows),
        copy_start=f"{reader['start']['copy_share']:.3f}",
        copy_end=f"{reader['end']['copy_share']:.3f}",
        reader_utility_start=f"{reader['start']['utility']:.2f}",
        reader_utility_end=f"{reader['end']['utility']:.2f}",
        answers="\n".join(answers),
    )
    path = output / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


__all__ = [
    "ABLATIONS",
    "CLAIMS",
    "LABELS",
    "Ablation",
    "Claim",
    "plot_comparison",
    "plot_pretraining",
    "table2_claims",
    "write_report",
]
