"""What a job prints: by default one progress bar and one summary line per stage; --quiet only the summary;
--verbose the libraries' inner bars and the Trainer's logged metrics as well. Run as a user runs it (a fresh
process)."""

import subprocess
import sys

import pytest
from helpers import TINY
from transformers import BertTokenizerFast

from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers.world.synthetic_world import generate_world


def openrealm(*argv: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "openrealm", *argv], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("output")
    world = generate_world(seed=0, num_people=12, num_organizations=3, num_cities=3, num_rivers=2, num_mountains=2,
                           num_regions=2)  # fmt: skip
    world.write(root / "world")
    train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=400)
    BertTokenizerFast(vocab_file=str(root / "vocab" / "vocab.txt"), do_lower_case=True).save_pretrained(root / "tok")
    return root


def corpus_build(root, name: str, *flags: str) -> subprocess.CompletedProcess:
    return openrealm("corpus", "build", "--input", str(root / "world" / "articles.jsonl"), "--output",
                     str(root / name), "--tokenizer", str(root / "tok"), *flags)  # fmt: skip


def test_corpus_build_prints_its_packing_bar_and_one_summary_line(world_files):
    result = corpus_build(world_files, "corpus")
    assert "Packing articles into blocks" in result.stderr
    for inner in ("Generating train split", "Saving the dataset", "Writing block records"):
        assert inner not in result.stderr
    assert len(result.stdout.splitlines()) == 1 and result.stdout.startswith("Wrote ")


def test_corpus_build_quiet_prints_the_summary_line_only(world_files):
    result = corpus_build(world_files, "corpus-quiet", "--quiet")
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1 and result.stdout.startswith("Wrote ")


def test_corpus_build_verbose_shows_the_inner_steps_too(world_files):
    result = corpus_build(world_files, "corpus-verbose", "--verbose")
    assert "Packing articles into blocks" in result.stderr and "Saving the dataset" in result.stderr


def ict(root, name: str, *flags: str) -> subprocess.CompletedProcess:
    if not (root / "corpus").is_dir():
        corpus_build(root, "corpus", "--quiet")
    return openrealm("train", "ict", "--corpus", str(root / "corpus"), "--init", "random", "--config-overrides", TINY,
                     "--output", str(root / name), "--max-steps", "2", "--batch-size", "4", "--logging-steps", "1",
                     "--save-steps", "0", *flags)  # fmt: skip


def test_train_ict_prints_a_bar_and_its_summary_but_not_the_trainer_metric_dicts(world_files):
    result = ict(world_files, "ict")
    assert "2/2" in result.stderr  # the training bar
    assert "'loss'" not in result.stdout + result.stderr and "train_runtime" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("ICT: saved the RealmEmbedder")


def test_train_ict_verbose_prints_the_trainer_metric_dicts(world_files):
    result = ict(world_files, "ict-verbose", "-v")
    assert "train_runtime" in result.stdout + result.stderr


def test_a_job_run_in_process_leaves_the_libraries_logging_as_it_was(world_files):
    import datasets
    import transformers

    from openrealm.trainers.cli import main

    before = (transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled(),
              datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled())  # fmt: skip
    assert main(["corpus", "build", "--input", str(world_files / "world" / "articles.jsonl"), "--output",
                 str(world_files / "corpus-in-process"), "--tokenizer", str(world_files / "tok"),
                 "--quiet"]) == 0  # fmt: skip
    assert (transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled(),
            datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()) == before  # fmt: skip


def test_corpus_build_dropping_duplicates_still_prints_one_bar_and_one_summary_line(world_files):
    articles = (world_files / "world" / "articles.jsonl").read_text()
    (world_files / "twice.jsonl").write_text(articles + articles)
    result = openrealm("corpus", "build", "--input", str(world_files / "twice.jsonl"), "--output",
                       str(world_files / "corpus-twice"), "--tokenizer", str(world_files / "tok"))  # fmt: skip
    assert "Packing articles into blocks" in result.stderr and "Flattening the indices" not in result.stderr
    assert len(result.stdout.splitlines()) == 1 and "duplicate block(s) dropped" in result.stdout
