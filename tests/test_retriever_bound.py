"""The retriever's bound under REALM's signal (trainers/pretraining/retriever_bound.py): REALM's retriever objective
with a perfect reader and every block a candidate, trained alone."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TinyWorld

from openrealm import RealmEmbedder
from openrealm.trainers.pretraining.retriever_bound import perfect_reader_loss, train_retriever_bound

# Measured on TinyWorld seeds 0-7 (random start, held-out masked queries, batch 16, lr 1e-3): recall@5 rises by 0.19 to
# 0.52 in 100 steps (mean 0.37; seed 0: 0.17 -> 0.52) and falls back somewhat by 200 steps as the 50 training blocks
# are overfitted.
STEPS = 100
MIN_RECALL_GAIN = 0.15


def test_perfect_reader_loss_is_minus_log_the_answer_blocks_share_of_p_z_given_x_without_the_own_block():
    scores = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    loss = perfect_reader_loss(scores, own_block_ids=[2], answers=[[0, 3]])
    expected = -math.log((math.exp(1.0) + math.exp(0.5)) / (math.exp(1.0) + math.exp(2.0) + math.exp(0.5)))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_perfect_reader_loss_does_not_depend_on_the_own_blocks_score():
    low = perfect_reader_loss(torch.tensor([[1.0, -9.0, 0.0]]), own_block_ids=[1], answers=[[0]])
    high = perfect_reader_loss(torch.tensor([[1.0, 9.0, 0.0]]), own_block_ids=[1], answers=[[0]])
    assert low.item() == pytest.approx(high.item(), rel=1e-6)


def test_perfect_reader_loss_averages_the_queries_of_a_batch():
    scores = torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 1.0]])
    batch = perfect_reader_loss(scores, own_block_ids=[0, 1], answers=[[1], [0, 2]])
    alone = [perfect_reader_loss(scores[i : i + 1], [own], [ids]) for i, own, ids in ((0, 0, [1]), (1, 1, [0, 2]))]
    assert batch.item() == pytest.approx((alone[0].item() + alone[1].item()) / 2, rel=1e-6)
    assert alone[1].item() == pytest.approx(0.0, abs=1e-6)  # every other block holds the span


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory) -> TinyWorld:
    return TinyWorld(tmp_path_factory.mktemp("bound"), seed=0)


def test_the_callback_runs_at_step_0_every_n_steps_and_at_the_end(tiny_world):
    embedder = RealmEmbedder.from_pretrained(tiny_world.start)
    steps = []
    train_retriever_bound(
        embedder, tiny_world.tokenizer, tiny_world.blocks, steps=5, batch_size=4, learning_rate=1e-3,
        callback=lambda step, model: steps.append((step, model.training)), callback_every=2,
    )  # fmt: skip
    assert steps == [(0, False), (2, False), (4, False), (5, False)]


def test_queries_are_never_drawn_from_excluded_blocks(tiny_world, monkeypatch):
    from openrealm.trainers.pretraining import retriever_bound

    drawn = []
    collator = retriever_bound.SalientSpanCollator

    def recording(*args, **kwargs):
        masker = collator(*args, **kwargs)

        def call(records):
            drawn.extend(int(record["block_id"]) for record in records)
            return masker(records)

        return call

    monkeypatch.setattr(retriever_bound, "SalientSpanCollator", recording)
    excluded = list(range(0, len(tiny_world.blocks), 2))
    embedder = RealmEmbedder.from_pretrained(tiny_world.start)
    train_retriever_bound(
        embedder, tiny_world.tokenizer, tiny_world.blocks, steps=6, batch_size=8, learning_rate=1e-3,
        exclude_block_ids=excluded,
    )  # fmt: skip
    assert len(drawn) == 48 and not set(drawn) & set(excluded)


def test_fewer_blocks_to_draw_from_than_a_batch_is_an_error(tiny_world):
    embedder = RealmEmbedder.from_pretrained(tiny_world.start)
    everything_but_three = range(len(tiny_world.blocks) - 3)
    with pytest.raises(ValueError, match="3 blocks to draw queries from, fewer than a batch of 4"):
        train_retriever_bound(
            embedder, tiny_world.tokenizer, tiny_world.blocks, steps=1, batch_size=4, learning_rate=1e-3,
            exclude_block_ids=everything_but_three,
        )  # fmt: skip


def test_the_bound_raises_held_out_recall_far_above_a_random_start(tiny_world):
    """Held-out masked queries (blocks never drawn from), recall@5 of an answer block: the objective teaches the
    retriever what a perfect reader's signal can. Margin: see MIN_RECALL_GAIN."""
    embedder = RealmEmbedder.from_pretrained(tiny_world.start)
    held_out = sorted(set(tiny_world.queries["block_id"].tolist()))
    recalls = {}
    train_retriever_bound(
        embedder, tiny_world.tokenizer, tiny_world.blocks, steps=STEPS, batch_size=16, learning_rate=1e-3,
        exclude_block_ids=held_out, callback=lambda step, model: recalls.setdefault(step, tiny_world.recall_of(model)),
    )  # fmt: skip
    assert recalls[STEPS] >= recalls[0] + MIN_RECALL_GAIN, recalls
