"""Can a tiny encoder learn to read before REALM pre-training? A "BERT stage" for the synthetic world (issue 14).

    python benchmarks/bench_reader_warmup.py --world-dir RUN --output READER [--hidden 64] [--layers 2]
        [--steps 2000] [--learning-rate 2e-3] [--irrelevant 0.0] [--init FOLDER] [--schedule constant|linear]

RUN is a folder with world/ and corpus/ (what `openrealm quickstart` or benchmarks/bench_learning.py writes). Each
example is one sentence stating a fact with its subject or value masked ([MASK] per wordpiece), followed by the
context of another sentence stating the same fact in another article (up to 60 wordpieces of that article around
it). Every entity-name wordpiece is renamed at random in every example, consistently across the pair, so the encoder
cannot learn the world's facts and must copy the span from the context. With `--irrelevant P`, a fraction P of the
contexts come from a random article instead (so the encoder learns to fall back when the block does not help, as it
must with REALM's useless candidates). Prints the accuracy (every masked wordpiece right) on 300 held-out pairs every
250 steps and saves a RealmKnowledgeAugEncoder that `--encoder` of `openrealm train pretrain` or
benchmarks/bench_learning.py takes. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from openrealm import RealmConfig, RealmKnowledgeAugEncoder

# Wordpieces of entity names that are ordinary words (kept, not renamed).
NAME_WORDS = ("river", "mount", "company", "works", "guild", "foundry", "press", "society", "trading", "house", "bank")


class FactPairs:
    """(masked sentence, context) examples from a world folder, names renamed per example."""

    def __init__(self, run: Path, irrelevant: float, context_length: int = 60):
        self.tokenizer = AutoTokenizer.from_pretrained(run / "corpus")
        read = lambda name: [json.loads(line) for line in open(run / "world" / name, encoding="utf-8")]  # noqa: E731
        self.articles = {article["title"]: article for article in read("articles.jsonl")}
        names = {entity["name"] for entity in read("entities.jsonl")}
        ids = {i for name in names for i in self.tokenizer(name, add_special_tokens=False)["input_ids"]}
        self.name_ids = sorted(ids - set(self.tokenizer.convert_tokens_to_ids(list(NAME_WORDS))))
        self.irrelevant, self.context_length = irrelevant, context_length
        pairs = [(f, a, b) for f in read("facts.jsonl") for a in f["mentions"] for b in f["mentions"] if a != b]
        random.Random(0).shuffle(pairs)
        self.test, self.train = pairs[:300], pairs[300:]

    def sentence(self, title: str, index: int) -> str:
        article = self.articles[title]
        return article["text"][article["sentence_char_starts"][index] : article["sentence_char_ends"][index]]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def context(self, title: str, index: int) -> list[int]:
        """The sentence and its neighbours in the article, grown alternately after and before, within the length."""
        count, low, high = len(self.articles[title]["sentence_char_starts"]), index, index
        ids = self.ids(self.sentence(title, index))
        grew = True
        while grew:
            grew = False
            for j in (high + 1, low - 1):
                if 0 <= j < count and len(ids) + len(more := self.ids(self.sentence(title, j))) <= self.context_length:
                    ids = ids + more if j > high else more + ids
                    low, high, grew = min(low, j), max(high, j), True
        return ids

    def example(self, pair, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
        fact, mention, other = pair
        text = self.sentence(mention["title"], mention["sentence_index"])
        target = fact["value"] if rng.random() < 0.5 else fact["subject"]
        if target not in text:
            target = fact["subject"] if target == fact["value"] else fact["value"]
        start = text.index(target)
        before, span, after = self.ids(text[:start]), self.ids(target), self.ids(text[start + len(target) :])
        tok = self.tokenizer
        query = [tok.cls_token_id, *before, *[tok.mask_token_id] * len(span), *after, tok.sep_token_id]
        labels = [-100] * (1 + len(before)) + span + [-100] * (len(after) + 1)
        if rng.random() < self.irrelevant:
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


def collate(examples) -> dict[str, torch.Tensor]:
    length = max(len(ids) for ids, _, _ in examples)
    pad = lambda row, value: row + [value] * (length - len(row))  # noqa: E731
    return {
        "input_ids": torch.tensor([pad(ids, 0) for ids, _, _ in examples]),
        "attention_mask": torch.tensor([pad([1] * len(ids), 0) for ids, _, _ in examples]),
        "token_type_ids": torch.tensor([pad(types, 0) for _, _, types in examples]),
        "labels": torch.tensor([pad(labels, -100) for _, labels, _ in examples]),
    }


def logits_of(model: RealmKnowledgeAugEncoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    hidden = model.realm(
        batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).last_hidden_state
    return model.cls(hidden)


@torch.no_grad()
def accuracy(model: RealmKnowledgeAugEncoder, data: FactPairs) -> float:
    """Fraction of the held-out pairs whose every masked wordpiece is predicted (same renaming every time)."""
    model.eval()
    rng, correct = random.Random(5), 0
    for start in range(0, len(data.test), 50):
        batch = collate([data.example(pair, rng) for pair in data.test[start : start + 50]])
        predicted, labels = logits_of(model, batch).argmax(-1), batch["labels"]
        correct += sum(bool((p[m] == t[m]).all()) for p, t, m in zip(predicted, labels, labels != -100))
    model.train()
    return correct / len(data.test)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-dir", required=True, type=Path, help="a folder with world/ and corpus/")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--irrelevant", type=float, default=0.0, help="fraction of contexts from a random article")
    parser.add_argument("--init", default=None, help="a RealmKnowledgeAugEncoder folder to continue from")
    parser.add_argument(
        "--schedule", choices=("constant", "linear"), default="constant", help="after 100 warm-up steps"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    data = FactPairs(args.world_dir, args.irrelevant)
    torch.manual_seed(args.seed)
    if args.init:
        model = RealmKnowledgeAugEncoder.from_pretrained(args.init)
    else:
        config = RealmConfig(
            vocab_size=len(data.tokenizer), hidden_size=args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=4, intermediate_size=4 * args.hidden, hidden_dropout_prob=0,
            attention_probs_dropout_prob=0, max_position_embeddings=384, retriever_proj_size=32,
        )  # fmt: skip
        model = RealmKnowledgeAugEncoder(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    decay = (lambda step: max(0.0, 1 - step / args.steps)) if args.schedule == "linear" else (lambda step: 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 100) * decay(step))
    rng, started = random.Random(args.seed + 1), time.perf_counter()
    for step in range(args.steps + 1):
        if step % 250 == 0 or step == args.steps:
            print(f"step {step}: accuracy {accuracy(model, data):.3f} ({time.perf_counter() - started:.0f} s)")
        if step == args.steps:
            break
        batch = collate([data.example(rng.choice(data.train), rng) for _ in range(args.batch_size)])
        logits = logits_of(model, batch)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.save_pretrained(args.output)
    data.tokenizer.save_pretrained(args.output)
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
