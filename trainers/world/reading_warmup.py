"""Reading warm-up: the "BERT stage" of the synthetic world, so that REALM pre-training starts from an encoder that
reads (copies a masked span from a block stating it) and falls back gracefully when a block does not state it.

    warm_up_encoder(world="WORLD", corpus="CORPUS", output="READER")   # as `openrealm quickstart` does

REALM starts its knowledge-augmented encoder from BERT, which already reads; a random encoder on the world's
vocabulary does not, and REALM's signal from a reader that barely reads moves the retriever the wrong way
(benchmarks/research/oracle_reader_control.md). This stage trains on REALM's own joint input over the world's
corpus (trainers/world/reading_tasks.py), names renamed in every example so that only reading pays, with a
curriculum that small transformers need to learn to copy within minutes (the copy circuit forms abruptly, later with
longer contexts and when a simpler solution also pays: Olsson et al. 2022, "In-context Learning and Induction Heads";
Edelman et al. 2024, "The Evolution of Statistical Induction Heads"; Singh et al. 2023, "The Transient Nature of
Emergent In-Context Learning in Transformers"):
1. the stating sentence alone as the context (short: the copy circuit forms);
2. whole stating blocks (the circuit finds the fact among the block's other facts);
3. a mixture of every kind of block REALM's candidates are (`Curriculum.mixture`): a stating block, an ambiguous one,
   one holding the span without stating the fact, one without it, the null document, so that the encoder shares its
   probability sensibly where a block does not state the fact instead of copying a wrong name with confidence.
Loss only at the masked wordpieces (REALM's masked-LM loss there), AdamW with linear warm-up and decay, no dropout.
Why these settings: benchmarks/research/reader_that_reads.md.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import accumulate
from pathlib import Path

import torch

from openrealm.trainers.world.reading_tasks import (
    DISTRACTOR,
    KINDS,
    ReadingTasks,
    collate,
    masked_vocab_log_prob,
    probe_examples,
    reading_probe,
)

MIXTURE_KINDS = (*KINDS, DISTRACTOR)  # what a Curriculum's mixture weighs


@dataclass(frozen=True)
class Curriculum:
    """What the warm-up's contexts are, by share of the steps: `sentence_share` of them the stating sentence alone,
    then `stating_share` whole stating blocks, then the rest drawn from `mixture` ({kind: weight}, KINDS), ramped in
    over `ramp_share` of the steps (an example's context comes from the mixture with a probability rising linearly
    from 0 to 1, else it is a stating block): switching at once took a copying encoder back by half its copy share.
    `final_mixture`, when given, replaces `mixture` over the last `final_share` of the steps (a late phase, e.g. more
    blocks without the span once the encoder copies: benchmarks/research/reader_that_reads.md). A mixture may also
    weigh DISTRACTOR: blocks without the span that state the same relation for another entity (`Query.distractors`)."""

    sentence_share: float = 0.15
    stating_share: float = 0.3
    ramp_share: float = 0.3
    mixture: dict[str, float] = field(
        default_factory=lambda: {"stating": 0.5, "ambiguous": 0.05, "mentioning": 0.25, "without": 0.15, "null": 0.05}
    )
    final_share: float = 0.0
    final_mixture: dict[str, float] | None = None

    def __post_init__(self):
        shares = (self.sentence_share, self.stating_share, self.ramp_share, self.final_share)
        if any(not 0.0 <= share <= 1.0 for share in shares) or sum(shares) > 1.0:
            raise ValueError(
                "sentence_share, stating_share, ramp_share and final_share must be fractions summing to at most 1, "
                f"got {shares}"
            )
        mixtures = {"mixture": self.mixture, "final_mixture": self.final_mixture}
        for name, mixture in mixtures.items():
            if mixture is None:  # no final phase
                continue
            unknown = set(mixture) - set(MIXTURE_KINDS)
            if unknown or any(weight < 0 for weight in mixture.values()) or sum(mixture.values()) <= 0:
                raise ValueError(f"{name} takes non-negative weights of {MIXTURE_KINDS}, not all 0; got {mixture}")

    def kinds(self) -> list[str]:
        """Every kind of block the mixtures draw (with a weight above 0)."""
        mixtures = (self.mixture, self.final_mixture or {})
        return sorted({kind for mixture in mixtures for kind, weight in mixture.items() if weight > 0})

    def kind(self, step: int, steps: int, rng: random.Random) -> str:
        """The context of one example at `step` of `steps`: "sentence", or one of MIXTURE_KINDS."""
        if step < self.sentence_share * steps:
            return "sentence"
        start, ramp = (self.sentence_share + self.stating_share) * steps, self.ramp_share * steps
        if step < start or (step < start + ramp and rng.random() >= (step - start) / ramp):
            return "stating"
        late = self.final_mixture is not None and step >= (1.0 - self.final_share) * steps
        mixture = self.final_mixture if late else self.mixture
        kinds = [kind for kind, weight in mixture.items() if weight > 0]
        return rng.choices(kinds, weights=[mixture[kind] for kind in kinds])[0]


HEDGE_KINDS = ("mentioning", "without", DISTRACTOR)  # blocks that hold names but do not state the query's fact


def no_fits(example) -> list[list[int]]:
    """An empty list of fits for each masked wordpiece of `example` (no hedge asked of it)."""
    return [[] for label in example[1] if label != -100]


def training_example(tasks: ReadingTasks, kind: str, rng: random.Random, pools: dict[str, list]):
    """(example, fits): one renamed example with a context of `kind` ("sentence" or one of MIXTURE_KINDS), and for
    each of its masked wordpieces the wordpieces of the block's names that fit it (`ReadingTasks.fitting`) where the
    block is of HEDGE_KINDS, else empty lists; pools: {kind: the queries having such a block} (`query_pools`)."""
    if kind == "null":
        example = tasks.example(rng.choice(tasks.queries), None, rng)
        return example, no_fits(example)
    query = rng.choice(pools["stating" if kind == "sentence" else kind])
    if kind == "sentence":
        example = tasks.example(query, query.stating_sentences[rng.choice(query.blocks["stating"])], rng)
        return example, no_fits(example)
    block = rng.choice(query.distractors) if kind == DISTRACTOR else rng.choice(query.blocks[kind])
    mapping = tasks.renaming(query.segments + tasks.block_segments[block], rng)  # as `example` would draw it
    example = tasks.example(query, block, mapping=mapping)
    return example, tasks.fitting(query, block, mapping) if kind in HEDGE_KINDS else no_fits(example)


def training_batch(
    tasks: ReadingTasks,
    draw_kind: Callable[[], str],
    batch_size: int,
    rng: random.Random,
    pools: dict[str, list],
    null_twins: bool = False,
) -> tuple[list, list, list[int], list[list[int]]]:
    """(examples, twins, rows, fits): `batch_size` `training_example`s, each of a kind `draw_kind()` draws just
    before it; with null_twins, an example over a block without the span also gives its null twin
    (`ReadingTasks.with_null_twin`, the example drawn as it is alone) and `rows` says which examples the twins belong
    to; fits: the examples' `training_example` fits, concatenated (one list per masked wordpiece, in order)."""
    examples, twins, rows, fits = [], [], [], []
    for _ in range(batch_size):
        kind = draw_kind()
        if null_twins and kind == "without":
            query = rng.choice(pools[kind])
            block = rng.choice(query.blocks[kind])
            example, twin = tasks.with_null_twin(query, block, rng)
            rows.append(len(examples))
            twins.append(twin)
            fits += no_fits(example)  # the twin's loss, not a hedge, pays this block
        else:
            example, example_fits = training_example(tasks, kind, rng, pools)
            fits += example_fits
        examples.append(example)
    return examples, twins, rows, fits


def batch_log_prob(encoder, examples: list, twins: list, pad_token_id: int = 0) -> torch.Tensor:
    """`masked_vocab_log_prob` [N, V] of `collate(examples + twins)` (row-major: the examples' masked wordpieces, then
    the twins'), the twins run as a batch of their own: a query over the null document is short, and padded beside the
    examples it would cost a whole block's length (the values are the same; padding is masked out)."""
    parts = [collate(part, pad_token_id) for part in (examples, twins) if part]
    return torch.cat([masked_vocab_log_prob(encoder, batch) for batch in parts])


def warm_up_loss(
    log_prob: torch.Tensor,
    labels: torch.Tensor,
    twin_rows: list[int],
    null_match_weight: float,
    fits: list[list[int]] | None = None,
    hedge_weight: float = 0.0,
):
    """The warm-up's loss from `masked_vocab_log_prob` [N, V] of a `collate`d batch of B examples followed by the
    null twins of its rows `twin_rows` (labels [B + T, L]): the masked-LM loss over the B examples' masked wordpieces,
    plus null_match_weight times the mean over the twinned examples' wordpieces of KL(p(.|null, x) || p(.|block,
    x)), the null document's prediction held fixed: a block without the span is paid for predicting what no block
    predicts, rather than the names it holds.

    hedge_weight > 0, with `fits` (one list of wordpiece ids per masked wordpiece of the B examples): where a
    wordpiece's list is not empty its target is (1 - hedge_weight) on the true wordpiece and hedge_weight spread evenly
    over the listed ones (the block's names that fit): a block that holds names without stating the fact is paid for
    a hedge across them rather than a bet on one (benchmarks/research/reader_that_reads.md, "A head that can
    hedge")."""
    counts = (labels != -100).sum(1).tolist()
    batch_size = len(counts) - len(twin_rows)
    main = sum(counts[:batch_size])
    targets = labels[labels != -100][:main].to(log_prob.device)
    token_loss = -log_prob[:main].gather(1, targets[:, None]).squeeze(1)
    if hedge_weight > 0.0 and fits is not None and any(fits):
        if len(fits) != main:
            raise ValueError(f"fits has {len(fits)} lists for {main} masked wordpieces")
        rows = [row for row, fit in enumerate(fits) if fit]
        row_of = torch.tensor([row for row in rows for _ in fits[row]], device=log_prob.device)
        ids = torch.tensor([piece for row in rows for piece in fits[row]], device=log_prob.device)
        weights = torch.tensor([1.0 / len(fits[row]) for row in rows for _ in fits[row]], device=log_prob.device)
        hedge = torch.zeros(main, device=log_prob.device).index_add(0, row_of, -log_prob[row_of, ids] * weights)
        hedged = torch.zeros(main, dtype=torch.bool, device=log_prob.device)
        hedged[rows] = True
        token_loss = torch.where(hedged, (1.0 - hedge_weight) * token_loss + hedge_weight * hedge, token_loss)
    loss = token_loss.mean()
    if not twin_rows or null_match_weight == 0.0:
        return loss
    starts = [0, *accumulate(counts)]
    block = torch.cat([torch.arange(starts[row], starts[row + 1]) for row in twin_rows])
    null = log_prob[main:].detach()
    return loss + null_match_weight * (null.exp() * (null - log_prob[block.to(log_prob.device)])).sum(-1).mean()


def query_pools(tasks: ReadingTasks) -> dict[str, list]:
    """{kind: the queries with at least one block of that kind} (MIXTURE_KINDS but "null")."""
    pools = {kind: [q for q in tasks.queries if q.blocks[kind]] for kind in KINDS[:-1]}
    return pools | {DISTRACTOR: [q for q in tasks.queries if q.distractors]}


def warm_up_reader(
    encoder,
    tasks: ReadingTasks,
    steps: int = 3600,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    curriculum: Curriculum | None = None,
    seed: int = 0,
    eval_every: int = 500,
    null_match_weight: float = 0.0,
    hedge_weight: float = 0.0,
) -> list[dict]:
    """Train `encoder` (a RealmKnowledgeAugEncoder, in place) on `tasks` by `curriculum`: AdamW (weight decay 0.01),
    linear warm-up over `warmup_steps` then linear decay to 0, gradients clipped at 1. Returns the history of
    `reading_probe` (its top-level numbers and each kind's mean log p), every `eval_every` steps and at the end.
    null_match_weight > 0: blocks without the span are also paid for matching the null document's prediction
    (`warm_up_loss`; their null twins cost one more short input each). hedge_weight > 0: blocks of HEDGE_KINDS are
    paid for a hedge across the names that fit (`warm_up_loss`). Runs on the GPU where there is one; the encoder
    stays there."""
    if null_match_weight < 0:
        raise ValueError(f"null_match_weight must be >= 0, got {null_match_weight}")
    if not 0.0 <= hedge_weight <= 1.0:
        raise ValueError(f"hedge_weight must be within [0, 1], got {hedge_weight}")
    curriculum = curriculum or Curriculum()
    pools = query_pools(tasks)
    for kind in ("stating", *[k for k in curriculum.kinds() if k != "null"]):
        if not pools[kind]:
            raise ValueError(f"the corpus gives no query a {kind} block; the curriculum needs one")
    torch.manual_seed(seed)
    encoder.to("cuda" if torch.cuda.is_available() else "cpu").train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup_steps, max(0.0, (steps - step) / max(1, steps - warmup_steps)))
    )
    rng, probe, started, history = random.Random(seed + 1), probe_examples(tasks), time.perf_counter(), []
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            result = reading_probe(encoder, tasks, probe)
            history.append(
                {"step": step, "copy_share": result["copy_share"], "stated_log_prob": result["stated_log_prob"]}
                | {"utility": result["utility"]}
                | {f"{kind}_log_prob": value["mean_log_prob"] for kind, value in result["kinds"].items()}
                | {"seconds": round(time.perf_counter() - started, 1)}
            )
            print(
                f"reading warm-up step {step}: copies {result['copy_share']:.3f} of the masked wordpieces from a "
                f"stating block (mean log p {result['stated_log_prob']:.2f}), utility {result['utility']:.2f} nats",
                flush=True,
            )
        if step == steps:
            break
        examples, twins, rows, fits = training_batch(
            tasks, partial(curriculum.kind, step, steps, rng), batch_size, rng, pools, null_match_weight > 0
        )
        log_prob = batch_log_prob(encoder, examples, twins, tasks.tokenizer.pad_token_id)
        labels = collate(examples + twins, tasks.tokenizer.pad_token_id)["labels"]
        loss = warm_up_loss(log_prob, labels, rows, null_match_weight, fits, hedge_weight)
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
    steps: int = 3600,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    curriculum: Curriculum | None = None,
    seed: int = 0,
    null_match_weight: float = 0.0,
    hedge_weight: float = 0.0,
) -> Path:
    """Warm up `encoder` ("random", sized by `config_overrides` k=v,..., or a REALM/BERT encoder folder to continue) on
    a world folder (`openrealm world`) and its corpus folder (whose tokenizer it uses), and save it with its tokenizer
    and reading_warmup.json (settings and history) into `output`."""
    from transformers import AutoTokenizer

    from openrealm.file_utils import check_apart
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.stage_utils import parse_config_overrides
    from openrealm.trainers.towers import load_encoder, save_tower
    from openrealm.trainers.world.synthetic_world import World

    check_apart(output, [("world", world), ("corpus", corpus), ("encoder", encoder)], "output")
    curriculum = curriculum or Curriculum()
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    tasks = ReadingTasks(World.read(world), load_corpus(corpus), tokenizer)
    model = load_encoder(  # this stage trains the MLM head
        encoder, tokenizer, parse_config_overrides(config_overrides), seed, warn_untrained_head=False
    )
    history = warm_up_reader(
        model, tasks, steps, batch_size, learning_rate, curriculum=curriculum, seed=seed,
        null_match_weight=null_match_weight, hedge_weight=hedge_weight,
    )  # fmt: skip
    summary = {"world": str(world), "corpus": str(corpus), "encoder": encoder, "config_overrides": config_overrides}
    summary |= {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate}
    summary |= {"null_match_weight": null_match_weight, "hedge_weight": hedge_weight}
    summary |= {"curriculum": asdict(curriculum), "seed": seed, "history": history}
    return save_tower(model, output, tokenizer, {"reading_warmup.json": json.dumps(summary, indent=2) + "\n"})


__all__ = [
    "Curriculum",
    "batch_log_prob",
    "HEDGE_KINDS",
    "MIXTURE_KINDS",
    "query_pools",
    "training_batch",
    "training_example",
    "warm_up_encoder",
    "warm_up_loss",
    "warm_up_reader",
]
