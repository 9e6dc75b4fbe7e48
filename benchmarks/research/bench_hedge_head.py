"""Can a small reader hedge? Tells apart why the warm-up's readers put their probability on one name of a block or on
none, where a block holds names without stating the fact (benchmarks/research/reader_that_reads.md, "A head that can
hedge"): the training signal (it never asks for the hedge), the attention (it cannot find the names that fit), or the
output (an MLM head cannot put mass on k names at once).

    python benchmarks/research/bench_hedge_head.py --run realm-quickstart [--steps 1000] [--seed 0]

From a random encoder of the quickstart's size on the run's world and corpus, four short trainings (AdamW lr 1e-3,
batch 32, no curriculum), each with the MLM head alone and with the copy head beside it (`RealmConfig.copy_head`):
- "hedge": mentioning blocks only, the target spread evenly over the wordpieces that fit (`hedge_weight` 1): the
  attention's task alone, with the answer given;
- "plain": REALM's masked-LM loss over a mixture of stating (0.5), mentioning (0.25), without (0.15) and null (0.1)
  blocks: whether the warm-up's own loss finds the hedge.
On 400 fresh renamed examples of each kind it reports the mean p on the wordpieces that fit (`ReadingTasks.fitting`)
from a mentioning block and from one without the span, the share of stating-block wordpieces copied (p > 0.5) and the
mean log p of the true wordpiece from a mentioning block. One JSON line per training at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

PLAIN = {"stating": 0.5, "mentioning": 0.25, "without": 0.15, "null": 0.1}


def measure(encoder, tasks, draws: dict[str, list]) -> dict[str, float]:
    """Mean p on the fits (mentioning, without), copy share (stating), log p of the truth (mentioning)."""
    from openrealm.trainers.world.reading_tasks import collate, masked_vocab_log_prob

    out = {}
    encoder.eval()
    with torch.no_grad():
        for kind, rows in draws.items():
            chunks = [collate([example for example, _ in rows[i : i + 64]]) for i in range(0, len(rows), 64)]
            log_prob = torch.cat([masked_vocab_log_prob(encoder, chunk) for chunk in chunks])
            fits = [fit for _, example_fits in rows for fit in example_fits]
            targets = torch.tensor([label for (_, labels, _), _ in rows for label in labels if label != -100])
            truth = log_prob.gather(1, targets[:, None]).squeeze(1)
            if kind == "stating":
                out["stating_copies"] = float((truth.exp() > 0.5).float().mean())
                continue
            on_fits = [float(log_prob[row, fit].exp().sum()) for row, fit in enumerate(fits) if fit]
            out[f"{kind}_p_on_fits"] = sum(on_fits) / len(on_fits)
            if kind == "mentioning":
                out["mentioning_log_prob"] = float(truth.mean())
    return {key: round(value, 3) for key, value in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="an `openrealm quickstart` OUTPUT folder (its world and corpus)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.quickstart.stages import MODEL
    from openrealm.trainers.stage_utils import parse_config_overrides
    from openrealm.trainers.towers import load_encoder
    from openrealm.trainers.world.reading_tasks import ReadingTasks
    from openrealm.trainers.world.reading_warmup import Curriculum, query_pools, training_example, warm_up_reader
    from openrealm.trainers.world.synthetic_world import World

    run = Path(args.run)
    tokenizer = AutoTokenizer.from_pretrained(run / "corpus")
    tasks = ReadingTasks(World.read(run / "world"), load_corpus(str(run / "corpus")), tokenizer)
    pools, rng = query_pools(tasks), random.Random(args.seed + 1000)  # held apart from the trainings' draws
    kinds = ("stating", "mentioning", "without")
    draws = {kind: [training_example(tasks, kind, rng, pools) for _ in range(400)] for kind in kinds}
    trainings = {
        "hedge": (Curriculum(0.0, 0.0, 0.0, mixture={"mentioning": 1.0}), 1.0),
        "plain": (Curriculum(0.0, 0.0, 0.0, mixture=PLAIN), 0.0),
    }
    for name, (curriculum, hedge_weight) in trainings.items():
        for head in ("mlm", "copy"):
            overrides = parse_config_overrides(MODEL + (",copy_head=true" if head == "copy" else ""))
            encoder = load_encoder("random", tokenizer, overrides, seed=args.seed, warn_untrained_head=False)
            started = time.perf_counter()
            warm_up_reader(
                encoder, tasks, steps=args.steps, learning_rate=1e-3, warmup_steps=50, curriculum=curriculum,
                seed=args.seed, eval_every=args.steps, hedge_weight=hedge_weight,
            )  # fmt: skip
            row = {"training": name, "head": head, "steps": args.steps, "seed": args.seed}
            row |= measure(encoder, tasks, draws) | {"seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
