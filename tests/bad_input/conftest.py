"""Fixtures of the bad-input tests."""

import pytest
from helpers import NILE_VOCAB, make_openqa_model

from openrealm import RealmTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return RealmTokenizer(vocab={token: i for i, token in enumerate(NILE_VOCAB)})


@pytest.fixture(scope="module")
def model():
    return make_openqa_model(seed=0, reader_beam_size=2)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A saved tiny RealmForOpenQA folder (weights, tokenizer, corpus, index); tests change copies of it."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    make_openqa_model(seed=0).save_pretrained(folder)
    return folder
