"""The reading warm-up (trainers/world/reading_warmup.py) and the reading tasks it trains on and is measured by
(trainers/world/reading_tasks.py): REALM's own joint input over the world's corpus, every block of a known kind for
each query, names renamed in training so that only reading pays."""

import json
import random
import re

import pytest
import torch
from datasets import Dataset
from helpers import TINY_WORLD, tiny_overrides
from transformers import AutoTokenizer

from openrealm import RealmKnowledgeAugEncoder
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers.embedding import exact_index
from openrealm.trainers.pretraining import RealmPretrainingExamples
from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, query_rows
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_embedder, load_encoder
from openrealm.trainers.world import reading_warmup
from openrealm.trainers.world.reading_tasks import (
    DISTRACTOR,
    KINDS,
    NAME_WORDS,
    ReadingTasks,
    collate,
    masked_log_prob,
    masked_vocab_log_prob,
    probe_examples,
    reading_probe,
)
from openrealm.trainers.world.reading_warmup import (
    MIXTURE_KINDS,
    Curriculum,
    batch_log_prob,
    query_pools,
    training_batch,
    training_example,
    warm_up_loss,
)
from openrealm.trainers.world.synthetic_world import MONTHS, generate_world

# The tiny towers without a retriever projection (an encoder), reading REALM's 384 joint positions.
ENCODER = tiny_overrides(retriever_proj_size=None, max_position_embeddings=384)
# The smallest encoder that learns to copy within a test's budget: two layers, as the induction-head results need.
READER = tiny_overrides(
    retriever_proj_size=None, max_position_embeddings=384, hidden_size=64, num_hidden_layers=2, intermediate_size=128
)


@pytest.fixture(scope="module")
def world_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    world = generate_world(seed=0, **TINY_WORLD)
    world.write(root / "world")
    tokenizer = train_wordpiece_vocab(world.texts(), root / "tokenizer", vocab_size=600)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(
        articles, root / "corpus", tokenizer, max_block_length=64, span_annotator=world.span_annotator(),
        progress=False,
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, **TINY_WORLD)


@pytest.fixture(scope="module")
def tasks(world, world_folder):
    corpus = world_folder / "corpus"
    return ReadingTasks(world, load_corpus(corpus), AutoTokenizer.from_pretrained(corpus))


def mention_sentences(world, fact) -> set[str]:
    return {world.sentence(m["title"], m["sentence_index"]).strip() for m in fact["mentions"]}


# -- the kinds of blocks ----------------------------------------------------------------------------------------------


def test_every_salient_span_of_every_block_is_a_query(tasks):
    spans = sum(len(row["span_char_starts"]) for row in tasks.blocks)
    assert len(tasks.queries) == spans
    assert all(q.sentence[q.span[0] : q.span[1]] for q in tasks.queries)


def blocks_of_kind(tasks, kind: str):
    """(query, the text of its masked span, a block's text) for every block of `kind` of every query."""
    for query in tasks.queries:
        span = query.sentence[query.span[0] : query.span[1]]
        for block in query.blocks[kind]:
            yield query, span, tasks.texts[block]


def stated_answers(world, fact, side: str, text: str) -> set[str]:
    """The `side` ("subject" or "value") of every fact of `fact`'s relation and other side that `text` states."""
    known = "value" if side == "subject" else "subject"
    return {
        other[side] for other in world.facts
        if other["relation"] == fact["relation"] and other[known] == fact[known]
        and any(s in text for s in mention_sentences(world, other))
    }  # fmt: skip


def test_a_stating_block_holds_another_statement_of_the_queried_fact_and_determines_the_answer(world, tasks):
    checked = 0
    for query, span, text in blocks_of_kind(tasks, "stating"):
        roles = tasks.roles(query.sentence, span)
        assert roles and all(stated_answers(world, fact, side, text) == {fact[side]} for fact, side in roles)
        checked += 1
    assert checked > 50


def test_an_ambiguous_block_states_the_fact_beside_another_of_the_same_form(world, tasks):
    found = 0
    for query, span, text in blocks_of_kind(tasks, "ambiguous"):
        (fact, side), *_ = tasks.roles(query.sentence, span)
        answers = stated_answers(world, fact, side, text)
        assert span in answers and len(answers) >= 2
        found += 1
    assert found  # "[MASK] worked for X Guild" against a block listing several of its staff


def test_mentioning_and_without_blocks_are_told_apart_by_the_masked_words(tasks):
    for query in tasks.queries[:200]:
        span = query.sentence[query.span[0] : query.span[1]]
        assert all(span in tasks.texts[b] for b in query.blocks["mentioning"])
        assert all(span not in tasks.texts[b] for b in query.blocks["without"])
        every = [b for kind in KINDS[:-1] for b in query.blocks[kind]]
        assert sorted(every) == [b for b in range(len(tasks.texts)) if b != query.block_id]  # each once, own left out


def states_a_fact_of(world, relations: set[str], text: str) -> bool:
    facts = [fact for fact in world.facts if fact["relation"] in relations]
    return any(s in text for fact in facts for s in mention_sentences(world, fact))


def test_a_distractor_lacks_the_span_and_states_the_same_relation_for_another_entity(world, tasks):
    found = 0
    for query in tasks.queries:
        span = query.sentence[query.span[0] : query.span[1]]
        relations = {fact["relation"] for fact, _ in tasks.roles(query.sentence, span)}
        expected = [b for b in query.blocks["without"] if states_a_fact_of(world, relations, tasks.texts[b])]
        assert list(query.distractors) == expected
        found += len(expected)
    assert found > 50  # "Zekutov was born in Pralta" for "Grofestus was born in [MASK]"


# -- examples ---------------------------------------------------------------------------------------------------------


def test_an_unrenamed_example_is_realm_pretrainings_joint_input_for_the_same_query_and_block(world_folder, tasks):
    """The probe reads exactly what REALM pre-training's reader reads: same ids, segments and labels."""
    tokenizer, blocks = tasks.tokenizer, tasks.blocks
    queries = fixed_masked_queries(tokenizer, blocks, num_queries=20, seed=3)
    embedder = load_embedder("random", tokenizer, parse_config_overrides(tiny_overrides()), seed=0).eval()
    examples = RealmPretrainingExamples(tokenizer, blocks, embedder, exact_index(embedder, blocks, tokenizer), 2)
    for row in range(len(queries["uid"])):
        block = (int(queries["block_id"][row]) + 1) % len(blocks)
        batch = examples.with_candidates(query_rows(queries, [row]), [[-1, block]])
        query = tasks.query(int(queries["block_id"][row]), queries["query_text"][row], tuple(queries["span"][row]))
        for k, context in enumerate((None, block)):
            ids, labels, types = tasks.example(query, context)
            length = int(batch["joint_attention_mask"][0, k].sum())
            assert ids == batch["joint_input_ids"][0, k, :length].tolist()  # exact: copied ids
            assert types == batch["joint_token_type_ids"][0, k, :length].tolist()  # exact: copied ids
            assert labels == batch["labels"][0, : len(labels)].tolist()  # exact: copied ids


def test_a_renamed_example_is_the_renamed_text_tokenized(tasks):
    """Renaming works on wordpieces for speed: it must give what tokenizing the renamed sentence and block would."""
    rng, tokenizer = random.Random(0), tasks.tokenizer
    for query in [q for q in tasks.queries if q.blocks["stating"]][:40]:
        block = query.blocks["stating"][0]
        state = rng.getstate()
        ids, labels, _ = tasks.example(query, block, rng)
        rng.setstate(state)
        mapping = {key: tokenizer.decode(spelled) for key, spelled in tasks.renaming(
            query.segments + tasks.block_segments[block], rng).items()}  # fmt: skip
        rename = lambda text, mapping=mapping: tasks.pattern.sub(lambda m: mapping[m.group()], text)  # noqa: E731
        start, end = query.span
        before, span, after = (rename(part) for part in (query.sentence[:start], query.sentence[start:end],
                                                         query.sentence[end:]))  # fmt: skip
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        masked = encode(span)
        query_ids = encode(before) + [tokenizer.mask_token_id] * len(masked) + encode(after)
        expected = [tokenizer.cls_token_id, *query_ids, tokenizer.sep_token_id]
        expected += encode(rename(tasks.texts[block])) + [tokenizer.sep_token_id]
        assert ids == expected  # exact: token ids
        assert [label for label in labels if label != -100] == masked  # exact: token ids


def test_renamed_answers_are_copyable_from_a_stating_block_and_differ_every_time(tasks):
    query = next(q for q in tasks.queries if q.blocks["stating"])
    answers = set()
    for seed in range(20):
        ids, labels, types = tasks.example(query, query.blocks["stating"][0], random.Random(seed))
        masked = [i for i, label in enumerate(labels) if label != -100]
        assert all(ids[i] == tasks.tokenizer.mask_token_id and types[i] == 0 for i in masked)
        body = [token for token, segment in zip(ids, types) if segment == 1]
        target = [labels[i] for i in masked]
        assert any(body[i : i + len(target)] == target for i in range(len(body)))  # stated in the block
        answers.add(tuple(target))
    assert len(answers) > 10


def test_renaming_draws_names_from_one_pool_and_keeps_ordinary_words(tasks):
    assert not {word.lower() for word in tasks.pools["name"]} & NAME_WORDS
    pool = tasks.pools["name"]
    kinds_in_pool = {e["kind"] for e in tasks.world.entities if any(w in pool for w in e["name"].split())}
    assert kinds_in_pool == {"person", "organization", "city", "river", "mountain", "region"}
    assert tasks.pools["month"] == list(MONTHS) and all(re.fullmatch(r"[12]\d{3}", y) for y in tasks.pools["year"])
    query = next(q for q in tasks.queries if "Guild" in tasks.texts[q.block_id])
    renamed = tasks.tokenizer.decode(tasks.example(query, query.block_id, random.Random(1))[0])
    assert "guild" in renamed  # "Guild" is kept; the name before it is not


def test_collate_pads_inputs_and_ignores_padding_in_the_loss(tasks):
    rng = random.Random(0)
    batch = collate([tasks.example(q, None, rng) for q in tasks.queries[:4]] + [tasks.example(tasks.queries[5], 0)])
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape == batch["labels"].shape == (5, int(lengths.max()))
    for row, length in enumerate(lengths.tolist()):
        assert (batch["labels"][row, length:] == -100).all() and (batch["input_ids"][row, length:] == 0).all()


# -- the curriculum ---------------------------------------------------------------------------------------------------


def test_curriculum_goes_from_stating_sentences_to_stating_blocks_to_the_mixture():
    curriculum, rng, steps = Curriculum(0.2, 0.3, 0.2, {"mentioning": 1.0}), random.Random(0), 1000
    kinds = [curriculum.kind(step, steps, rng) for step in range(steps)]
    assert set(kinds[:200]) == {"sentence"} and set(kinds[200:500]) == {"stating"}
    ramp = kinds[500:700]
    assert ramp[:50].count("mentioning") < ramp[150:].count("mentioning")  # the mixture ramps in
    assert set(kinds[700:]) == {"mentioning"}


def test_curriculum_final_mixture_replaces_the_mixture_over_the_last_steps_only():
    curriculum = Curriculum(0.0, 0.0, 0.0, {"stating": 1.0}, final_share=0.25, final_mixture={"without": 1.0})
    rng, steps = random.Random(0), 1000
    kinds = [curriculum.kind(step, steps, rng) for step in range(steps)]
    assert set(kinds[:750]) == {"stating"} and set(kinds[750:]) == {"without"}
    assert curriculum.kinds() == ["stating", "without"]


def test_curriculum_without_a_final_mixture_draws_as_before():
    plain, late = Curriculum(), Curriculum(final_share=0.2)  # a share without a final mixture changes nothing
    first, second = random.Random(0), random.Random(0)
    assert [plain.kind(s, 100, first) for s in range(100)] == [late.kind(s, 100, second) for s in range(100)]


def test_curriculum_mixture_draws_kinds_in_their_shares():
    curriculum, rng = Curriculum(0.0, 0.0, 0.0, {"stating": 3.0, "null": 1.0}), random.Random(0)
    kinds = [curriculum.kind(0, 10, rng) for _ in range(4000)]
    assert abs(kinds.count("null") / 4000 - 0.25) < 0.03


def test_curriculum_mixture_may_weigh_distractors():
    curriculum = Curriculum(0.0, 0.0, 0.0, {DISTRACTOR: 1.0})
    assert curriculum.kind(5, 10, random.Random(0)) == DISTRACTOR and curriculum.kinds() == [DISTRACTOR]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((0.7, 0.4), "summing to at most 1"),
        ((-0.1, 0.2), "summing to at most 1"),
        ((0.1, 0.1, 0.1, {"stated": 1.0}), "mixture takes"),
        ((0.1, 0.1, 0.1, {"null": 0.0}), "mixture takes"),
        ((0.3, 0.3, 0.3, {"null": 1.0}, 0.2), "summing to at most 1"),
        ((0.1, 0.1, 0.1, {"null": 1.0}, 0.2, {"stated": 1.0}), "final_mixture takes"),
        ((0.1, 0.1, 0.1, {"null": 1.0}, 0.2, {}), "final_mixture takes"),
    ],
)
def test_curriculum_refuses_impossible_shares(arguments, message):
    with pytest.raises(ValueError, match=message):
        Curriculum(*arguments)


def test_training_examples_of_each_kind_hold_the_answer_only_where_that_kind_does(tasks):
    rng, pools = random.Random(0), query_pools(tasks)
    for kind in ("sentence", *MIXTURE_KINDS):
        for _ in range(20):
            (ids, labels, types), _ = training_example(tasks, kind, rng, pools)
            target = [label for label in labels if label != -100]
            body = [token for token, segment in zip(ids, types) if segment == 1][:-1]  # less the final [SEP]
            held = any(body[i : i + len(target)] == target for i in range(len(body)))
            if kind in ("sentence", "stating", "ambiguous", "mentioning"):
                assert held, kind
            elif kind == "null":
                assert body == []
            # "without" and its distractors: the renamed answer is a fresh name, absent from the block
            if kind in ("without", DISTRACTOR):
                assert not held


def test_a_null_twin_is_the_same_renamed_query_over_no_block(tasks):
    query = query_pools(tasks)["without"][0]
    example, twin = tasks.with_null_twin(query, query.blocks["without"][0], random.Random(3))
    (ids, labels, types), (twin_ids, twin_labels, twin_types) = example, twin
    query_length = types.index(1)  # [CLS] query [SEP]
    assert twin_ids[:query_length] == ids[:query_length] and twin_labels[:query_length] == labels[:query_length]
    assert twin_ids[query_length:] == [tasks.tokenizer.sep_token_id] and twin_types[query_length:] == [1]
    assert set(twin_labels[query_length:]) == {-100}


def test_null_twins_leave_the_batch_drawn_as_without_them(tasks):
    pools = query_pools(tasks)
    kinds = iter(["stating", "without", "null", "without", "mentioning"] * 2)
    plain, none, _, _ = training_batch(tasks, lambda: next(kinds), 5, random.Random(7), pools)
    kinds = iter(["stating", "without", "null", "without", "mentioning"] * 2)
    twinned, twins, rows, _ = training_batch(tasks, lambda: next(kinds), 5, random.Random(7), pools, null_twins=True)
    assert twinned == plain and none == [] and rows == [1, 3]
    assert [twin[0][: len(twin[0]) - 1] for twin in twins] == [
        twinned[row][0][: len(twin[0]) - 1] for row, twin in zip(rows, twins)
    ]


def test_twins_run_apart_get_the_log_probs_they_get_padded_beside_the_examples(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0).eval()
    kinds = iter(["stating", "without", "null", "without", "mentioning"])
    examples, twins, _, _ = training_batch(tasks, lambda: next(kinds), 5, random.Random(7), query_pools(tasks), True)
    with torch.no_grad():
        apart = batch_log_prob(encoder, examples, twins)
        padded = masked_vocab_log_prob(encoder, collate(examples + twins))
    assert len(twins) == 2 and apart.shape == padded.shape
    assert torch.allclose(apart, padded, atol=1e-5)


def test_warm_up_loss_without_twins_is_the_masked_lm_loss(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0).eval()
    batch = collate([tasks.example(q, q.block_id) for q in tasks.queries[:4]])
    with torch.no_grad():
        loss = warm_up_loss(masked_vocab_log_prob(encoder, batch), batch["labels"], [], 1.0)
        expected = -masked_log_prob(encoder, batch).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_warm_up_loss_adds_the_kl_from_the_null_twins_prediction(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0).eval()
    query = query_pools(tasks)["without"][0]
    example, twin = tasks.with_null_twin(query, query.blocks["without"][0], random.Random(1))
    other = tasks.example(tasks.queries[0], tasks.queries[0].block_id, random.Random(2))
    batch = collate([other, example, twin])
    with torch.no_grad():
        log_prob = masked_vocab_log_prob(encoder, batch)
        plain = warm_up_loss(log_prob, batch["labels"], [1], 0.0)
        loss = warm_up_loss(log_prob, batch["labels"], [1], 2.0)
        block = masked_vocab_log_prob(encoder, collate([example]))
        null = masked_vocab_log_prob(encoder, collate([twin]))
    kl = (null.exp() * (null - block)).sum(-1).mean()
    assert kl.item() > 0.0
    assert loss.item() == pytest.approx(plain.item() + 2.0 * kl.item(), rel=1e-5)


def test_warm_up_loss_holds_the_null_prediction_fixed(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0)
    query = query_pools(tasks)["without"][0]
    example, twin = tasks.with_null_twin(query, query.blocks["without"][0], random.Random(1))
    batch = collate([example, twin])
    log_prob = masked_vocab_log_prob(encoder, batch)
    log_prob.retain_grad()
    warm_up_loss(log_prob, batch["labels"], [0], 1.0).backward()
    example_tokens = int((batch["labels"][0] != -100).sum())
    assert log_prob.grad[:example_tokens].abs().sum() > 0
    assert log_prob.grad[example_tokens:].abs().sum() == 0  # exact: no gradient reaches the null twin


def test_fitting_lists_the_ith_wordpiece_of_each_name_of_the_masked_length_the_block_holds(tasks):
    rng, pools = random.Random(4), query_pools(tasks)
    for query in pools["mentioning"][:10]:
        block = query.blocks["mentioning"][0]
        mapping = tasks.renaming(query.segments + tasks.block_segments[block], rng)
        ids, labels, types = tasks.example(query, block, mapping=mapping)
        targets = [label for label in labels if label != -100]
        body = [token for token, segment in zip(ids, types) if segment == 1][:-1]
        held = [tuple(body[i : i + len(targets)]) for i in range(len(body) - len(targets) + 1)]
        fits = tasks.fitting(query, block, mapping)
        assert len(fits) == len(targets)
        for place, (target, fit) in enumerate(zip(targets, fits)):
            assert fit == sorted(set(fit)) and set(fit) <= set(body)
            # a mentioning block holds the masked span itself, renamed as in the query
            assert tuple(targets) in held and target in fit, (place, target, fit)


def test_only_blocks_that_hold_names_without_stating_the_fact_get_fits(tasks):
    rng, pools = random.Random(0), query_pools(tasks)
    for kind in ("sentence", *MIXTURE_KINDS):
        for _ in range(10):
            (ids, labels, types), fits = training_example(tasks, kind, rng, pools)
            assert len(fits) == sum(label != -100 for label in labels)
            if kind not in reading_warmup.HEDGE_KINDS:
                assert fits == [[]] * len(fits), kind
    assert set(reading_warmup.HEDGE_KINDS) == {"mentioning", "without", DISTRACTOR}


def test_warm_up_loss_hedges_over_the_fits_with_the_hedge_weight(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0).eval()
    query = query_pools(tasks)["mentioning"][0]
    mapping = tasks.renaming(query.segments + tasks.block_segments[query.blocks["mentioning"][0]], random.Random(1))
    example = tasks.example(query, query.blocks["mentioning"][0], mapping=mapping)
    fits = tasks.fitting(query, query.blocks["mentioning"][0], mapping)
    other = tasks.example(tasks.queries[0], tasks.queries[0].block_id, random.Random(2))
    batch = collate([other, example])
    all_fits = [[] for label in other[1] if label != -100] + fits
    with torch.no_grad():
        log_prob = masked_vocab_log_prob(encoder, batch)
        loss = warm_up_loss(log_prob, batch["labels"], [], 0.0, all_fits, 0.25)
        unhedged = warm_up_loss(log_prob, batch["labels"], [], 0.0, all_fits, 0.0)
    targets = batch["labels"][batch["labels"] != -100]
    true = -log_prob.gather(1, targets[:, None]).squeeze(1)
    spread = torch.tensor([-log_prob[row, fit].mean() if fit else 0.0 for row, fit in enumerate(all_fits)])
    hedged = torch.tensor([bool(fit) for fit in all_fits])
    expected = torch.where(hedged, 0.75 * true + 0.25 * spread, true).mean()
    assert hedged.sum() == len(fits) > 0
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert unhedged.item() == pytest.approx(true.mean().item(), rel=1e-6)


def test_warm_up_refuses_a_hedge_weight_outside_0_1(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0)
    with pytest.raises(ValueError, match="hedge_weight must be within"):
        reading_warmup.warm_up_reader(encoder, tasks, steps=1, hedge_weight=1.5)


def test_warm_up_refuses_a_negative_null_match_weight(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0)
    with pytest.raises(ValueError, match="null_match_weight must be >= 0"):
        reading_warmup.warm_up_reader(encoder, tasks, steps=1, null_match_weight=-1.0)


# -- training and the probe -------------------------------------------------------------------------------------------


def test_probe_reports_each_kind_and_the_stating_blocks_worth_over_none(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0)
    probe = reading_probe(encoder, tasks)
    assert set(probe["kinds"]) <= set(MIXTURE_KINDS) and {"stating", "null", DISTRACTOR} <= set(probe["kinds"])
    assert probe["copy_share"] == probe["kinds"]["stating"]["copy_share"]
    stating, null = probe["kinds"]["stating"]["mean_log_prob"], probe["kinds"]["null"]["mean_log_prob"]
    assert probe["utility"] == pytest.approx(stating - null, abs=1e-3)
    assert probe["copy_share"] == 0.0 and abs(probe["utility"]) < 0.2  # a random encoder reads nothing


def test_probe_draws_one_distractor_per_query_having_one_apart_from_the_other_kinds(tasks):
    examples = probe_examples(tasks)
    null_queries = [example[0][: example[2].index(1)] for example in examples["null"]]  # [CLS] query [SEP]
    distractor_queries = [example[0][: example[2].index(1)] for example in examples[DISTRACTOR]]
    queries = fixed_masked_queries(tasks.tokenizer, tasks.blocks, num_queries=len(tasks.texts), seed=0)
    having = [
        tasks.query(b, sentence, tuple(span)).distractors != ()
        for b, sentence, span in zip(queries["block_id"].tolist(), queries["query_text"], queries["span"].tolist())
    ]
    assert distractor_queries == [q for q, has in zip(null_queries, having) if has] and any(having)


def test_warm_up_makes_a_stating_block_worth_more_than_no_block(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(READER), seed=0)
    curriculum = Curriculum(sentence_share=1.0, stating_share=0.0, ramp_share=0.0)  # the short-context phase alone
    history = reading_warmup.warm_up_reader(encoder, tasks, steps=600, curriculum=curriculum, eval_every=600)
    assert [entry["step"] for entry in history] == [0, 600]
    # 2 layers, 64 wide, 600 steps on stating sentences: utility (on whole blocks) 0.0 -> 1.3-3.4 nats over seeds 0-3.
    assert history[-1]["utility"] > history[0]["utility"] + 0.8, history


def test_masked_log_prob_reads_the_masked_positions_only(tasks):
    encoder = load_encoder("random", tasks.tokenizer, parse_config_overrides(ENCODER), seed=0).eval()
    batch = collate([tasks.example(q, None) for q in tasks.queries[:3]])
    with torch.no_grad():
        values = masked_log_prob(encoder, batch)
        full = encoder(batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits.log_softmax(-1)  # fmt: skip
    mask = batch["labels"] != -100
    assert values.shape == (int(mask.sum()),)
    assert torch.allclose(values, full[mask].gather(1, batch["labels"][mask][:, None]).squeeze(1), atol=1e-5)


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
    assert summary["null_match_weight"] == 0.0 and summary["hedge_weight"] == 0.0
    assert summary["curriculum"] == {"sentence_share": 0.15, "stating_share": 0.3, "ramp_share": 0.3,
                                     "mixture": Curriculum().mixture, "final_share": 0.0,
                                     "final_mixture": None}  # fmt: skip
