"""The `openrealm` command line: convert a legacy folder, ask questions."""

import io
import json
import subprocess
import sys

import pytest
from helpers import BLOCK_TEXTS, fixture_folder, make_openqa_model

from openrealm.trainers import cli
from openrealm.trainers.cli import main


def test_convert_writes_the_new_layout_and_overwrite_replaces_its_model_files(tmp_path, capsys):
    destination = tmp_path / "converted"
    assert main(["convert", str(fixture_folder("openqa", "hub")), str(destination)]) == 0
    assert (destination / "block_records.safetensors").is_file()
    (destination / "model-00002-of-00002.safetensors").write_bytes(b"a shard of an earlier run")
    assert main(["convert", str(fixture_folder("openqa", "hub")), str(destination), "--overwrite"]) == 0
    assert not (destination / "model-00002-of-00002.safetensors").exists()
    assert "Converted" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["convert", str(fixture_folder("embedder", "hub"))], ["world", "--num-people", "4", "--quiet", "--output"]],
    ids=["convert", "world"],
)
def test_an_existing_output_is_refused_naming_the_overwrite_flag(argv, tmp_path, capsys):
    assert main([*argv, str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    expected = (
        f"{tmp_path / 'out'} already exists: choose another folder, or pass --overwrite (overwrite=True in Python)"
    )
    assert error == f"openrealm: error: {expected}"


def test_ask_prints_answers_with_their_blocks_as_json(tmp_path, capsys):
    make_openqa_model(seed=0).save_pretrained(tmp_path)
    assert main(["ask", "--model", str(tmp_path), "--json", "--top-k", "2", "where does the nile flow ?"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["question"] == "where does the nile flow ?"
    assert len(line["answers"]) == 2
    assert all(answer["text"] in BLOCK_TEXTS for answer in line["answers"])


def test_ask_reads_questions_from_stdin(tmp_path, capsys, monkeypatch):
    make_openqa_model(seed=0).save_pretrained(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("where does the nile flow ?\n\nwho was born in paris ?\n"))
    assert main(["ask", "--model", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 2 and "who was born in paris ?" in out


# --- lazy parsers: help imports only what it shows ---------------------------------------------------------------


def test_a_job_help_lists_the_job_options():
    help_text = subprocess.run(
        [sys.executable, "-m", "openrealm", "train", "pretrain", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "--shard-index" in help_text and "--refresh-every" in help_text


def modules_imported_by(*argv: str) -> set[str]:
    """The modules `python -X importtime -m openrealm ARGV` imported (its help must print)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "openrealm", *argv], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: openrealm"), result.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}


HEAVY = {"torch", "transformers", "datasets"}  # every job module but quickstart's and world's imports one of them


def test_openrealm_help_imports_neither_torch_transformers_nor_datasets():
    imported = modules_imported_by("--help")
    assert "openrealm.trainers.cli" in imported
    assert not HEAVY & imported


@pytest.mark.parametrize("job", [[group] if command is None else [group, command] for group, command in cli.JOBS])
def test_every_job_help_imports_neither_torch_transformers_nor_datasets(job):
    assert not HEAVY & modules_imported_by(*job, "--help")


SPAWNING_COMMAND = """
import multiprocessing


def child_knows_realm():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import openrealm  # noqa: F401 - already imported while the child unpickled this module

    return "realm" in CONFIG_MAPPING


if __name__ == "__main__":
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import openrealm  # noqa: F401

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print("realm" in CONFIG_MAPPING, pool.apply(child_knows_realm))
"""


def test_a_spawned_child_of_the_command_line_registers_realm_on_import(tmp_path):
    # A script named `openrealm` (as the console script is) defers registration to its command; its spawned children
    # (the quickstart's parallel stages) inherit that sys.argv but run no command, so they must register on import:
    # without it, each loaded the corpus tokenizer through a trust_remote_code prompt and hung.
    script = tmp_path / "openrealm"
    script.write_text(SPAWNING_COMMAND)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True"]


def test_the_command_line_registers_realm_before_a_command_runs(tmp_path):
    # `python -m openrealm` defers the package root's registration with transformers to the command: the
    # question-answering pipeline must still exist when `ask` runs.
    make_openqa_model(seed=0).save_pretrained(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "openrealm", "ask", "--model", str(tmp_path), "--json", BLOCK_TEXTS[0]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout.splitlines()[-1])["answers"][0]
    assert {"answer", "score", "block_id", "title", "text"} <= set(answer)


def test_every_command_takes_quiet_and_verbose_as_the_readme_says(capsys):
    commands = [["convert"], ["ask"], *([group, *([command] if command else [])] for group, command in cli.JOBS)]
    for words in commands:
        with pytest.raises(SystemExit) as exited:
            cli.build_parser([*words, "--help"]).parse_args([*words, "--help"])
        assert exited.value.code == 0
        usage = capsys.readouterr().out
        assert "-q, --quiet" in usage and "-v, --verbose" in usage, words
