"""transformers 4.x user code keeps working: the retriever's call ("np" and "pt"), numpy indexing of block_records, a
folder written by 4.x's RealmRetriever.save_pretrained, RealmForOpenQA over a records-only retriever, and RealmConfig
fields transformers 5's BERT cannot honour. Expected values were recorded with transformers 4.57.6 in
tests/reference/fixtures/transformers4_api/ (see tests/reference/README.md)."""

import json
import logging
import shutil
import sys

import numpy as np
import pytest
import torch
from helpers import FIXTURES, fixture_folder, fixture_tokenizer, tiny_config_kwargs
from safetensors.torch import load_file, save_file
from transformers import BatchEncoding

from openrealm import RealmConfig, RealmForOpenQA, RealmRetriever

API_FIXTURES = FIXTURES / "transformers4_api"
API = json.loads((API_FIXTURES / "cases.json").read_text(encoding="utf-8"))
FOLDER_4X = API_FIXTURES / API["retriever_folder"]["path"]
BLOCKS = API["retriever_folder"]["blocks"]
CALLS = API["retriever_calls"]
# The keys 4.57.6 indexed its block_records with (the fixture's labels name them).
INDEX_KEYS = {
    "int 1": 1,
    "int -1": -1,
    "numpy int64 3": np.int64(3),
    "numpy array [2, 0, 2]": np.array([2, 0, 2]),
    "list [1, 2]": [1, 2],
    "slice 1:3": slice(1, 3),
    "slice ::-2": slice(None, None, -2),
    "numpy array [[0, 1], [3, 4]]": np.array([[0, 1], [3, 4]]),
    "numpy bool mask [T, F, T, F, F]": np.array([True, False, True, False, False]),
}
ARRAY_TYPES = {"np": "numpy.ndarray", "pt": "torch.Tensor"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh OPENREALM_CACHE for the module (legacy records are converted into it)."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("openrealm_cache")
        patch.setenv("OPENREALM_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def retriever(cache) -> RealmRetriever:
    return RealmRetriever.from_pretrained(FOLDER_4X)


def call(retriever: RealmRetriever, case: str, return_tensors: str):
    spec = CALLS[case]
    make = np.array if return_tensors == "np" else torch.tensor
    return retriever(
        make(spec["block_ids"]),
        make(spec["question_input_ids"]),
        spec["answer_ids"],
        max_length=spec["max_length"],
        return_tensors=return_tensors,
    )


def type_name(value) -> str:
    return f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"


# --- 1. the retriever's call -------------------------------------------------------------------------------------


@pytest.mark.parametrize("return_tensors", ["np", "pt"])
@pytest.mark.parametrize("case", CALLS)
def test_retriever_call_returns_4x_answer_labels_as_python_lists(retriever, case, return_tensors):
    expected = CALLS[case]["returns"][return_tensors]
    has_answers, start_pos, end_pos, _ = call(retriever, case, return_tensors)
    assert (has_answers, start_pos, end_pos) == (expected["has_answers"], expected["start_pos"], expected["end_pos"])
    if expected["has_answers"] is not None:
        assert [type(value).__name__ for value in (has_answers, start_pos, end_pos)] == expected["label_types"]


@pytest.mark.parametrize("return_tensors", ["np", "pt"])
@pytest.mark.parametrize("case", CALLS)
def test_retriever_call_returns_a_batch_encoding_of_int64_arrays_of_the_requested_type(
    retriever, case, return_tensors
):
    expected = CALLS[case]["returns"][return_tensors]["concat_inputs"]
    concat_inputs = call(retriever, case, return_tensors)[3]
    assert type(concat_inputs) is BatchEncoding and expected["class"] == "BatchEncoding"
    assert sorted(concat_inputs.keys()) == expected["keys"]
    for key, field in expected["fields"].items():
        value = concat_inputs[key]
        assert type_name(value) == field["type"] == ARRAY_TYPES[return_tensors], key
        assert (str(value.dtype).replace("torch.", ""), list(value.shape)) == (field["dtype"], field["shape"]), key


@pytest.mark.parametrize("return_tensors", ["np", "pt"])
@pytest.mark.parametrize("case", CALLS)
def test_retriever_call_encodes_question_and_blocks_as_4x(retriever, case, return_tensors):
    expected = CALLS[case]["returns"][return_tensors]["concat_inputs"]["fields"]
    concat_inputs = call(retriever, case, return_tensors)[3]
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert concat_inputs[key].tolist() == expected[key]["values"], key


@pytest.mark.parametrize("case", CALLS)
def test_special_tokens_mask_marks_only_cls_sep_and_padding_as_4x(retriever, case):
    """4.x's tokenizer call with return_special_tokens_mask=True: the question's wordpieces are not special."""
    expected = CALLS[case]["returns"]["np"]["concat_inputs"]["fields"]["special_tokens_mask"]["values"]
    assert call(retriever, case, "np")[3]["special_tokens_mask"].tolist() == expected


def test_retriever_call_refuses_other_return_tensors(retriever):
    with pytest.raises(ValueError, match="return_tensors must be 'pt' or 'np', got 'tf'"):
        call(retriever, "no_answer_ids", "tf")


# --- 2. block_records indexing -----------------------------------------------------------------------------------


def in_memory_retriever(retriever: RealmRetriever) -> RealmRetriever:
    """A retriever built as in 4.x, from a numpy object array of UTF-8 bytes."""
    return RealmRetriever(np.array([text.encode() for text in BLOCKS], dtype=object), retriever.tokenizer)


def test_every_recorded_4x_index_is_covered():
    assert set(INDEX_KEYS) == set(API["block_records_indexing"])


@pytest.mark.parametrize("source", ["legacy_folder", "numpy_array"])
@pytest.mark.parametrize("label", INDEX_KEYS)
def test_block_records_index_like_the_4x_numpy_object_array(retriever, source, label):
    records = (retriever if source == "legacy_folder" else in_memory_retriever(retriever)).block_records
    expected = API["block_records_indexing"][label]
    value = records[INDEX_KEYS[label]]
    if expected["type"] == "bytes":
        assert type(value) is bytes and value.decode() == expected["utf8"]
    else:
        assert type_name(value) == expected["type"]
        assert (str(value.dtype), list(value.shape)) == (expected["dtype"], expected["shape"])
        assert sorted({type(item).__name__ for item in value.reshape(-1)}) == expected["element_types"]
        assert np.vectorize(bytes.decode, otypes=[object])(value).tolist() == expected["utf8"]


@pytest.mark.parametrize("source", ["legacy_folder", "numpy_array"])
def test_record_returns_title_and_text(retriever, source):
    records = (retriever if source == "legacy_folder" else in_memory_retriever(retriever)).block_records
    assert records.record(1) == {"title": "", "text": "café 中文 in london."}


# --- 3. a folder written by 4.x's RealmRetriever.save_pretrained -------------------------------------------------


def test_folder_of_4x_retriever_save_pretrained_loads_records_and_tokenizer(retriever):
    assert API["retriever_folder"]["files"] == sorted(path.name for path in FOLDER_4X.iterdir())
    assert len(retriever.block_records) == API["retriever_folder"]["loaded_by_4_57_6"]["num_blocks"]
    assert [bytes(record).decode() for record in retriever.block_records] == BLOCKS
    assert not retriever.has_index  # 4.x's retriever held no embeddings either


def test_folder_of_4x_retriever_is_refused_where_an_index_is_required_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="no model weights holding `block_emb`"):
        RealmRetriever.from_pretrained(FOLDER_4X, require_index=True)
    assert not (tmp_path / "cache").exists()


def broken_copies(tmp_path):
    """Copies of the 4.x folder that fail to load in three different ways."""
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    shutil.copy(FOLDER_4X / "block_records.npy", no_tokenizer)
    str_elements = tmp_path / "str_elements"
    shutil.copytree(FOLDER_4X, str_elements)
    np.save(str_elements / "block_records.npy", np.array(BLOCKS, dtype=object), allow_pickle=True)  # str, not bytes
    wrong_rows = tmp_path / "wrong_rows"
    shutil.copytree(FOLDER_4X, wrong_rows)
    save_file({"block_emb": torch.zeros(len(BLOCKS) + 1, 16)}, str(wrong_rows / "model.safetensors"))
    return {"no_tokenizer": no_tokenizer, "str_elements": str_elements, "wrong_rows": wrong_rows}


@pytest.mark.parametrize(
    "broken, error",
    [("no_tokenizer", (OSError, ValueError)), ("str_elements", ValueError), ("wrong_rows", ValueError)],
)
def test_a_failed_legacy_load_writes_nothing_to_the_cache(tmp_path, monkeypatch, broken, error):
    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(error):
        RealmRetriever.from_pretrained(broken_copies(tmp_path)[broken])
    assert not (tmp_path / "cache").exists()


def test_a_legacy_load_leaves_exactly_one_complete_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path / "cache"))
    RealmRetriever.from_pretrained(FOLDER_4X)
    entries = list((tmp_path / "cache" / "legacy_block_records").iterdir())
    assert len(entries) == 1 and [path.name for path in entries[0].iterdir()] == ["block_records.safetensors"]


# --- 4. RealmForOpenQA over a records-only retriever -------------------------------------------------------------


def records_only_model(retriever: RealmRetriever, **overrides) -> RealmForOpenQA:
    """RealmForOpenQA(config, retriever) as 4.x allowed, over a fresh records-only copy of the 4.x retriever."""
    torch.manual_seed(0)
    config = RealmConfig(**{**tiny_config_kwargs(), "num_block_records": len(BLOCKS), **overrides})
    return RealmForOpenQA(config, in_memory_retriever(retriever))


def ask(model: RealmForOpenQA, question: str, answers: list[str] | None = None):
    tokenizer = model.retriever.tokenizer
    answer_ids = None if answers is None else tokenizer(answers, add_special_tokens=False).input_ids
    return model(**tokenizer([question], return_tensors="pt"), answer_ids=answer_ids)


def test_openqa_over_a_records_only_retriever_trains(retriever):
    model = records_only_model(retriever, searcher_beam_size=len(BLOCKS)).train()
    output = ask(model, "who is the pioneer in modern computer science?", ["turing", "nile"])
    # Every block scores 0, so all 5 are retrieved in some order; blocks 0 ("turing") and 2 ("nile") hold answers.
    correct = output.retrieved_block_ids[0][output.reader_output.retriever_correct]
    assert sorted(correct.tolist()) == [0, 2]
    assert torch.isfinite(output.loss) and output.loss > 0
    output.loss.backward()
    assert model.reader.qa_outputs.dense_output.weight.grad.abs().sum() > 0


def test_openqa_over_a_records_only_retriever_warns_that_the_index_is_empty(retriever, caplog):
    model = records_only_model(retriever).eval()
    with caplog.at_level(logging.WARNING):
        output = ask(model, "where is paris?")
    assert "index is empty: all 5 x 16 block embeddings are zero" in caplog.text
    assert output.retrieved_logits.abs().max() == 0
    assert torch.equal(model.block_emb, torch.zeros(len(BLOCKS), 16))  # exact: zeros, as the 4.x port leaves them


def test_assigned_block_emb_is_searched_without_warning(retriever, caplog):
    model = records_only_model(retriever).eval()
    block_emb = torch.eye(len(BLOCKS), 16)
    model.block_emb = block_emb
    query = model.embedder(**model.retriever.tokenizer(["where is paris?"], return_tensors="pt")).projected_score
    with caplog.at_level(logging.WARNING):
        output = ask(model, "where is paris?")
    assert "index is empty" not in caplog.text
    expected = (query @ block_emb.T).topk(model.config.reader_beam_size).indices
    assert torch.equal(output.retrieved_block_ids, expected)


def test_block_emb_copied_in_place_as_in_4x_is_searched_without_warning(retriever, caplog):
    model = records_only_model(retriever).eval()
    model.block_emb.copy_(torch.eye(len(BLOCKS), 16) * torch.arange(1.0, len(BLOCKS) + 1)[:, None])
    query = model.embedder(**model.retriever.tokenizer(["where is paris?"], return_tensors="pt")).projected_score
    with caplog.at_level(logging.WARNING):
        output = ask(model, "where is paris?")
    assert "index is empty" not in caplog.text
    torch.testing.assert_close(
        output.retrieved_logits, query[:, output.retrieved_block_ids[0]] * (1 + output.retrieved_block_ids)
    )


def test_records_only_retriever_must_match_config_num_block_records(retriever):
    model = records_only_model(retriever, num_block_records=12)
    with pytest.raises(ValueError, match="holds 5 block records and no index, and config.num_block_records is 12"):
        ask(model, "where is paris?")


def test_from_pretrained_gives_a_records_only_retriever_the_checkpoint_block_emb(manifest):
    texts = manifest["models"]["openqa"]["retrieval"]["block_records"]
    folder = fixture_folder("openqa", "safetensors")
    records_only = RealmRetriever(np.array([text.encode() for text in texts], dtype=object), fixture_tokenizer())
    model = RealmForOpenQA.from_pretrained(folder, retriever=records_only)
    assert model.retriever is records_only
    assert torch.equal(model.block_emb, load_file(folder / "model.safetensors")["block_emb"])  # exact: loaded


@pytest.mark.skipif(sys.platform != "linux", reason="the mapping is read from /proc")
@pytest.mark.parametrize("layout", ["safetensors", "hub"])  # model.safetensors / pytorch_model.bin
def test_a_4x_checkpoint_block_emb_is_reported_memory_mapped(layout, cache):
    model = RealmForOpenQA.from_pretrained(fixture_folder("openqa", layout))
    assert model.retriever.index.is_memory_mapped


# --- 6. RealmConfig fields transformers 5's BERT cannot honour ---------------------------------------------------

CONFIG_4X = API["config_fields_transformers5_bert_lacks"]


@pytest.mark.parametrize("value", ["relative_key", "relative_key_query"])
def test_relative_position_embedding_type_is_a_value_error_naming_field_value_and_support(value):
    recorded = CONFIG_4X[f"position_embedding_type={value}"]
    # 4.x accepted it and built another model: distance_embedding weights, no absolute positions.
    assert recorded["config_accepted"] and recorded["extra_state_dict_keys"]
    assert recorded["max_abs_projected_score_change_with_the_absolute_model_weights"] > 0.1
    with pytest.raises(
        ValueError, match=rf"position_embedding_type='{value}' is not supported; supported: 'absolute'"
    ):
        RealmConfig(position_embedding_type=value)


def test_pruned_heads_is_a_value_error_naming_field_value_and_support():
    assert CONFIG_4X["pruned_heads={0: [1]}"]["layer_0_query_weight_shape"] == [24, 32]  # 4.x pruned a head
    with pytest.raises(ValueError, match=r"pruned_heads=\{0: \[1\]\} is not supported; supported: \{\}"):
        RealmConfig(pruned_heads={0: [1]})


def test_a_config_json_with_relative_positions_fails_to_load(tmp_path):
    RealmConfig().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        RealmConfig.from_pretrained(tmp_path)


def test_the_4x_defaults_absolute_positions_and_no_pruned_heads_are_accepted():
    config = RealmConfig(position_embedding_type="absolute", pruned_heads={}, chunk_size_feed_forward=0)
    assert config.position_embedding_type == "absolute"
