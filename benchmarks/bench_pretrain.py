"""REALM pre-training throughput with and without an index build running, the trainer's stall at each swap and the
index staleness at each swap (issue 4 §7).

    python benchmarks/bench_pretrain.py [--steps 60] [--batch-size 8] [--output DIR]

On the synthetic world (seed 0, 288 blocks) with a small random model (hidden 128, 2 layers, both towers), the same
training runs twice: refresh "off" (no build ever runs) and refresh "async" with refresh_every=1, so that a new build
starts at the first step end after the previous one swapped in: a builder process is running almost all the time.
Reported: examples/s (steps after the first 5, which include start-up), the ratio with build / without, the trainer's
time in the refresh callback per swap (the swap itself as `IndexRefreshCallback` records it, and the full callback time
of that step boundary and of the step end that started the build), as ms and % of the mean step time, and the
staleness in steps at each swap. The refresh callback is timed by wrapping its two hooks on the instance.

Since the snapshot went off the training thread, the step end that starts a build only clones the embedder's tensors
(into the buffers of the previous snapshot); the module copy, safetensors save and builder start run on the callback's
background thread, and so do loading the new version and pruning. The last table times that training-step part
directly, against the previous way (deep copy + save_pretrained + process start on the step), for the benchmark's
embedder and a BERT-base-sized one (median of --repeats).
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback

from openrealm import RealmConfig, RealmEmbedder
from openrealm.tokenization.corpus import build_corpus, load_corpus
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import pretrain
from openrealm.trainers.ict import load_embedder, parse_config_overrides
from openrealm.trainers.refresh import clone_tensors
from openrealm.trainers.synthetic_world import generate_world

MODEL = "hidden_size=128,num_hidden_layers=2,num_attention_heads=4,intermediate_size=512,retriever_proj_size=64"
WARMUP_STEPS = 5  # steps left out of the throughput (first batches, allocator warm-up)
EMBEDDERS = {  # for the build-start table: the benchmark's embedder and a BERT-base-sized one
    "bench (hidden 128, 2 layers)": dict(parse_config_overrides(MODEL), vocab_size=4000),
    "BERT-base": dict(vocab_size=30522, retriever_proj_size=128),
}


class StepTimer(TrainerCallback):
    """Wall time of each optimiser step, from one step's on_step_begin to the next's (callbacks included)."""

    def __init__(self):
        self.begins: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begins.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        self.begins.append(time.perf_counter())


def time_hooks(refresh) -> dict[str, dict[int, float]]:
    """Wrap the callback's on_step_begin / on_step_end on the instance: seconds spent in each, by global step."""
    spent: dict[str, dict[int, float]] = {"begin": {}, "end": {}}
    for name, key in (("on_step_begin", "begin"), ("on_step_end", "end")):
        hook = getattr(refresh, name)

        def timed(args, state, control, _hook=hook, _key=key, **kwargs):
            started = time.perf_counter()
            result = _hook(args, state, control, **kwargs)
            spent[_key][state.global_step] = time.perf_counter() - started
            return result

        setattr(refresh, name, timed)
    return spent


def make_corpus(root: Path) -> Path:
    world = generate_world(seed=0)
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=4000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab, span_annotator=world.span_annotator())
    return root / "corpus"


def train(corpus: Path, output: Path, mode: str, steps: int, batch_size: int) -> dict:
    """One run; returns its step times, swaps and the callback's time per hook."""
    parser = argparse.ArgumentParser()
    pretrain.add_arguments(parser)
    argv = ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += [
        "--max-steps",
        str(steps),
        "--refresh-every",
        "1",
        "--refresh-mode",
        mode,
        "--batch-size",
        str(batch_size),
    ]
    argv += ["--config-overrides", MODEL, "--no-progress", "--logging-steps", str(steps), "--learning-rate", "1e-4"]
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    blocks = load_corpus(corpus)
    overrides = parse_config_overrides(MODEL)
    embedder = load_embedder("random", tokenizer, overrides, 0)
    encoder = pretrain.load_encoder("random", tokenizer, overrides, 0)
    index = pretrain.initial_index(args, embedder, output / "index")
    trainer = pretrain.build_trainer(args, embedder, encoder, tokenizer, blocks, index)
    timer = StepTimer()
    trainer.add_callback(timer)
    spent = time_hooks(trainer.refresh)
    trainer.train()
    step_seconds = [b - a for a, b in zip(timer.begins, timer.begins[1:])]
    return {"step_seconds": step_seconds, "swaps": list(trainer.refresh.swaps), "spent": spent}


def throughput(run: dict, batch_size: int) -> float:
    seconds = run["step_seconds"][WARMUP_STEPS:]
    return batch_size * len(seconds) / sum(seconds)


def swap_rows(run: dict, mean_step: float) -> list[str]:
    """One markdown row per swap: step, version, staleness, swap stall, callback time at that boundary and at the
    step end that started the build (snapshot save + Popen)."""
    rows = []
    for swap in run["swaps"]:
        boundary = run["spent"]["begin"].get(swap["step"], float("nan"))
        start = run["spent"]["end"].get(swap["snapshot_step"], float("nan"))
        cells = [swap["step"], swap["version"], swap["step"] - swap["snapshot_step"]]
        for seconds in (swap["stall_seconds"], boundary, start):
            cells.append(f"{1000 * seconds:.1f} ms ({100 * seconds / mean_step:.2f}%)")
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def build_start_on_step(config: dict, repeats: int, work: Path) -> dict[str, float]:
    """Median seconds the training step spends starting a build: previously (deep copy, save, builder start) and now
    (clone into the previous snapshot's buffers). The started process is `python -c pass`."""
    embedder = RealmEmbedder(RealmConfig(**config))
    previous, now, clones = [], [], clone_tensors(embedder)
    for repeat in range(repeats):
        started = time.perf_counter()
        snapshot = copy.deepcopy(embedder).eval().requires_grad_(False)
        snapshot.save_pretrained(work / f"snapshot-{repeat}")
        process = subprocess.Popen([sys.executable, "-c", "pass"])
        previous.append(time.perf_counter() - started)
        process.wait()
        started = time.perf_counter()
        clones = clone_tensors(embedder, into=clones)
        now.append(time.perf_counter() - started)
    params = sum(p.numel() for p in embedder.parameters())
    return {"params": params, "previous": statistics.median(previous), "now": statistics.median(now)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the build-start timing (default 3)")
    args = parser.parse_args()
    root = Path(args.output or tempfile.mkdtemp(prefix="bench-pretrain-"))
    corpus = make_corpus(root)
    runs = {mode: train(corpus, root / mode, mode, args.steps, args.batch_size) for mode in ("off", "async")}
    off, busy = (throughput(runs[mode], args.batch_size) for mode in ("off", "async"))
    mean_step = statistics.mean(runs["async"]["step_seconds"][WARMUP_STEPS:])
    print(f"\nmachine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; ")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}")
    print(f"model: {MODEL}; batch {args.batch_size}; {args.steps} steps; 288 blocks\n")
    print("| refresh | examples/s | mean step (ms) | index swaps |")
    print("|---|---|---|---|")
    for mode, value in (("off", off), ("async, build always running", busy)):
        run = runs["off" if mode == "off" else "async"]
        step = 1000 * statistics.mean(run["step_seconds"][WARMUP_STEPS:])
        print(f"| {mode} | {value:.2f} | {step:.0f} | {len(run['swaps'])} |")
    print(f"\nratio with build / without: {busy / off:.3f}\n")
    print("| swap at step | version | staleness (steps) | swap stall | callback at that step boundary | build start |")
    print("|---|---|---|---|---|---|")
    print("\n".join(swap_rows(runs["async"], mean_step)))
    print("\n| embedder | parameters | build start on the step: previous (copy + save + Popen) | now (clone) |")
    print("|---|---|---|---|")
    for name, config in EMBEDDERS.items():
        cost = build_start_on_step(config, args.repeats, root / "start")
        row = [
            name,
            f"{cost['params'] / 1e6:.1f} M",
            f"{1000 * cost['previous']:.1f} ms",
            f"{1000 * cost['now']:.1f} ms",
        ]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
