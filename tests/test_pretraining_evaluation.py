"""Does REALM pre-training learn? The evaluation on fixed masked queries (trainers/pretraining/evaluation.py: retrieval
utility, the paper's Figure 4, and recall@8 of a block holding the masked span) and its periodic callback, on a small
synthetic world."""

import argparse
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers import tiny_overrides
from transformers import AutoTokenizer

from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import towers
from openrealm.trainers.embedding import exact_index
from openrealm.trainers.jobs import train_pretrain as pretrain
from openrealm.trainers.options import train_pretrain
from openrealm.trainers.pretraining import NUM_CANDIDATES, RealmPretrainingModel
from openrealm.trainers.pretraining.evaluation import (
    PretrainingEvalCallback,
    curves,
    evaluate_pretraining,
    fixed_masked_queries,
    recall_at_k,
)
from openrealm.trainers.pretraining.preparation import initial_index
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.world.synthetic_world import generate_world

# Random towers, wider than the tiny ones and without dropout.
TOWERS = tiny_overrides(
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=256,
    retriever_proj_size=32,
    hidden_dropout_prob=0,
    attention_probs_dropout_prob=0,
    max_position_embeddings=384,
)
WORLD = dict(num_people=40, num_organizations=12, num_cities=12, num_rivers=4, num_mountains=4, num_regions=3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A world of 75 fictional entities (207 facts, each stated in two blocks), packed into short blocks."""
    root = tmp_path_factory.mktemp("learn")
    world = generate_world(seed=0, **WORLD)
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=2000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab, max_block_length=64, span_annotator=world.span_annotator())
    return root / "corpus"


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return AutoTokenizer.from_pretrained(corpus)


@pytest.fixture(scope="module")
def blocks(corpus):
    return load_corpus(corpus)


@pytest.fixture(scope="module")
def queries(tokenizer, blocks):
    return fixed_masked_queries(tokenizer, blocks, num_queries=64, seed=0)


def random_model(tokenizer, seed: int = 0) -> RealmPretrainingModel:
    overrides = parse_config_overrides(TOWERS)
    embedder = towers.load_embedder("random", tokenizer, overrides, seed)
    encoder = towers.load_encoder("random", tokenizer, overrides, seed)
    return RealmPretrainingModel(embedder, encoder, embedding_dropout=0.0)


def test_eval_queries_are_fixed_and_their_answer_blocks_hold_the_masked_span(tokenizer, blocks, queries):
    again = fixed_masked_queries(tokenizer, blocks, num_queries=64, seed=0)
    assert torch.equal(again["query_input_ids"], queries["query_input_ids"]) and len(queries["uid"]) == 64
    texts = blocks["text"]
    for own, span, answers, ids in zip(
        queries["block_id"].tolist(), queries["span_text"], queries["answer_block_ids"], queries["query_input_ids"]
    ):
        assert span and span in texts[own] and own not in answers
        assert answers == [i for i, text in enumerate(texts) if span in text and i != own]
        assert tokenizer.mask_token_id in ids.tolist()
    # Every fact of the world is stated in two blocks: (nearly) every masked span can be found elsewhere.
    assert sum(bool(a) for a in queries["answer_block_ids"]) >= 0.9 * len(queries["uid"])


def test_recall_at_8_counts_queries_with_an_answer_block_in_the_top_8_other_blocks(tokenizer, blocks, queries):
    model = random_model(tokenizer)
    index = exact_index(model.embedder, blocks, tokenizer)
    recall = recall_at_k(model.embedder, index, queries, k=8)
    model.embedder.eval()
    with torch.no_grad():
        query_emb = model.embedder(
            queries["query_input_ids"], attention_mask=queries["query_attention_mask"]
        ).projected_score
    scores = query_emb @ index.block_emb.T
    scores[torch.arange(len(scores)), queries["block_id"]] = float("-inf")  # the trivial (own) block never counts
    top = scores.topk(8, dim=1).indices.tolist()
    expected = sum(bool(set(t) & set(a)) for t, a in zip(top, queries["answer_block_ids"])) / len(top)
    assert recall == pytest.approx(expected) and 0 < recall < 1


def test_a_random_encoder_gets_no_retrieval_utility(tokenizer, blocks, queries):
    metrics = evaluate_pretraining(random_model(tokenizer), tokenizer, blocks, queries)
    assert abs(metrics["retrieval_utility"]) < 0.01
    # Untrained: the MLM loss is about log(vocabulary size), and nothing is predicted right.
    assert metrics["mlm_loss"] == pytest.approx(torch.log(torch.tensor(float(len(tokenizer)))).item(), abs=0.5)
    assert metrics["num_queries"] == 64 and metrics["num_tokens"] >= 64
    assert 0 <= metrics["answer_in_candidates"] <= 1 and 0 < metrics["null_doc_prob"] < 1
    # A random embedder gives every block nearly the same embedding: p(z|x) is close to uniform over the K candidates.
    assert metrics["retrieval_entropy"] == pytest.approx(math.log(NUM_CANDIDATES), abs=0.01)


def test_eval_callback_logs_utility_and_recall_every_n_steps(corpus, tokenizer, blocks, queries, tmp_path):
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    args = parser.parse_args(
        ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(tmp_path / "out")]
        + ["--max-steps", "4", "--refresh-every", "2", "--refresh-mode", "sync", "--batch-size", "4"]
        + ["--config-overrides", TOWERS, "--no-progress", "--logging-steps", "4"]
    )
    model = random_model(tokenizer)
    index = initial_index(args, model.embedder, tmp_path / "out" / "index")
    trainer = pretrain.build_trainer(args, model.embedder, model.encoder, tokenizer, blocks, index)
    callback = PretrainingEvalCallback(queries, tokenizer, blocks, eval_steps=2, refresh=trainer.refresh)
    trainer.add_callback(callback)
    trainer.train()
    steps, utility = curves(trainer.state.log_history, "eval_retrieval_utility")
    assert steps == [0, 2, 4] and len(utility) == 3
    assert curves(trainer.state.log_history, "eval_recall@8")[0] == [0, 2, 4]
    # The stale-index view: the run's index at step 4 was built at step 4 (sync), the fresh one is the same.
    last = callback.history[-1]
    assert last["eval_stale_recall@8"] == pytest.approx(last["eval_recall@8"])
