"""REALM pre-training throughput with and without an index build running, the trainer's stall at each swap and the
index staleness at each swap.

    python benchmarks/bench_pretrain.py [--steps 60] [--batch-size 8] [--output DIR]
    python benchmarks/bench_pretrain.py --model bert-base --bf16 --measure-peak --steps 40   # on a GPU (H100/H200)

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

`--model bert-base` sizes both towers as BERT-base (12 layers, hidden 768; the world's 4,000-wordpiece vocabulary, so
the MLM head is smaller than BERT's 30,522) on a larger world whose blocks fill 288 wordpieces; `--bf16` trains in
bfloat16 mixed precision. Model FLOPs per example come from torch's `FlopCounterMode` over a few extra steps (forward
and backward of both towers, the query embedding for retrieval included; the index search and the builder's process
are not counted), and with `--peak-tflops` (the device's dense bf16 peak: 989 for an H100 or H200 SXM) each run's
examples/s is reported as a fraction of that peak (the target is >= 40%, with and without the async build
sharing the GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from _device_limits import describe, matmul_tflops
from datasets import Dataset
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoTokenizer, TrainerCallback

from openrealm import RealmConfig, RealmEmbedder
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers.jobs import train_pretrain as pretrain
from openrealm.trainers.options import train_pretrain
from openrealm.trainers.pretraining.builder import clone_tensors
from openrealm.trainers.pretraining.preparation import initial_index
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_embedder, load_encoder
from openrealm.trainers.world.synthetic_world import generate_world

MODEL = "hidden_size=128,num_hidden_layers=2,num_attention_heads=4,intermediate_size=512,retriever_proj_size=64"
MODELS = {  # --model: RealmConfig overrides of both towers
    "bench": MODEL,
    "bert-base": "hidden_size=768,num_hidden_layers=12,num_attention_heads=12,intermediate_size=3072,"
    "retriever_proj_size=128",
}
FULL_BLOCK_WORLD = {"num_people": 2000, "num_organizations": 600, "num_cities": 600}  # for --model bert-base
ARTICLES_PER_FULL_BLOCK = 6
FLOP_STEPS = 3  # extra steps run under FlopCounterMode (it slows them down, so they are not timed)
PROFILE_STEPS = 6  # steps under torch.profiler with --profile
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


def make_corpus(root: Path, full_blocks: bool = False) -> Path:
    """The synthetic world (seed 0) as a corpus. full_blocks: a larger world whose articles are joined
    ARTICLES_PER_FULL_BLOCK at a time, so that blocks fill Wikipedia's 288 wordpieces (the default world's articles
    make blocks of about 20, too short to load a GPU)."""
    world = generate_world(seed=0, **(FULL_BLOCK_WORLD if full_blocks else {}))
    rows = [{"title": a["title"], "text": a["text"]} for a in world.articles]
    if full_blocks:
        step = ARTICLES_PER_FULL_BLOCK
        rows = [
            {"title": rows[i]["title"], "text": " ".join(row["text"] for row in rows[i : i + step])}
            for i in range(0, len(rows), step)
        ]
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=4000)
    build_corpus(Dataset.from_list(rows), root / "corpus", vocab, span_annotator=world.span_annotator())
    return root / "corpus"


def train(
    corpus: Path,
    output: Path,
    mode: str,
    steps: int,
    batch_size: int,
    model: str = MODEL,
    bf16: bool = False,
    counter: contextlib.AbstractContextManager | None = None,
) -> dict:
    """One run; returns its step times, swaps, the callback's time per hook and the attention implementation.
    `counter`, if given, is entered around the training loop only (not the initial index build before it): a
    FlopCounterMode or a profiler."""
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
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
    argv += ["--config-overrides", model, "--quiet", "--logging-steps", str(steps), "--learning-rate", "1e-4"]
    args = parser.parse_args(argv + (["--bf16"] if bf16 else []))
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    blocks = load_corpus(corpus)
    overrides = parse_config_overrides(model)
    embedder = load_embedder("random", tokenizer, overrides, 0)
    encoder = load_encoder("random", tokenizer, overrides, 0)
    index = initial_index(args, embedder, output / "index")
    trainer = pretrain.build_trainer(args, embedder, encoder, tokenizer, blocks, index)
    timer = StepTimer()
    trainer.add_callback(timer)
    spent = time_hooks(trainer.refresh)
    with counter or contextlib.nullcontext():
        trainer.train()
    step_seconds = [b - a for a, b in zip(timer.begins, timer.begins[1:])]
    attention = encoder.config._attn_implementation
    return {"step_seconds": step_seconds, "swaps": list(trainer.refresh.swaps), "spent": spent, "attention": attention}


def flops_per_example(corpus: Path, output: Path, batch_size: int, model: str, bf16: bool) -> float:
    """Model FLOPs of one training example (forward + backward), counted by FlopCounterMode over FLOP_STEPS steps of
    a refresh-off run (the same batches' shapes vary with the masked sentences, hence the mean)."""
    counter = FlopCounterMode(display=False)
    train(corpus, output, "off", FLOP_STEPS, batch_size, model, bf16, counter)
    return counter.get_total_flops() / (FLOP_STEPS * batch_size)


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


def write_profile(corpus: Path, output: Path, args: argparse.Namespace, model: str, table: Path) -> None:
    """torch.profiler over PROFILE_STEPS refresh-off steps: the kernels and operators by device time (CPU time
    without a GPU), the 40 costliest, to `table`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    try:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, acc_events=True) as prof:  # each optimiser step ends a profiler cycle
            train(corpus, output, "off", PROFILE_STEPS, args.batch_size, model, args.bf16, prof)
    except RuntimeError as error:  # no CUDA tracing (e.g. CUPTI refused in a sandbox): host operators only
        print(f"CUDA profiling failed ({error}); profiling host time only", flush=True)
        cuda = False
        shutil.rmtree(output, ignore_errors=True)
        with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof:
            train(corpus, output, "off", PROFILE_STEPS, args.batch_size, model, args.bf16, prof)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    table.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90) + "\n")
    print(f"profile of {PROFILE_STEPS} steps: {table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", choices=sorted(MODELS), default="bench", help="size of both towers")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for the fraction of peak")
    parser.add_argument("--measure-peak", action="store_true", help="measure the matmul peak in this run instead")
    parser.add_argument(
        "--profile", default=None, help="also profile a few refresh-off steps; kernel table to this file"
    )
    parser.add_argument("--output", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the build-start timing (default 3)")
    args = parser.parse_args()
    if args.measure_peak:  # the rate of the dtype the towers' matrix products run in
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        args.peak_tflops = matmul_tflops(device, dtype)
        print(f"measured {dtype} matmul peak on {describe(device)}: {args.peak_tflops:.1f} TFLOP/s", flush=True)
    root = Path(args.output or tempfile.mkdtemp(prefix="bench-pretrain-"))
    corpus = make_corpus(root, full_blocks=args.model == "bert-base")
    num_blocks = len(load_corpus(corpus))
    model = MODELS[args.model]
    runs = {
        mode: train(corpus, root / mode, mode, args.steps, args.batch_size, model, args.bf16)
        for mode in ("off", "async")
    }
    flops = flops_per_example(corpus, root / "flops", args.batch_size, model, args.bf16)
    off, busy = (throughput(runs[mode], args.batch_size) for mode in ("off", "async"))
    mean_step = statistics.mean(runs["async"]["step_seconds"][WARMUP_STEPS:])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    print(f"\nmachine: {device}, {torch.get_num_threads()} torch threads; ")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}")
    print(f"model ({args.model}): {model}; attention {runs['off']['attention']}; {'bf16' if args.bf16 else 'fp32'}")
    print(f"batch {args.batch_size}; {args.steps} steps; {num_blocks} blocks; {flops / 1e9:.1f} GFLOP per example\n")
    if args.peak_tflops:
        print(f"peak: {args.peak_tflops:.1f} TFLOP/s ({'measured in this run' if args.measure_peak else 'given'})")
    print("| refresh | examples/s | mean step (ms) | index swaps | model TFLOP/s | fraction of peak |")
    print("|---|---|---|---|---|---|")
    for mode, value in (("off", off), ("async, build always running", busy)):
        run = runs["off" if mode == "off" else "async"]
        step = 1000 * statistics.mean(run["step_seconds"][WARMUP_STEPS:])
        achieved = value * flops / 1e12
        peak = f"{achieved / args.peak_tflops:.1%}" if args.peak_tflops else "(no --peak-tflops)"
        print(f"| {mode} | {value:.2f} | {step:.0f} | {len(run['swaps'])} | {achieved:.3f} | {peak} |")
    print(f"\nratio with build / without: {busy / off:.3f}\n")
    print("| swap at step | version | staleness (steps) | swap stall | callback at that step boundary | build start |")
    print("|---|---|---|---|---|---|")
    print("\n".join(swap_rows(runs["async"], mean_step)))
    if args.profile:
        write_profile(corpus, root / "profile", args, model, Path(args.profile))
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
