"""RealmTokenizer: BERT uncased WordPiece ids identical to transformers 4.57.6 (slow and fast),
batch_encode_candidates, and resolution of legacy tokenizer configs through AutoTokenizer."""

import json

import pytest
import torch
from helpers import FIXTURES, fixture_folder
from transformers import AutoTokenizer

from openrealm import RealmTokenizer, RealmTokenizerFast

CASES = json.loads((FIXTURES / "tokenizer_cases.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(fixture_folder("embedder", "hub"))


def test_legacy_tokenizer_config_naming_realm_tokenizer_resolves_through_auto_tokenizer(tokenizer):
    config = json.loads((fixture_folder("embedder", "hub") / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "RealmTokenizer"
    assert isinstance(tokenizer, RealmTokenizer)


def test_tokenizer_class_named_realm_tokenizer_fast_resolves_too(tmp_path):
    folder = fixture_folder("embedder", "hub")
    for name in ("vocab.txt", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "RealmTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert isinstance(AutoTokenizer.from_pretrained(tmp_path), RealmTokenizerFast)


@pytest.mark.parametrize("case", CASES["texts"], ids=lambda case: case["text"][:20])
def test_single_text_ids_match_reference(tokenizer, case):
    encoded = tokenizer(case["text"])
    for backend in ("slow", "fast"):
        for field in ("input_ids", "token_type_ids", "attention_mask"):
            assert encoded[field] == case[backend][field], (backend, field)


@pytest.mark.parametrize("case", CASES["pairs"], ids=lambda case: case["text"][:20])
def test_text_pair_ids_match_reference(tokenizer, case):
    encoded = tokenizer(case["text"], case["text_pair"])
    for field in ("input_ids", "token_type_ids", "attention_mask"):
        assert encoded[field] == case["slow"][field], field


def test_batch_encode_candidates_matches_reference(tokenizer):
    case = CASES["batch_encode_candidates"]
    encoded = tokenizer.batch_encode_candidates(case["text"], max_length=case["max_length"], return_tensors="pt")
    for field in ("input_ids", "attention_mask", "token_type_ids"):
        assert encoded[field].shape == (2, 2, case["max_length"])
        assert torch.equal(encoded[field], torch.tensor(case["slow"][field])), field


def test_batch_encode_candidates_requires_max_length(tokenizer):
    with pytest.raises(ValueError, match="max_length"):
        tokenizer.batch_encode_candidates([["a", "b"]])


@pytest.mark.parametrize("case", CASES["decode"], ids=lambda case: str(case["ids"][:4]))
def test_decode_matches_the_fast_tokenizer_of_reference(tokenizer, case):
    assert tokenizer.decode(case["ids"]) == case["fast_skip_special_tokens_false"]
    assert tokenizer.decode(case["ids"], skip_special_tokens=True) == case["fast_skip_special_tokens_true"]
