"""`openrealm world` with bad input: `--overwrite` replaces only a world and a vocabulary that `world` wrote, never a
corpus, a model or a folder of notes given as --output or --tokenizer-output; sizes, seeds and a vocabulary too small
for the world's characters are refused before either folder is written; a refusal writes nothing."""

import os

import pytest
from helpers import one_error_line, refused_argument

from openrealm.trainers.cli import main

SMALL_WORLD = ["--num-people", "12", "--num-organizations", "3", "--num-cities", "3", "--num-rivers", "2",
               "--num-mountains", "2", "--num-regions", "2"]  # fmt: skip


def contents(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def world_argv(output, *extra: str) -> list[str]:
    return ["world", "--output", str(output), *SMALL_WORLD, *extra]


def test_world_overwrite_refuses_a_folder_of_notes_and_leaves_it(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes\n")
    assert main(world_argv(notes, "--overwrite")) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: Refusing to replace {notes}: it is not a synthetic world (no world_config.json); remove "
        "it yourself or choose another folder"
    )
    assert os.listdir(notes) == ["todo.txt"]


def test_world_overwrite_refuses_a_world_holding_files_it_did_not_write(tmp_path, capsys):
    assert main(world_argv(tmp_path / "w")) == 0
    (tmp_path / "w" / "mine.txt").write_text("kept\n")
    before = contents(tmp_path / "w")
    assert main(world_argv(tmp_path / "w", "--seed", "1", "--overwrite")) == 2
    expected = "it holds files that `openrealm world` did not write (mine.txt); move them out first"
    assert one_error_line(capsys).endswith(expected)
    assert contents(tmp_path / "w") == before


def test_world_overwrite_refuses_a_model_as_tokenizer_output_and_writes_no_world(tmp_path, capsys):
    assert main(world_argv(tmp_path / "w", "--tokenizer-output", str(tmp_path / "model"), "--vocab-size", "400")) == 0
    (tmp_path / "model" / "config.json").write_text("{}\n")  # a model trained with the vocabulary, beside it
    before = contents(tmp_path / "model")
    argv = world_argv(tmp_path / "w2", "--tokenizer-output", str(tmp_path / "model"), "--vocab-size", "400")
    assert main([*argv, "--overwrite"]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: Refusing to replace {tmp_path / 'model'}: it holds files that a vocabulary does not "
        "(config.json); move them out first"
    )
    assert contents(tmp_path / "model") == before
    assert not (tmp_path / "w2").exists()


def test_world_overwrite_refuses_a_tokenizer_it_did_not_train(tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "vocab.txt").write_text("[PAD]\n[unused0]\n[unused1]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    argv = world_argv(tmp_path / "w", "--tokenizer-output", str(bert), "--vocab-size", "400", "--overwrite")
    assert main(argv) == 2
    assert "it is not a vocabulary `openrealm world` trained" in one_error_line(capsys)
    assert os.listdir(bert) == ["vocab.txt"] and not (tmp_path / "w").exists()


def test_world_overwrite_replaces_the_world_and_vocabulary_it_wrote(tmp_path, capsys):
    argv = world_argv(tmp_path / "w", "--tokenizer-output", str(tmp_path / "tok"), "--vocab-size", "400")
    assert main(argv) == 0
    assert main([*argv, "--seed", "1", "--overwrite"]) == 0
    assert '"seed": 1' in (tmp_path / "w" / "world_config.json").read_text()
    assert (tmp_path / "tok" / "vocab.txt").is_file()


def world_and_vocab_argv(tmp_path, *extra: str) -> list[str]:
    return [
        "world",
        "--output",
        str(tmp_path / "w"),
        *SMALL_WORLD,
        "--tokenizer-output",
        str(tmp_path / "tok"),
        *extra,
    ]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--num-people 0", "must be a positive integer (at least 1), got 0"),
        ("--mentions-per-person -1", "must be a non-negative integer (0 or more), got -1"),
        ("--seed -1", "must be an integer from 0 to 2147483647, got -1"),
        ("--vocab-size 0", "must be a positive integer (at least 1), got 0"),
    ],
    ids=["num-people", "mentions-per-person", "seed", "vocab-size"],
)
def test_a_world_option_out_of_its_range_is_refused_naming_it(tmp_path, capsys, option, message):
    line = refused_argument(world_and_vocab_argv(tmp_path, *option.split()), capsys)
    assert line == f"openrealm world: error: argument {option.split()[0]}: {message}"
    assert not (tmp_path / "w").exists()


def test_a_vocabulary_too_small_for_the_worlds_characters_is_refused_before_the_world_is_written(tmp_path, capsys):
    assert main(world_and_vocab_argv(tmp_path, "--vocab-size", "10")) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: vocab_size 10 is too small: the special tokens and the characters of the texts alone take "
        "77 entries"
    )
    assert not (tmp_path / "w").exists() and not (tmp_path / "tok").exists()
    assert (
        main(world_and_vocab_argv(tmp_path, "--vocab-size", "400")) == 0
    )  # nothing was written: the corrected run works
    assert (tmp_path / "tok" / "vocab.txt").read_text().count("\n") == 400
