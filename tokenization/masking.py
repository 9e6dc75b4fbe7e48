"""REALM pre-training queries: one masked sentence per corpus record (Google's example_generator.py and
featurization.py, paper sections 3.4 and 4.5).

`mask_query` turns one knowledge-corpus record (columns `text`, `sentence_char_starts/ends`, `span_char_starts/ends`,
`uid`, `block_id`) into a query; `SalientSpanCollator` does it for a batch and returns tensors.

Strategies:
- "salient" (REALM; Google's `text_features_to_query` + `Featurizer.mask_query`): one salient span drawn uniformly
  from all the record's valid spans, its sentence alone is the query, every wordpiece inside the span is [MASK].
- "random_token" (paper ablation "random uniform masks", BERT): BERT's `create_pretraining_data` rule on one random
  sentence: round(15%) of its wordpieces (at least 1, at most `max_masks`), chosen uniformly, all [MASK] (no 80/10/10).
- "random_span" (paper ablation "random span masks", SpanBERT): in one random sentence, a run of whole words from a
  random word, its length in words drawn from SpanBERT's Geometric(0.2) clipped at 10, then cut back to whole words
  within `max_masks` wordpieces (at least one word).
Google's released code has only "salient" and never falls back to the others: a record without a usable span is
skipped.

Departure from Google: wordpieces are aligned to characters with the fast tokenizer's offset mapping, not by greedy
left-to-right matching of `##`-stripped pieces against the normalised text. The offsets are exact (normalisation that
changes the string's length, e.g. some accent stripping, does not break them, where Google skipped the query with a
TokenizationError) and come for free from the Rust tokenizer. Offsets are python str offsets (the corpus is python
text end to end), not UTF-8 bytes.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

STRATEGIES = ("salient", "random_token", "random_span")
# Why a record gives no query (the keys of SalientSpanCollator.num_skipped).
SKIP_REASONS = ("no_valid_spans", "span_covers_no_wordpiece", "mask_out_of_range", "no_wordpieces")
MASKED_LM_PROB = 0.15  # BERT
SPAN_GEOMETRIC_P = 0.2  # SpanBERT
SPAN_MAX_WORDS = 10  # SpanBERT


def mask_query(
    record: Mapping[str, Any],
    tokenizer,
    rng: random.Random,
    strategy: str = "salient",
    query_seq_len: int = 96,
    max_masks: int = 10,
    stats: Counter | None = None,
) -> dict[str, Any] | None:
    """One masked query from a corpus record, or None when the record is skipped (the reason is counted in `stats`).

    Returns `query_input_ids`, `query_attention_mask`, `labels` [query_seq_len] (`[CLS] masked sentence [SEP]`
    padded; labels = original ids at the predicted positions, -100 elsewhere), `mlm_positions`, `mlm_targets`,
    `mlm_mask` [max_masks] (positions are wordpiece index + 1 for the [CLS]), `uid`, `block_id`, `query_text` (the
    unmasked sentence), `span` (start, end) char offsets of the masked span in `query_text` ((-1, -1) for
    "random_token").
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown masking strategy {strategy!r}: expected one of {STRATEGIES}")
    sentences = _sentence_bounds(record)
    max_index = query_seq_len - 2  # room for [CLS] and [SEP]
    if strategy == "salient":
        choice = _salient_choice(record, sentences, rng)
        if isinstance(choice, str):
            return _skip(stats, choice)
        (sent_start, sent_end), (span_start, span_end) = choice
        sentence = record["text"][sent_start:sent_end]
        encoding = _encode(tokenizer, sentence)
        masked = pieces_inside(encoding["offset_mapping"], span_start, span_end)
        if not masked:
            return _skip(stats, "span_covers_no_wordpiece")
        if masked[-1] >= max_index:  # Google: the mask must never be truncated away
            return _skip(stats, "mask_out_of_range")
        span = (span_start, span_end)
    else:
        candidates = [(s, e) for s, e in sentences if record["text"][s:e].strip()]
        if not candidates:
            return _skip(stats, "no_wordpieces")
        sent_start, sent_end = candidates[rng.randrange(len(candidates))]
        sentence = record["text"][sent_start:sent_end]
        encoding = _encode(tokenizer, sentence)
        if not encoding["input_ids"]:
            return _skip(stats, "no_wordpieces")
        if strategy == "random_token":
            masked = _random_tokens(min(len(encoding["input_ids"]), max_index), max_masks, rng)
            span = (-1, -1)
        else:
            masked = _random_whole_word_span(encoding.word_ids(), max_index, max_masks, rng)
            if not masked:
                return _skip(stats, "mask_out_of_range")
            span = (encoding["offset_mapping"][masked[0]][0], encoding["offset_mapping"][masked[-1]][1])
    example = _featurize(encoding["input_ids"], masked, tokenizer, query_seq_len, max_masks)
    example.update(
        uid=record["uid"], block_id=int(record["block_id"]), query_text=sentence, span=(int(span[0]), int(span[1]))
    )
    return example


def _skip(stats: Counter | None, reason: str) -> None:
    if stats is not None:
        stats[reason] += 1
    return None


def _sentence_bounds(record: Mapping[str, Any]) -> list[tuple[int, int]]:
    starts, ends = record["sentence_char_starts"], record["sentence_char_ends"]
    if len(starts) != len(ends):
        raise ValueError(
            f"record {record.get('block_id')!r}: sentence_char_starts and sentence_char_ends differ in length"
        )
    return list(zip(starts, ends))


def _salient_choice(
    record: Mapping[str, Any], sentences: Sequence[tuple[int, int]], rng: random.Random
) -> tuple[tuple[int, int], tuple[int, int]] | str:
    """(sentence bounds, span relative to the sentence) of a span drawn uniformly from the valid ones, or a reason.

    A span is valid when some sentence fully contains it; it belongs to the first such sentence (as Google's
    example_generator.py).
    """
    starts, ends = record["span_char_starts"], record["span_char_ends"]
    if len(starts) != len(ends):
        raise ValueError(f"record {record.get('block_id')!r}: span_char_starts and span_char_ends differ in length")
    valid = []
    for start, end in zip(starts, ends):
        sentence = next(((s, e) for s, e in sentences if s <= start and end <= e), None)
        if sentence is not None:
            valid.append((sentence, (start - sentence[0], end - sentence[0])))
    if not valid:
        return "no_valid_spans"
    # Uniform over all spans of the record, not "a sentence, then a span": busy sentences are picked more often.
    return valid[rng.randrange(len(valid))]


def _encode(tokenizer, sentence: str):
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"{type(tokenizer).__name__} has no offset mapping: masking needs a fast (tokenizers) tokenizer"
        )
    return tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True)


def pieces_inside(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Indices of the wordpieces lying entirely inside [start, end); partial overlaps are not masked (Google)."""
    return [i for i, (a, b) in enumerate(offsets) if start <= a and b <= end and a < b]


def _random_tokens(num_pieces: int, max_masks: int, rng: random.Random) -> list[int]:
    """BERT's `create_pretraining_data`: round(15%) of the pieces, at least 1, at most max_masks, uniformly."""
    count = min(max_masks, max(1, round(num_pieces * MASKED_LM_PROB)))
    return sorted(rng.sample(range(num_pieces), count))


def _random_whole_word_span(
    word_ids: Sequence[int | None], max_index: int, max_masks: int, rng: random.Random
) -> list[int]:
    """Pieces of a run of whole words: a random first word, SpanBERT's length in words, at most max_masks pieces
    (a single longer word is masked whole, its first max_masks pieces predicted). [] when no word fits the query."""
    words: list[list[int]] = []
    for index, word in enumerate(word_ids):
        if words and word is not None and word == word_ids[index - 1]:
            words[-1].append(index)
        else:
            words.append([index])
    words = [pieces for pieces in words if pieces[-1] < max_index]  # whole words inside the query only
    if not words:
        return []
    num_words = 1
    while num_words < SPAN_MAX_WORDS and rng.random() >= SPAN_GEOMETRIC_P:
        num_words += 1
    first = rng.randrange(len(words))
    masked = list(words[first])
    for pieces in words[first + 1 : first + num_words]:
        if len(masked) + len(pieces) > max_masks:
            break
        masked.extend(pieces)
    return masked


def _featurize(
    piece_ids: Sequence[int], masked: Sequence[int], tokenizer, query_seq_len: int, max_masks: int
) -> dict[str, Any]:
    """`[CLS] pieces (masked) [SEP]` padded to query_seq_len, and the first max_masks targets (Google's
    featurization.py)."""
    ids = list(piece_ids[: query_seq_len - 2])
    for index in masked:
        ids[index] = tokenizer.mask_token_id  # 100% [MASK]: no 80/10/10
    ids = [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]
    padding = query_seq_len - len(ids)
    predicted = list(masked[:max_masks])  # pieces past max_masks stay [MASK] but are not predicted
    positions = [index + 1 for index in predicted]
    targets = [int(piece_ids[index]) for index in predicted]
    labels = [-100] * query_seq_len
    for position, target in zip(positions, targets):
        labels[position] = target
    unused = max_masks - len(predicted)
    return {
        "query_input_ids": ids + [tokenizer.pad_token_id] * padding,
        "query_attention_mask": [1] * len(ids) + [0] * padding,
        "mlm_positions": positions + [0] * unused,
        "mlm_targets": targets + [0] * unused,
        "mlm_mask": [1] * len(predicted) + [0] * unused,
        "labels": labels,
    }


class SalientSpanCollator:
    """Records -> a batch of masked queries (skipped records dropped), for a DataLoader's `collate_fn`.

    Output: `query_input_ids`, `query_attention_mask`, `labels` int64 [B, query_seq_len]; `mlm_positions`,
    `mlm_targets`, `mlm_mask` int64 [B, max_masks]; `block_id` int64 [B]; `span` int64 [B, 2]; `uid`, `query_text`
    lists of B str; `num_skipped` {reason: count} for this batch. `labels` is what `RealmKnowledgeAugEncoder` takes
    (pad it with -100 to the joint length; its own `mlm_mask` is [B, L], not this [B, max_masks] one).

    Counters (`num_examples`, `num_skipped` by reason) accumulate in the process that runs the collator: with
    DataLoader workers, sum the batches' `num_skipped` instead. Deterministic given `seed`; each DataLoader worker
    gets its own stream derived from (seed, worker id).
    """

    def __init__(
        self,
        tokenizer,
        strategy: str = "salient",
        seed: int = 0,
        query_seq_len: int = 96,
        max_masks: int = 10,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown masking strategy {strategy!r}: expected one of {STRATEGIES}")
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.seed = seed
        self.query_seq_len = query_seq_len
        self.max_masks = max_masks
        self.num_examples = 0
        self.num_skipped: Counter = Counter()
        self._rng = random.Random(seed)
        self._worker_id: int | None = None

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        rng = self._worker_rng()
        skipped: Counter = Counter()
        examples = []
        for record in records:
            example = mask_query(
                record, self.tokenizer, rng, self.strategy, self.query_seq_len, self.max_masks, stats=skipped
            )
            if example is not None:
                examples.append(example)
        self.num_examples += len(examples)
        self.num_skipped.update(skipped)
        return self._stack(examples, dict(skipped))

    def _worker_rng(self) -> random.Random:
        info = torch.utils.data.get_worker_info()
        if info is not None and self._worker_id != info.id:
            # Workers receive copies of this collator: without reseeding they would all draw the same masks.
            self._worker_id = info.id
            self._rng = random.Random(f"{self.seed}-worker-{info.id}")
        return self._rng

    def _stack(self, examples: list[dict[str, Any]], skipped: dict[str, int]) -> dict[str, Any]:
        def tensor(key: str, width: int | None) -> torch.Tensor:
            rows = [example[key] for example in examples]
            shape = (len(rows), width) if width is not None else (len(rows),)
            return torch.tensor(rows, dtype=torch.int64).reshape(shape)

        batch = {key: tensor(key, self.query_seq_len) for key in ("query_input_ids", "query_attention_mask", "labels")}
        batch.update({key: tensor(key, self.max_masks) for key in ("mlm_positions", "mlm_targets", "mlm_mask")})
        batch.update(block_id=tensor("block_id", None), span=tensor("span", 2))
        batch.update(uid=[example["uid"] for example in examples], query_text=[e["query_text"] for e in examples])
        batch["num_skipped"] = skipped
        return batch

    def stats(self) -> dict[str, int]:
        """Counters for logging: num_examples, num_skipped (total) and skipped_<reason>."""
        counters = {"num_examples": self.num_examples, "num_skipped": sum(self.num_skipped.values())}
        counters.update({f"skipped_{reason}": count for reason, count in sorted(self.num_skipped.items())})
        return counters


__all__ = ["SKIP_REASONS", "STRATEGIES", "SalientSpanCollator", "mask_query", "pieces_inside"]
