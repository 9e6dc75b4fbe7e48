"""The reading warm-up (trainers/world/reading_warmup.py): the synthetic world's "BERT stage" teaches the encoder to
copy a masked name from a context stating the same fact, with names renamed so that memorising the world never pays."""

import json
import random

import pytest
import torch
from helpers import TINY_WORLD, tiny_overrides
from transformers import AutoTokenizer

from openrealm import RealmKnowledgeAugEncoder
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_encoder
from openrealm.trainers.world import reading_warmup
from openrealm.trainers.world.reading_warmup import FactPairs, collate, mlm_logits
from openrealm.trainers.world.synthetic_world import generate_world

# The tiny towers without a retriever projection (an encoder), reading 256 positions.
ENCODER = tiny_overrides(retriever_proj_size=None, max_position_embeddings=256)


@pytest.fixture(scope="module")
def world_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    world = generate_world(seed=0, **TINY_WORLD)
    world.write(root / "world")
    train_wordpiece_vocab(world.texts(), root / "corpus", vocab_size=600)
    return root


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, **TINY_WORLD)


@pytest.fixture(scope="module")
def pairs(world, world_folder):
    return FactPairs(world, AutoTokenizer.from_pretrained(world_folder / "corpus"), irrelevant=0.0)


def test_masked_wordpieces_are_the_renamed_answer_and_appear_in_the_stating_context(pairs):
    rng = random.Random(0)
    mask = pairs.tokenizer.mask_token_id
    for pair in pairs.train[:50]:
        ids, labels, types = pairs.example(pair, rng)
        masked = [i for i, label in enumerate(labels) if label != -100]
        assert masked and all(ids[i] == mask for i in masked) and all(types[i] == 0 for i in masked)
        context = [token for token, segment in zip(ids, types) if segment == 1]
        assert all(labels[i] in context for i in masked)  # copyable: the answer is stated in the context


def test_names_are_renamed_differently_in_every_example(pairs):
    pair = pairs.train[0]
    answers = {
        tuple(label for label in pairs.example(pair, random.Random(seed))[1] if label != -100) for seed in range(20)
    }
    assert len(answers) > 10  # the same fact's answer is a different name almost every time


def test_ordinary_words_inside_names_are_not_renamed(pairs):
    kept = set(pairs.tokenizer.convert_tokens_to_ids(list(reading_warmup.NAME_WORDS)))
    assert kept.isdisjoint(pairs.name_ids) and pairs.name_ids


def test_up_to_three_quarters_of_the_pairs_are_held_out(world, pairs):
    total = sum(len(f["mentions"]) * (len(f["mentions"]) - 1) for f in world.facts)
    assert len(pairs.test) == min(reading_warmup.HELD_OUT_PAIRS, total * 3 // 4)
    assert len(pairs.test) + len(pairs.train) == total


def test_irrelevant_fraction_outside_zero_to_one_is_refused(world, pairs):
    with pytest.raises(ValueError, match="irrelevant must be a fraction"):
        FactPairs(world, pairs.tokenizer, irrelevant=1.5)


def test_collate_pads_inputs_and_ignores_padding_in_the_loss(pairs):
    rng = random.Random(0)
    batch = collate([pairs.example(pair, rng) for pair in pairs.train[:4]])
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, int(lengths.max()))
    for row, length in enumerate(lengths.tolist()):
        assert (batch["labels"][row, length:] == -100).all() and (batch["input_ids"][row, length:] == 0).all()


def test_warm_up_lowers_the_masked_name_loss_on_held_out_pairs(pairs):
    encoder = load_encoder("random", pairs.tokenizer, parse_config_overrides(ENCODER), seed=0)
    batch = collate([pairs.example(pair, random.Random(3)) for pair in pairs.test[:64]])

    def loss() -> float:
        with torch.no_grad():
            logits = mlm_logits(encoder, batch)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).item()

    before = loss()
    history = reading_warmup.warm_up_reader(encoder, pairs, steps=100, learning_rate=3e-3, eval_every=100)
    assert [entry["step"] for entry in history] == [0, 100]
    assert loss() < before - 0.3  # 6.38 -> 5.74 after these 100 steps: 0.3 is about half the drop


def test_command_saves_the_trained_encoder_with_its_history(world_folder, tmp_path):
    def warm_up(output):
        world, corpus = world_folder / "world", world_folder / "corpus"
        saved = reading_warmup.warm_up_encoder(world, corpus, output, config_overrides=ENCODER, steps=3, seed=1)
        assert saved == output
        return load_encoder(output)

    encoder, again = warm_up(tmp_path / "reader"), warm_up(tmp_path / "again")
    start = load_encoder("random", AutoTokenizer.from_pretrained(tmp_path / "reader"),
                         parse_config_overrides(ENCODER), seed=1)  # fmt: skip
    assert isinstance(encoder, RealmKnowledgeAugEncoder) and encoder.config.hidden_size == 32
    trained, rerun, initial = encoder.state_dict(), again.state_dict(), start.state_dict()
    # exact: the same seed trains the same weights (the same computation twice in one process); any change is training
    assert all(torch.equal(trained[name], rerun[name]) for name in trained)
    assert not torch.equal(  # exact: see above
        trained["realm.embeddings.word_embeddings.weight"], initial["realm.embeddings.word_embeddings.weight"]
    )
    summary = json.loads((tmp_path / "reader" / "reading_warmup.json").read_text())
    assert summary["steps"] == 3 and [entry["step"] for entry in summary["history"]] == [0, 3]
