"""BM25 baseline retrieval over a knowledge corpus (bm25s): rare words find their block, titles are indexed, shapes."""

import pytest
import torch
from helpers import BLOCK_TEXTS, make_openqa_model

from openrealm.trainers.bm25 import Bm25BlockSearcher
from openrealm.trainers.world.synthetic_world import generate_world

TITLES = [f"title {i}" for i in range(len(BLOCK_TEXTS))]


@pytest.fixture(scope="module")
def searcher():
    return Bm25BlockSearcher(BLOCK_TEXTS, TITLES)


def test_a_rare_word_finds_its_block(searcher):
    block_ids = searcher.search(["Who pioneered computer SCIENCE?", "where is cairo"], k=3)
    assert block_ids[:, 0].tolist() == [3, 0]


def test_search_returns_k_block_ids_per_question_best_first(searcher):
    block_ids, scores = searcher.search_with_scores(["capital city of france", "thames", "egypt", "london"], k=4)
    assert block_ids.shape == (4, 4) and block_ids.dtype == torch.long
    assert scores.shape == (4, 4) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    assert block_ids[0, 0].item() == 1 and len(set(block_ids[0].tolist())) == 4


def test_titles_are_indexed_with_the_text():
    searcher = Bm25BlockSearcher(["a text about rivers", "a text about cities"], ["Danube", "Vienna"])
    assert searcher.search(["vienna"], k=1).tolist() == [[1]]


def test_words_unseen_in_the_corpus_score_nothing(searcher):
    block_ids, scores = searcher.search_with_scores(["zyzzyva quokka"], k=2)
    assert block_ids.shape == (1, 2) and scores.abs().sum().item() == 0.0


def test_from_retriever_indexes_the_block_records():
    model = make_openqa_model(seed=0)
    searcher = Bm25BlockSearcher.from_retriever(model.retriever, batch_size=4)  # two record batches
    assert searcher.num_blocks == len(BLOCK_TEXTS)
    assert searcher.search(["thames"], k=1).tolist() == [[4]]
    assert searcher.search(["title 5 born"], k=1).tolist() == [[5]]


def test_bad_arguments_are_refused(searcher):
    with pytest.raises(ValueError, match="corpus size"):
        searcher.search(["paris"], k=len(BLOCK_TEXTS) + 1)
    with pytest.raises(TypeError, match="list of questions"):
        searcher.search("paris", k=1)
    with pytest.raises(ValueError, match="titles"):
        Bm25BlockSearcher(["one", "two"], ["only one title"])
    with pytest.raises(ValueError, match="empty corpus"):
        Bm25BlockSearcher([])


def test_bm25_finds_the_facts_of_the_synthetic_world():
    world = generate_world(seed=0)
    searcher = Bm25BlockSearcher([a["text"] for a in world.articles], [a["title"] for a in world.articles])
    questions = world.questions[:200]
    block_ids = searcher.search([q["question"] for q in questions], k=1)
    texts = [a["text"] for a in world.articles]
    found = [any(q["answers"][0] in texts[i] for i in row) for q, row in zip(questions, block_ids.tolist())]
    # The subject's name is rare, so an article stating the fact comes first (measured: all 200 questions).
    assert sum(found) / len(found) >= 0.95


@pytest.mark.parametrize(("user_setting", "expected"), [(None, "false"), ("true", "true")])
def test_importing_bm25_keeps_jax_from_preallocating_gpu_memory_unless_the_user_chose(user_setting, expected):
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    if user_setting is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = user_setting
    code = "import os, openrealm.trainers.bm25; print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == expected
