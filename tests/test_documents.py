"""A folder of documents as people keep them (tokenization/documents.py): `corpus build --input DIR` reads its
.txt, .md, .html and .pdf files, titles from the documents themselves, text as a reader sees it, and names what it
left out."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_WORLD
from transformers import AutoTokenizer

from openrealm import BlockRecords
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.documents import html_text, markdown_text, read_document_folder
from openrealm.tokenization.sources import input_kind
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import cli
from openrealm.trainers.world.synthetic_world import generate_world

MARKDOWN = """---
layout: page
---
# The *Old* Mill

The mill stands by the [river](https://example.org/river) and grinds **wheat**.

- It was built in `1821`.
> Nobody remembers who built it.

```
mill --start
```
"""
HTML = """<html><head><title>Harbour &amp; Docks</title><style>p {color: red}</style></head>
<body><script>var x = 1;</script><h1>Harbour</h1>
<p>Ships dock at the <b>north</b> pier &mdash; daily.</p></body></html>
"""


def pdf_bytes(text: str, title: str | None) -> bytes:
    """A one-page PDF whose text layer holds `text`, with metadata title `title`."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    page = writer.add_blank_page(612, 792)
    font = DictionaryObject(
        {NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
         NameObject("/BaseFont"): NameObject("/Helvetica")}
    )  # fmt: skip
    fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
    page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
    content = DecodedStreamObject()
    content.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())
    page[NameObject("/Contents")] = writer._add_object(content)
    if title:
        writer.add_metadata({"/Title": title})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.fixture
def notes(tmp_path) -> Path:
    """A folder holding one file of each case: documents of every type, and files that cannot be read."""
    root = tmp_path / "notes"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "plain.txt").write_text("The granary holds grain.\n\n\n\nIt  was   rebuilt twice.\n")
    (root / "sub" / "mill.md").write_text(MARKDOWN)
    (root / "sub" / "deeper" / "harbour.html").write_text(HTML)
    (root / "report.pdf").write_bytes(pdf_bytes("The bridge opened in spring.", "Bridge Report"))
    (root / "blank.md").write_text("  \n\n")
    (root / "binary.txt").write_bytes(b"\x00\x01\x02 not text")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / ".git" / "config.md").write_text("# hidden")
    (root / ".hidden.txt").write_text("hidden")
    return root


def test_every_document_type_is_read_with_its_own_title_and_the_text_a_reader_sees(notes):
    read, _ = read_document_folder(notes)
    articles = {a["path"]: (a["title"], a["text"]) for a in read}
    assert articles == {
        "plain.txt": ("plain", "The granary holds grain.\n\nIt was rebuilt twice."),
        "report.pdf": ("Bridge Report", "The bridge opened in spring."),
        "sub/deeper/harbour.html": ("Harbour & Docks", "Harbour\n\nShips dock at the north pier \u2014 daily."),
        "sub/mill.md": (
            "The Old Mill",
            "The mill stands by the river and grinds wheat.\n\nIt was built in 1821.\nNobody remembers who built "
            "it.\n\nmill --start",
        ),
    }
    assert [a["path"] for a in read] == sorted(articles)  # path order


def test_files_that_cannot_be_read_are_counted_and_named_in_one_line(notes):
    _, folder = read_document_folder(notes)
    assert folder.skipped == {
        "binary": ["binary.txt"],
        "empty": ["blank.md"],
        "not UTF-8": ["latin1.txt"],
        "not a document type": ["photo.png"],
    }
    summary = folder.summary()
    assert "\n" not in summary and summary.startswith(f"{notes}: read 4 document(s); left out 4 file(s): ")
    assert "1 binary (binary.txt)" in summary and "1 not UTF-8 (latin1.txt)" in summary


def test_the_summary_names_only_the_first_three_files_of_a_reason(tmp_path):
    for i in range(5):
        (tmp_path / f"empty{i}.txt").write_text("")
    (tmp_path / "real.txt").write_text("Real text.")
    summary = read_document_folder(tmp_path)[1].summary()
    assert "5 empty (empty0.txt, empty1.txt, empty2.txt, ...)" in summary


def test_a_folder_without_a_readable_document_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(ValueError, match=r"no readable document .* read 0 document\(s\); left out 2 file"):
        read_document_folder(tmp_path)


def test_markdown_keeps_link_text_and_drops_targets_marks_and_fences():
    title, text = markdown_text("Intro with ![a map](map.png), <b>bold</b> and a [ref][1].\n\n[1]: https://x.org\n")
    assert (title, text.strip()) == ("", "Intro with a map, bold and a ref.")


def test_markdown_emphasis_is_dropped_but_underscores_inside_words_stay():
    assert markdown_text("Set __max_block_length__ and _not_ my_var_name, *x* ~~y~~.")[1] == (
        "Set max_block_length and not my_var_name, x y."
    )


def test_html_drops_scripts_styles_and_tags_and_converts_entities():
    title, text = html_text(HTML)
    assert (title, text.split()) == ("Harbour & Docks", "Harbour Ships dock at the north pier \u2014 daily.".split())


def test_a_folder_is_read_as_documents_unless_save_to_disk_wrote_it(notes, tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"title": ["t"], "text": ["x"]}).save_to_disk(tmp_path / "saved")
    assert input_kind(str(notes)) == "documents" and input_kind(str(tmp_path / "saved")) == "folder"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    world = generate_world(seed=0, **TINY_WORLD)
    path = tmp_path_factory.mktemp("documents-tokenizer") / "tokenizer"
    train_wordpiece_vocab([*world.texts(), MARKDOWN, HTML], path, vocab_size=600)
    return path


def test_corpus_build_reads_a_folder_of_documents_and_keeps_each_files_path_as_its_passage_id(
    notes, tokenizer_dir, tmp_path
):
    output = tmp_path / "corpus"
    argv = ["corpus", "build", "--input", str(notes), "--tokenizer", str(tokenizer_dir), "--output", str(output)]
    result = subprocess.run(
        [str(Path(sys.executable).parent / "openrealm"), *argv, "--passages-as-blocks", "--no-page-filter"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{notes}: read 4 document(s); left out 4 file(s)" in result.stderr
    blocks = load_corpus(output)
    assert sorted(zip(blocks["title"], blocks["passage_id"])) == [
        ("Bridge Report", "report.pdf"),
        ("Harbour & Docks", "sub/deeper/harbour.html"),
        ("The Old Mill", "sub/mill.md"),
        ("plain", "plain.txt"),
    ]
    mill = blocks["text"][list(blocks["passage_id"]).index("sub/mill.md")]
    assert "grinds wheat" in mill and "**" not in mill and "https" not in mill
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert tokenizer.decode(blocks["title_ids"][0])  # tokenized with the given vocabulary
    assert json.loads((output / "corpus_config.json").read_text())["num_blocks"] == 4


def test_every_block_of_a_document_keeps_its_path_and_the_records_say_the_ids_are_paths(tokenizer_dir, tmp_path):
    notes = tmp_path / "notes"
    (notes / "guide").mkdir(parents=True)
    (notes / "guide" / "long.md").write_text(
        "# Long\n\n" + " ".join(f"the mill grinds wheat {i} ." for i in range(80))
    )
    (notes / "short.txt").write_text("the harbour has a north pier .")
    output = tmp_path / "corpus"
    argv = ["corpus", "build", "--input", str(notes), "--tokenizer", str(tokenizer_dir), "--output", str(output)]
    assert cli.main([*argv, "--max-block-length", "32", "-q"]) == 0
    blocks = load_corpus(output)
    paths = dict(zip(blocks["title"], blocks["passage_id"]))
    assert list(blocks["title"]).count("Long") > 3 and paths == {"Long": "guide/long.md", "short": "short.txt"}
    records = BlockRecords.open(output / "block_records.safetensors")
    assert records.ids_are_paths and records.passage_ids([0]) == ["guide/long.md"]


def test_a_corpus_of_jsonl_articles_keeps_no_ids(tokenizer_dir, tmp_path):
    articles = tmp_path / "articles.jsonl"
    articles.write_text(json.dumps({"title": "Mill", "text": "the mill grinds wheat ."}) + "\n")
    output = tmp_path / "corpus"
    argv = ["corpus", "build", "--input", str(articles), "--tokenizer", str(tokenizer_dir), "--output", str(output)]
    assert cli.main([*argv, "-q"]) == 0
    assert "passage_id" not in load_corpus(output).column_names
    assert not BlockRecords.open(output / "block_records.safetensors").has_passage_ids


def test_corpus_build_from_a_folder_without_documents_exits_2_and_writes_nothing(tokenizer_dir, tmp_path):
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "a.png").write_bytes(b"\x89PNG")
    output = tmp_path / "corpus"
    argv = ["corpus", "build", "--input", str(tmp_path / "pictures"), "--tokenizer", str(tokenizer_dir)]
    assert cli.main([*argv, "--output", str(output)]) == 2
    assert not output.exists()
