"""RealmForOpenQA and RealmRetriever: batching, the old port's defects fixed, provenance, saving a folder that answers
questions on its own, Hub repos, pushing, index swapping and legacy folders."""

import json
import shutil

import pytest
import torch
from helpers import BLOCK_TEXTS, answers_for, fixture_folder, make_openqa_model
from transformers import AutoModel

import openrealm
from openrealm import RealmBlockIndex, RealmForOpenQA, RealmRetriever

QUESTIONS = [
    "where does the nile flow ?",
    "who was a pioneer of computer science ?",
    "what is the capital of france ?",
]


@pytest.fixture(scope="module")
def model():
    return make_openqa_model(seed=0)


def test_batch_of_questions_gives_the_same_answers_as_one_at_a_time(model, tokenizer):
    answers = [answers_for(tokenizer, "egypt"), answers_for(tokenizer, "alan turing"), answers_for(tokenizer, "paris")]
    batch = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    together = model(**batch, answer_ids=answers)
    assert together.reader_output.block_idx.shape == (3,)
    losses = []
    for b, question in enumerate(QUESTIONS):
        alone = model(**tokenizer([question], return_tensors="pt"), answer_ids=answers[b])
        assert torch.equal(alone.predicted_answer_ids, together.predicted_answer_ids[b])
        assert alone.predicted_block_ids.item() == together.predicted_block_ids[b].item()
        assert torch.equal(alone.retrieved_block_ids[0], together.retrieved_block_ids[b])
        torch.testing.assert_close(alone.retrieved_logits[0], together.retrieved_logits[b], rtol=1e-5, atol=1e-5)
        losses.append(alone.reader_output.loss)
    torch.testing.assert_close(together.reader_output.loss, torch.stack(losses).mean(), rtol=1e-5, atol=1e-5)


def test_top_k_of_one_reads_a_single_block(tokenizer):
    model = make_openqa_model(seed=0, reader_beam_size=1)
    output = model(**tokenizer(["where does the nile flow ?"], return_tensors="pt"))
    assert output.retrieved_block_ids.shape == (1, 1)
    assert output.reader_input_ids.shape[:2] == (1, 1)
    assert output.reader_output.block_idx.item() == 0
    assert output.predicted_block_ids.item() == output.retrieved_block_ids[0, 0].item()


def test_answer_ids_as_a_padded_tensor_equal_answer_ids_as_lists(model, tokenizer):
    """The 4.x port silently found no answer (zero loss) when answer_ids was a tensor."""
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    as_lists = answers_for(tokenizer, "egypt", "the nile")
    padded = torch.full((2, 2), -1)
    padded[0, :1] = torch.tensor(as_lists[0])
    padded[1, :2] = torch.tensor(as_lists[1])
    # Read every block so that the answer is among them whatever the random model retrieves first.
    from_lists = model(**question, answer_ids=as_lists, reader_beam_size=6).reader_output
    from_tensor = model(**question, answer_ids=padded, reader_beam_size=6).reader_output
    assert from_tensor.retriever_correct.any()
    assert torch.equal(from_tensor.retriever_correct, from_lists.retriever_correct)
    torch.testing.assert_close(from_tensor.loss, from_lists.loss)


def test_question_with_an_out_of_vocabulary_word_reaches_the_reader_unchanged(model, tokenizer):
    """The 4.x port decoded the question and re-tokenized it, which dropped [UNK] words."""
    question = tokenizer(["which river flows through zebra egypt ?"], return_tensors="pt")
    assert tokenizer.unk_token_id in question["input_ids"][0].tolist()
    output = model(**question)
    question_length = question["input_ids"].shape[1]
    assert torch.equal(output.reader_input_ids[0, 0, :question_length], question["input_ids"][0])


def test_blocks_read_can_be_raised_per_call(model, tokenizer):
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    assert model(**question).reader_input_ids.shape[1] == model.config.reader_beam_size == 3
    output = model(**question, reader_beam_size=5)
    assert output.retrieved_block_ids.shape == (1, 5)
    assert output.reader_input_ids.shape[1] == 5


def test_output_carries_retrieved_block_ids_and_scores_best_first(model, tokenizer):
    output = model(**tokenizer(["paris is the capital of which country ?"], return_tensors="pt"), reader_beam_size=6)
    logits = output.retrieved_logits[0]
    assert sorted(output.retrieved_block_ids[0].tolist()) == list(range(len(BLOCK_TEXTS)))
    assert torch.all(logits[:-1] >= logits[1:])
    expected = (
        model.retriever.index.block_emb[output.retrieved_block_ids[0]]
        @ model.embedder(
            **tokenizer(["paris is the capital of which country ?"], return_tensors="pt")
        ).projected_score[0]
    )
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # the block the reader's best span came from (which one, for a random reader, is a near-tie other kernels break
    # otherwise)
    assert output.predicted_block_ids[0].item() == output.retrieved_block_ids[0, output.reader_output.block_idx].item()


def test_training_mode_retrieves_the_searcher_beam_and_trains_the_query_tower(tokenizer):
    model = make_openqa_model(seed=1, searcher_beam_size=6).train()
    output = model(
        **tokenizer(["where does the nile flow ?"], return_tensors="pt"), answer_ids=answers_for(tokenizer, "egypt")
    )
    assert output.retrieved_block_ids.shape == (1, 6)
    assert output.reader_output.retriever_correct.shape == (6,)
    assert output.reader_input_ids.shape[1] == model.config.reader_beam_size == 3
    assert output.reader_output.retriever_loss > 0
    output.reader_output.loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0


def test_save_pretrained_writes_a_folder_that_answers_on_its_own(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    names = {path.name for path in tmp_path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "block_records.safetensors",
        "block_index",
        "pipeline_realm.py",
    } <= names
    assert {p.name for p in (tmp_path / "block_index").iterdir()} >= {"index_config.json", "block_emb.safetensors"}
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, RealmForOpenQA) and reloaded.retriever is not None
    question = tokenizer(QUESTIONS[:2], padding=True, return_tensors="pt")
    expected, actual = model(**question), reloaded(**question)
    assert torch.equal(expected.retrieved_block_ids, actual.retrieved_block_ids)
    assert [a.tolist() for a in expected.predicted_answer_ids] == [a.tolist() for a in actual.predicted_answer_ids]
    assert reloaded.retriever.block_records.texts([0, 5]) == [BLOCK_TEXTS[0], BLOCK_TEXTS[5]]
    assert reloaded.retriever.block_records.titles([3]) == ["title 3"]


def lay_out_as_hub_cache(folder, cache, repo_id="openrealm-tests/tiny-openqa"):
    """Copy a folder into a Hugging Face cache snapshot, so the repo id resolves offline like a downloaded repo."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return repo_id


def test_from_pretrained_takes_a_hub_repo_id(model, tokenizer, tmp_path, monkeypatch):
    model.save_pretrained(tmp_path / "folder")
    cache = tmp_path / "hub"
    repo_id = lay_out_as_hub_cache(tmp_path / "folder", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    loaded = RealmForOpenQA.from_pretrained(repo_id, cache_dir=str(cache)).eval()
    assert loaded.retriever is not None and len(loaded.retriever.block_records) == len(BLOCK_TEXTS)
    question = tokenizer(QUESTIONS[:1], return_tensors="pt")
    assert torch.equal(loaded(**question).retrieved_block_ids, model(**question).retrieved_block_ids)


class RecordingHub:
    """Stands in for the Hub API: records what push_to_hub would upload."""

    def __init__(self):
        self.uploaded = {}

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_commit(self, repo_id, operations, **kwargs):
        for operation in operations:
            with open(operation.path_or_fileobj, "rb") as f:
                self.uploaded[operation.path_in_repo] = f.read()
        return "commit-url"


def test_push_to_hub_uploads_weights_tokenizer_records_and_index(model, monkeypatch):
    hub = RecordingHub()
    monkeypatch.setattr("transformers.utils.hub.hf_api", lambda: hub)
    monkeypatch.setattr(
        "transformers.utils.hub.create_and_tag_model_card",
        lambda repo_id, tags=None, token=None: __import__("huggingface_hub").ModelCard("---\n---\n"),
    )
    assert model.push_to_hub("someone/tiny-realm") == "commit-url"
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "block_records.safetensors",
        "block_index/index_config.json",
        "block_index/block_emb.safetensors",
        "modeling_realm.py",
        "pipeline_realm.py",
    } <= set(hub.uploaded)
    assert json.loads(hub.uploaded["config.json"])["custom_pipelines"]["question-answering"]["impl"] == (
        "pipeline_realm.RealmQuestionAnsweringPipeline"
    )


def test_swapping_the_index_changes_results_and_version(model, tokenizer):
    retriever = model.retriever
    original = retriever.index
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    before = model(**question).retrieved_block_ids
    try:
        reversed_emb = original.block_emb.flip(0).contiguous()
        retriever.swap_index(RealmBlockIndex.build(reversed_emb, index_type="exact", version=7))
        assert retriever.index_version == 7
        after = model(**question).retrieved_block_ids
        assert torch.equal(after, len(BLOCK_TEXTS) - 1 - before)
    finally:
        retriever.swap_index(original)


def test_index_with_a_different_row_count_than_the_records_is_refused(model):
    with pytest.raises(ValueError, match="6 blocks"):
        model.retriever.swap_index(RealmBlockIndex.build(torch.randn(5, model.config.retriever_proj_size)))


def test_model_without_retriever_explains_how_to_get_one(tokenizer):
    from helpers import tiny_realm_config

    model = RealmForOpenQA(tiny_realm_config())
    with pytest.raises(ValueError, match="has no retriever"):
        model(**tokenizer(["a question"], return_tensors="pt"))


def test_retriever_call_keeps_the_4x_signature(model, tokenizer):
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")["input_ids"]
    has_answers, starts, ends, concat = model.retriever(
        torch.tensor([0, 1]), question, answers_for(tokenizer, "egypt"), max_length=40
    )
    assert has_answers == [True, False]
    egypt = tokenizer.convert_tokens_to_ids("egypt")
    assert concat["input_ids"][0, starts[0][0]].item() == egypt and starts[0] == ends[0]
    assert concat["special_tokens_mask"].shape == concat["input_ids"].shape


def test_legacy_folder_converts_to_the_new_layout_with_identical_answers(tmp_path, manifest):
    destination = openrealm.convert_legacy_folder(fixture_folder("openqa", "hub"), tmp_path / "converted")
    names = {path.name for path in (tmp_path / "converted").iterdir()}
    assert {"model.safetensors", "block_records.safetensors", "block_index"} <= names
    assert "block_records.npy" not in names and "pytorch_model.bin" not in names
    legacy = RealmForOpenQA.from_pretrained(fixture_folder("openqa", "hub"), attn_implementation="eager").eval()
    converted = RealmForOpenQA.from_pretrained(destination, attn_implementation="eager").eval()
    case = manifest["models"]["openqa"]["cases"]["answer_in_reader_beam"]["json"]
    question = converted.retriever.tokenizer([case["question"]], return_tensors="pt")
    expected, actual = (
        legacy(**question, answer_ids=case["answer_ids"]),
        converted(**question, answer_ids=case["answer_ids"]),
    )
    assert torch.equal(expected.predicted_answer_ids, actual.predicted_answer_ids)
    torch.testing.assert_close(expected.reader_output.loss, actual.reader_output.loss)


def test_convert_refuses_an_existing_destination(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        openrealm.convert_legacy_folder(fixture_folder("embedder", "hub"), tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []


def test_legacy_records_are_read_without_unpickling(tmp_path, monkeypatch):
    """The legacy block_records.npy is converted by the restricted reader; pickle is never called."""
    import pickle

    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path))

    def refuse(*args, **kwargs):
        raise AssertionError("pickle must not be used")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    retriever = RealmRetriever.from_pretrained(fixture_folder("openqa", "hub"))
    assert len(retriever.block_records) == 12
    assert retriever.index.index_type == "exact"


def test_a_failed_save_leaves_the_previous_folder_untouched(model, tmp_path, monkeypatch):
    model.save_pretrained(tmp_path)
    before = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}

    def fail(directory):
        raise OSError("disk full")

    monkeypatch.setattr(model.retriever, "write_files", fail)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path)
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == before
    assert not [path for path in tmp_path.parent.iterdir() if ".saving-" in path.name]


def test_folder_with_records_but_no_index_is_refused_naming_the_folder(model, tmp_path):
    model.save_pretrained(tmp_path)
    shutil.rmtree(tmp_path / "block_index")
    with pytest.raises(FileNotFoundError, match="no block_index/"):
        RealmForOpenQA.from_pretrained(tmp_path)


def test_folder_whose_index_rows_contradict_the_records_is_refused(model, tmp_path):
    model.save_pretrained(tmp_path)
    RealmBlockIndex.build(torch.randn(4, model.config.retriever_proj_size)).save_pretrained(tmp_path / "block_index")
    with pytest.raises(ValueError, match=f"{tmp_path}.*4 rows.*6 blocks"):
        RealmForOpenQA.from_pretrained(tmp_path)
