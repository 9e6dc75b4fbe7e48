"""The knowledge-corpus builder: articles -> blocks of at most 288 wordpieces, stored as Arrow + block records."""

import argparse
import hashlib
import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from datasets import Dataset
from helpers import write_jsonl

from openrealm import BlockRecords, RealmRetriever, RealmTokenizer
from openrealm.tokenization.blocks import BlockBuilder, block_features, document_uid, pack_articles
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import block_columns, load_corpus, save_blocks
from openrealm.tokenization.duplicates import duplicate_rows
from openrealm.tokenization.retriever_inputs import batch_retriever_inputs, block_retriever_inputs
from openrealm.trainers.cli import main
from openrealm.trainers.jobs.corpus_build import run
from openrealm.trainers.options import corpus_build

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    ". , ! ? ( ) & ; ' \" < > - ##s ##ing the a of in and is was to river city nile paris london flow flows egypt "
    "one two three four five six seven eight nine ten alpha beta gamma delta list index outline disambiguation "
    "tom jerry born march atlas"
).split()


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece tokenizer whose words are one wordpiece each (unknown words are one [UNK]): lengths are exact."""
    return RealmTokenizer(vocab={token: i for i, token in enumerate(SPECIAL + WORDS)})


def articles(*pairs: tuple[str, str]) -> Dataset:
    return Dataset.from_list([{"title": title, "text": text} for title, text in pairs])


def numbered_sentences(count: int, words: int) -> list[str]:
    """`count` sentences of `words` vocabulary words plus a full stop (words + 1 wordpieces each)."""
    vocab = "one two three four five six seven eight nine ten".split()
    return [" ".join(vocab[(s + w) % 10] for w in range(words)) + "." for s in range(count)]


class FindParis:
    """A picklable stub span annotator: every "paris" (any case), plus one span running past the sentence's end."""

    name = "find-paris"

    def __call__(self, sentence: str) -> list[tuple[int, int, str]]:
        spans = [(m.start(), m.end(), "LOC") for m in re.finditer("paris", sentence, re.IGNORECASE)]
        return spans + [(0, len(sentence) + 1, "BAD")]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, tokenizer):
    """A small built corpus, shared by the read-only tests (copied before being damaged)."""
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    source = articles(
        ("nile", "The nile flows to egypt. " * 30 + "Paris is a city."),
        ("paris", "Paris is a city. London is a city. Tom was born in Paris."),
    )
    # The repeated nile sentence packs into identical blocks: kept, so that the blocks are the packer's output as is.
    build_corpus(source, out, tokenizer, max_block_length=24, span_annotator=FindParis(), deduplicate=False)
    return out


def test_blocks_stay_within_288_wordpieces(tmp_path, tokenizer):
    text = " ".join(numbered_sentences(200, 9))
    blocks = build_corpus(articles(("alpha beta gamma", text)), tmp_path / "c", tokenizer)
    lengths = [3 + len(title) + len(body) for title, body in zip(blocks["title_ids"], blocks["token_ids"])]
    assert len(blocks) > 1 and max(lengths) <= 288
    assert min(lengths[:-1]) > 288 - 10  # greedy: a block closes only when the next 10-wordpiece sentence won't fit


def test_small_budget_packs_several_blocks_per_article_without_crossing_articles(tmp_path, tokenizer):
    texts = [" ".join(numbered_sentences(12, 4)), " ".join(numbered_sentences(7, 3)), "one two."]
    blocks = build_corpus(articles(*[(f"title {i}", t) for i, t in enumerate(texts)]), tmp_path / "c", tokenizer, 24)
    assert all(3 + len(t) + len(b) <= 24 for t, b in zip(blocks["title_ids"], blocks["token_ids"]))
    for article_id, text in enumerate(texts):
        own = [row for row in blocks if row["article_id"] == article_id]
        assert len(own) > 1 or article_id == 2
        assert " ".join(row["text"] for row in own) == text  # in order, complete, and nothing from another article
        assert {row["title"] for row in own} == {f"title {article_id}"}
    assert blocks["block_id"] == list(range(len(blocks)))
    assert blocks["article_id"] == sorted(blocks["article_id"])


def test_title_counts_against_the_budget(tmp_path, tokenizer):
    text = "one two three. four five. six."  # 4 + 3 + 2 wordpieces
    untitled = build_corpus(articles(("", text)), tmp_path / "a", tokenizer, max_block_length=12)
    titled = build_corpus(articles(("alpha beta", text)), tmp_path / "b", tokenizer, max_block_length=12)
    assert untitled["text"] == ["one two three. four five. six."]  # 3 + 0 + 9 = 12
    assert titled["text"] == ["one two three. four five.", "six."]  # 3 + 2 + 9 > 12
    assert titled["sentence_starts"] == [[0, 4], [0]]


def test_sentence_char_offsets_give_back_the_sentences(corpus_dir):
    blocks = load_corpus(corpus_dir)
    sentences = [
        row["text"][s:e] for row in blocks for s, e in zip(row["sentence_char_starts"], row["sentence_char_ends"])
    ]
    assert sentences == ["The nile flows to egypt."] * 30 + [
        "Paris is a city.",
        "Paris is a city.",
        "London is a city.",
    ] + ["Tom was born in Paris."]


def test_sentence_starts_index_the_wordpieces_of_each_sentence(tmp_path, tokenizer):
    text = "The rivers flowing in Egypt. Zanzibar flows (to Paris)! Atlas, the city of Tom & Jerry; born 1912."
    blocks = build_corpus(articles(("nile rivers", text)), tmp_path / "c", tokenizer, max_block_length=24)
    checked = 0
    for row in blocks:
        bounds = row["sentence_starts"] + [len(row["token_ids"])]
        for k, (s, e) in enumerate(zip(row["sentence_char_starts"], row["sentence_char_ends"])):
            expected = tokenizer(row["text"][s:e], add_special_tokens=False)["input_ids"]
            assert row["token_ids"][bounds[k] : bounds[k + 1]] == expected
            checked += 1
    assert checked == 3 and len(blocks) == 2
    assert blocks[0]["title_ids"] == tokenizer("nile rivers", add_special_tokens=False)["input_ids"]


def test_uid_is_sha1_of_title_sep_text_and_stable_across_builds(tmp_path, tokenizer):
    source = articles(("nile", "The nile flows. " * 20), ("paris", "Paris is a city."))
    first = build_corpus(source, tmp_path / "a", tokenizer, max_block_length=24, deduplicate=False)
    second = build_corpus(source, tmp_path / "b", tokenizer, max_block_length=24, deduplicate=False)
    expected = [hashlib.sha1(f"{r['title']} <sep> {r['text']}".encode()).hexdigest() for r in first]
    assert first["uid"] == expected == second["uid"]
    assert len(expected) == 5 and len(set(expected)) == 2  # the 4 identical nile blocks share one uid


def test_overlong_sentence_is_split_at_word_boundaries_without_losing_text(tmp_path, tokenizer):
    sentence = "one rivers flowing two " * 5 + "three."  # 5 * (1 + 2 + 2 + 1) + 2 = 32 wordpieces
    blocks = build_corpus(articles(("alpha", f"Paris. {sentence} Egypt.")), tmp_path / "c", tokenizer, 12)
    assert " ".join(blocks["text"]) == f"Paris. {sentence.strip()} Egypt."
    assert all(3 + 1 + len(ids) <= 12 for ids in blocks["token_ids"])
    assert sum(len(ids) for ids in blocks["token_ids"]) == 2 + 32 + 2
    for row in blocks:  # no cut inside "rivers" or "flowing": every block re-tokenizes to its own wordpieces
        assert tokenizer(row["text"], add_special_tokens=False)["input_ids"] == row["token_ids"]


def test_overlong_sentence_without_white_space_is_cut_between_words(tmp_path, tokenizer):
    sentence = "-".join(["one", "two", "flowing"] * 4) + "."  # 4 * (1 + 1 + 1 + 1 + 1 + 2) - 1 + 1 = 28 wordpieces
    blocks = build_corpus(articles(("alpha", sentence)), tmp_path / "c", tokenizer, max_block_length=12)
    assert len(blocks) == 4 and "".join(blocks["text"]) == sentence
    for row in blocks:  # cuts fall before a "-" or after it, never inside "flow ##ing"
        assert tokenizer(row["text"], add_special_tokens=False)["input_ids"] == row["token_ids"]
        assert 3 + 1 + len(row["token_ids"]) <= 12


def test_title_longer_than_the_budget_leaves_one_wordpiece_per_block(tmp_path, tokenizer):
    blocks = build_corpus(articles(("alpha beta gamma delta one two", "Nile flows.")), tmp_path / "c", tokenizer, 8)
    assert blocks["text"] == ["Nile", "flows", "."]  # budget max(1, 8 - 3 - 6): packing still advances, text is kept


def test_truncation_configured_in_the_tokenizer_file_does_not_cut_sentences(tmp_path):
    truncating = RealmTokenizer(vocab={token: i for i, token in enumerate(SPECIAL + WORDS)})
    truncating.backend_tokenizer.enable_truncation(max_length=3)  # as all-MiniLM's tokenizer.json ships (128)
    blocks = build_corpus(articles(("nile", "one two three four five.")), tmp_path / "c", truncating)
    assert len(blocks[0]["token_ids"]) == 6


def test_page_filter_drops_list_index_outline_and_disambiguation_pages(tmp_path, tokenizer):
    titles = ["List of rivers", "Index of cities", "Outline of egypt", "Paris (disambiguation)", "Nile", "A List of x"]
    source = articles(*[(title, "The nile flows.") for title in titles])
    kept = build_corpus(source, tmp_path / "a", tokenizer)
    unfiltered = build_corpus(source, tmp_path / "b", tokenizer, page_filter=False)
    assert kept["title"] == ["Nile", "A List of x"] and kept["article_id"] == [4, 5]
    assert unfiltered["title"] == titles


def test_text_is_html_unescaped_but_not_the_title(tmp_path, tokenizer):
    source = articles(("Tom &amp; Jerry", "Tom &amp; Jerry &lt;3 &quot;paris&quot;."))
    blocks = build_corpus(source, tmp_path / "c", tokenizer)
    assert blocks["text"] == ['Tom & Jerry <3 "paris".']
    assert blocks["title"] == ["Tom &amp; Jerry"]  # as Google: only the text is unescaped


def test_spans_land_at_their_offsets_and_spans_leaving_the_sentence_are_dropped(corpus_dir):
    blocks = load_corpus(corpus_dir)
    found = 0
    for row in blocks:
        expected = [(m.start(), m.end()) for m in re.finditer("Paris", row["text"])]
        assert list(zip(row["span_char_starts"], row["span_char_ends"])) == expected
        assert row["span_labels"] == ["LOC"] * len(expected)
        found += len(expected)
    assert found == 3


def test_span_annotator_factory_is_called_once_per_process(tmp_path, tokenizer):
    calls = []

    def factory():
        calls.append(1)
        return FindParis()

    source = articles(("a", "Paris is a city."), ("b", "Paris."), ("c", "The nile."))
    blocks = build_corpus(source, tmp_path / "c", tokenizer, span_annotator=factory, batch_size=1)
    assert len(calls) == 1
    assert blocks["span_char_starts"] == [[0], [0], []]


def test_two_processes_build_the_same_dataset_as_one(tmp_path, tokenizer):
    source = articles(*[(f"t{i}", " ".join(numbered_sentences(3 + i % 5, 4)) + " Paris.") for i in range(40)])
    one = build_corpus(source, tmp_path / "a", tokenizer, 24, num_proc=1, span_annotator=FindParis, batch_size=8)
    two = build_corpus(source, tmp_path / "b", tokenizer, 24, num_proc=2, span_annotator=FindParis, batch_size=8)
    assert len(one) > 40
    assert one.to_dict() == two.to_dict()


class FailOnBoom:
    def __call__(self, sentence: str) -> list:
        if "boom" in sentence:
            raise RuntimeError("annotator failed")
        return []


def test_failure_midway_leaves_neither_output_nor_temporary_folder(tmp_path, tokenizer):
    source = articles(("a", "The nile."), ("b", "Paris."), ("c", "boom."), ("d", "London."))
    with pytest.raises(RuntimeError, match="annotator failed"):
        build_corpus(source, tmp_path / "out", tokenizer, span_annotator=FailOnBoom(), batch_size=1)
    assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_old_corpus_and_a_successful_one_replaces_it(tmp_path, tokenizer):
    build_corpus(articles(("a", "The nile.")), tmp_path / "out", tokenizer)
    with pytest.raises(RuntimeError):
        build_corpus(
            articles(("b", "boom.")), tmp_path / "out", tokenizer, span_annotator=FailOnBoom(), overwrite=True
        )
    assert load_corpus(tmp_path / "out")["text"] == ["The nile."]
    build_corpus(articles(("b", "Paris.")), tmp_path / "out", tokenizer, overwrite=True)
    assert load_corpus(tmp_path / "out")["text"] == ["Paris."]
    assert os.listdir(tmp_path) == ["out"]


def test_existing_output_is_refused_and_only_a_corpus_is_overwritten(tmp_path, tokenizer):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("not a corpus")
    with pytest.raises(FileExistsError, match="already exists"):
        build_corpus(articles(("a", "The nile.")), tmp_path / "out", tokenizer)
    with pytest.raises(FileExistsError, match="not an openrealm corpus"):
        build_corpus(articles(("a", "The nile.")), tmp_path / "out", tokenizer, overwrite=True)
    assert (tmp_path / "out" / "precious.txt").read_text() == "not a corpus"


def damage_config(folder, **changes):
    path = folder / "corpus_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda d: (d / "corpus_config.json").unlink(), FileNotFoundError, "corpus_config.json is missing"),
        (lambda d: (d / "corpus_config.json").write_text("{"), ValueError, "corpus_config.json is not valid JSON"),
        (lambda d: damage_config(d, format="other"), ValueError, "format is 'other'"),
        (lambda d: damage_config(d, format_version=2), ValueError, "unsupported format_version 2"),
        (
            lambda d: damage_config(d, num_blocks=1),
            ValueError,
            r"blocks holds \d+ blocks but .*corpus_config.json says 1",
        ),
        (lambda d: shutil.rmtree(d / "blocks"), FileNotFoundError, "blocks/ is missing"),
        (
            lambda d: BlockRecords.write(d / "block_records.safetensors", [("t", "x")]),
            ValueError,
            r"block_records.safetensors holds 1 blocks but .*blocks holds \d+",
        ),
    ],
    ids=["no-config", "bad-json", "format", "version", "count-vs-config", "no-blocks", "count-vs-records"],
)
def test_load_corpus_names_the_damaged_file(tmp_path, corpus_dir, damage, error, message):
    folder = tmp_path / "copy"
    shutil.copytree(corpus_dir, folder)
    damage(folder)
    with pytest.raises(error, match=message):
        load_corpus(folder)


def test_realm_retriever_serves_the_corpus_texts_and_titles(corpus_dir, tokenizer):
    blocks = load_corpus(corpus_dir)
    retriever = RealmRetriever.from_pretrained(corpus_dir)
    ids = list(range(len(blocks)))
    assert retriever.block_records.texts(ids) == blocks["text"]
    assert retriever.block_records.titles(ids) == blocks["title"]
    assert retriever.tokenizer.get_vocab() == tokenizer.get_vocab()


def test_block_retriever_inputs_layout(tokenizer):
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    inputs = block_retriever_inputs([11, 12], [21, 22, 23], tokenizer)
    assert inputs["input_ids"] == [cls, 11, 12, sep, 21, 22, 23, sep]
    assert inputs["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inputs["attention_mask"] == [1] * 8


def test_block_retriever_inputs_truncate_the_title_first_then_the_body(tokenizer):
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    long_title = block_retriever_inputs(list(range(10, 20)), [21, 22], tokenizer, max_length=8)
    assert long_title["input_ids"] == [cls, 10, 11, 12, 13, 14, sep, sep]
    assert long_title["token_type_ids"] == [0] * 7 + [1]
    long_body = block_retriever_inputs([11, 12], list(range(20, 30)), tokenizer, max_length=8)
    assert long_body["input_ids"] == [cls, 11, 12, sep, 20, 21, 22, sep]


def test_batch_retriever_inputs_pads_to_the_longest_block(tokenizer):
    rows = [{"title_ids": [11], "token_ids": [21, 22, 23]}, {"title_ids": [11, 12], "token_ids": [21]}]
    batch = batch_retriever_inputs(rows, tokenizer)
    pad, cls, sep = tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id
    assert torch.equal(
        batch["input_ids"], torch.tensor([[cls, 11, sep, 21, 22, 23, sep], [cls, 11, 12, sep, 21, sep, pad]])
    )
    assert torch.equal(batch["token_type_ids"], torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1] * 7, [1] * 6 + [0]]))
    columns = {"title_ids": [r["title_ids"] for r in rows], "token_ids": [r["token_ids"] for r in rows]}
    assert torch.equal(batch_retriever_inputs(columns, tokenizer)["input_ids"], batch["input_ids"])


def cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    corpus_build(parser)
    return parser.parse_args(argv)


def test_cli_builds_a_corpus_from_jsonl_with_date_spans(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [{"id": 1, "title": "paris", "text": "Paris was born in March 1912. The city flows."}]
    source = write_jsonl(tmp_path / "a.jsonl", rows)
    args = cli_args(
        "--input", source, "--output", str(tmp_path / "c"), "--tokenizer", str(tmp_path / "tok"), "--spans", "regex"
    )
    assert run(args) == 0
    blocks = load_corpus(tmp_path / "c")
    row = blocks[0]
    assert row["text"] == rows[0]["text"]
    assert [row["text"][s:e] for s, e in zip(row["span_char_starts"], row["span_char_ends"])] == ["March 1912"]
    config = json.loads((tmp_path / "c" / "corpus_config.json").read_text())
    assert config["span_annotators"] == ["date-regex"] and config["num_blocks"] == 1 and config["source"] == source
    assert "Wrote 1 blocks from 1 articles" in capsys.readouterr().out


def test_cli_default_flags_mark_the_dates_of_a_block(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [{"title": "tom", "text": "Tom was born in March 1912. Jerry was born on 4 March 1920 in Paris."}]
    args = cli_args("--input", write_jsonl(tmp_path / "a.jsonl", rows), "--output", str(tmp_path / "c"),
                    "--tokenizer", str(tmp_path / "tok"))  # fmt: skip
    assert run(args) == 0
    row = load_corpus(tmp_path / "c")[0]
    spans = [row["text"][s:e] for s, e in zip(row["span_char_starts"], row["span_char_ends"])]
    assert spans == ["March 1912", "4 March 1920"] and row["span_labels"] == ["DATE", "DATE"]
    assert json.loads((tmp_path / "c" / "corpus_config.json").read_text())["span_annotators"] == ["date-regex"]


def test_cli_none_builds_a_corpus_without_spans(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [{"title": "tom", "text": "Tom was born in March 1912."}]
    args = cli_args("--input", write_jsonl(tmp_path / "a.jsonl", rows), "--output", str(tmp_path / "c"),
                    "--tokenizer", str(tmp_path / "tok"), "--spans", "none")  # fmt: skip
    assert run(args) == 0
    assert load_corpus(tmp_path / "c")[0]["span_char_starts"] == []
    assert json.loads((tmp_path / "c" / "corpus_config.json").read_text())["span_annotators"] == []


def test_cli_refuses_an_existing_output(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_jsonl(tmp_path / "a.jsonl", [{"title": "paris", "text": "Paris."}])
    (tmp_path / "c").mkdir()
    argv = [
        "corpus",
        "build",
        "--input",
        source,
        "--output",
        str(tmp_path / "c"),
        "--tokenizer",
        str(tmp_path / "tok"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("openrealm: error: ") and "already exists" in err and err.count("\n") == 1


def test_jsonl_without_a_text_field_is_an_error_naming_the_file(tmp_path, tokenizer):
    source = write_jsonl(tmp_path / "a.jsonl", [{"title": "paris", "body": "Paris."}])
    with pytest.raises(ValueError, match=r"a\.jsonl, line 1: missing field 'text' \(fields: body, title\)"):
        build_corpus(source, tmp_path / "c", tokenizer)
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


def test_malformed_jsonl_is_an_error_naming_the_file(tmp_path, tokenizer):
    (tmp_path / "a.jsonl").write_text('{"title": "paris", "text": "Paris."}\nnot json\n')
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2: invalid JSON: Expecting value \(column 1\)"):
        build_corpus(str(tmp_path / "a.jsonl"), tmp_path / "c", tokenizer)
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


# Three copies of "nile", two of "paris" and one "london": 6 articles, one block each, 3 of them duplicates.
REPEATED = [
    ("nile", "The nile flows to egypt. Tom was born in March."),
    ("paris", "Paris is a city."),
    ("nile", "The nile flows to egypt. Tom was born in March."),
    ("london", "London is a city."),
    ("nile", "The nile flows to egypt. Tom was born in March."),
    ("paris", "Paris is a city."),
]


def test_duplicate_blocks_are_dropped_by_default_keeping_the_first_of_each(tmp_path, tokenizer):
    blocks = build_corpus(articles(*REPEATED), tmp_path / "c", tokenizer, span_annotator=FindParis())
    assert blocks["title"] == ["nile", "paris", "london"] and blocks["block_id"] == [0, 1, 2]
    assert blocks["article_id"] == [0, 1, 3]
    records = RealmRetriever.from_pretrained(str(tmp_path / "c")).block_records
    assert [(records.title(i), records.text(i)) for i in range(len(records))] == [
        (title, text) for title, text in (REPEATED[0], REPEATED[1], REPEATED[3])
    ]
    row = blocks[1]  # its spans moved with it
    assert [row["text"][s:e] for s, e in zip(row["span_char_starts"], row["span_char_ends"])] == ["Paris"]
    config = json.loads((tmp_path / "c" / "corpus_config.json").read_text())
    assert (config["deduplicate"], config["num_duplicate_blocks"], config["num_duplicates_dropped"]) == (True, 0, 3)
    assert (config["num_blocks"], config["num_articles"], config["num_input_articles"]) == (3, 3, 6)


def test_duplicates_spread_over_several_packed_files_and_record_batches_are_dropped_keeping_the_first_in_order(
    tmp_path, tokenizer
):
    # 2,400 one-block articles of 1,400 distinct (title, text) pairs, packed by two processes: two Arrow files of
    # 1,000-row record batches, duplicates in both and of rows of the other; 1,400 blocks kept (two output batches).
    rng = np.random.default_rng(0)
    distinct = [(f"t{i // 2}", ("The nile flows.", "Paris is a city.")[i % 2]) for i in range(1400)]
    order = np.concatenate([rng.permutation(1400), rng.integers(0, 1400, size=1000)])
    pairs = [distinct[i] for i in order]
    first = sorted({pair: row for row, pair in reversed(list(enumerate(pairs)))}.values())
    blocks = build_corpus(articles(*pairs), tmp_path / "c", tokenizer, num_proc=2, batch_size=200, progress=False)
    assert blocks["article_id"] == first and blocks["block_id"] == list(range(len(first)))
    assert list(zip(blocks["title"], blocks["text"])) == [pairs[row] for row in first]
    records = BlockRecords.open(tmp_path / "c" / "block_records.safetensors")
    assert [(records.title(i), records.text(i)) for i in range(len(records))] == [pairs[row] for row in first]
    config = json.loads((tmp_path / "c" / "corpus_config.json").read_text())
    assert (config["num_blocks"], config["num_articles"], config["num_duplicates_dropped"]) == (1400, 1400, 1000)


def test_passages_are_packed_in_arrow_record_batches_of_1000_blocks_by_default(tmp_path, tokenizer):
    # each record batch of the packed table costs memory while the build holds it: few batches, not one per 256 rows
    passages = Dataset.from_dict({"title": ["paris"] * 2500, "text": [f"Paris {i}." for i in range(2500)]})
    passages = passages.add_column("passage_id", [str(i) for i in range(2500)])
    builder = BlockBuilder(tokenizer, passages=True)
    blocks, _ = pack_articles(passages, builder, str(tmp_path), progress=False)
    assert [len(chunk) for chunk in blocks.data.column("uid").chunks] == [1000, 1000, 500]
    assert blocks["passage_id"] == [str(i) for i in range(2500)]


def packed_blocks(num_rows: int, num_distinct: int) -> Dataset:
    """Blocks as pack_articles returns them (COLUMNS but block_id) in three Arrow chunks: row i is article i, with
    one of num_distinct (title, text) pairs drawn at random, so that later rows repeat earlier ones."""
    from datasets import concatenate_datasets

    features = block_features()
    del features["block_id"]
    rows = []
    for row, pair in enumerate(np.random.default_rng(0).integers(0, num_distinct, size=num_rows).tolist()):
        title, text = f"t{pair}", "one two. " * (pair % 7 + 1)
        rows.append(dict(article_id=row, uid=document_uid(title, text), title=title, text=text, title_ids=[pair]))
        rows[-1].update(token_ids=list(range(pair % 5 + 1)), sentence_starts=[0], sentence_char_starts=[0])
        rows[-1].update(sentence_char_ends=[len(text)], span_char_starts=[0], span_char_ends=[3], span_labels=["LOC"])
    bounds = [0, num_rows // 4, num_rows * 3 // 4, num_rows]
    blocks = concatenate_datasets(
        [Dataset.from_list(rows[a:b], features=features) for a, b in zip(bounds, bounds[1:])]
    )
    return blocks.with_format(None)  # no format columns, as pack_articles's blocks


@pytest.mark.parametrize("max_shard_size", [None, 60_000])
def test_save_blocks_writes_the_files_that_datasets_select_and_save_to_disk_write(
    tmp_path, monkeypatch, max_shard_size
):
    import datasets
    from datasets import Value, load_from_disk

    if max_shard_size is not None:  # 250 KB of rows kept: five shards
        monkeypatch.setattr(datasets.config, "MAX_SHARD_SIZE", max_shard_size)
    blocks = packed_blocks(2600, 1800)
    duplicates = duplicate_rows(blocks.data.column("uid"))
    kept = np.setdiff1d(np.arange(len(blocks)), duplicates)
    expected = blocks.select(kept).flatten_indices()
    expected = expected.add_column("block_id", np.arange(len(kept)), feature=Value("int64"))
    expected.select_columns(block_columns(False)).save_to_disk(tmp_path / "expected")
    written = save_blocks(blocks, tmp_path / "blocks", duplicates, first_block_id=0, columns=block_columns(False))
    assert written == len(kept) == 1362  # two record batches of 1,000 rows at most
    names = sorted(os.listdir(tmp_path / "expected"))
    assert sorted(os.listdir(tmp_path / "blocks")) == names
    assert len(names) == 2 + (1 if max_shard_size is None else 5)  # the shards, state.json, dataset_info.json
    for name in names[:-2]:  # each shard: the same schema (features) and record batches
        ours, theirs = (pa.ipc.open_stream((tmp_path / f / name).read_bytes()) for f in ("blocks", "expected"))
        assert ours.schema.equals(theirs.schema, check_metadata=True)
        assert [batch.num_rows for batch in ours] == [batch.num_rows for batch in theirs], name
    assert load_from_disk(tmp_path / "blocks").data.table.equals(load_from_disk(tmp_path / "expected").data.table)
    assert (tmp_path / "blocks" / "dataset_info.json").read_text() == (
        tmp_path / "expected" / "dataset_info.json"
    ).read_text()
    state, expected_state = (json.loads((tmp_path / f / "state.json").read_text()) for f in ("blocks", "expected"))
    assert state.pop("_fingerprint") != expected_state.pop("_fingerprint") and state == expected_state


def test_duplicate_rows_of_sha1_uids_agree_with_comparing_the_strings_across_chunks():
    rng = np.random.default_rng(0)
    distinct = [hashlib.sha1(str(i).encode()).hexdigest() for i in range(50)]
    uids = [distinct[i] for i in rng.integers(0, 50, size=400)]
    chunked = pa.chunked_array([pa.array(uids[:150]), pa.array(uids[150:])])
    expected = [row for row, uid in enumerate(uids) if uid in uids[:row]]
    assert duplicate_rows(chunked).tolist() == expected
    assert duplicate_rows([uid.upper() for uid in uids]).tolist() == expected  # not lowercase hex: strings compared


# Counts what Arrow allocates while it is the default pool; never freed, since buffers it allocated may outlive a test.
COUNTING_POOL = pa.proxy_memory_pool(pa.default_memory_pool())


def test_duplicate_rows_of_a_memory_mapped_column_copies_only_the_rows_whose_prefix_repeats(tmp_path):
    # 100,000 uids (4.4 MB) in 100 record batches, as a corpus's blocks/ holds them; 990 repeat an earlier one
    uids = [hashlib.sha1(str(i if i % 100 else i // 100).encode()).hexdigest() for i in range(100_000)]
    table = pa.table({"uid": uids})
    with pa.OSFile(str(tmp_path / "uids.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    column = pa.ipc.open_file(pa.memory_map(str(tmp_path / "uids.arrow"))).read_all().column("uid")
    default = pa.default_memory_pool()
    pa.set_memory_pool(COUNTING_POOL)  # its peak is the search's own
    try:
        found = duplicate_rows(column)
    finally:
        pa.set_memory_pool(default)
    assert found.tolist() == [100 * k for k in range(1, 1000) if k % 100]
    assert COUNTING_POOL.max_memory() < table.nbytes / 10  # not a copy of the column: the 1,980 rows compared whole


def test_uids_sharing_their_first_64_bits_are_not_duplicates_unless_equal():
    a, b = "0123456789abcdef" + "0" * 24, "0123456789abcdef" + "1" * 24
    assert duplicate_rows([a, b, a, b]).tolist() == [2, 3]
    assert duplicate_rows([a, b]).tolist() == []


def test_no_deduplicate_keeps_duplicate_blocks_and_counts_them(tmp_path, tokenizer):
    blocks = build_corpus(articles(*REPEATED), tmp_path / "c", tokenizer, deduplicate=False)
    assert blocks["title"] == [title for title, _ in REPEATED]
    config = json.loads((tmp_path / "c" / "corpus_config.json").read_text())
    assert (config["deduplicate"], config["num_duplicate_blocks"], config["num_duplicates_dropped"]) == (False, 3, 0)


def test_a_block_repeated_inside_one_article_is_a_duplicate(tmp_path, tokenizer):
    text = " ".join(numbered_sentences(2, 9) * 2)  # two blocks of the same two sentences at max_block_length 24
    blocks = build_corpus(articles(("alpha", text)), tmp_path / "c", tokenizer, max_block_length=24)
    assert len(blocks) == 1
    assert json.loads((tmp_path / "c" / "corpus_config.json").read_text())["num_duplicates_dropped"] == 1


def test_same_text_under_another_title_is_not_a_duplicate(tmp_path, tokenizer):
    same_text = articles(("paris", "Paris is a city."), ("london", "Paris is a city."))
    blocks = build_corpus(same_text, tmp_path / "c", tokenizer)
    assert len(blocks) == 2


def test_cli_build_says_how_many_duplicates_it_dropped(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_jsonl(tmp_path / "a.jsonl", [{"title": t, "text": x} for t, x in REPEATED])
    assert run(cli_args("--input", source, "--output", str(tmp_path / "c"), "--tokenizer", str(tmp_path / "tok"))) == 0
    captured = capsys.readouterr()
    assert "Wrote 3 blocks from 3 of 6 articles" in captured.out
    assert "(3 duplicate block(s) dropped: the same title and text as an earlier block)" in captured.out
    assert "warning" not in captured.err


def test_cli_build_says_how_many_articles_made_no_block_and_why(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [("List of rivers", "The nile is long."), ("empty", ""), ("blank", "   "), ("nile", "The nile is long.")]
    source = write_jsonl(tmp_path / "a.jsonl", [{"title": t, "text": x} for t, x in rows])
    assert run(cli_args("--input", source, "--output", str(tmp_path / "c"), "--tokenizer", str(tmp_path / "tok"))) == 0
    assert capsys.readouterr().out == (
        f"Wrote 1 blocks from 1 of 4 articles to {tmp_path / 'c'} (1 article(s) dropped by the page filter, which "
        "--no-page-filter turns off; 2 article(s) without text)\n"
    )
    config = json.loads((tmp_path / "c" / "corpus_config.json").read_text())
    assert (config["num_pages_filtered"], config["num_articles_without_text"]) == (1, 2)


def test_cli_build_with_no_deduplicate_warns_about_the_duplicates_it_keeps(tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    source = write_jsonl(tmp_path / "a.jsonl", [{"title": t, "text": x} for t, x in REPEATED])
    argv = (
        "--input",
        source,
        "--output",
        str(tmp_path / "c"),
        "--tokenizer",
        str(tmp_path / "tok"),
        "--no-deduplicate",
    )
    assert run(cli_args(*argv)) == 0
    captured = capsys.readouterr()
    assert "Wrote 6 blocks from 6 articles" in captured.out and "dropped" not in captured.out
    warning = captured.err.splitlines()[-1]
    assert warning.startswith("openrealm corpus build: warning: 3 of 6 blocks duplicate an earlier block")
    assert "without --no-deduplicate" in warning
