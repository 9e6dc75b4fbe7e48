"""The `train pretrain` job end to end (trainers/jobs/train_pretrain.py): the REALM metrics it logs, the towers it
saves, its options (oracle reader, frozen retriever, initial prior entropy, gradient accumulation, held-out queries)
and the corpora it refuses or stops on, naming why. The index refresh callback's own tests are in test_refresh.py."""

import argparse
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    DATED,
    TINY_PRETRAIN,
    UNDATED,
    cli_pretrain,
    pretrain_argv,
    repeated_corpus,
    small_corpus,
    tiny_embedder_for,
    tiny_overrides,
    weights_equal,
)
from transformers import AutoTokenizer, TrainerCallback

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers import cli, dropped, towers
from openrealm.trainers.indexing import build_index, list_versions
from openrealm.trainers.jobs import train_pretrain as pretrain
from openrealm.trainers.options import train_pretrain
from openrealm.trainers.pretraining.trainer import NULL_DOC_WARNING, NullDocumentWatch
from openrealm.trainers.stage_utils import parse_config_overrides


def test_pretraining_job_logs_realm_metrics_and_saves_loadable_towers(world_corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--corpus", str(world_corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--max-steps", "4", "--refresh-every", "2", "--refresh-mode", "sync", "--batch-size", "4"]
    argv += ["--logging-steps", "1", "--config-overrides", TINY_PRETRAIN, "--no-progress", "--index-batch-size", "32"]
    assert cli.main(["train", "pretrain", *argv]) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    logs = [entry for entry in summary["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    for name in (
        "retrieval_utility",
        "null_doc_prob",
        "retrieval_entropy",
        "num_trivial_retrieved",
        "index_staleness_seconds",
    ):
        assert all(name in entry for entry in logs), name
    # Sync refreshes at steps 2 and 4: the index in use and its staleness as logged after each step.
    assert [entry["index_version"] for entry in logs] == [0, 1, 1, 2]
    assert [entry["index_staleness_steps"] for entry in logs] == [1, 0, 1, 0]
    assert sum(entry["num_examples"] for entry in logs) > 0
    assert list_versions(output / "index") == [0, 1, 2]
    embedder = RealmEmbedder.from_pretrained(output / "embedder")
    encoder = RealmKnowledgeAugEncoder.from_pretrained(output / "encoder")
    assert embedder.config.hidden_size == 32 and encoder.config.retriever_proj_size == 16
    assert (
        AutoTokenizer.from_pretrained(output / "embedder").get_vocab()
        == AutoTokenizer.from_pretrained(world_corpus).get_vocab()
    )


class StepRecorder(TrainerCallback):
    """Records the global step at each step end."""

    def __init__(self):
        self.steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_extra_callbacks_passed_to_run_see_every_step(world_corpus, tmp_path):
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    argv = [
        "--corpus",
        str(world_corpus),
        "--embedder",
        "random",
        "--encoder",
        "random",
        "--output",
        str(tmp_path / "out"),
    ]
    argv += ["--max-steps", "3", "--refresh-every", "2", "--refresh-mode", "off", "--batch-size", "2"]
    argv += ["--config-overrides", TINY_PRETRAIN, "--no-progress", "--index-batch-size", "32"]
    recorder = StepRecorder()
    assert pretrain.run(parser.parse_args(argv), callbacks=[recorder]) == 0
    assert recorder.steps == [1, 2, 3]
    assert json.loads((tmp_path / "out" / "pretraining.json").read_text())["max_steps"] == 3


def test_embedder_learning_rate_gives_the_retriever_its_own_optimizer_groups(world_corpus, tmp_path):
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    args = parser.parse_args(
        ["--corpus", str(world_corpus), "--embedder", "random", "--encoder", "random",
         "--output", str(tmp_path / "out"), "--max-steps", "2", "--refresh-every", "10", "--refresh-mode", "off",
         "--learning-rate", "1e-3", "--embedder-learning-rate", "1e-5", "--no-progress"]
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(world_corpus)
    embedder = tiny_embedder_for(tokenizer)
    fields = parse_config_overrides(TINY_PRETRAIN)
    encoder = towers.load_encoder("random", tokenizer, fields)
    index = build_index(embedder, world_corpus, tmp_path / "index", version=0, progress=False)
    trainer = pretrain.build_trainer(args, embedder, encoder, tokenizer, load_corpus(world_corpus), index)
    groups = trainer.create_optimizer().param_groups
    embedder_ids = {id(p) for p in embedder.parameters()}
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert sum(len(group["params"]) for group in groups) == len(trainable)
    for group in groups:
        in_embedder = {id(p) in embedder_ids for p in group["params"]}
        assert len(in_embedder) == 1  # a group is all retriever or all encoder
        assert group["lr"] == (1e-5 if in_embedder == {True} else 1e-3)
    assert {group["lr"] for group in groups} == {1e-5, 1e-3}


def test_pretraining_refuses_a_corpus_without_any_salient_span_naming_the_counts_and_flags(
    world_corpus, tmp_path, capsys
):
    blocks = small_corpus(world_corpus, tmp_path / "corpus", UNDATED[:3], spans="none")
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("openrealm: error: 0 of 3 blocks") and "(span annotators: none)" in error
    for flag in ("--spans spacy", "--spans MODEL", "--spans random_span", "--spans random_token"):
        assert flag in error, flag
    assert not output.exists()  # refused before any index was built


def test_pretraining_refuses_a_refresh_lag_without_async_refresh_before_building_anything(
    world_corpus, tmp_path, capsys
):
    output = tmp_path / "out"
    assert (
        cli.main(["train", "pretrain", *pretrain_argv(world_corpus, output, "--max-steps", "2", "--refresh-lag", "5")])
        == 2
    )
    assert "got lag=5 with mode='off' (--refresh-mode, --refresh-every, --refresh-lag)" in capsys.readouterr().err
    assert not output.exists()


def test_random_span_masking_trains_on_a_corpus_without_spans(world_corpus, tmp_path):
    blocks = small_corpus(world_corpus, tmp_path / "corpus", UNDATED, spans="none")
    argv = pretrain_argv(blocks, tmp_path / "out", "--max-steps", "1", "--spans", "random_span", "--batch-size", "2")
    assert cli.main(["train", "pretrain", *argv]) == 0
    summary = json.loads((tmp_path / "out" / "pretraining.json").read_text())
    assert summary["totals"]["num_examples"] == 2 and summary["skipped_batches"] == 0


def test_batches_of_only_dropped_examples_are_skipped_counted_and_training_finishes(world_corpus, tmp_path, capsys):
    # One block of 8 has a date: batches of 2 over the 8 blocks (one epoch in 4 steps) leave 3 batches empty.
    texts = ["The river was named in March 1912 by the city.", *UNDATED[1:]]
    blocks = small_corpus(world_corpus, tmp_path / "corpus", texts)
    output = tmp_path / "out"
    argv = pretrain_argv(blocks, output, "--max-steps", "4", "--batch-size", "2", "--logging-steps", "1")
    assert cli.main(["train", "pretrain", *argv]) == 0
    assert "1 of 8 blocks have a salient span" in capsys.readouterr().out
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["skipped_batches"] == 3 and summary["dropped_examples"] == 7
    assert summary["totals"]["num_examples"] == 1 and summary["totals"]["num_skipped_queries"] == 7
    logs = [entry for entry in summary["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    assert sorted(entry["num_skipped_batches"] for entry in logs) == [0, 1, 1, 1]
    trained = [entry for entry in logs if entry["num_skipped_batches"] == 0]
    assert trained[0]["num_examples"] == 1 and "retrieval_utility" in trained[0]
    assert all("retrieval_utility" not in entry for entry in logs if entry["num_skipped_batches"])
    assert [entry["num_dropped_examples"] for entry in logs] == [
        2 if entry["num_skipped_batches"] else 1 for entry in logs
    ]
    assert math.isfinite(summary["train_loss"])


def test_cli_corpus_build_with_defaults_feeds_train_pretrain_with_defaults(world_corpus, tmp_path):
    from openrealm.trainers import cli

    texts = [f"The city number {i} was founded in {1800 + 7 * i} near the river." for i in range(6)] + UNDATED[:4]
    source = tmp_path / "articles.jsonl"
    source.write_text("".join(json.dumps({"title": f"Town {i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    built = tmp_path / "corpus"
    tokenizer = str(world_corpus.parent / "vocab")
    assert cli.main(["corpus", "build", "--input", str(source), "--output", str(built), "--tokenizer", tokenizer]) == 0
    output = tmp_path / "out"
    argv = ["train", "pretrain", "--corpus", str(built), "--embedder", "random", "--encoder", "random"]
    argv += ["--output", str(output), "--max-steps", "2", "--refresh-every", "100"]
    argv += ["--config-overrides", TINY_PRETRAIN]
    assert cli.main(argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["spans"] == "salient" and summary["refresh_mode"] == "async" and summary["batch_size"] == 4
    assert summary["totals"]["num_examples"] > 0 and math.isfinite(summary["train_loss"])
    assert json.loads((built / "corpus_config.json").read_text())["span_annotators"] == ["date-regex"]


def test_pretraining_that_drops_every_example_for_duplicate_blocks_ends_with_an_error_and_saves_nothing(
    world_corpus, tmp_path, capsys
):
    # 10 articles present 3 times (30 blocks, 20 duplicates), 4 steps of 4 with sync refreshes.
    blocks = repeated_corpus(world_corpus, tmp_path / "corpus", DATED, copies=3)
    output = tmp_path / "out"
    argv = ["--max-steps", "4", "--batch-size", "4", "--refresh-every", "2", "--refresh-mode", "sync"]
    assert cli_pretrain(blocks, output, *argv) == 2
    err = capsys.readouterr().err
    assert "REALM pre-training: warning: 20 of 30 blocks duplicate an earlier block" in err
    error = err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: REALM pre-training ended: 16 of 16 corpus rows read (100%) give no training example: 16 "
        "because their retrieved blocks held two copies of one block"
    )
    assert "Rebuild the corpus with `openrealm corpus build` (without --no-deduplicate)" in error
    assert "more than --max-dropped-share 0.9" in error and error.endswith("No model was saved.")
    assert not (output / "pretraining.json").exists() and not (output / "embedder").exists()


def test_pretraining_stops_at_the_first_logging_step_past_the_share_once_enough_rows_were_read(
    world_corpus, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(dropped, "MIN_EXAMPLES_TO_STOP", 8)  # 200 rows by default: too many for a test
    recorder = StepRecorder()
    blocks = repeated_corpus(world_corpus, tmp_path / "corpus", DATED, copies=3)
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    argv = pretrain_argv(blocks, tmp_path / "out", "--max-steps", "40", "--batch-size", "4", "--logging-steps", "2")
    args = parser.parse_args(argv)
    with pytest.raises(ValueError, match=r"REALM pre-training stopped after step 2 of 40: 8 of 8 corpus rows read"):
        pretrain.run(args, callbacks=[recorder])
    assert recorder.steps == [1, 2]
    assert not (tmp_path / "out" / "pretraining.json").exists()


def test_pretraining_summary_line_warns_when_most_rows_give_no_example_with_the_counts_by_cause(
    world_corpus, tmp_path, capsys
):
    texts = ["The river was named in March 1912 by the city.", *UNDATED[1:]]  # 1 of 8 blocks has a salient span
    blocks = small_corpus(world_corpus, tmp_path / "corpus", texts)
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "4", "--batch-size", "2") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"REALM pre-training: saved embedder/, encoder/ and scorer/ to {output} (train loss ")
    assert "; warning: 7 of 8 corpus rows read (88%) give no training example: 7 because their block has no " in line
    assert "--spans spacy" in line and "--spans random_span" in line
    summary = json.loads((output / "pretraining.json").read_text())
    assert (
        summary["totals"]["num_skipped_no_valid_spans"] == 7 and summary["totals"]["num_dropped_duplicate_uids"] == 0
    )


def test_pretraining_summary_line_has_no_warning_when_most_rows_train(world_corpus, tmp_path, capsys):
    blocks = small_corpus(world_corpus, tmp_path / "corpus", DATED[:8])
    assert cli_pretrain(blocks, tmp_path / "out", "--max-steps", "2", "--batch-size", "2") == 0
    assert "warning" not in capsys.readouterr().out.splitlines()[-1]
    assert json.loads((tmp_path / "out" / "pretraining.json").read_text())["null_document_collapse"] is None


def test_the_null_document_watch_warns_once_at_the_first_log_whose_null_probability_reaches_its_threshold(capsys):
    watch = NullDocumentWatch(threshold=0.5)
    logs = {100: {"loss": 3.0, "null_doc_prob": 0.12}, 200: {"eval_recall@5": 0.3}, 300: {"null_doc_prob": 0.61}}
    for step, entry in {**logs, 400: {"null_doc_prob": 0.97}}.items():
        watch.on_log(None, SimpleNamespace(global_step=step, is_world_process_zero=True), None, logs=entry)
    assert watch.first == {"step": 300, "null_doc_prob": 0.61}
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [f"REALM pre-training: warning: {watch.message()}"]
    assert "averaged 0.61 in the steps logged at step 300" in warnings[0] and "--embedder-learning-rate" in warnings[0]


def test_the_null_document_watch_stays_silent_below_its_threshold(capsys):
    watch = NullDocumentWatch()
    for step, value in ((1, 0.125), (2, NULL_DOC_WARNING - 0.01)):
        state = SimpleNamespace(global_step=step, is_world_process_zero=True)
        watch.on_log(None, state, None, logs={"null_doc_prob": value})
    assert watch.first is None and watch.message() is None and capsys.readouterr().err == ""


def test_pretraining_whose_retriever_runs_onto_the_null_document_warns_in_its_summary_line_and_records_it(
    world_corpus, tmp_path, capsys, monkeypatch
):
    # A threshold of 0 stands in for a collapsed run: every logged p(null|x) reaches it.
    monkeypatch.setattr(pretrain, "NullDocumentWatch", lambda: NullDocumentWatch(threshold=0.0))
    output = tmp_path / "out"
    assert cli_pretrain(world_corpus, output, "--max-steps", "2", "--batch-size", "2", "--logging-steps", "1") == 0
    summary = json.loads((output / "pretraining.json").read_text())
    first = summary["null_document_collapse"]
    logged = [entry for entry in summary["log_history"] if "null_doc_prob" in entry]
    assert first == {"step": 1, "null_doc_prob": logged[0]["null_doc_prob"]}
    line = capsys.readouterr().out.splitlines()[-1]
    assert "; warning: p(null document | x) averaged " in line and "in the steps logged at step 1:" in line


def test_pretraining_refuses_more_candidates_than_distinct_blocks_before_building_anything(
    world_corpus, tmp_path, capsys
):
    blocks = repeated_corpus(world_corpus, tmp_path / "corpus", DATED[:3], copies=3)
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        f"openrealm: error: --num-candidates 8 retrieves 8 blocks per query, but {blocks} holds only 3 distinct ones "
        "(9 searchable blocks, of which 6 duplicate another): every query would be dropped. Lower --num-candidates"
    )
    assert not output.exists()


def test_pretraining_refuses_a_corpus_of_one_block_before_building_anything(world_corpus, tmp_path, capsys):
    blocks = small_corpus(world_corpus, tmp_path / "corpus", DATED[:1])
    assert cli_pretrain(blocks, tmp_path / "out", "--max-steps", "2") == 2
    assert "holds only 1 distinct ones (1 searchable blocks): every query" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_pretraining_refuses_a_corpus_where_too_few_blocks_have_a_salient_span_unless_told_to_train_anyway(
    world_corpus, tmp_path, capsys
):
    texts = [DATED[0], *(f"The river number {i} flows past the city number {i}." for i in range(11))]
    blocks = small_corpus(world_corpus, tmp_path / "corpus", texts)  # 1 of 12 blocks has a date: 92% dropped at least
    output = tmp_path / "out"
    assert cli_pretrain(blocks, output, "--max-steps", "1", "--batch-size", "2") == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: 11 of 12 corpus rows (92%) give no training example: 11 because their block has no salient "
        "span"
    )
    assert not output.exists()
    assert cli_pretrain(blocks, output, "--max-steps", "1", "--batch-size", "2", "--max-dropped-share", "1") == 0
    assert (output / "pretraining.json").is_file()


def test_pretraining_whose_masks_all_lie_past_the_query_length_ends_with_an_error_naming_it(
    world_corpus, tmp_path, capsys
):
    # Towers of 16 positions read queries of 12 wordpieces: every date below comes later in its sentence.
    texts = [
        f"The river number {i} flows past the old city and into the sea since March {1900 + i}." for i in range(8)
    ]
    blocks = small_corpus(world_corpus, tmp_path / "corpus", texts)
    argv = ["--max-steps", "2", "--batch-size", "2", "--config-overrides", tiny_overrides(max_position_embeddings=16)]
    assert cli_pretrain(blocks, tmp_path / "out", *argv) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert (
        "4 of 4 corpus rows read (100%) give no training example: 4 because the words to mask lie past the first "
        in error
    )
    assert "10 wordpieces of their sentence" in error and "max_position_embeddings" in error


def test_held_out_query_blocks_give_no_training_query_and_are_listed_in_the_summary(world_corpus, tmp_path):
    from openrealm.trainers.pretraining.evaluation import held_out_query_blocks

    blocks = load_corpus(world_corpus)
    args = SimpleNamespace(hold_out_queries=10, seed=3, corpus=world_corpus)
    held_out = held_out_query_blocks(blocks, 10, seed=3)
    training = pretrain.training_queries(blocks, args)
    assert len(held_out) == 10 and len(training) == len(blocks) - 10
    assert not set(training["block_id"]) & set(held_out)
    assert all(len(blocks[i]["span_char_starts"]) for i in held_out)  # each can give a query
    output = tmp_path / "out"
    assert cli_pretrain(world_corpus, output, "--max-steps", "2", "--hold-out-queries", "10", "--seed", "3") == 0
    assert json.loads((output / "pretraining.json").read_text())["held_out_query_blocks"] == held_out


def test_blocks_removed_from_the_corpus_give_no_training_query_and_are_never_held_out(world_corpus, tmp_path):
    from openrealm.trainers.living_corpus import edit_corpus
    from openrealm.trainers.pretraining.preparation import held_out_blocks

    corpus = Path(shutil.copytree(world_corpus, tmp_path / "corpus"))
    blocks = load_corpus(corpus)
    args = SimpleNamespace(hold_out_queries=10, seed=3, corpus=corpus)
    removed = held_out_blocks(blocks, args)[:3]  # blocks that would be held out
    edit_corpus(corpus, remove_ids=removed, progress=False)
    held_out, training = held_out_blocks(blocks, args), pretrain.training_queries(blocks, args)
    assert len(held_out) == 10 and not set(held_out) & set(removed)
    assert len(training) == len(blocks) - 13
    assert not set(training["block_id"]) & {*removed, *held_out}


def test_the_oracle_reader_trains_the_retriever_through_the_command_line_and_logs_its_answer_metrics(
    world_corpus, tmp_path
):
    output = tmp_path / "out"
    argv = ["--max-steps", "2", "--logging-steps", "1", "--oracle-reader-weight", "1", "--batch-size", "8"]
    assert cli_pretrain(world_corpus, output, *argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["oracle_reader_weight"] == 1.0
    logged = [entry for entry in summary["log_history"] if "answer_in_candidates" in entry]
    assert len(logged) == 2 and all(0 <= entry["answer_in_candidates"] <= 1 for entry in logged)
    assert all(math.isfinite(entry["answer_posterior_gain"]) for entry in logged)
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert not weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)  # the retriever moved


def test_a_frozen_retriever_takes_no_update_while_the_reader_trains(world_corpus, tmp_path):
    output = tmp_path / "out"
    assert (
        cli_pretrain(world_corpus, output, "--max-steps", "3", "--freeze-retriever-steps", "3", "--batch-size", "8")
        == 0
    )
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)  # no step touched it
    trained = RealmKnowledgeAugEncoder.from_pretrained(output / "encoder")
    initial = towers.load_encoder(
        "random", AutoTokenizer.from_pretrained(world_corpus), parse_config_overrides(TINY_PRETRAIN), 0
    )
    assert not weights_equal(trained, initial)  # the reader did train
    assert json.loads((output / "pretraining.json").read_text())["freeze_retriever_steps"] == 3


def test_the_retriever_trains_once_its_frozen_steps_are_over(world_corpus, tmp_path):
    output = tmp_path / "out"
    assert (
        cli_pretrain(world_corpus, output, "--max-steps", "3", "--freeze-retriever-steps", "2", "--batch-size", "8")
        == 0
    )
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    assert not weights_equal(RealmEmbedder.from_pretrained(output / "embedder"), start)


def test_initial_prior_entropy_scales_the_start_so_the_sampled_prior_has_that_entropy(world_corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--max-steps", "1", "--initial-prior-entropy", "1.2", "--batch-size", "8", "--learning-rate", "0"]
    assert cli_pretrain(world_corpus, output, *argv) == 0
    prior = json.loads((output / "pretraining.json").read_text())["initial_prior"]
    assert prior["entropy_after"] == pytest.approx(1.2, abs=1e-3)
    assert prior["entropy_before"] > 1.5 and prior["embedding_scale"] > 1  # a random start's prior is near uniform
    start = RealmEmbedder.from_pretrained(output / "index" / "v000000" / "block_index" / "embedder")
    scaled = RealmEmbedder.from_pretrained(output / "embedder")  # lr 0: the scale is all that changed
    torch.testing.assert_close(scaled.cls.LayerNorm.weight, start.cls.LayerNorm.weight * prior["embedding_scale"])


def test_an_initial_prior_entropy_of_log_k_or_more_is_refused_before_anything_is_built(world_corpus, tmp_path, capsys):
    output = tmp_path / "out"
    assert cli_pretrain(world_corpus, output, "--max-steps", "1", "--initial-prior-entropy", "2.5") == 2
    error = capsys.readouterr().err
    assert "--initial-prior-entropy 2.5 must lie between 0 and log K = 2.079 nats (K = --num-candidates 8)" in error
    assert not (output / "index").exists()


def test_gradient_accumulation_updates_once_per_accumulated_batches(world_corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--max-steps", "2", "--gradient-accumulation-steps", "2", "--batch-size", "4", "--logging-steps", "1"]
    assert cli_pretrain(world_corpus, output, *argv) == 0
    summary = json.loads((output / "pretraining.json").read_text())
    assert summary["gradient_accumulation_steps"] == 2
    assert summary["totals"]["num_examples"] + summary["dropped_examples"] == 2 * 2 * 4  # steps x micro-batches x size
