"""Does REALM's own reader (no oracle) train the retriever on the tests' tiny world? The measurement behind a CI test
of the learned reader (benchmarks/research/reader_that_reads.md, "The learned reader on the tests' tiny world").

Per seed: the tests' `TinyWorld` (about 65 blocks of 64 wordpieces), an ICT start (`train ict`, 100 steps), an encoder
of the quickstart's size warmed up to read (`warm_up_reader`, the quickstart's curriculum; `--reader random`: no
warm-up, the control), then `train pretrain` with the learned reader (oracle weight 0), refresh sync; prints the
held-out masked-query recall@5 of the start and after, with the reader's copy share and the seconds each part took.

    python benchmarks/research/bench_learned_reader_tiny.py --seeds 0 3 --warmup-steps 2000 --steps 200
    python benchmarks/research/bench_learned_reader_tiny.py --seeds 0 3 --reader random
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))  # helpers.py

from helpers import HELD_OUT_BLOCKS, TINY_WORLD, TinyWorld  # noqa: E402

from openrealm.trainers import cli  # noqa: E402
from openrealm.trainers.stage_utils import parse_config_overrides  # noqa: E402
from openrealm.trainers.towers import load_encoder, save_tower  # noqa: E402
from openrealm.trainers.world.reading_tasks import ReadingTasks  # noqa: E402
from openrealm.trainers.world.reading_warmup import warm_up_reader  # noqa: E402
from openrealm.trainers.world.synthetic_world import generate_world  # noqa: E402

# The quickstart's towers (trainers/quickstart/stages.py MODEL), 384 positions for pre-training's joint input.
MODEL = (
    "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=256,retriever_proj_size=32,"
    "hidden_dropout_prob=0,attention_probs_dropout_prob=0,max_position_embeddings=384"
)


def run_seed(root: Path, seed: int, args: argparse.Namespace) -> dict:
    """One seed: ICT start, reader, REALM pre-training; the held-out recalls and timings."""
    started = time.perf_counter()
    world = TinyWorld(root, seed)
    ict = root / "ict"
    assert cli.main([
        "train", "ict", "--corpus", str(world.corpus), "--init", "random", "--output", str(ict),
        "--config-overrides", MODEL, "--max-steps", str(args.ict_steps), "--batch-size", "32",
        "--learning-rate", "1e-3", "--save-steps", "0", "--seed", str(seed), "--embedding-dropout", "0", "--quiet",
    ]) == 0  # fmt: skip
    encoder = load_encoder("random", world.tokenizer, parse_config_overrides(MODEL), seed, warn_untrained_head=False)
    history = []
    if args.reader == "warm":
        tasks = ReadingTasks(generate_world(seed=seed, **TINY_WORLD), world.blocks, world.tokenizer)
        history = warm_up_reader(encoder, tasks, steps=args.warmup_steps, seed=seed, eval_every=args.warmup_steps)
    save_tower(encoder, root / "reader", world.tokenizer)
    prepared = time.perf_counter()
    output = root / "realm"
    assert cli.main([
        "train", "pretrain", "--corpus", str(world.corpus), "--embedder", str(ict), "--encoder", str(root / "reader"),
        "--output", str(output), "--max-steps", str(args.steps), "--refresh-every", "10", "--refresh-mode", "sync",
        "--batch-size", "16", "--num-candidates", "8", "--learning-rate", "3e-5", "--embedder-learning-rate", "1e-3",
        "--warmup-steps", "10", "--embedding-dropout", "0", "--hold-out-queries", str(HELD_OUT_BLOCKS),
        "--seed", str(seed), "--logging-steps", str(args.steps), "--quiet",
    ]) == 0  # fmt: skip
    trained = time.perf_counter()
    start, end = world.recall(ict), world.recall(output / "embedder")
    return {
        "seed": seed,
        "reader": args.reader,
        "copy_share": history[-1]["copy_share"] if history else None,
        "start": round(start, 4),
        "end": round(end, 4),
        "gain": round(end - start, 4),
        "seconds_start_and_reader": round(prepared - started, 1),
        "seconds_pretraining": round(trained - prepared, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--reader", choices=("warm", "random"), default="warm")
    parser.add_argument("--warmup-steps", type=int, default=2000)
    parser.add_argument("--ict-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"learned-reader-{seed}-") as root:
            results.append(run_seed(Path(root), seed, args))
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
