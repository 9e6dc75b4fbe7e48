"""`openrealm index build` with bad input: a missing corpus, wordpiece ids outside the vocabulary and a damaged
corpus tokenizer are named (block, file), exit 2."""

import json
import os
import shutil

import pytest
from helpers import NILE_ARTICLE, fixture_folder, one_error_line, refused_argument, write_lines

from openrealm.tokenization.corpus import build_corpus
from openrealm.trainers.cli import main


def corpus_with_id(tmp_path, column: str, block: int, value: int) -> str:
    """A corpus of three articles (the fixture tokenizer: 158 wordpieces) whose `column` of `block` starts with
    `value`, as a hand edit of the Arrow file would leave it."""
    from datasets import load_from_disk
    from helpers import fixture_tokenizer

    articles = [{"title": name, "text": f"{name} is a city."} for name in ("paris", "london", "nile")]
    source = write_lines(tmp_path / "a.jsonl", *map(json.dumps, articles))
    folder = tmp_path / "corpus"
    build_corpus(source, folder, fixture_tokenizer(), progress=False)
    blocks = load_from_disk(str(folder / "blocks"))
    edited = blocks.map(lambda row, i: {column: [value, *row[column][1:]] if i == block else row[column]},
                        with_indices=True)  # fmt: skip
    edited.save_to_disk(str(tmp_path / "edited"))
    shutil.rmtree(folder / "blocks")
    os.rename(tmp_path / "edited", folder / "blocks")
    return str(folder)


def test_index_build_with_a_missing_corpus_exits_2_with_one_line(tmp_path, capsys):
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = [
        "index",
        "build",
        "--embedder",
        embedder,
        "--corpus",
        str(tmp_path / "nope"),
        "--output",
        str(tmp_path / "i"),
    ]
    assert main(argv) == 2
    assert one_error_line(capsys) == f"openrealm: error: corpus folder not found: {tmp_path / 'nope'}"
    assert not (tmp_path / "i").exists()


@pytest.mark.parametrize(
    ("column", "value", "allowed"),
    [("token_ids", -5, "0 to 157, the vocabulary of"), ("title_ids", 158, "0 to 157, the vocabulary of")],
    ids=["negative", "beyond-the-vocabulary"],
)
def test_index_build_names_the_block_holding_a_wordpiece_id_outside_the_vocabulary(
    tmp_path, capsys, column, value, allowed
):
    corpus_dir = corpus_with_id(tmp_path, column, 1, value)
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = ["index", "build", "--embedder", embedder, "--corpus", corpus_dir, "--output", str(tmp_path / "index")]
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {corpus_dir}/blocks: block 1 holds wordpiece id {value} in {column}, outside {allowed} "
        f"{corpus_dir}/tokenizer.json: the blocks were changed after corpus build"
    )
    assert not (tmp_path / "index").exists()


def test_index_build_names_a_damaged_corpus_tokenizer_file(tmp_path, capsys):
    from helpers import fixture_tokenizer

    build_corpus(write_lines(tmp_path / "a.jsonl", json.dumps(NILE_ARTICLE)), tmp_path / "corpus", fixture_tokenizer())
    (tmp_path / "corpus" / "tokenizer.json").write_text("{\n", encoding="utf-8")
    embedder = str(fixture_folder("embedder", "safetensors"))
    argv = ["index", "build", "--embedder", embedder, "--corpus", str(tmp_path / "corpus")]
    argv += ["--output", str(tmp_path / "i")]
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(
        f"openrealm: error: {tmp_path / 'corpus' / 'tokenizer.json'} is not a tokenizer file: EOF while parsing"
    )
    assert not (tmp_path / "i").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--max-length 0", "must be an integer of at least 4, got 0"),
        ("--version -1", "must be a non-negative integer (0 or more), got -1"),
        ("--keep 0", "must be a positive integer (at least 1), got 0"),
        ("--num-shards 0", "must be a positive integer (at least 1), got 0"),
        ("--num-workers -1", "must be a non-negative integer (0 or more), got -1"),
    ],
    ids=["max-length", "version", "keep", "num-shards", "num-workers"],
)
def test_an_index_build_option_out_of_its_range_is_refused_naming_it(tmp_path, capsys, option, message):
    argv = ["index", "build", "--embedder", "E", "--corpus", "C", "--output", str(tmp_path / "i"), *option.split()]
    line = refused_argument(argv, capsys)
    assert line == f"openrealm index build: error: argument {option.split()[0]}: {message}"
    assert not (tmp_path / "i").exists()
