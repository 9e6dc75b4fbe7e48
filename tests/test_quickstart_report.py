"""The quickstart's report and results.json "claims": the paper's Table 2 and Figure 4 orderings, checked on a run's
numbers (trainers/quickstart/report.py). Fast: hand-made results, no training."""

import copy

import pytest

from openrealm.trainers.quickstart.report import ABLATIONS, CLAIMS, table2_claims, write_report


def results_with(recall: dict[str, float], exact_match: dict[str, float], curve_recall, curve_utility) -> dict:
    """A results.json's "ablations" and "pretraining_curve" with the given numbers."""
    return {
        "ablations": [
            {"name": name, "zero_shot_recall_at_5": recall[name], "exact_match": exact_match[name]} for name in recall
        ],
        "pretraining_curve": {
            "step": [0, 200, 400][: len(curve_recall)],
            "recall_at_5": list(curve_recall),
            "retrieval_utility": list(curve_utility),
        },
    }


# The paper's Table 2 on NQ dev (recall@5, exact match), and a Figure 4 that rises.
PAPER = results_with(
    {"realm": 38.5, "no_realm_pretraining": 13.9, "stale_index": 15.1, "random_span_masks": 26.1},
    {"realm": 38.2, "no_realm_pretraining": 31.3, "stale_index": 28.7, "random_span_masks": 35.3},
    curve_recall=(20.0, 27.0, 35.0),
    curve_utility=(0.1, 0.3, 0.5),
)


def with_recall(results: dict, name: str, value: float) -> dict:
    changed = copy.deepcopy(results)
    next(row for row in changed["ablations"] if row["name"] == name)["zero_shot_recall_at_5"] = value
    return changed


def test_every_claim_holds_on_the_papers_own_numbers():
    claims = table2_claims(PAPER)
    assert list(claims) == [claim.name for claim in CLAIMS]
    assert all(claim["holds"] for claim in claims.values())
    assert claims["recall_1.5x_ict_start"] == {"measured": 38.5, "baseline": 13.9, "holds": True}


def test_ratio_claim_holds_at_exactly_one_and_a_half_times_the_start_and_fails_below():
    assert table2_claims(with_recall(PAPER, "no_realm_pretraining", 38.5 / 1.5))["recall_1.5x_ict_start"]["holds"]
    below = table2_claims(with_recall(PAPER, "no_realm_pretraining", 26.0))
    assert not below["recall_1.5x_ict_start"]["holds"] and below["recall_ict_start_plus_10"]["holds"]


def test_points_claim_fails_when_realm_is_less_than_ten_points_above_its_start():
    claims = table2_claims(with_recall(PAPER, "no_realm_pretraining", 29.0))
    assert not claims["recall_ict_start_plus_10"]["holds"]
    assert claims["recall_ict_start_plus_10"]["baseline"] == 29.0


def test_stale_index_claim_needs_five_points():
    assert table2_claims(with_recall(PAPER, "stale_index", 33.5))["recall_stale_index_plus_5"]["holds"]
    assert not table2_claims(with_recall(PAPER, "stale_index", 34.0))["recall_stale_index_plus_5"]["holds"]


def test_random_spans_claim_holds_on_a_tie():
    assert table2_claims(with_recall(PAPER, "random_span_masks", 38.5))["recall_random_span_masks"]["holds"]
    assert not table2_claims(with_recall(PAPER, "random_span_masks", 39.0))["recall_random_span_masks"]["holds"]


def test_exact_match_claim_fails_on_a_tie():
    tied = copy.deepcopy(PAPER)
    next(row for row in tied["ablations"] if row["name"] == "no_realm_pretraining")["exact_match"] = 38.2
    claims = table2_claims(tied)
    assert claims["exact_match_no_realm_pretraining"] == {"measured": 38.2, "baseline": 38.2, "holds": False}


def test_figure_4_claims_compare_the_last_evaluation_with_step_zero():
    flat = copy.deepcopy(PAPER)
    flat["pretraining_curve"]["recall_at_5"] = [20.0, 40.0, 29.0]  # up in the middle, +9 at the end
    flat["pretraining_curve"]["retrieval_utility"] = [0.5, 0.9, 0.5]
    claims = table2_claims(flat)
    assert claims["figure4_recall_plus_10"] == {"measured": 29.0, "baseline": 20.0, "holds": False}
    assert not claims["figure4_utility_rises"]["holds"]


def test_claims_read_rows_by_name_not_by_position():
    shuffled = copy.deepcopy(PAPER)
    shuffled["ablations"].reverse()
    assert table2_claims(shuffled) == table2_claims(PAPER)


def test_claims_name_a_missing_ablation_row():
    missing = copy.deepcopy(PAPER)
    missing["ablations"] = [row for row in missing["ablations"] if row["name"] != "stale_index"]
    with pytest.raises(ValueError, match="no ablation row named 'stale_index'"):
        table2_claims(missing)


def write(tmp_path, ablations: list[dict]) -> str:
    """The report of a run with PAPER's curve and the given Table 2 rows."""
    history = [
        {"step": step, "eval_retrieval_utility": utility, "eval_recall@5": recall / 100, "eval_mlm_accuracy": 0.3,
         "eval_null_doc_prob": null, "eval_num_queries": 40}
        for step, utility, recall, null in zip(
            (0, 200, 400), (0.1, 0.3, 0.5), (20.0, 27.0, 35.0), (0.02, 0.61, 0.7), strict=True
        )
    ]  # fmt: skip
    openqa = {"exact_match": 30.0, "recall@1": 40.0, "recall@5": 60.0, "recall@10": 70.0, "reader_oracle": 50.0}
    runs = {name: dict(openqa) for name in ("realm", "no-pretraining", "realm-reader-bm25")}
    demo = [{"question": "Where was Bo born?", "answer": "Kel", "expected": ["Kel"], "block_id": 3, "title": "Bo"}]
    world = {"ict_start_recall_at_5": 13.9, "bm25_recall_at_5": 99.0, "perfect_reader_bound_recall_at_5": 80.0}
    claims = table2_claims(with_recall(PAPER, "stale_index", 36.0))
    path = write_report(tmp_path, "default", 0, {"world": 1.0}, history, runs, demo, ablations, world, claims, READER)
    return path.read_text()


@pytest.fixture
def report(tmp_path) -> str:
    return write(tmp_path, PAPER["ablations"])


def probe(copy_share: float, stated: float, null: float) -> dict:
    """A reading_probe result with the stating block's and the null document's numbers given."""
    kinds = {"stating": {"wordpieces": 100, "mean_log_prob": stated, "copy_share": copy_share}}
    kinds["null"] = {"wordpieces": 120, "mean_log_prob": null, "copy_share": 0.02}
    return {"copy_share": copy_share, "stated_log_prob": stated, "utility": stated - null, "kinds": kinds}


READER = {"start": probe(0.93, -0.38, -4.19), "end": probe(0.9, -0.44, -4.16)}


def test_report_shows_how_well_the_encoder_reads_before_and_after_pretraining(report):
    assert "| stating | -0.38 | -0.44 | 0.930 | 0.900 |" in report
    assert "| null | -4.19 | -4.16 | 0.020 | 0.020 |" in report
    assert "copied 0.930 of the masked wordpieces from a stating block after its warm-up and 0.900 after" in report
    assert "worth 3.81 nats per wordpiece over no block before and 3.72 after" in report


def test_report_puts_the_papers_numbers_beside_each_table_2_row(report):
    for ablation, row in zip(ABLATIONS, PAPER["ablations"], strict=True):
        ours = f"{row['zero_shot_recall_at_5']:.1f} | {row['exact_match']:.1f}"
        assert f"| {ablation.row} | {ours} | {ablation.paper[0]:.1f} | {ablation.paper[1]:.1f} |" in report


def test_report_says_which_claims_hold_on_the_run(report):
    assert "| zero-shot recall@5: REALM >= 1.5x its ICT start | 38.5 vs 13.9 | 38.5 vs 13.9 (2.77x) | yes |" in report
    stale = "| zero-shot recall@5: REALM >= the index never refreshed + 5 points | 38.5 vs 36.0 |"
    assert stale in report and f"{stale} 38.5 vs 15.1, 30x stale (+23.4) | **no** |" in report
    assert f"{len(CLAIMS) - 1} of {len(CLAIMS)} hold on this run" in report


def test_report_gives_p_null_at_each_figure_4_step(report):
    assert "| step | retrieval utility | recall@5 | MLM accuracy | p(null document) |" in report
    assert "| 200 | 0.300 | 27.0 | 30.0 | 0.61 |" in report


def test_report_names_the_runs_whose_retriever_ran_onto_the_null_document(tmp_path):
    ablations = copy.deepcopy(PAPER["ablations"])
    collapse = {"realm": {"step": 150, "null_doc_prob": 0.67913}, "stale_index": {"step": 200, "null_doc_prob": 0.6}}
    for row in ablations:
        row["null_document_collapse"] = collapse.get(row["name"])
    report = write(tmp_path, ablations)
    named = "in REALM (p(null|x) 0.68 at step 150), Stale MIPS (index never refreshed) (p(null|x) 0.60 at step 200):"
    assert f"**The retriever ran onto the null document** {named}" in report


def test_report_says_when_no_retriever_ran_onto_the_null_document(report):
    assert "No pre-training run's retriever ran onto it" in report
    assert "ran onto the null document**" not in report
