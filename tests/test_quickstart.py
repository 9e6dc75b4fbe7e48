"""`openrealm quickstart`: the whole REALM lifecycle on the embedded default world, end to end (about 8 minutes).

The default preset, as a user runs it. The assertions are what holds for seeds 0-4 and two fresh seeds; which of the
paper's orderings hold varies with the seed and is not asserted (results.json "claims"; benchmarks/RESULTS.md, "Table 2
on the quickstart")."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import pipeline

import openrealm  # noqa: F401 - registers the question-answering pipeline
from openrealm.trainers.quickstart import PRETRAINING_STAGE
from openrealm.trainers.quickstart_report import CLAIMS, table2_claims

pytestmark = pytest.mark.slow

# The world's perfect-reader bound above the ICT start, in zero-shot recall@5 points: 51.1, 44.6, 19.6, 58.7, 39.1 on
# seeds 0-4 and 28.3, 29.3 on seeds 2027, 31337 (docs/quickstart.md).
MIN_BOUND_GAIN = 10.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The README's main command, run as a user runs it: the `openrealm` console script in its own process."""
    output = tmp_path_factory.mktemp("quickstart") / "run"
    command = [str(Path(sys.executable).parent / "openrealm"), "quickstart", "--output", str(output), "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return output


@pytest.fixture(scope="module")
def results(run) -> dict:
    return json.loads((run / "results.json").read_text())


def test_every_model_is_evaluated_on_the_same_held_out_questions(results):
    # Exact match itself is not asserted: on 92 questions REALM's is below the baseline's for some seeds and above it
    # for others (benchmarks/RESULTS.md).
    counts = {name: run["count"] for name, run in results["open_qa"].items()}
    assert set(counts.values()) == {92} and len(counts) == 5


def test_bm25_baseline_is_measured_with_the_same_reader(results):
    bm25 = results["open_qa"]["realm-reader-bm25"]
    # The world's questions name their entity, so lexical retrieval finds the block almost always.
    assert bm25["recall@5"] > 90.0 and bm25["count"] == results["open_qa"]["realm"]["count"]


def test_pretraining_curve_has_utility_and_recall_from_step_zero_to_the_last_step(results):
    steps = [entry["step"] for entry in results["pretraining"]]
    assert steps[0] == 0 and steps[-1] == results["settings"]["pretrain_steps"]
    for entry in results["pretraining"]:
        assert 0.0 <= entry["eval_recall@5"] <= 1.0 and "eval_retrieval_utility" in entry


def test_report_shows_both_plots_and_every_stage(run, results):
    report = (run / "report.md").read_text()
    for figure in ("figure_pretraining.png", "figure_comparison.png"):
        assert f"]({figure})" in report
        assert (run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(results["timings_s"]) >= {PRETRAINING_STAGE, "answers through the pipeline"}


def test_reading_warmup_taught_the_encoder_to_copy_from_a_stating_context(run):
    history = json.loads((run / "reading-warmup" / "reading_warmup.json").read_text())["history"]
    # held-out copy accuracy at the end, seeds 0-4: 0.44, 0.30, 0.28, 0.37, 0.10 (0.0 at the start)
    assert history[0]["accuracy"] < 0.05 and history[-1]["accuracy"] > 0.08
    assert history[-1]["accuracy_irrelevant"] < 0.05  # it reads; it has not memorised the world


def test_pretraining_refreshed_the_index_asynchronously_with_swaps_at_fixed_steps(run, results):
    summary = json.loads((run / "pretrain" / "pretraining.json").read_text())
    lag = results["settings"]["refresh_every"]
    assert summary["refresh_mode"] == "async" and summary["refresh_lag"] == lag
    # Each index went in exactly `lag` steps after its snapshot, whatever the timing: the run is reproducible.
    assert len(summary["index_swaps"]) >= 10
    assert {swap["step"] - swap["snapshot_step"] for swap in summary["index_swaps"]} == {lag}


def test_parallel_runs_wrote_their_logs(run):
    for name in ("pretrain", "pretrain-stale-index", "pretrain-random-span-masks", "realm", "no-pretraining"):
        assert (run / "logs" / f"{name}.log").stat().st_size > 0, name


def test_saved_model_is_hub_ready_and_answers_through_the_pipeline_with_provenance(run, results):
    folder = run / "realm-openqa"
    for name in ("config.json", "model.safetensors", "block_records.safetensors", "README.md", "pipeline_realm.py"):
        assert (folder / name).is_file(), name
    assert "model-index" in (folder / "README.md").read_text()
    question = json.loads((run / "world" / "questions_test.jsonl").read_text().splitlines()[0])
    answer = pipeline("question-answering", model=str(folder))(question["question"])
    assert answer["answer"] and answer["title"] and answer["text"] and 0 <= answer["block_id"]
    assert results["demo"][0]["question"] == question["question"]


def test_results_carry_table_2_rows_for_every_ablation(results):
    rows = {row["name"]: row for row in results["ablations"]}
    assert set(rows) == {"realm", "no_realm_pretraining", "stale_index", "random_span_masks"}
    for name, row in rows.items():
        assert 0.0 <= row["zero_shot_recall_at_5"] <= 100.0
        # Each row's exact match is its own fine-tuned model's, as in open_qa.
        run = {"realm": "realm", "no_realm_pretraining": "no-pretraining"}.get(name, name.replace("_", "-"))
        assert row["exact_match"] == results["open_qa"][run]["exact_match"]


def test_retrieved_blocks_help_the_encoder_throughout_pretraining(results):
    # Retrieval utility (log p(y|x) marginalised over the candidates minus log p(y|null document, x)) stays above 0 at
    # every evaluation: the encoder reads the retrieved blocks. Seeds 0, 1, 2 end at 1.70, 0.67, 1.61 nats, well above
    # the threshold. What does not hold for every seed is not asserted: the retriever's recall rising (it rises for
    # seed 0 and stays flat for seeds 1 and 2; benchmarks/RESULTS.md).
    assert min(results["pretraining_curve"]["retrieval_utility"]) > 0.0


def test_pretraining_curve_is_figure_4_in_percent(results):
    curve, history = results["pretraining_curve"], results["pretraining"]
    assert curve["step"] == [entry["step"] for entry in history]
    assert curve["recall_at_5"] == [100.0 * entry["eval_recall@5"] for entry in history]
    assert curve["retrieval_utility"] == [entry["eval_retrieval_utility"] for entry in history]


def test_ablations_pretrained_with_their_own_settings(run):
    stale = json.loads((run / "pretrain-stale-index" / "pretraining.json").read_text())
    spans = json.loads((run / "pretrain-random-span-masks" / "pretraining.json").read_text())
    assert stale["refresh_mode"] == "off" and not stale["index_swaps"]
    assert spans["refresh_mode"] == "async" and spans["spans"] == "random_span"


def test_results_carry_the_worlds_structure_from_the_runs_that_measured_it(results):
    world, rows = results["world"], {row["name"]: row for row in results["ablations"]}
    assert set(world) == {"ict_start_recall_at_5", "bm25_recall_at_5", "perfect_reader_bound_recall_at_5"}
    assert world["ict_start_recall_at_5"] == rows["no_realm_pretraining"]["zero_shot_recall_at_5"]
    assert world["bm25_recall_at_5"] == results["open_qa"]["realm-reader-bm25"]["recall@5"]


def test_the_perfect_reader_bound_is_far_above_the_ict_start(results):
    # REALM's objective with a perfect reader and every block a candidate, trained from the ICT start: the most REALM's
    # signal could teach the retriever on this world.
    world = results["world"]
    assert world["perfect_reader_bound_recall_at_5"] >= world["ict_start_recall_at_5"] + MIN_BOUND_GAIN


def test_report_shows_table_2(run):
    report = (run / "report.md").read_text()
    assert "| pre-training | zero-shot recall@5 | exact match after fine-tuning | paper (NQ dev): recall@5 |" in report
    assert "| Stale MIPS (index never refreshed) |" in report and "| Random span masks |" in report


def test_report_shows_the_worlds_structure(run, results):
    report = (run / "report.md").read_text()
    bound = results["world"]["perfect_reader_bound_recall_at_5"]
    row = "| perfect-reader bound (REALM's objective, a perfect reader, every block a candidate) |"
    assert f"{row} {bound:.1f} |" in report


def test_results_check_the_papers_orderings_on_the_runs_own_numbers(run, results):
    # Which of them hold is not asserted here (README, "Does it learn?": it varies with the seed); that each is
    # computed from this run's rows and shown in the report is.
    assert results["claims"] == table2_claims(results)
    assert set(results["claims"]) == {claim.name for claim in CLAIMS}
    report = (run / "report.md").read_text()
    held = sum(claim["holds"] for claim in results["claims"].values())
    assert f"{held} of {len(CLAIMS)} hold on this run" in report
