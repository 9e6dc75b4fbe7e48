"""`openrealm world` with bad input: `--overwrite` replaces only a world and a vocabulary that `world` wrote, never a
corpus, a model or a folder of notes given as --output or --tokenizer-output; a refusal writes nothing."""

import os

import pytest
from helpers import one_error_line

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


@pytest.mark.parametrize("vocab_size", ["5", "30"])
def test_world_with_a_vocab_size_too_small_writes_neither_output(tmp_path, capsys, vocab_size):
    argv = world_argv(tmp_path / "w", "--tokenizer-output", str(tmp_path / "tok"), "--vocab-size", vocab_size)
    assert main(argv) == 2
    assert "vocab_size" in one_error_line(capsys)
    assert os.listdir(tmp_path) == []
