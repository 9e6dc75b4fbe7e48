"""What a reader of the synthetic world must do, in REALM's own joint input: which corpus blocks state which facts, the
reading examples of the warm-up (names renamed), and the probe that measures how well an encoder reads.

    tasks = ReadingTasks(World.read("WORLD"), load_corpus("CORPUS"), tokenizer)
    probe = reading_probe(encoder, tasks)      # {"copy_share": 0.92, "stated_log_prob": -0.33, "kinds": {...}}

A query is what REALM pre-training masks (tokenization/masking.py): one sentence of a block with one salient span
masked, `[CLS] query [SEP] block [SEP]` (trainers/pretraining/examples.py: `joint_inputs`). Each other block is, for
that query, one of five kinds (`KINDS`), read off the world's facts rather than guessed from strings:
- "stating": it states the fact the query asks (holds one of its mention sentences) and no other fact of the same
  relation with the same known side, so a reader can copy the masked span from it;
- "ambiguous": it states the fact, but also the same relation for another entity ("[MASK] worked for Porsakuth
  Guild" against a block listing three employees): the best a reader can do is share p over them;
- "mentioning": it holds the span's words without stating the fact (REALM's and the oracle reader's "answer block":
  `holds_masked_span`);
- "without": it does not hold the span; "null": the empty document.
Among the blocks without the span, the *distractors* (`Query.distractors`) state the same relation for another
entity ("Zekutov was born in Pralta" for "Grofestus was born in [MASK]"): the blocks a reader that copies without
checking whose fact a sentence states copies a wrong name from.

Renaming: in every training example each name word (the syllable words of entity names; "River", "Guild"... are kept)
becomes a random name word of the world, one pool shared by every kind of entity, consistently across the query and
the block, and years and months become random years and months. The facts a trained encoder has seen are then
fictional, so what it does on the world's own (never renamed) text is reading, not recall: the probe's facts are
held out by construction, and the kind of name a sentence asks for pays nothing
(benchmarks/research/reader_that_reads.md).
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from openrealm.tokenization.masking import pieces_inside
from openrealm.trainers.pretraining.examples import JOINT_SEQ_LEN, joint_inputs
from openrealm.trainers.stage_utils import eval_mode
from openrealm.trainers.world.synthetic_world import MONTHS, World

KINDS = ("stating", "ambiguous", "mentioning", "without", "null")
DISTRACTOR = "distractor"  # a block without the span stating the same relation for another entity (Query.distractors)
# Words inside entity names that are ordinary words ("Mount X", "X River", "X Trading House"): never renamed.
NAME_WORDS = frozenset(
    ("river", "mount", "company", "works", "guild", "foundry", "press", "society", "trading", "house", "bank")
)
YEAR = re.compile(r"\b[12]\d{3}\b")
COPIED = math.log(0.5)  # a wordpiece counts as copied when the reader gives it p > 0.5


@dataclass(frozen=True)
class Segment:
    """A run of wordpieces of one text: `key` is the name word, year or month it spells (None: other words);
    `masked` whether it lies in the query's masked span."""

    ids: tuple[int, ...]
    key: str | None = None
    masked: bool = False


@dataclass(frozen=True)
class Query:
    """One maskable salient span: the sentence of block `block_id` holding it, its segments, and the other blocks of
    each kind (`KINDS` but "null"), as sorted block ids."""

    block_id: int
    sentence: str
    span: tuple[int, int]  # char offsets in `sentence`
    segments: tuple[Segment, ...]
    blocks: dict[str, tuple[int, ...]]
    stating_sentences: dict[int, tuple[Segment, ...]]  # stating or ambiguous block id -> its stating sentence
    distractors: tuple[int, ...] = ()  # the "without" blocks stating a fact of the same relation (another entity's)


class ReadingTasks:
    """The world's queries (every salient span of every block, as REALM masks them) with their blocks of each kind,
    and the examples built from them.

    `example(query, context, rng)` gives `(input_ids, labels, token_type_ids)` of `[CLS] query [SEP] context [SEP]`,
    labels at the masked wordpieces only; context: a block id, a tuple of segments (a stating sentence) or None (the
    null document); rng=None: no renaming (the world as it is).
    """

    def __init__(self, world: World, blocks, tokenizer, joint_seq_len: int = JOINT_SEQ_LEN):
        self.world, self.blocks, self.tokenizer, self.joint_seq_len = world, blocks, tokenizer, joint_seq_len
        self.texts = list(blocks["text"])
        words = {w for e in world.entities for w in e["name"].split() if w.lower() not in NAME_WORDS}
        years = {year for article in world.articles for year in YEAR.findall(article["text"])}
        self.pools = {"name": sorted(words), "year": sorted(years), "month": list(MONTHS)}
        self.pool_of = {key: pool for pool, keys in self.pools.items() for key in keys}
        self.pattern = re.compile(
            r"\b(" + "|".join(re.escape(k) for k in sorted(self.pool_of, key=lambda k: (-len(k), k))) + r")\b"
        )
        self.word_ids = {key: tuple(self._ids(key)) for key in self.pool_of}
        facts_by_sentence: dict[str, list[dict]] = {}
        for fact in world.facts:
            for mention in fact["mentions"]:
                sentence = world.sentence(mention["title"], mention["sentence_index"]).strip()
                facts_by_sentence.setdefault(sentence, []).append(fact)
        self.facts_by_sentence = facts_by_sentence
        # the facts each block states: those with a mention sentence inside the block's text
        self.block_facts = [
            {f["fact_id"]: f for s, facts in facts_by_sentence.items() if s in text for f in facts}
            for text in self.texts
        ]
        self.block_segments = [self.segments(text) for text in self.texts]
        # each block's salient spans (REALM's masking units) as segments, to spell them as an example renames them
        self.block_spans = [
            tuple(self.segments(row["text"][s:e]) for s, e in zip(row["span_char_starts"], row["span_char_ends"]))
            for row in blocks
        ]
        self.queries = [query for block_id, row in enumerate(blocks) for query in self._block_queries(block_id, row)]
        if not any(q.blocks["stating"] for q in self.queries):
            raise ValueError("no block of the corpus states a fact of another block's sentence: nothing to read")

    # -- text to segments ---------------------------------------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def segments(self, text: str, span: tuple[int, int] | None = None) -> tuple[Segment, ...]:
        """`text` as wordpiece segments: each name word, year or month its own segment, the rest in runs; with `span`
        (char offsets), the wordpieces wholly inside it marked masked (`pieces_inside`, as REALM's masking)."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        masked = set(pieces_inside(offsets, *span)) if span else set()
        match_of: list[tuple[int, str] | None] = [None] * len(ids)  # (which match, its word) of each wordpiece
        for number, match in enumerate(self.pattern.finditer(text)):
            for i in pieces_inside(offsets, match.start(), match.end()):
                match_of[i] = (number, match.group())
        out: list[Segment] = []
        for i, piece in enumerate(ids):
            if out and i > 0 and match_of[i] == match_of[i - 1] and (i in masked) == out[-1].masked:
                out[-1] = Segment(out[-1].ids + (piece,), out[-1].key, out[-1].masked)  # the same word or plain run
            else:
                out.append(Segment((piece,), match_of[i] and match_of[i][1], i in masked))
        return tuple(out)

    # -- queries and the kinds of blocks ------------------------------------------------------------------------------
    def roles(self, sentence: str, span_text: str) -> list[tuple[dict, str]]:
        """(fact, "subject" or "value") for each fact the sentence states in which the masked span is that side."""
        roles = []
        for fact in self.facts_by_sentence.get(sentence.strip(), []):
            if span_text == fact["subject"]:
                roles.append((fact, "subject"))
            elif span_text == fact["value"]:
                roles.append((fact, "value"))
        return roles

    def kind(self, roles: list[tuple[dict, str]], span_text: str, block_id: int) -> str:
        """Which of KINDS (but "null") block `block_id` is for a query with these roles and masked text."""
        if span_text not in self.texts[block_id]:
            return "without"
        stated = self.block_facts[block_id]
        if not roles or any(fact["fact_id"] not in stated for fact, _ in roles):
            return "mentioning"
        allowed = None  # the values the block allows for the masked side, under every role
        for fact, side in roles:
            known = "value" if side == "subject" else "subject"
            values = {
                other[side]
                for other in stated.values()
                if other["relation"] == fact["relation"] and other[known] == fact[known]
            }
            allowed = values if allowed is None else allowed & values
        return "stating" if len(allowed) == 1 else "ambiguous"

    def query(self, block_id: int, sentence: str, span: tuple[int, int]) -> Query:
        """The Query of masking `span` (char offsets) of `sentence`, a sentence of block `block_id`."""
        span_text = sentence[span[0] : span[1]]
        roles = self.roles(sentence, span_text)
        kinds: dict[str, list[int]] = {kind: [] for kind in KINDS[:-1]}
        for other in range(len(self.texts)):
            if other != block_id:
                kinds[self.kind(roles, span_text, other)].append(other)
        mentions = {
            self.world.sentence(m["title"], m["sentence_index"]).strip() for fact, _ in roles for m in fact["mentions"]
        } - {sentence.strip()}
        stating_sentences = {}
        for other in kinds["stating"] + kinds["ambiguous"]:
            found = [s for s in sorted(mentions) if s in self.texts[other]]
            stating_sentences[other] = self.segments(" ".join(found))
        relations = {fact["relation"] for fact, _ in roles}
        distractors = [
            b for b in kinds["without"] if any(f["relation"] in relations for f in self.block_facts[b].values())
        ]
        return Query(
            block_id,
            sentence,
            span,
            self.segments(sentence, span),
            {kind: tuple(ids) for kind, ids in kinds.items()},
            stating_sentences,
            tuple(distractors),
        )

    def _block_queries(self, block_id: int, row) -> list[Query]:
        text, queries = row["text"], []
        for start, end in zip(row["sentence_char_starts"], row["sentence_char_ends"]):
            for span_start, span_end in zip(row["span_char_starts"], row["span_char_ends"]):
                if start <= span_start and span_end <= end:
                    queries.append(self.query(block_id, text[start:end], (span_start - start, span_end - start)))
        return queries

    # -- examples -----------------------------------------------------------------------------------------------------
    def renaming(self, segments: Sequence[Segment], rng: random.Random) -> dict[str, tuple[int, ...]]:
        """A random new spelling for each name word, year and month among `segments`: distinct draws from their pool
        (names from one pool whatever the entity's kind)."""
        found: dict[str, list[str]] = {pool: [] for pool in self.pools}
        for key in sorted({s.key for s in segments if s.key is not None}):
            found[self.pool_of[key]].append(key)
        mapping = {}
        for pool, keys in found.items():
            for key, new in zip(keys, rng.sample(self.pools[pool], len(keys))):
                mapping[key] = self.word_ids[new]
        return mapping

    def example(
        self,
        query: Query,
        context: int | tuple[Segment, ...] | None,
        rng: random.Random | None = None,
        mapping: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[list[int], list[int], list[int]]:
        body_segments = (
            () if context is None else self.block_segments[context] if isinstance(context, int) else context
        )
        if mapping is None:
            mapping = self.renaming(query.segments + body_segments, rng) if rng is not None else {}
        query_ids, targets, positions = [], [], []
        for segment in query.segments:
            ids = spell(segment, mapping)
            if segment.masked:
                positions += range(len(query_ids), len(query_ids) + len(ids))
                targets += ids
                ids = [self.tokenizer.mask_token_id] * len(ids)
            query_ids += ids
        body = [i for segment in body_segments for i in spell(segment, mapping)]
        joint = joint_inputs(query_ids, body, self.tokenizer, self.joint_seq_len)
        labels = [-100] * len(joint["input_ids"])
        for position, target in zip(positions, targets):
            labels[1 + position] = target  # after [CLS]
        return joint["input_ids"], labels, joint["token_type_ids"]

    def fitting(self, query: Query, block_id: int, mapping: dict[str, tuple[int, ...]]) -> list[list[int]]:
        """For each masked wordpiece of `query` (place i of its n, spelled by `mapping` as `example` spells them): the
        sorted distinct i-th wordpieces of the salient spans of n wordpieces block `block_id` holds, spelled alike.
        These are what a reader that cannot tell which of the block's names answers the query may bet on."""
        n = sum(len(spell(segment, mapping)) for segment in query.segments if segment.masked)
        spans = {tuple(i for s in span for i in spell(s, mapping)) for span in self.block_spans[block_id]}
        spans = [span for span in spans if len(span) == n]
        return [sorted({span[place] for span in spans}) for place in range(n)]

    def with_null_twin(self, query: Query, block_id: int, rng: random.Random) -> tuple[tuple, tuple]:
        """(the query over block `block_id`, the same query over the null document), renamed alike: the pair on which
        a reader's prediction from a block can be compared with its prediction from no block."""
        mapping = self.renaming(query.segments + self.block_segments[block_id], rng)
        return self.example(query, block_id, mapping=mapping), self.example(query, None, mapping=mapping)


def spell(segment: Segment, mapping: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """A segment's wordpieces under a renaming (`ReadingTasks.renaming`): its new spelling if it is a renamed key."""
    return mapping.get(segment.key, segment.ids) if segment.key is not None else segment.ids


def collate(examples: list[tuple[list[int], list[int], list[int]]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad examples into input_ids, attention_mask, token_type_ids and labels [B, L]."""
    length = max(len(ids) for ids, _, _ in examples)
    pad = lambda row, value: row + [value] * (length - len(row))  # noqa: E731
    return {
        "input_ids": torch.tensor([pad(ids, pad_token_id) for ids, _, _ in examples]),
        "attention_mask": torch.tensor([pad([1] * len(ids), 0) for ids, _, _ in examples]),
        "token_type_ids": torch.tensor([pad(types, 0) for _, _, types in examples]),
        "labels": torch.tensor([pad(labels, -100) for _, labels, _ in examples]),
    }


def masked_vocab_log_prob(encoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(.|z,x) over the vocabulary at each masked wordpiece [N, V] (row-major over the batch), the MLM head run
    at those positions only, as REALM pre-training runs it. The batch moves to the encoder's device."""
    device = next(encoder.parameters()).device
    batch = {key: value.to(device) for key, value in batch.items()}
    hidden = encoder.realm(
        batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).last_hidden_state
    rows, positions = (batch["labels"] != -100).nonzero(as_tuple=True)
    return encoder.masked_log_prob(
        hidden, rows, positions, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    )


def masked_log_prob(encoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(y|z,x) of each masked wordpiece [N] (row-major over the batch; `masked_vocab_log_prob` at the labels)."""
    labels = batch["labels"]
    targets = labels[labels != -100].to(next(encoder.parameters()).device)
    return masked_vocab_log_prob(encoder, batch).gather(1, targets[:, None]).squeeze(1)


def examples_log_prob(encoder, examples: list, batch_size: int = 64) -> torch.Tensor:
    """masked_log_prob over a list of `ReadingTasks.example`s, `collate`d `batch_size` at a time: [N] over their
    masked wordpieces, in order."""
    batches = (collate(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size))
    return torch.cat([masked_log_prob(encoder, batch) for batch in batches])


def probe_examples(tasks: ReadingTasks, seed: int = 0) -> dict[str, list]:
    """The probe's examples, the world as it is (no renaming): one query per block drawn as REALM pre-training draws
    them (`fixed_masked_queries` over every block), and for each query one block of each kind it has, drawn at
    random, plus the null document, and one of its distractors (DISTRACTOR, drawn apart so that the other draws do not
    depend on them). {kind: [example, ...]}."""
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries

    queries = fixed_masked_queries(tasks.tokenizer, tasks.blocks, num_queries=len(tasks.texts), seed=seed)
    rng, other = np.random.default_rng(seed), np.random.default_rng(seed + 1)  # other: the distractors' draws
    sets: dict[str, list] = {kind: [] for kind in KINDS}
    distractors: list = []
    for block_id, sentence, span in zip(
        queries["block_id"].tolist(), queries["query_text"], queries["span"].tolist(), strict=True
    ):
        query = tasks.query(block_id, sentence, tuple(span))
        for kind, blocks in query.blocks.items():
            if blocks:
                sets[kind].append(tasks.example(query, int(rng.choice(blocks))))
        sets["null"].append(tasks.example(query, None))
        if query.distractors:
            distractors.append(tasks.example(query, int(other.choice(query.distractors))))
    if distractors:
        sets[DISTRACTOR] = distractors
    return sets


@torch.no_grad()
def reading_probe(encoder, tasks: ReadingTasks, examples: dict[str, list] | None = None, seed: int = 0) -> dict:
    """How well `encoder` reads, per masked wordpiece, in REALM's joint input on the world as it is: for each kind of
    block (`KINDS`, and DISTRACTOR where the world has them), the count of wordpieces, the mean log p(y|z,x) and the
    share copied (p > 0.5); at the top, `copy_share` and `stated_log_prob` from a stating block, and `utility`: the
    stating block's mean log p minus the null document's (what reading the block adds). examples:
    `probe_examples(tasks, seed)`, built once if None."""
    examples = probe_examples(tasks, seed) if examples is None else examples
    kinds = {}
    with eval_mode(encoder):
        for kind, rows in examples.items():
            if not rows:
                continue
            values = examples_log_prob(encoder, rows)
            kinds[kind] = {
                "wordpieces": len(values),
                "mean_log_prob": round(float(values.mean()), 4),
                "copy_share": round(float((values > COPIED).float().mean()), 4),
            }
    stating = kinds.get("stating", {"mean_log_prob": float("nan"), "copy_share": float("nan")})
    return {
        "copy_share": stating["copy_share"],
        "stated_log_prob": stating["mean_log_prob"],
        "utility": round(stating["mean_log_prob"] - kinds["null"]["mean_log_prob"], 4),
        "kinds": kinds,
    }


def probe_encoders(
    world: str | os.PathLike, corpus: str | os.PathLike, encoders: dict[str, str | os.PathLike]
) -> dict[str, dict]:
    """reading_probe of each encoder folder ({name: folder}) on a world folder and its corpus folder, the same
    examples for every encoder -> {name: probe}, each also printed in one line."""
    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.towers import load_encoder

    tokenizer = AutoTokenizer.from_pretrained(corpus)
    tasks = ReadingTasks(World.read(world), load_corpus(corpus), tokenizer)
    examples = probe_examples(tasks)
    probes = {name: reading_probe(load_encoder(path, tokenizer), tasks, examples) for name, path in encoders.items()}
    for name, probe in probes.items():
        print(
            f"reader at the {name}: copies {probe['copy_share']:.3f} of the masked wordpieces from a stating block "
            f"(mean log p {probe['stated_log_prob']:.2f}); utility {probe['utility']:.2f} nats over no block"
        )
    return probes


__all__ = [
    "DISTRACTOR",
    "KINDS",
    "NAME_WORDS",
    "Query",
    "ReadingTasks",
    "Segment",
    "collate",
    "examples_log_prob",
    "masked_log_prob",
    "masked_vocab_log_prob",
    "probe_encoders",
    "probe_examples",
    "reading_probe",
]
