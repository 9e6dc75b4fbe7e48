"""Knowledge corpora as users have them (docs/corpus.md): Parquet, CSV, TSV in DPR's psgs_w100.tsv layout, folders
written by datasets' save_to_disk, globs and Hub dataset ids, read by `openrealm corpus build | add | update --input`
through datasets' loaders; `--passages-as-blocks` keeps each passage one block with its passage id."""

import csv
import json
import os
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict
from helpers import BLOCK_TEXTS, fixture_folder, fixture_tokenizer, make_openqa_model

from openrealm import BlockRecords, RealmRetriever
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus, read_corpus_config
from openrealm.tokenization.sources import InputOptions, unquote_cell
from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import evaluate_openqa
from openrealm.trainers.living_corpus import edit_corpus

ROWS = [
    {"id": "1", "title": "the nile", "text": BLOCK_TEXTS[0]},
    {"id": "2", "title": "paris", "text": BLOCK_TEXTS[1]},
    {"id": "3", "title": "london", "text": BLOCK_TEXTS[2]},
]
TOKENIZER = str(fixture_folder("embedder", "safetensors"))


def write_tsv(path: Path, rows: list[dict], columns=("id", "text", "title"), delimiter="\t") -> str:
    """A table in DPR's psgs_w100.tsv layout (header id, text, title; quoted as Python's csv module quotes)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[row[column] for column in columns] for row in rows])
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def build(source, output: Path, **kwargs):
    kwargs.setdefault("page_filter", False)
    return build_corpus(source, output, fixture_tokenizer(), progress=False, **kwargs)


def titles_and_texts(blocks) -> list[tuple[str, str]]:
    return list(zip(blocks["title"], blocks["text"]))


EXPECTED = [(row["title"], row["text"]) for row in ROWS]


# --- Every layout gives the blocks the same rows give as JSONL -------------------------------------------------------


def test_jsonl_parquet_csv_tsv_and_a_saved_dataset_give_the_same_blocks(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    Dataset.from_list(ROWS).save_to_disk(tmp_path / "saved")
    sources = {
        "jsonl": str(jsonl),
        "parquet": write_parquet(tmp_path / "a.parquet", ROWS),
        "csv": write_tsv(tmp_path / "a.csv", ROWS, ("title", "text", "id"), delimiter=","),
        "tsv": write_tsv(tmp_path / "a.tsv", ROWS),
        "saved": str(tmp_path / "saved"),
    }
    for name, source in sources.items():
        assert titles_and_texts(build(source, tmp_path / f"corpus-{name}")) == EXPECTED, name


def arrow_files(folder: Path) -> list[str]:
    """The Arrow files below folder (hidden folders included), relative to it, sorted."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*.arrow"))


def test_once_packed_the_build_removes_its_arrow_copy_of_a_tsv_but_never_a_saved_dataset(tmp_path, monkeypatch):
    from openrealm.tokenization import corpus

    Dataset.from_list(ROWS).save_to_disk(tmp_path / "saved")
    saved_files = {path: (tmp_path / "saved" / path).read_bytes() for path in arrow_files(tmp_path / "saved")}
    arrow_files_when_deduplicating, duplicate_rows = [], corpus.duplicate_rows

    def spy(uids):  # the Arrow files of the build's scratch folder when the duplicate search starts
        scratch = next(path for path in tmp_path.rglob(".scratch") if path.is_dir())
        arrow_files_when_deduplicating.append(arrow_files(scratch))
        return duplicate_rows(uids)

    monkeypatch.setattr(corpus, "duplicate_rows", spy)
    assert titles_and_texts(build(write_tsv(tmp_path / "a.tsv", ROWS), tmp_path / "from-tsv")) == EXPECTED
    assert titles_and_texts(build(str(tmp_path / "saved"), tmp_path / "from-saved")) == EXPECTED
    assert arrow_files_when_deduplicating == [["blocks.arrow"], ["blocks.arrow"]]  # the packed blocks alone
    assert {path: (tmp_path / "saved" / path).read_bytes() for path in arrow_files(tmp_path / "saved")} == saved_files


def test_a_glob_reads_its_files_in_sorted_order(tmp_path):
    (tmp_path / "shards").mkdir()
    write_parquet(tmp_path / "shards" / "part-1.parquet", ROWS[1:])
    write_parquet(tmp_path / "shards" / "part-0.parquet", ROWS[:1])
    blocks = build(str(tmp_path / "shards" / "*.parquet"), tmp_path / "corpus")
    assert titles_and_texts(blocks) == EXPECTED


def test_a_saved_dataset_dict_reads_the_split_asked_for_else_train(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS[:2]), "extra": Dataset.from_list(ROWS[2:])}).save_to_disk(
        tmp_path / "saved"
    )
    assert titles_and_texts(build(str(tmp_path / "saved"), tmp_path / "c1")) == EXPECTED[:2]
    assert (
        titles_and_texts(build(str(tmp_path / "saved"), tmp_path / "c2", input_options=InputOptions(split="extra")))
        == EXPECTED[2:]
    )


def test_tsv_cells_stay_text_na_null_empty_numbers_and_quotes(tmp_path):
    rows = [
        {"id": "007", "title": "NA", "text": 'paris is "the" capital city of france .'},
        {"id": "8", "title": "null", "text": "london is the capital city of england ."},
        {"id": "9", "title": "", "text": "12"},
    ]
    blocks = build(write_tsv(tmp_path / "psgs.tsv", rows), tmp_path / "corpus", passages_as_blocks=True)
    assert blocks["title"] == ["NA", "null", ""]
    assert blocks["text"] == [row["text"] for row in rows]
    assert blocks["passage_id"] == ["007", "8", "9"]


def test_other_column_names_are_read_with_title_and_text_columns(tmp_path):
    rows = [{"heading": row["title"], "body": row["text"]} for row in ROWS]
    blocks = build(
        write_parquet(tmp_path / "a.parquet", rows), tmp_path / "c", input_options=InputOptions("heading", "body")
    )
    assert titles_and_texts(blocks) == EXPECTED


def test_a_hub_dataset_of_several_splits_gives_its_train_split_unless_told(tmp_path, monkeypatch):
    splits = DatasetDict({"test": Dataset.from_list(ROWS[:1]), "train": Dataset.from_list(ROWS[1:])})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split=None: splits if split is None else splits[split])
    assert titles_and_texts(build("someone/corpus", tmp_path / "c1")) == EXPECTED[1:]
    assert (
        titles_and_texts(build("someone/corpus", tmp_path / "c2", input_options=InputOptions(split="test")))
        == EXPECTED[:1]
    )


def test_a_hub_id_is_loaded_with_its_configuration_and_split(tmp_path, monkeypatch):
    """No network: datasets.load_dataset is replaced, and the call it gets is checked."""
    calls = []

    def load_dataset(name, config_name=None, split=None, **kwargs):
        calls.append((name, config_name, split))
        return Dataset.from_list(
            [{"id": row["id"], "url": "u", "title": row["title"], "text": row["text"]} for row in ROWS]
        )

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    blocks = build(
        "wikimedia/wikipedia", tmp_path / "corpus", input_options=InputOptions(input_name="20231101.en", split="train")
    )
    assert calls == [("wikimedia/wikipedia", "20231101.en", "train")]
    assert titles_and_texts(blocks) == EXPECTED


# --- Quotes: one row a TSV line unless --tsv-quoting csv; CSV's quoting checked; no row lost -------------------------

MERGING_QUOTES = [
    '1\t"Hello there, he said.\tT1',
    "2\tSecond passage.\tT2",
    '3\tThird "ends" here.\tT3',
    "4\tFourth.\tT4",
]


def write_text_lines(path: Path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_a_tsv_cell_opening_a_quote_never_swallows_the_rows_after_it(tmp_path, capsys):
    tsv = write_text_lines(tmp_path / "merge.tsv", "id\ttext\ttitle", *MERGING_QUOTES)
    assert main(build_argv(tsv, tmp_path / "corpus", "--passages-as-blocks", "--no-page-filter")) == 0
    blocks = load_corpus(tmp_path / "corpus")
    assert blocks["passage_id"] == ["1", "2", "3", "4"]
    assert blocks["title"] == ["T1", "T2", "T3", "T4"]
    assert blocks["text"] == ['"Hello there, he said.', "Second passage.", 'Third "ends" here.', "Fourth."]


def test_a_tsv_with_a_quote_never_closed_reads_its_header(tmp_path):
    tsv = write_text_lines(tmp_path / "open.tsv", "id\ttext\ttitle", *MERGING_QUOTES[:2])
    blocks = build(tsv, tmp_path / "corpus", passages_as_blocks=True)
    assert blocks["text"] == ['"Hello there, he said.', "Second passage."]


def test_a_tsv_cell_wholly_in_quotes_is_read_as_dpr_writes_it(tmp_path):
    tsv = write_text_lines(
        tmp_path / "psgs_w100.tsv", "id\ttext\ttitle", '1\t"Aaron ( or ; ""Aharon"") is a prophet."\tAaron'
    )
    blocks = build(tsv, tmp_path / "corpus", passages_as_blocks=True)
    assert blocks["text"] == ['Aaron ( or ; "Aharon") is a prophet.']


@pytest.mark.parametrize(
    ("cell", "text"),
    [('"a ""b"" c"', 'a "b" c'), ('""', ""), ('"', '"'), ('"a"b"', '"a"b"'), ('"open', '"open'), ('a "b"', 'a "b"')],
)
def test_only_a_cell_wholly_in_quotes_with_its_inner_quotes_doubled_is_unquoted(cell, text):
    assert unquote_cell(cell) == text


def test_tsv_quoting_none_keeps_every_cell_as_written(tmp_path, capsys):
    tsv = write_text_lines(tmp_path / "a.tsv", "id\ttext\ttitle", '1\t"Quoted text."\t"T1"')
    assert main(build_argv(tsv, tmp_path / "corpus", "--passages-as-blocks", "--tsv-quoting", "none")) == 0
    blocks = load_corpus(tmp_path / "corpus")
    assert (blocks["title"], blocks["text"]) == (['"T1"'], ['"Quoted text."'])


def test_tsv_quoting_csv_reads_tabs_and_line_breaks_in_quoted_cells_and_says_so(tmp_path, capsys):
    tsv = write_text_lines(tmp_path / "a.tsv", "id\ttext\ttitle", '1\t"One\ttab."\tT1', '2\t"Two\nlines."\tT2')
    assert main(build_argv(tsv, tmp_path / "corpus", "--passages-as-blocks", "--tsv-quoting", "csv")) == 0
    assert load_corpus(tmp_path / "corpus")["text"] == ["One\ttab.", "Two\nlines."]
    assert capsys.readouterr().err == (
        f"{tsv}: 2 row(s) from 3 line(s) after the header: quoted cells of 1 row(s) span lines "
        "(the first: row 2, lines 3-4)\n"
    )


def test_a_tab_in_a_quoted_tsv_cell_is_refused_naming_tsv_quoting_csv(tmp_path, capsys):
    tsv = write_text_lines(tmp_path / "a.tsv", "id\ttext\ttitle", '1\t"One\ttab."\tT1')
    out = tmp_path / "corpus"
    assert_refused(
        capsys,
        build_argv(tsv, out),
        out,
        f"{tsv}, row 1 (line 2): 4 cell(s), but the header has 3 (id, text, title); if its quoted cells hold tabs or "
        "line breaks, read it with --tsv-quoting csv",
    )


def test_a_csv_quote_swallowing_the_rows_after_it_is_refused_naming_its_lines(tmp_path, capsys):
    lines = [line.replace("\t", ",") for line in MERGING_QUOTES]
    path = write_text_lines(tmp_path / "merge.csv", "id,text,title", *lines)
    out = tmp_path / "corpus"
    assert_refused(
        capsys, build_argv(path, out), out, f"{path}, line 4: ',' expected after '\"' (the row began on line 2)"
    )


def test_a_csv_cell_with_line_breaks_is_one_row_not_a_lost_one(tmp_path, capsys):
    path = write_text_lines(tmp_path / "a.csv", "id,text,title", '1,"Two\nlines.",T1', "2,One line.,T2")
    assert main(build_argv(path, tmp_path / "corpus", "--passages-as-blocks")) == 0
    assert load_corpus(tmp_path / "corpus")["passage_id"] == ["1", "2"]
    assert "2 row(s) from 3 line(s) after the header: quoted cells of 1 row(s) span lines" in capsys.readouterr().err


def test_a_header_naming_a_column_read_twice_is_refused(tmp_path, capsys):
    tsv = write_text_lines(tmp_path / "a.tsv", "title\ttext\ttitle", "A\tSome text.\tB")
    out = tmp_path / "corpus"
    expected = f"{tsv}: the header names the column 'title' 2 times (title, text, title), so which to read is unclear"
    assert_refused(capsys, build_argv(tsv, out), out, expected)


def test_rows_the_table_reader_loses_are_refused(tmp_path, capsys, monkeypatch):
    from openrealm.tokenization import sources

    read = sources._read_table_file
    monkeypatch.setattr(sources, "_read_table_file", lambda *args: read(*args).select([0, 2]))
    tsv = write_tsv(tmp_path / "psgs.tsv", ROWS)
    out = tmp_path / "corpus"
    expected = f"{tsv}: the TSV reader gave 2 row(s), but the file holds 3 after its header: rows would be lost"
    assert_refused(capsys, build_argv(tsv, out), out, expected)


# --- Passages as blocks ----------------------------------------------------------------------------------------------


def test_passages_as_blocks_keep_one_block_each_with_its_id_in_blocks_and_records(tmp_path):
    long_text = " ".join([BLOCK_TEXTS[0]] * 3)  # 3 sentences that article packing at 24 wordpieces would split
    rows = [
        {"id": "41", "title": "the nile", "text": long_text},
        {"id": "42", "title": "paris", "text": BLOCK_TEXTS[1]},
    ]
    blocks = build(write_tsv(tmp_path / "psgs.tsv", rows), tmp_path / "corpus", passages_as_blocks=True)
    assert blocks["passage_id"] == ["41", "42"] and blocks["text"] == [row["text"] for row in rows]
    records = BlockRecords.open(tmp_path / "corpus" / "block_records.safetensors")
    assert records.passage_ids([1, 0]) == ["42", "41"]
    assert RealmRetriever.from_pretrained(tmp_path / "corpus").block_records.passage_ids([0]) == ["41"]
    config = read_corpus_config(tmp_path / "corpus")
    assert (config["passages_as_blocks"], config["num_passages_cut"]) == (True, 0)


def test_a_passage_longer_than_a_block_is_cut_at_a_word_and_counted(tmp_path, capsys):
    rows = [{"id": "1", "title": "the nile", "text": " ".join([BLOCK_TEXTS[0]] * 3)}, ROWS[1]]
    tsv = write_tsv(tmp_path / "psgs.tsv", rows)
    argv = ["corpus", "build", "--input", tsv, "--output", str(tmp_path / "corpus"), "--tokenizer", TOKENIZER]
    assert main([*argv, "--passages-as-blocks", "--max-block-length", "16", "--no-page-filter", "--quiet"]) == 0
    assert "(1 passage(s) longer than 16 wordpieces with their title: cut to fit one block)" in capsys.readouterr().out
    blocks = load_corpus(tmp_path / "corpus")
    assert len(blocks) == 2 and blocks["passage_id"] == ["1", "2"]
    assert len(blocks[0]["title_ids"]) + len(blocks[0]["token_ids"]) + 3 <= 16
    # [CLS] the nile [SEP] + 11 one-wordpiece words + [SEP]: the passage's first sentence without its full stop
    assert blocks[0]["text"] == "the nile river flows through egypt and the city of cairo"
    assert read_corpus_config(tmp_path / "corpus")["num_passages_cut"] == 1


def test_integer_ids_of_a_parquet_file_are_kept_as_strings(tmp_path):
    rows = [{**row, "id": int(row["id"])} for row in ROWS]
    blocks = build(write_parquet(tmp_path / "a.parquet", rows), tmp_path / "c", passages_as_blocks=True)
    assert blocks["passage_id"] == ["1", "2", "3"]


def test_passages_without_an_id_column_make_blocks_without_passage_ids(tmp_path):
    rows = [{"title": row["title"], "text": row["text"]} for row in ROWS]
    for name, source in (
        ("parquet", write_parquet(tmp_path / "a.parquet", rows)),
        ("dataset", Dataset.from_list(rows)),
    ):
        blocks = build(source, tmp_path / name, passages_as_blocks=True)
        assert blocks["passage_id"] == [None, None, None], name
        assert RealmRetriever.from_pretrained(tmp_path / name).block_records.passage_ids([0, 2]) == [None, None]


def test_without_passages_as_blocks_articles_are_packed_and_no_id_is_kept(tmp_path):
    blocks = build(write_tsv(tmp_path / "psgs.tsv", ROWS), tmp_path / "corpus")
    assert "passage_id" not in blocks.column_names
    assert not BlockRecords.open(tmp_path / "corpus" / "block_records.safetensors").has_passage_ids


def test_corpus_add_to_a_corpus_of_passages_keeps_the_new_ids_beside_the_old(tmp_path):
    build(write_tsv(tmp_path / "psgs.tsv", ROWS[:2]), tmp_path / "corpus", passages_as_blocks=True)
    summary = edit_corpus(tmp_path / "corpus", add=write_tsv(tmp_path / "new.tsv", ROWS[2:]), progress=False)
    assert summary["added_block_ids"] == [2, 3]
    assert load_corpus(tmp_path / "corpus")["passage_id"] == ["1", "2", "3"]
    assert RealmRetriever.from_pretrained(tmp_path / "corpus").block_records.passage_ids([0, 1, 2]) == ["1", "2", "3"]


def test_corpus_add_and_update_read_parquet_with_other_column_names(tmp_path, capsys):
    build(write_tsv(tmp_path / "psgs.tsv", ROWS[:2]), tmp_path / "corpus")
    new = write_parquet(tmp_path / "new.parquet", [{"heading": "london", "body": BLOCK_TEXTS[2]}])
    argv = ["--corpus", str(tmp_path / "corpus"), "--input", new, "--title-column", "heading", "--text-column", "body"]
    assert main(["corpus", "add", *argv, "-q"]) == 0
    changed = write_parquet(tmp_path / "changed.parquet", [{"heading": "london", "body": BLOCK_TEXTS[4]}])
    argv[3] = changed
    assert main(["corpus", "update", *argv, "-q"]) == 0
    records = RealmRetriever.from_pretrained(tmp_path / "corpus").block_records
    assert [records.record(i) for i in (2, 3)] == [
        {"title": "london", "text": BLOCK_TEXTS[2]},
        {"title": "london", "text": BLOCK_TEXTS[4]},
    ]


def test_evaluate_names_the_passage_ids_of_the_blocks_it_read(tmp_path):
    model = make_openqa_model(seed=0)
    records = BlockRecords.write(
        tmp_path / "block_records.safetensors",
        [(f"title {i}", text, f"dpr-{i}") for i, text in enumerate(BLOCK_TEXTS)],
        passage_ids=True,
    )
    model.retriever = RealmRetriever(records, model.retriever.tokenizer, index=model.retriever.index)
    results = evaluate_openqa(model, [{"question": "where does the nile flow ?", "answers": ["egypt"]}], num_blocks=2)
    prediction = results["predictions"][0]
    assert prediction["passage_ids"] == [f"dpr-{i}" for i in prediction["block_ids"]]
    assert prediction["predicted_passage_id"] == f"dpr-{prediction['predicted_block_id']}"


# --- Bad input: the file, the row, the column; nothing written -------------------------------------------------------


def assert_refused(capsys, argv: list[str], output: Path, *message_parts: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("openrealm: error: ") and err.count("\n") == 1, err
    for part in message_parts:
        assert part in err, err
    assert not output.exists()


def build_argv(source: str, output: Path, *extra: str) -> list[str]:
    return ["corpus", "build", "--input", source, "--output", str(output), "--tokenizer", TOKENIZER, "-q", *extra]


def test_a_missing_column_is_named_with_the_columns_found(tmp_path, capsys):
    rows = [{"id": row["id"], "text": row["text"], "name": row["title"]} for row in ROWS]
    tsv = write_tsv(tmp_path / "psgs.tsv", rows, ("id", "text", "name"))
    out = tmp_path / "corpus"
    assert_refused(
        capsys, build_argv(tsv, out), out, tsv, "no column 'title'", "columns: id, text, name", "--title-column"
    )


def test_a_missing_value_names_the_file_the_row_and_the_column(tmp_path, capsys):
    path = write_parquet(tmp_path / "a.parquet", [ROWS[0], ROWS[1], {**ROWS[2], "text": None}])
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(path, out), out, f"{path}, row 3: no value in column 'text'")


@pytest.mark.parametrize("cells", [["2", BLOCK_TEXTS[1]], ["2", BLOCK_TEXTS[1], "paris", "extra"]])
def test_a_tsv_row_with_other_cells_than_the_header_names_its_row_and_line(tmp_path, capsys, cells):
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text(f"id\ttext\ttitle\n1\t{BLOCK_TEXTS[0]}\tthe nile\n" + "\t".join(cells) + "\n")
    out = tmp_path / "corpus"
    expected = f"{tsv}, row 2 (line 3): {len(cells)} cell(s), but the header has 3 (id, text, title)"
    assert_refused(capsys, build_argv(str(tsv), out), out, expected)


def test_a_tsv_that_is_not_utf8_is_refused_naming_it(tmp_path, capsys):
    tsv = tmp_path / "psgs.tsv"
    tsv.write_bytes(b"id\ttext\ttitle\n1\tcaf\xe9\tthe nile\n")
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(str(tsv), out), out, f"{tsv}: not UTF-8 text")


def arrow_batch_ends(path: Path) -> list[int]:
    """The byte offset after each record batch of an Arrow stream file."""
    with pa.memory_map(str(path)) as source:
        reader, ends = pa.ipc.open_stream(source), []
        for _ in reader:
            ends.append(source.tell())
    return ends


@pytest.mark.parametrize("cut", ["in a batch", "between batches"])
def test_a_saved_dataset_whose_arrow_file_is_cut_short_is_refused_naming_the_file(tmp_path, capsys, cut):
    Dataset.from_list(ROWS * 400).save_to_disk(tmp_path / "saved")  # 1200 rows: two record batches
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    ends = arrow_batch_ends(arrow)
    os.truncate(arrow, ends[0] if cut == "between batches" else ends[1] - 100)
    capsys.readouterr()  # save_to_disk's progress bar
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(str(tmp_path / "saved"), out), out, f"{arrow}: not a whole Arrow file")


def test_a_saved_dataset_whose_state_json_is_not_json_is_refused_naming_it(tmp_path, capsys):
    Dataset.from_list(ROWS).save_to_disk(tmp_path / "saved")
    (tmp_path / "saved" / "state.json").write_text("not json {")
    capsys.readouterr()  # save_to_disk's progress bar
    out = tmp_path / "corpus"
    expected = f"{tmp_path / 'saved' / 'state.json'}: not JSON: Expecting value: line 1 column 1 (char 0)"
    assert_refused(capsys, build_argv(str(tmp_path / "saved"), out), out, expected)


def test_a_column_of_numbers_is_named_with_its_type(tmp_path, capsys):
    path = write_parquet(tmp_path / "a.parquet", [{"title": "t", "text": 5}])
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(path, out), out, path, "column 'text' (text) holds int64, not strings")


def test_a_named_id_column_must_be_there(tmp_path, capsys):
    tsv = write_tsv(tmp_path / "psgs.tsv", ROWS)
    out = tmp_path / "corpus"
    argv = build_argv(tsv, out, "--passages-as-blocks", "--id-column", "pid")
    assert_refused(capsys, argv, out, tsv, "no column 'pid'", "columns: id, text, title", "--id-column")


def test_an_id_column_without_passages_as_blocks_is_refused(tmp_path, capsys):
    tsv = write_tsv(tmp_path / "psgs.tsv", ROWS)
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(tsv, out, "--id-column", "id"), out, "--passages-as-blocks")


def test_a_glob_matching_nothing_is_refused(tmp_path, capsys):
    out = tmp_path / "corpus"
    assert_refused(capsys, build_argv(str(tmp_path / "*.parquet"), out), out, "no file matches")


# --- A user's road: DPR's TSV -> corpus build --passages-as-blocks -> index build -> ask -----------------------------


def test_cli_walk_from_a_dpr_tsv_to_answers_naming_their_passage_ids(tmp_path, capsys):
    rows = [{"id": str(100 + i), "title": f"title {i}", "text": text} for i, text in enumerate(BLOCK_TEXTS)]
    tsv = write_tsv(tmp_path / "psgs_w100.tsv", rows)
    corpus = tmp_path / "corpus"
    assert main(build_argv(tsv, corpus, "--passages-as-blocks", "--no-page-filter")) == 0
    assert f"Wrote {len(rows)} blocks from {len(rows)} passages" in capsys.readouterr().out
    model = make_openqa_model(seed=0)
    model.embedder.save_pretrained(tmp_path / "embedder")
    assert main(["index", "build", "--embedder", str(tmp_path / "embedder"), "--corpus", str(corpus), "--output",
                 str(corpus / "block_index"), "--layout", "plain", "--quiet"]) == 0  # fmt: skip
    model.retriever = RealmRetriever.from_pretrained(corpus)
    model.save_pretrained(tmp_path / "model")
    capsys.readouterr()
    assert (
        main(["ask", "--model", str(tmp_path / "model"), "--json", "--top-k", "2", "where does the nile flow ?"]) == 0
    )
    answers = json.loads(capsys.readouterr().out)["answers"]
    assert [answer["passage_id"] for answer in answers] == [str(100 + answer["block_id"]) for answer in answers]
    assert main(["ask", "--model", str(tmp_path / "model"), "where does the nile flow ?"]) == 0
    assert f"block {answers[0]['block_id']} (passage {answers[0]['passage_id']})" in capsys.readouterr().out
