"""`openrealm push`: the open-QA folder is uploaded with a model card whose metadata carries the evaluation results
(model-index), the corpus and the citation; no network (a recording stand-in for HfApi)."""

import json
import shutil
import subprocess
import sys
import threading

import pytest
import torch
import yaml
from helpers import BLOCK_TEXTS, LOCK_HOLDER, WAIT_SECONDS, RecordingHfApi, make_openqa_model
from huggingface_hub import ModelCard

from openrealm.hub_cards import realm_model_card
from openrealm.hub_cards.model_card import REALM_BIBTEX, openqa_model_card, written_by_openrealm
from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import evaluate_openqa, write_results
from openrealm.trainers.living_corpus import edit_corpus
from openrealm.trainers.openqa import save_finetuned
from openrealm.trainers.publishing import push_openqa_model

PUSH_WAIT_SECONDS = 30  # for a push to start waiting for the writer holding the folder's lock
QUESTIONS = [
    {"question": "where does the nile flow ?", "answers": ["egypt"]},
    {"question": "which river flows through london ?", "answers": ["thames"]},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.set_num_threads(1)
    model = make_openqa_model(seed=0)
    path = tmp_path_factory.mktemp("push") / "realm-openqa"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def results_file(folder, tmp_path_factory):
    model = make_openqa_model(seed=0)
    results = evaluate_openqa(model, QUESTIONS, num_blocks=2, recall_ks=(1, 5))
    results.update(dataset="qa/test.jsonl", dataset_name="toy-qa", split="test", retrieval="dense")
    return write_results(results, tmp_path_factory.mktemp("eval") / "test.json")


def card_metadata(card_text: str) -> dict:
    return yaml.safe_load(card_text.split("---")[1])


def test_push_uploads_model_tokenizer_corpus_index_code_and_card(folder, results_file):
    api = RecordingHfApi()
    url = push_openqa_model(folder, "me/realm-toy", eval_results=[results_file], private=True, api=api)
    assert url == "https://huggingface.co/me/realm-toy/commit/0" and api.repos == [("me/realm-toy", True)]
    uploaded = api.uploads["me/realm-toy"]
    assert {
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "block_records.safetensors",
        "block_index/index_config.json",
        "modeling_realm.py",
        "pipeline_realm.py",
    } <= set(uploaded)
    assert uploaded["README.md"] == (folder / "README.md").read_bytes()  # the card is kept in the folder too


def test_hidden_temporaries_and_checkpoints_are_not_uploaded(folder, results_file):
    (folder / ".README.md-abc123").write_text("half-written")
    (folder / "checkpoint-5").mkdir(exist_ok=True)
    (folder / "checkpoint-5" / "optimizer.pt").write_bytes(b"state")
    api = RecordingHfApi()
    try:
        push_openqa_model(folder, "me/realm-toy", eval_results=[results_file], api=api)
    finally:
        (folder / ".README.md-abc123").unlink()
        (folder / "checkpoint-5" / "optimizer.pt").unlink()
        (folder / "checkpoint-5").rmdir()
    uploaded = set(api.uploads["me/realm-toy"])
    assert "README.md" in uploaded and not any(path.startswith((".", "checkpoint-")) for path in uploaded)


def test_card_model_index_holds_the_evaluation_results(folder, results_file):
    api = RecordingHfApi()
    push_openqa_model(folder, "me/realm-toy", eval_results=[results_file], api=api)
    results = json.loads(results_file.read_text())
    metadata = card_metadata(api.uploads["me/realm-toy"]["README.md"].decode())
    (entry,) = metadata["model-index"]
    assert entry["name"] == "me/realm-toy"
    (result,) = entry["results"]
    assert result["task"]["type"] == "question-answering"
    assert result["dataset"] == {"name": "toy-qa", "type": "toy-qa", "split": "test"}
    metrics = {metric["type"]: metric["value"] for metric in result["metrics"]}
    assert metrics == {
        "exact_match": round(results["exact_match"], 2),
        "recall@1": round(results["recall@1"], 2),
        "recall@5": round(results["recall@5"], 2),
        "reader_oracle": round(results["reader_oracle"], 2),
    }
    assert metadata["pipeline_tag"] == "question-answering" and "realm" in metadata["tags"]


def test_card_names_the_corpus_and_cites_realm(tmp_path):
    corpus = tmp_path / "wiki-blocks"
    corpus.mkdir()
    (corpus / "corpus_config.json").write_text(json.dumps({"num_blocks": 4667, "num_articles": 2515}))
    summary = {"max_steps": 300, "learning_rate": 1e-5, "batch_size": 16, "train": "webquestions/train.jsonl"}
    card = openqa_model_card([], model_name="me/realm", training_summary=summary, corpus=str(corpus))
    text = str(card)
    for line in (
        "knowledge corpus: `wiki-blocks`",
        "blocks: 4667",
        "articles: 2515",
        "steps: 300",
        "learning rate: 1e-05",
    ):
        assert line in text, line
    assert REALM_BIBTEX in text and "No evaluation results were given." in text
    assert "model-index" not in card_metadata(text)


def test_card_results_table_has_one_row_per_evaluation():
    evaluations = [
        {"dataset_name": "nq_open", "split": "dev", "exact_match": 40.0, "recall@5": 60.0, "count": 10},
        {"dataset_name": "curatedtrec", "split": "test", "exact_match": 20.5, "recall@5": 30.25, "match": "regex"},
    ]
    card = ModelCard(str(openqa_model_card(evaluations, model_name="me/realm")))
    assert "| nq_open | dev | 10 | unknown | dense | 40.00 | 60.00 | unknown |" in card.text
    assert "| curatedtrec | test | unknown | unknown | dense | 20.50 | 30.25 | unknown |" in card.text
    assert {result.dataset_name for result in card.data.eval_results} == {"nq_open", "curatedtrec"}


def test_pretraining_cards_still_work():
    card = realm_model_card("embedder", {"max_steps": 2, "num_blocks": len(BLOCK_TEXTS)})
    assert "steps: 2" in card.text and f"blocks: {len(BLOCK_TEXTS)}" in card.text


def test_cli_pushes_with_the_results(folder, results_file, monkeypatch, capsys):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    argv = ["push", "--model", str(folder), "--repo-id", "me/realm-cli", "--eval-results", str(results_file)]
    assert main(argv) == 0
    assert api.repos == [("me/realm-cli", False)]
    assert b"exact_match" in api.uploads["me/realm-cli"]["README.md"]
    assert "Pushed" in capsys.readouterr().out


def test_an_incomplete_folder_is_refused_before_any_upload(folder, tmp_path):
    api = RecordingHfApi()
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors.*block_records.safetensors.*block_index"):
        push_openqa_model(partial, "me/x", api=api)
    assert api.repos == [] and api.uploads == {}


def test_results_without_exact_match_are_refused(folder, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"recall@5": 1.0}))
    with pytest.raises(ValueError, match="exact_match"):
        push_openqa_model(folder, "me/x", eval_results=[bad], api=RecordingHfApi())


def test_push_with_demo_uploads_a_space_ready_app_and_a_card_that_explains_it(folder, results_file, monkeypatch):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    argv = ["push", "--model", str(folder), "--repo-id", "me/realm-toy", "--eval-results", str(results_file)]
    try:
        assert main([*argv, "--with-demo"]) == 0
    finally:
        written = {name: (folder / name).read_bytes() for name in ("app.py", "openrealm_demo.py", "requirements.txt")}
        for name in written:
            (folder / name).unlink()
    uploaded = api.uploads["me/realm-toy"]
    assert {name: uploaded[name] for name in written} == written
    assert b"build_demo('me/realm-toy')" in uploaded["app.py"]
    card = uploaded["README.md"].decode()
    assert "## Demo" in card and "hf download me/realm-toy app.py openrealm_demo.py requirements.txt" in card


def test_push_without_demo_uploads_no_app(folder, results_file):
    api = RecordingHfApi()
    push_openqa_model(folder, "me/realm-toy", eval_results=[results_file], api=api)
    uploaded = api.uploads["me/realm-toy"]
    assert "app.py" not in uploaded and "## Demo" not in uploaded["README.md"].decode()


def test_without_eval_results_the_card_keeps_the_folders_own_dev_results_and_training_summary(folder, results_file):
    dev = json.loads(results_file.read_text()) | {"dataset": "dev.jsonl", "dataset_name": "toy-dev", "split": "dev"}
    (folder / "dev_results.json").write_text(json.dumps(dev))
    (folder / "openqa_training.json").write_text(json.dumps({"max_steps": 123, "train": "toy-train"}))
    api = RecordingHfApi()
    try:
        push_openqa_model(folder, "me/realm-toy", api=api)
    finally:
        (folder / "dev_results.json").unlink()
        (folder / "openqa_training.json").unlink()
    card = api.uploads["me/realm-toy"]["README.md"].decode()
    (entry,) = card_metadata(card)["model-index"]
    assert [result["dataset"]["name"] for result in entry["results"]] == ["toy-dev"]
    assert "steps: 123" in card and "training data: toy-train" in card


def test_push_replaces_the_card_it_wrote_and_marks_it_as_openrealms(folder, results_file):
    api = RecordingHfApi()
    push_openqa_model(folder, "me/realm-toy", api=api)
    push_openqa_model(folder, "me/realm-toy", eval_results=[results_file], api=api)
    card = (folder / "README.md").read_text()
    assert "model-index" in card_metadata(card) and written_by_openrealm(card)
    assert card.splitlines()[-1].startswith("<!-- written by openrealm (sha256 ")


def test_push_replaces_the_card_train_openqa_wrote(tmp_path):
    save_finetuned(make_openqa_model(seed=0), tmp_path / "openqa", {"num_blocks": 6, "max_steps": 1}, None)
    api = RecordingHfApi()
    push_openqa_model(tmp_path / "openqa", "me/realm-trained", api=api)
    assert "# me/realm-trained" in api.uploads["me/realm-trained"]["README.md"].decode()


def test_the_card_counts_the_blocks_the_model_retrieves_from_not_those_removed(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "model")
    edit_corpus(copy, remove_ids=[0, 1], progress=False)
    api = RecordingHfApi()
    push_openqa_model(copy, "me/realm-toy", api=api)
    assert f"- blocks: {len(BLOCK_TEXTS) - 2}\n" in api.uploads["me/realm-toy"]["README.md"].decode()


@pytest.mark.parametrize("readme", ["keep", "replace"])
def test_push_readme_keep_uploads_a_hand_written_readme_and_replace_writes_the_card(
    folder, results_file, monkeypatch, capsys, readme
):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    mine = "# My model\n\nNotes of my own.\n"
    (folder / "README.md").write_text(mine)
    argv = ["push", "--model", str(folder), "--repo-id", "me/realm-toy", "--eval-results", str(results_file)]
    try:
        assert main([*argv, "--readme", readme]) == 0
        uploaded = api.uploads["me/realm-toy"]["README.md"].decode()
        assert (uploaded == mine) == (readme == "keep")
        assert ("model-index" in uploaded) == (readme == "replace")
        assert ("with the folder's own README.md" in capsys.readouterr().out) == (readme == "keep")
    finally:
        (folder / "README.md").unlink()


def test_push_waits_for_a_writer_of_the_folder_and_uploads_the_version_it_wrote(folder, tmp_path, waiting):
    # a save of the folder (e.g. `train openqa --overwrite`) holds its lock: an upload meanwhile would send files of
    # two versions (new weights beside the old index), and the card would be written into the version being replaced
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    api, pushed = RecordingHfApi(), threading.Event()

    def push() -> None:
        push_openqa_model(folder, "me/realm-waits", api=api)
        pushed.set()

    pushing = threading.Thread(target=push)
    pushing.start()
    try:
        assert waiting.wait(PUSH_WAIT_SECONDS), "the push did not wait for the writer"
        assert api.uploads == {} and not pushed.is_set()
    finally:
        holder.communicate("\n", timeout=WAIT_SECONDS)
        pushing.join(WAIT_SECONDS)
    assert pushed.is_set()
    assert api.uploads["me/realm-waits"]["model.safetensors"] == (folder / "model.safetensors").read_bytes()
