"""Does REALM's own reader (no oracle) train the retriever on the tests' tiny world? How the learned-reader part of
tests/learning/test_retriever_learns.py was set, and that it fails without a reader or without the gradient
(benchmarks/research/reader_that_reads.md, "The learned reader on the tests' tiny world").

Per seed: the tests' `TinyWorld` (about 65 blocks of 64 wordpieces), its ICT start (`ict_start`: 100 steps from
random towers of the quickstart's size), an encoder of that size warmed up to read (`warm_up_reader`, the quickstart's
curriculum; `--reader random`: no warm-up, the control), then the test's `learned_pretrain` (oracle weight 0; refresh
sync, or `--refresh-mode`); prints the held-out masked-query recall@5 of the start and after, with the reader's copy
share and the seconds each part took. With `--starts DIR`, the ICT start and the warmed-up reader are read from
DIR/seed-N/embedder and DIR/seed-N/encoder when there, else made and written there (the test's stored starts:
tests/learning/starts/README.md). `--break detach` cuts the query and candidate embeddings from the graph
(bench_retriever_learns_test.py). `--threads` and the kernel variables (ATEN_CPU_CAPABILITY=default,
MKL_CBWR=COMPATIBLE) give the same run another CPU's arithmetic.

    python benchmarks/research/bench_learned_reader_tiny.py --seeds 0 1 2 3 --starts tests/learning/starts
    python benchmarks/research/bench_learned_reader_tiny.py --seeds 0 1 2 3 4 5 6 7 --starts /tmp/starts
    python benchmarks/research/bench_learned_reader_tiny.py --starts tests/learning/starts --reader random
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "learning"), str(Path(__file__).resolve().parent)]

from bench_retriever_learns_test import BREAKS  # noqa: E402
from helpers import TinyWorld  # noqa: E402
from test_retriever_learns import (  # noqa: E402
    EMBEDDER_LEARNING_RATE,
    LEARNED_BATCH_SIZE,
    LEARNED_CANDIDATES,
    LEARNED_STEPS,
    learned_pretrain,
)

from openrealm.trainers import cli  # noqa: E402
from openrealm.trainers.stage_utils import parse_config_overrides  # noqa: E402
from openrealm.trainers.towers import load_encoder, save_tower  # noqa: E402
from openrealm.trainers.world.reading_tasks import ReadingTasks  # noqa: E402
from openrealm.trainers.world.reading_warmup import warm_up_reader  # noqa: E402

# The quickstart's tower size, 128 positions: a tiny world's query and block fit.
TOWER = (
    "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=256,retriever_proj_size=32,"
    "hidden_dropout_prob=0,attention_probs_dropout_prob=0,max_position_embeddings=128"
)
TOWER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def keep_tower_files(folder: Path, *extra: str) -> Path:
    """Remove from a saved tower's folder all but TOWER_FILES and `extra` (the package's code, a run's own files)."""
    for name in {path.name for path in folder.iterdir()} - {*TOWER_FILES, *extra}:
        (folder / name).unlink()
    return folder


def ict_start(world: TinyWorld, output: Path, steps: int = 100) -> Path:
    """The retriever's start: `train ict` from random towers of TOWER's size into `output`."""
    argv = [
        "train", "ict", "--corpus", str(world.corpus), "--init", "random", "--output", str(output),
        "--config-overrides", TOWER, "--max-steps", str(steps), "--batch-size", "32", "--learning-rate", "1e-3",
        "--save-steps", "0", "--seed", str(world.seed), "--embedding-dropout", "0", "--quiet",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    return keep_tower_files(output)


def start_for(world: TinyWorld, args: argparse.Namespace) -> Path:
    """The ICT start's folder: stored under --starts, or trained now (and stored when --starts)."""
    stored = args.starts / f"seed-{world.seed}" / "embedder" if args.starts else None
    if stored is not None and stored.is_dir():
        return stored
    return ict_start(world, stored or world.root / "ict", args.ict_steps)


def reader_for(world: TinyWorld, args: argparse.Namespace) -> tuple[Path, list]:
    """(the reader's folder, its warm-up history): stored, warmed up now (and stored when --starts), or untrained."""
    stored = args.starts / f"seed-{world.seed}" / "encoder" if args.starts else None
    if args.reader == "warm" and stored is not None and stored.is_dir():
        return stored, json.loads((stored / "reading_warmup.json").read_text())["history"]
    encoder = load_encoder(
        "random", world.tokenizer, parse_config_overrides(TOWER), world.seed, warn_untrained_head=False
    )
    history = []
    if args.reader == "warm":
        tasks = ReadingTasks(world.synthetic_world, world.blocks, world.tokenizer)
        history = warm_up_reader(encoder, tasks, steps=args.warmup_steps, seed=world.seed, eval_every=args.eval_every)
    folder = stored if args.reader == "warm" and stored is not None else world.root / "reader"
    command = "python benchmarks/research/bench_learned_reader_tiny.py " + " ".join(sys.argv[1:])
    summary = {"seed": world.seed, "steps": args.warmup_steps, "config_overrides": TOWER, "command": command}
    save_tower(encoder, folder, world.tokenizer, {"reading_warmup.json": json.dumps(summary | {"history": history})})
    return keep_tower_files(folder, "reading_warmup.json"), history


def run_seed(root: Path, seed: int, args: argparse.Namespace) -> dict:
    """One seed: ICT start, reader, REALM pre-training; the held-out recalls and timings."""
    started = time.perf_counter()
    world = TinyWorld(root, seed)
    start = start_for(world, args)
    reader, history = reader_for(world, args)
    prepared = time.perf_counter()
    output = learned_pretrain(
        world,
        start,
        reader,
        args.embedder_learning_rate,
        args.refresh_mode,
        args.steps,
        args.batch_size,
        args.num_candidates,
    )
    trained = time.perf_counter()
    before, after = world.recall(start), world.recall(output / "embedder")
    return {
        "seed": seed,
        "reader": args.reader,
        "break": args.defect,
        "embedder_learning_rate": args.embedder_learning_rate,
        "refresh_mode": args.refresh_mode,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "num_candidates": args.num_candidates,
        "copy_share": history[-1]["copy_share"] if history else None,
        "start": round(before, 4),
        "end": round(after, 4),
        "gain": round(after - before, 4),
        "seconds_start_and_reader": round(prepared - started, 1),
        "seconds_pretraining": round(trained - prepared, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--reader", choices=("warm", "random"), default="warm")
    parser.add_argument(
        "--starts",
        type=Path,
        default=None,
        help="read each seed's ICT start and warmed-up reader from DIR/seed-N/{embedder,encoder}, or write them there",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch's thread count (default: its own)")
    parser.add_argument("--warmup-steps", type=int, default=3600)
    parser.add_argument("--eval-every", type=int, default=600, help="probe the warm-up's reader this often")
    parser.add_argument("--ict-steps", type=int, default=100)
    parser.add_argument("--embedder-learning-rate", type=float, default=EMBEDDER_LEARNING_RATE)
    parser.add_argument("--refresh-mode", choices=("sync", "async", "off"), default="sync")
    parser.add_argument("--steps", type=int, default=LEARNED_STEPS, help="REALM pre-training's steps")
    parser.add_argument("--batch-size", type=int, default=LEARNED_BATCH_SIZE, help="REALM pre-training's batch")
    parser.add_argument("--num-candidates", type=int, default=LEARNED_CANDIDATES, help="K, the null document included")
    parser.add_argument("--break", dest="defect", choices=sorted(BREAKS), help="patch this defect in for the run")
    parser.add_argument("--keep", type=Path, default=None, help="keep each seed's runs under DIR/seed-N")
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.defect:
        BREAKS[args.defect]()
    results = []
    for seed in args.seeds:
        if args.keep:
            results.append(run_seed(args.keep / f"seed-{seed}", seed, args))
        else:
            with tempfile.TemporaryDirectory(prefix=f"learned-reader-{seed}-") as root:
                results.append(run_seed(Path(root), seed, args))
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
