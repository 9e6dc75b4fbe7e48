"""`openrealm world` with bad input: sizes, seeds and a vocabulary too small for the world's characters are refused
before either folder is written."""

import pytest
from helpers import one_error_line, refused_argument

from openrealm.trainers.cli import main

SIZES = ["--num-people", "12", "--num-organizations", "3", "--num-cities", "3", "--num-rivers", "2"]
SIZES += ["--num-mountains", "2", "--num-regions", "2"]


def world_argv(tmp_path, *extra: str) -> list[str]:
    return ["world", "--output", str(tmp_path / "w"), *SIZES, "--tokenizer-output", str(tmp_path / "tok"), *extra]


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
    line = refused_argument(world_argv(tmp_path, *option.split()), capsys)
    assert line == f"openrealm world: error: argument {option.split()[0]}: {message}"
    assert not (tmp_path / "w").exists()


def test_a_vocabulary_too_small_for_the_worlds_characters_is_refused_before_the_world_is_written(tmp_path, capsys):
    assert main(world_argv(tmp_path, "--vocab-size", "10")) == 2
    assert one_error_line(capsys) == (
        "openrealm: error: vocab_size 10 is too small: the special tokens and the characters of the texts alone take "
        "77 entries"
    )
    assert not (tmp_path / "w").exists() and not (tmp_path / "tok").exists()
    assert main(world_argv(tmp_path, "--vocab-size", "400")) == 0  # nothing was written: the corrected run works
    assert (tmp_path / "tok" / "vocab.txt").read_text().count("\n") == 400
