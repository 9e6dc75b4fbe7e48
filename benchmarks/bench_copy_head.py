"""The copy head's cost (`RealmConfig.copy_head`, modeling_realm's `RealmCopyHead`) in the quickstart's two stages that
run it, against the MLM head alone and against the head's earlier formula, in the same run.

    python benchmarks/bench_copy_head.py [--repeats 5] [--threads 1]

On the quickstart's default world (seed 0) and model (width 64, 2 layers), forward and backward of the masked
wordpieces' log p (`masked_vocab_log_prob` / `masked_log_prob`, the path the stages train through) for:
- the reading warm-up's batches (32 examples from the warm-up's final mixture, the null-match loss's null twins
  drawn: `training_batch(..., null_twins=True)`), the twins padded into the examples' batch ("joint", as before) or
  in a batch of their own ("split", as the warm-up now runs them), and without twins;
- REALM's joint passes through `masked_log_prob`: 16 queries x 8 rows of the same length as REALM's (reading
  examples; the masked positions those of each query's first row).
Each with the MLM head alone, the copy head as it is (the query projected back through the key weights: keys never
computed) and the copy head's earlier formula (keys projected at every document wordpiece of every masked wordpiece's
row: `RealmCopyHead.scores` patched for the measurement). Reported: seconds per step (median of --repeats passes over
20 batches, the cells interleaved pass by pass) and ratios against the MLM head alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer

from openrealm.modeling_realm import RealmCopyHead
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers.quickstart.stages import DEFAULT, MODEL, Stages
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_encoder
from openrealm.trainers.world.reading_tasks import ReadingTasks, collate, masked_vocab_log_prob
from openrealm.trainers.world.reading_warmup import Curriculum, query_pools, training_batch
from openrealm.trainers.world.synthetic_world import World

CURRENT = RealmCopyHead.scores


def projected_keys(self, hidden_at, hidden):
    """The copy head's earlier scores: keys k(h_j) projected at every wordpiece of every row, q(h) . k(h_j)."""
    scores = torch.einsum("...md,...ld->...ml", self.query(hidden_at), self.key(hidden)).float()
    return scores / hidden.shape[-1] ** 0.5


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def seconds_per_step(step, batches) -> float:
    started = time.perf_counter()
    for batch in batches:
        step(batch).backward()
    return (time.perf_counter() - started) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        stages = Stages(Path(scratch), DEFAULT, seed=0, progress=False)
        corpus = stages.corpus(stages.world())
        tokenizer = AutoTokenizer.from_pretrained(corpus)
        tasks = ReadingTasks(World.read(stages.path("world")), load_corpus(corpus), tokenizer)
        mixture = Curriculum(sentence_share=0.0, stating_share=0.0, ramp_share=0.0)
        rng, pools = random.Random(0), query_pools(tasks)
        draws = [training_batch(tasks, partial(mixture.kind, 0, 1, rng), 32, rng, pools, True) for _ in range(20)]
        joint_input = []
        for examples, _, _, _ in draws:  # query i's rows: its example, then 7 others (REALM's rows' lengths)
            rows = [examples[(i + 7 * j) % 32] for i in range(16) for j in range(8)]
            batch = collate(rows)
            joint_input.append({key: value.view(16, 8, -1) for key, value in batch.items()})
        models = {
            copy: load_encoder(
                "random",
                tokenizer,
                parse_config_overrides(MODEL + f",copy_head={str(copy).lower()}"),
                0,
                warn_untrained_head=False,
            ).train()
            for copy in (False, True)
        }

        def warm_up(model, parts):
            def step(draw):
                examples, twins = draw[:2]
                groups = {"joint": [examples + twins], "split": [examples, twins], "none": [examples]}[parts]
                return torch.cat([masked_vocab_log_prob(model, collate(g)) for g in groups if g])[:, 5].sum()

            return step

        def realm(model):
            def step(batch):
                flat = {key: value.flatten(0, 1) for key, value in batch.items()}
                hidden = model.realm(
                    flat["input_ids"], attention_mask=flat["attention_mask"], token_type_ids=flat["token_type_ids"]
                ).last_hidden_state.view(16, 8, flat["input_ids"].shape[-1], -1)
                rows, positions = (batch["labels"][:, 0] != -100).nonzero(as_tuple=True)
                ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
                return model.masked_log_prob(hidden, rows, positions, ids, types, mask)[..., 5].sum()

            return step

        heads = {
            "MLM head alone": (models[False], CURRENT),
            "copy head (keys never projected)": (models[True], CURRENT),
            "copy head, earlier formula (keys projected per masked wordpiece)": (models[True], projected_keys),
        }
        columns = {
            **{
                f"warm-up, twins {parts}": (partial(warm_up, parts=parts), draws)
                for parts in ("joint", "split", "none")
            },
            "REALM joint passes (16 x 8)": (realm, joint_input),
        }
        times = {(head, column): [] for head in heads for column in columns}
        for _ in range(args.repeats):  # interleaved, so that a slower spell of the machine touches every cell alike
            for (head, column), found in times.items():
                model, scores = heads[head]
                RealmCopyHead.scores = scores
                step, batches = columns[column]
                found.append(seconds_per_step(step(model), batches))
        results = {head: {column: statistics.median(times[head, column]) for column in columns} for head in heads}
        RealmCopyHead.scores = CURRENT
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, threads {args.threads}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    names = list(next(iter(results.values())))
    print("| head | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    base = results["MLM head alone"]
    for head, row in results.items():
        cells = [f"{1000 * row[c]:.1f} ms ({row[c] / base[c]:.2f}x)" for c in names]
        print(f"| {head} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
