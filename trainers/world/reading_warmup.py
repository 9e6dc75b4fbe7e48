"""Reading warm-up: the "BERT stage" of the synthetic world, so that REALM pre-training starts from an encoder that
reads.

    warm_up_encoder(world="WORLD", corpus="CORPUS", output="READER", steps=1500)   # as `openrealm quickstart` does

REALM starts both towers from BERT, whose encoder already reads: given a masked fact and a passage stating it, it
copies the answer. A random encoder on the world's vocabulary cannot, so retrieval utility (what a retrieved block adds
to the masked-token likelihood) stays near 0 and the retriever gets no signal (benchmarks/RESULTS.md). This
stage teaches reading and nothing else. Each example is one sentence stating a fact with its subject or value masked
([MASK] per wordpiece), followed by up to 60 wordpieces of another article around a sentence stating the same fact;
a fraction `irrelevant` of the contexts come from a random article instead, so the encoder also learns to fall back
when a block does not help, as it must with REALM's useless candidates. Every entity-name wordpiece is renamed at
random in every example, consistently across the pair, so memorising the world's facts never pays: the answer must
be copied from the context. The result is a RealmKnowledgeAugEncoder for `openrealm train pretrain --encoder`.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import torch

from openrealm.trainers.stage_utils import eval_mode

# Wordpieces of entity names that are ordinary words, kept when names are renamed.
NAME_WORDS = ("river", "mount", "company", "works", "guild", "foundry", "press", "society", "trading", "house", "bank")
# Pairs held out to measure accuracy: 300, or three quarters of a smaller world's. Training on few pairs is deliberate:
# from 114 training pairs (seed 0 default world) the encoder copied 40% at step 1,000, from 332 it copied 1%; with
# names renamed in every example, few pairs cost no generality (benchmarks/RESULTS.md, "A reader that can read, and
# what REALM's gradient then does to the retriever").
HELD_OUT_PAIRS = 300


class FactPairs:
    """(masked sentence, context) training examples of a world, entity names renamed per example.

    Pairs are (fact, mention, other mention) for every ordered pair of a fact's mentions; after a fixed shuffle the
    first `HELD_OUT_PAIRS` (at most three quarters) are held out to measure accuracy.
    """

    def __init__(self, world, tokenizer, irrelevant: float = 0.0, context_length: int = 60):
        if not 0.0 <= irrelevant <= 1.0:
            raise ValueError(f"irrelevant must be a fraction in [0, 1], got {irrelevant}")
        self.world, self.tokenizer, self.irrelevant, self.context_length = world, tokenizer, irrelevant, context_length
        self.articles = world.articles_by_title
        ids = {i for entity in world.entities for i in self.ids(entity["name"])}
        self.name_ids = sorted(ids - set(tokenizer.convert_tokens_to_ids(list(NAME_WORDS))))
        pairs = [(f, a, b) for f in world.facts for a in f["mentions"] for b in f["mentions"] if a != b]
        if len(pairs) < 10:
            raise ValueError(f"the world states {len(pairs)} pairs of mentions of one fact; the warm-up needs 10")
        random.Random(0).shuffle(pairs)
        held_out = min(HELD_OUT_PAIRS, len(pairs) * 3 // 4)
        self.test, self.train = pairs[:held_out], pairs[held_out:]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def context(self, title: str, index: int) -> list[int]:
        """The sentence and its neighbours in the article, grown alternately after and before, within the length."""
        count, low, high = len(self.articles[title]["sentence_char_starts"]), index, index
        ids = self.ids(self.world.sentence(title, index))
        grew = True
        while grew:
            grew = False
            for j in (high + 1, low - 1):
                if (
                    0 <= j < count
                    and len(ids) + len(more := self.ids(self.world.sentence(title, j))) <= self.context_length
                ):
                    ids = ids + more if j > high else more + ids
                    low, high, grew = min(low, j), max(high, j), True
        return ids

    def example(
        self, pair, rng: random.Random, irrelevant: float | None = None
    ) -> tuple[list[int], list[int], list[int]]:
        """(input_ids, labels, token_type_ids): [CLS] masked sentence [SEP] context [SEP], names renamed; the context
        comes from a random article with probability `irrelevant` (default: the one given at construction)."""
        fact, mention, other = pair
        text = self.world.sentence(mention["title"], mention["sentence_index"])
        target = fact["value"] if rng.random() < 0.5 else fact["subject"]
        if target not in text:
            target = fact["subject"] if target == fact["value"] else fact["value"]
        start = text.index(target)
        before, span, after = self.ids(text[:start]), self.ids(target), self.ids(text[start + len(target) :])
        tok = self.tokenizer
        query = [tok.cls_token_id, *before, *[tok.mask_token_id] * len(span), *after, tok.sep_token_id]
        labels = [-100] * (1 + len(before)) + span + [-100] * (len(after) + 1)
        if rng.random() < (self.irrelevant if irrelevant is None else irrelevant):
            title = rng.choice(list(self.articles))
            context = self.context(title, rng.randrange(len(self.articles[title]["sentence_char_starts"])))
        else:
            context = self.context(other["title"], other["sentence_index"])
        context.append(tok.sep_token_id)
        renamed = self.name_ids[:]
        rng.shuffle(renamed)
        rename = dict(zip(self.name_ids, renamed))
        ids = [rename.get(i, i) for i in query + context]
        labels = [rename.get(i, i) if i != -100 else i for i in labels] + [-100] * len(context)
        return ids, labels, [0] * len(query) + [1] * len(context)


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


def mlm_logits(encoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The encoder's MLM logits [B, L, V] for one joint input (no retrieval: the context is in the input)."""
    hidden = encoder.realm(
        batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).last_hidden_state
    return encoder.cls(hidden)


@torch.no_grad()
def reading_accuracy(encoder, data: FactPairs) -> dict[str, float]:
    """On the held-out pairs (the same renaming every call): `accuracy`, the fraction whose every masked wordpiece is
    predicted from a context stating the fact, and `accuracy_irrelevant`, the same from a random article's context
    (what memorising would buy; near 0 when the encoder reads)."""
    with eval_mode(encoder):
        results = {}
        for name, irrelevant in (("accuracy", 0.0), ("accuracy_irrelevant", 1.0)):
            rng, correct = random.Random(5), 0
            for start in range(0, len(data.test), 50):
                batch = collate([data.example(pair, rng, irrelevant) for pair in data.test[start : start + 50]])
                predicted, labels = mlm_logits(encoder, batch).argmax(-1), batch["labels"]
                correct += sum(bool((p[m] == t[m]).all()) for p, t, m in zip(predicted, labels, labels != -100))
            results[name] = correct / len(data.test)
    return results


def warm_up_reader(
    encoder,
    data: FactPairs,
    steps: int = 1500,
    batch_size: int = 32,
    learning_rate: float = 2e-3,
    warmup_steps: int = 100,
    seed: int = 0,
    eval_every: int = 500,
) -> list[dict]:
    """Train `encoder` (a RealmKnowledgeAugEncoder, in place) to copy masked names from the context: AdamW, linear
    warm-up over `warmup_steps`, then linear decay to 0, gradients clipped at 1. Returns the history of
    reading_accuracy, every `eval_every` steps and at the end."""
    torch.manual_seed(seed)
    encoder.train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup_steps, max(0.0, (steps - step) / max(1, steps - warmup_steps)))
    )
    rng, started, history = random.Random(seed + 1), time.perf_counter(), []
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            history.append({"step": step, **reading_accuracy(encoder, data)})
            history[-1]["seconds"] = round(time.perf_counter() - started, 1)
            print(
                f"reading warm-up step {step}: accuracy {history[-1]['accuracy']:.3f} from a stating context, "
                f"{history[-1]['accuracy_irrelevant']:.3f} from a random one",
                flush=True,
            )
        if step == steps:
            break
        batch = collate([data.example(rng.choice(data.train), rng) for _ in range(batch_size)])
        loss = torch.nn.functional.cross_entropy(mlm_logits(encoder, batch).flatten(0, 1), batch["labels"].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    encoder.eval()
    return history


def warm_up_encoder(
    world: str | os.PathLike,
    corpus: str | os.PathLike,
    output: str | os.PathLike,
    encoder: str = "random",
    config_overrides: str = "",
    steps: int = 1500,
    batch_size: int = 32,
    learning_rate: float = 2e-3,
    irrelevant: float = 0.0,
    seed: int = 0,
) -> Path:
    """Warm up `encoder` ("random", sized by `config_overrides` k=v,..., or a REALM/BERT encoder folder to continue) on
    the pairs of a world folder (`openrealm world`) and its corpus folder (whose tokenizer it uses), and save it with
    its tokenizer and reading_warmup.json into `output`. irrelevant: the fraction of contexts from a random article."""
    from transformers import AutoTokenizer

    from openrealm.file_utils import check_apart
    from openrealm.trainers.stage_utils import parse_config_overrides
    from openrealm.trainers.towers import load_encoder, save_tower
    from openrealm.trainers.world.synthetic_world import World

    check_apart(output, [("world", world), ("corpus", corpus), ("encoder", encoder)], "output")
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    data = FactPairs(World.read(world), tokenizer, irrelevant)
    model = load_encoder(  # this stage trains the MLM head
        encoder, tokenizer, parse_config_overrides(config_overrides), seed, warn_untrained_head=False
    )
    history = warm_up_reader(model, data, steps, batch_size, learning_rate, seed=seed)
    summary = {"world": str(world), "corpus": str(corpus), "encoder": encoder, "config_overrides": config_overrides}
    summary |= {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate, "irrelevant": irrelevant}
    summary |= {"seed": seed, "history": history}
    return save_tower(model, output, tokenizer, {"reading_warmup.json": json.dumps(summary, indent=2) + "\n"})


__all__ = ["FactPairs", "collate", "mlm_logits", "warm_up_encoder", "warm_up_reader"]
