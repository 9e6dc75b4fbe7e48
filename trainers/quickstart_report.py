"""The quickstart's report: its figures (the paper's Figure 4 and the open-QA comparison) and report.md, whose prose
is the template trainers/templates/quickstart_report.md filled with this run's numbers; and the rows of Table 2."""

from __future__ import annotations

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
    refresh_mode: str = "async"
    spans: str = "salient"


ABLATIONS = (
    Ablation("realm", "realm", "REALM (pre-trained)", "REALM", "pretrain"),
    Ablation(
        "no_realm_pretraining", "no-pretraining", "no REALM pre-training",
        "Baseline (ICT retriever, no REALM pre-training)", None,
    ),
    Ablation(
        "stale_index", "stale-index", "stale index", "Stale MIPS (index never refreshed)", "pretrain-stale-index",
        refresh_mode="off",
    ),
    Ablation(
        "random_span_masks", "random-span-masks", "random span masks", "Random span masks",
        "pretrain-random-span-masks", spans="random_span",
    ),
)  # fmt: skip
LABELS = {ablation.run: ablation.label for ablation in ABLATIONS} | {"realm-reader-bm25": "REALM reader + BM25"}


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
) -> Path:
    """OUTPUT/report.md: what ran, the Figure 4 curve, Table 2's ablations, the world's structure numbers, the open-QA
    comparison and a few answers. timings: stage name -> seconds; history: the REALM run's evaluations; runs: open-QA
    results by run name; demo: the pipeline's answers; ablations: Table 2's rows (in ABLATIONS' order); world:
    results.json's "world" (zero-shot recall@5 of the ICT start, BM25 and the perfect-reader bound)."""
    first, last = history[0], history[-1]
    scores = {row["name"]: row for row in ablations}
    realm_recall = scores["realm"]["zero_shot_recall_at_5"]
    ict_recall = scores["no_realm_pretraining"]["zero_shot_recall_at_5"]
    figure4_rows = [
        f"| {e['step']} | {e['eval_retrieval_utility']:.3f} | {100 * e['eval_recall@5']:.1f} "
        f"| {100 * e['eval_mlm_accuracy']:.1f} |"
        for e in history
    ]
    table2_rows = [
        f"| {ablation.row} | {row['zero_shot_recall_at_5']:.1f} | {row['exact_match']:.1f} |"
        for ablation, row in zip(ABLATIONS, ablations, strict=True)
    ]
    openqa_rows = [
        f"| {LABELS[name]} | {r['exact_match']:.1f} | {r['recall@1']:.1f} | {r['recall@5']:.1f} "
        f"| {r['recall@10']:.1f} | {r['reader_oracle']:.1f} |"
        for name, r in runs.items()
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
        table2_rows="\n".join(table2_rows),
        recall_ratio=f"{realm_recall / ict_recall if ict_recall else float('inf'):.2f}",
        ict_start_recall=f"{world['ict_start_recall_at_5']:.1f}",
        bm25_recall=f"{world['bm25_recall_at_5']:.1f}",
        bound_recall=f"{world['perfect_reader_bound_recall_at_5']:.1f}",
        openqa_rows="\n".join(openqa_rows),
        answers="\n".join(answers),
    )
    path = output / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


__all__ = ["ABLATIONS", "LABELS", "Ablation", "plot_comparison", "plot_pretraining", "write_report"]
