"""REALM's full corpus size on CPU: converting a legacy block_records.npy, saving a loaded index, and
exact search against the old port's.

    .venv/bin/python benchmarks/bench_full_corpus.py --workdir /tmp/full_corpus            # 13,353,718 blocks
    .venv/bin/python benchmarks/bench_full_corpus.py --workdir /tmp/small --blocks 100000  # a quick look
    .venv/bin/python benchmarks/bench_full_corpus.py --workdir /tmp/full_corpus --parts search

1. Legacy conversion. A synthetic legacy `block_records.npy` of --blocks records of about --text-bytes bytes each (the
   published file: 13,353,718 records, 12.6 GB) is written the way np.save pickles an object array (protocol 4,
   without frames), streamed here so that it never sits in RAM. It is converted by `convert_legacy_block_records` of
   this checkout and, in the same run, by the version of `--baseline` (a git revision: the two-pass reader with
   scratch files), each in a fresh process. Reported: wall time, peak resident memory split into anonymous and
   file-backed (/proc/self/status RssAnon / RssFile, sampled every 0.2 s), and peak extra disk used (statvfs of the
   work folder, sampled alike), against the output's size.
2. Saving a loaded index. A RealmBlockIndex of --blocks x 128 random float32 embeddings (6.8 GB at full size) is
   saved, loaded (memory-mapped) and saved again into a new folder: the second save hard-links the unchanged
   block_emb.safetensors. Reported: the time of each save.
3. Exact search. A saved index of --blocks x 128 random float32 embeddings is loaded memory-mapped (as users load
   one) in two fresh processes: the old transformers port's search (`einsum("BD,QD->QB", block_emb, q)`, then top-k
   over the whole [Q, N] score matrix), and RealmBlockIndex's chunked exact search at each chunk size of a sweep and
   at the size default_chunk_size picks. Each (batch of Q queries, method) is timed --repeats times with fresh random
   queries (seeds 0..R-1) after one warm-up search: median and range. Peak RssAnon / RssFile of each process.
4. Sharded exact search. The same embeddings written as an index of 2 shard files (as `train pretrain --shard-index`
   writes them) are searched by 2 processes (gloo, one thread each), each mapping only its own file, every search
   collective (each rank its own Q queries); against one process (2 threads) searching the unsharded index for the
   same 2 x Q queries. Reported: median time per search, each process's peak RssAnon / RssFile, and whether the ids
   equal the unsharded index's.

Writes a markdown report to stdout (and --output).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def write_legacy_npy(path: str, num_blocks: int, text_bytes: int) -> int:
    """An np.save-style pickled object array of `num_blocks` distinct bytes texts, streamed -> file size."""
    template = np.empty(2, dtype=object)
    template[:] = [b"\x01", b"\x02"]
    buffer = io.BytesIO()
    np.save(buffer, template, allow_pickle=True)
    raw = buffer.getvalue()
    start = raw.index(b"\x80\x04")
    pickled = raw[start:]
    if pickled[2:3] == b"\x95":  # drop the FRAME (its length would not match the stream written here)
        pickled = pickled[:2] + pickled[11:]
    shape = b"K\x01K\x02\x85"  # the state's version 1 and shape (2,): BININT1 1, BININT1 2, TUPLE1
    pickled = pickled.replace(shape, b"K\x01J" + struct.pack("<i", num_blocks) + b"\x85", 1)
    elements_at = pickled.index(b"]\x94(") + 2  # after EMPTY_LIST MEMOIZE: MARK, elements, APPENDS
    prefix, suffix = pickled[:elements_at], b"t\x94b."
    words = np.random.default_rng(0).integers(0, 1 << 20, size=(4096, text_bytes // 8))
    pool = [b" ".join(b"w%d" % w for w in row)[:text_bytes] for row in words]
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": (num_blocks,)})
        f.write(prefix)
        for first in range(0, num_blocks, 1000):
            parts = [b"("]
            for i in range(first, min(first + 1000, num_blocks)):
                text = b"%d " % i + pool[i % len(pool)]
                parts.append(b"B" + struct.pack("<I", len(text)) + text + b"\x94")
            parts.append(b"e")
            f.write(b"".join(parts))
        f.write(suffix)
    return os.path.getsize(path)


CONVERT = """
import sys, time, importlib.util
spec = importlib.util.spec_from_file_location("block_records_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
start = time.perf_counter()
records = module.convert_legacy_block_records(sys.argv[2], sys.argv[3])
print(len(records), time.perf_counter() - start)
"""


SEARCH = """
import json, statistics, sys, time, torch
from openrealm import RealmBlockIndex
from openrealm.index_realm import default_chunk_size, torch_exact_search
folder, method, batches, chunks, repeats = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:6])
block_emb = RealmBlockIndex.from_pretrained(folder).block_emb
def port(q):
    return torch.einsum("BD,QD->QB", block_emb, q).topk(5, dim=1)
results = []
with torch.no_grad():
    for batch in batches:
        rule = default_chunk_size(torch.device("cpu"), batch)
        settings = [None] if method == "port" else sorted({*chunks, rule})
        for chunk in settings:
            search = port if chunk is None else (lambda q, chunk=chunk: torch_exact_search(block_emb, q, 5, chunk))
            search(torch.randn(batch, block_emb.shape[1]))  # warm-up: every page read once
            seconds = []
            for seed in range(repeats):
                q = torch.randn(batch, block_emb.shape[1], generator=torch.Generator().manual_seed(seed))
                start = time.perf_counter()
                search(q)
                seconds.append(time.perf_counter() - start)
            results.append({"batch": batch, "chunk": chunk, "rule": chunk == rule, "seconds": seconds,
                            "median": statistics.median(seconds)})
print(json.dumps(results))
"""


SHARDED = """
import json, statistics, sys, time, torch
import torch.distributed as dist
from openrealm import RealmBlockIndex, ShardedBlockIndex
folder, store = sys.argv[1], sys.argv[4]
rank, world, batch, repeats = *map(int, sys.argv[2:4]), *map(int, sys.argv[5:7])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
torch.set_num_threads(1)
index = ShardedBlockIndex.from_pretrained(folder)
def queries(seed):
    return torch.randn(batch, index.dim, generator=torch.Generator().manual_seed(7919 + 1000 * seed + rank))
index.search(queries(repeats), 5)  # warm-up: every page of the shard read once
seconds, ids = [], []
for seed in range(repeats):
    start = time.perf_counter()
    ids.append(index.search(queries(seed), 5)[1].tolist())
    seconds.append(time.perf_counter() - start)
print(json.dumps({"rows": index.block_emb.shape[0], "mapped": index.is_memory_mapped, "seconds": seconds,
                  "median": statistics.median(seconds), "ids": ids}))
dist.destroy_process_group()
"""

WHOLE = """
import json, statistics, sys, time, torch
from openrealm import RealmBlockIndex
folder, world, batch, repeats = sys.argv[1], *map(int, sys.argv[2:5])
index = RealmBlockIndex.from_pretrained(folder)
def queries(seed, rank):
    return torch.randn(batch, index.dim, generator=torch.Generator().manual_seed(7919 + 1000 * seed + rank))
index.search(torch.cat([queries(repeats, rank) for rank in range(world)]), 5)
seconds, ids = [], []
for seed in range(repeats):
    start = time.perf_counter()
    found = index.search(torch.cat([queries(seed, rank) for rank in range(world)]), 5)[1]
    seconds.append(time.perf_counter() - start)
    ids.append([found[rank * batch : (rank + 1) * batch].tolist() for rank in range(world)])
print(json.dumps({"seconds": seconds, "median": statistics.median(seconds), "ids": ids}))
"""


def run_sampled(command: list[str], folder: str) -> tuple[str, dict]:
    """Run `command`, sampling its RssAnon / RssFile and the disk used under `folder` -> (stdout, peaks)."""
    before = shutil.disk_usage(folder).used
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peaks = {"rss_anon": 0, "rss_file": 0, "disk": 0}

    def sample() -> None:
        while process.poll() is None:
            try:
                with open(f"/proc/{process.pid}/status") as status:
                    for line in status:
                        key = {"RssAnon:": "rss_anon", "RssFile:": "rss_file"}.get(line.split(":")[0] + ":")
                        if key:
                            peaks[key] = max(peaks[key], int(line.split()[1]) * 1024)
            except OSError:
                pass
            peaks["disk"] = max(peaks["disk"], shutil.disk_usage(folder).used - before)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    stdout, _ = process.communicate()
    sampler.join()
    if process.returncode:
        raise RuntimeError(f"{command} failed with exit code {process.returncode}")
    return stdout, peaks


def convert(module_path: str, npy: str, output: str, workdir: str) -> dict:
    stdout, peaks = run_sampled([sys.executable, "-c", CONVERT, module_path, npy, output], workdir)
    count, seconds = stdout.split()
    result = {"blocks": int(count), "seconds": float(seconds), "output_bytes": os.path.getsize(output), **peaks}
    os.remove(output)
    return result


def baseline_module(revision: str, workdir: str) -> str:
    source = subprocess.run(
        ["git", "-C", REPO, "show", f"{revision}:modeling_realm/block_records.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = os.path.join(workdir, f"block_records_{revision}.py")
    with open(path, "w") as f:
        f.write(source)
    return path


def save_timings(num_blocks: int, workdir: str) -> dict:
    import torch

    from openrealm import RealmBlockIndex

    generator = torch.Generator().manual_seed(0)
    index = RealmBlockIndex(torch.randn(num_blocks, 128, generator=generator))
    timings = {}
    start = time.perf_counter()
    index.save_pretrained(os.path.join(workdir, "index_a"))
    timings["save_in_ram"] = time.perf_counter() - start
    del index
    loaded = RealmBlockIndex.from_pretrained(os.path.join(workdir, "index_a"))
    timings["is_memory_mapped"] = loaded.is_memory_mapped
    start = time.perf_counter()
    loaded.save_pretrained(os.path.join(workdir, "index_b"))
    timings["save_loaded_unchanged"] = time.perf_counter() - start
    timings["linked"] = (
        os.stat(os.path.join(workdir, "index_a", "block_emb.safetensors")).st_ino
        == os.stat(os.path.join(workdir, "index_b", "block_emb.safetensors")).st_ino
    )
    timings["bytes"] = os.path.getsize(os.path.join(workdir, "index_a", "block_emb.safetensors"))
    shutil.rmtree(os.path.join(workdir, "index_a"))
    shutil.rmtree(os.path.join(workdir, "index_b"))
    return timings


def write_random_index(num_blocks: int, folder: str) -> int:
    """A saved exact index of num_blocks x 128 seeded N(0, 1) embeddings -> bytes of its block_emb file."""
    import torch

    from openrealm import RealmBlockIndex

    generator = torch.Generator().manual_seed(0)
    RealmBlockIndex(torch.randn(num_blocks, 128, generator=generator)).save_pretrained(folder)
    return os.path.getsize(os.path.join(folder, "block_emb.safetensors"))


def search_timings(num_blocks: int, workdir: str, batches: list[int], chunks: list[int], repeats: int) -> dict:
    """Part 3: {"port": [...], "exact": [...]} timing rows (see SEARCH), each process's peaks, the index's bytes."""
    folder = os.path.join(workdir, "search_index")
    index_bytes = write_random_index(num_blocks, folder)
    out = {"index_bytes": index_bytes}
    for method in ("port", "exact"):
        argv = [sys.executable, "-c", SEARCH, folder, method, *map(json.dumps, (batches, chunks, repeats))]
        stdout, peaks = run_sampled(argv, workdir)
        out[method] = {"rows": json.loads(stdout), **peaks}
    shutil.rmtree(folder)
    return out


def sharded_timings(num_blocks: int, workdir: str, batch: int, repeats: int, world: int = 2) -> dict:
    """Part 4: one process on the unsharded index against `world` processes on its shards (see SHARDED / WHOLE)."""
    import torch

    from openrealm import RealmBlockIndex, ShardedBlockIndex
    from openrealm.index_realm import save_block_emb_shard, write_sharded_index

    whole_dir, sharded_dir = os.path.join(workdir, "whole_index"), os.path.join(workdir, "sharded_index")
    block_emb = torch.randn(num_blocks, 128, generator=torch.Generator().manual_seed(0))
    RealmBlockIndex(block_emb).save_pretrained(whole_dir)
    os.makedirs(sharded_dir)
    files = []
    for rank in range(world):
        start, stop = ShardedBlockIndex.shard_range(num_blocks, rank, world)
        files.append(os.path.join(workdir, f"shard-{rank}.tmp"))
        save_block_emb_shard(files[-1], block_emb[start:stop])
    write_sharded_index(sharded_dir, files, num_blocks)
    del block_emb
    argv = [sys.executable, "-c", WHOLE, whole_dir, str(world), str(batch), str(repeats)]
    stdout, peaks = run_sampled(argv, workdir)
    out = {"whole": {**json.loads(stdout), **peaks}, "ranks": [None] * world}
    store = os.path.join(workdir, "gloo_store")

    def rank_process(rank: int) -> None:
        argv = [sys.executable, "-c", SHARDED, sharded_dir, str(rank), str(world), store, str(batch), str(repeats)]
        stdout, peaks = run_sampled(argv, workdir)
        out["ranks"][rank] = {**json.loads(stdout), **peaks}

    threads = [threading.Thread(target=rank_process, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shutil.rmtree(whole_dir)
    shutil.rmtree(sharded_dir)
    out["ids_equal"] = all(
        rank_out["ids"][seed] == out["whole"]["ids"][seed][rank]
        for rank, rank_out in enumerate(out["ranks"])
        for seed in range(repeats)
    )
    return out


def sharded_report(sharded: dict, batch: int) -> list[str]:
    gib = 1 << 30
    world = len(sharded["ranks"])
    lines = [
        "",
        "| search of 2 x Q queries | processes | rows held per process | median s | peak RssAnon GiB | peak RssFile "
        "GiB |",
        "|---|---|---|---|---|---|",
        f"| one process, unsharded index | 1 (2 threads) | all | {sharded['whole']['median']:.3f} | "
        f"{sharded['whole']['rss_anon'] / gib:.2f} | {sharded['whole']['rss_file'] / gib:.2f} |",
    ]
    for rank, out in enumerate(sharded["ranks"]):
        lines.append(
            f"| rank {rank} of {world}, sharded index (mapped: {out['mapped']}) | {world} (1 thread each) | "
            f"{out['rows']:,} | {out['median']:.3f} | {out['rss_anon'] / gib:.2f} | {out['rss_file'] / gib:.2f} |"
        )
    lines.append(f"- Q = {batch} queries per rank; ids identical to the unsharded index's: {sharded['ids_equal']}")
    return lines


def search_report(search: dict) -> list[str]:
    gib = 1 << 30
    lines = [
        "",
        "| Q | method | chunk rows | median s | range s | port / this |",
        "|---|---|---|---|---|---|",
    ]
    port = {row["batch"]: row["median"] for row in search["port"]["rows"]}
    for row in search["port"]["rows"] + search["exact"]["rows"]:
        name = "port (einsum + topk)" if row["chunk"] is None else "exact" + (" (default rule)" if row["rule"] else "")
        chunk = "-" if row["chunk"] is None else f"2^{row['chunk'].bit_length() - 1}"
        lines.append(
            f"| {row['batch']} | {name} | {chunk} | {row['median']:.3f} | {min(row['seconds']):.3f}-"
            f"{max(row['seconds']):.3f} | {port[row['batch']] / row['median']:.2f}x |"
        )
    for batch in port:
        rows = [row for row in search["exact"]["rows"] if row["batch"] == batch]
        best, rule = min(rows, key=lambda row: row["median"]), next(row for row in rows if row["rule"])
        lines.append(
            f"- Q={batch}: the default rule's chunk (2^{rule['chunk'].bit_length() - 1}) takes "
            f"{rule['median'] / best['median']:.2f}x the best chunk's time (2^{best['chunk'].bit_length() - 1}) and "
            "is "
            f"{port[batch] / rule['median']:.2f}x the port's speed"
        )
    for method in ("port", "exact"):
        peaks = search[method]
        lines.append(
            f"- Peak RSS of the {method} process: anonymous {peaks['rss_anon'] / gib:.2f} GiB, file-backed "
            f"{peaks['rss_file'] / gib:.2f} GiB (the memory-mapped index: {search['index_bytes'] / gib:.2f} GiB on "
            "disk)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="folder for the generated files (about 40 GB at full size)")
    parser.add_argument("--blocks", type=int, default=13_353_718)
    parser.add_argument("--text-bytes", type=int, default=940, help="bytes per record (published file: ~944)")
    parser.add_argument("--baseline", default="133f911", help="git revision of the conversion to compare with")
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--parts", default="convert,save,search,sharded", help="comma-separated parts to run (default all)"
    )
    parser.add_argument("--batches", default="1,16,64", help="queries per search in part 3")
    parser.add_argument("--chunks", default="12,14,16,17,18,20,22", help="log2 chunk sizes swept in part 3")
    parser.add_argument("--repeats", type=int, default=5, help="timed searches per setting in part 3")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    os.makedirs(args.workdir, exist_ok=True)
    import torch

    lines = [
        f"- {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Command: `python benchmarks/bench_full_corpus.py --workdir {args.workdir} --blocks {args.blocks} "
        f"--parts {args.parts}`",
    ]
    measured = {}
    if "convert" in parts:
        measured["conversion"] = conversion = conversion_timings(args)
        lines += conversion_report(conversion, args.baseline)
    if "save" in parts:
        measured["save"] = saves = save_timings(args.blocks, args.workdir)
        lines.append(
            f"- Saving {args.blocks:,} x 128 embeddings ({saves['bytes'] / (1 << 30):.2f} GiB): from RAM "
            f"{saves['save_in_ram']:.1f} s; loaded and unchanged {saves['save_loaded_unchanged']:.2f} s "
            f"(hard-linked: {saves['linked']}; is_memory_mapped: {saves['is_memory_mapped']})"
        )
    if "search" in parts:
        batches = [int(b) for b in args.batches.split(",")]
        chunks = [2 ** int(c) for c in args.chunks.split(",")]
        measured["search"] = search = search_timings(args.blocks, args.workdir, batches, chunks, args.repeats)
        lines += search_report(search)
    if "sharded" in parts:
        batch = int(args.batches.split(",")[-1])
        measured["sharded"] = sharded = sharded_timings(args.blocks, args.workdir, batch, args.repeats)
        lines += sharded_report(sharded, batch)
    report = "\n".join(lines)
    print(report)
    print(json.dumps(measured))
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


def conversion_timings(args: argparse.Namespace) -> dict:
    """Part 1: convert the generated legacy file with this checkout and with --baseline."""
    npy = os.path.join(args.workdir, "block_records.npy")
    start = time.perf_counter()
    npy_bytes = write_legacy_npy(npy, args.blocks, args.text_bytes)
    generate_seconds = time.perf_counter() - start
    here = os.path.join(REPO, "modeling_realm", "block_records.py")
    output = os.path.join(args.workdir, "block_records.safetensors")
    results = {
        "this checkout": convert(here, npy, output, args.workdir),
        f"baseline {args.baseline}": convert(baseline_module(args.baseline, args.workdir), npy, output, args.workdir),
    }
    os.remove(npy)
    return {"npy_bytes": npy_bytes, "generate_seconds": generate_seconds, "results": results}


def conversion_report(conversion: dict, baseline: str) -> list[str]:
    gib = 1 << 30
    results = conversion["results"]
    lines = [
        f"- Legacy file: {next(iter(results.values()))['blocks']:,} records, {conversion['npy_bytes'] / gib:.2f} GiB "
        f"(generated in {conversion['generate_seconds']:.0f} s)",
        "",
        "| conversion | wall s | per record µs | peak RssAnon GiB | peak RssFile GiB | peak extra disk / output |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['seconds']:.1f} | {1e6 * r['seconds'] / r['blocks']:.2f} | {r['rss_anon'] / gib:.2f} | "
            f"{r['rss_file'] / gib:.2f} | {r['disk'] / r['output_bytes']:.2f} |"
        )
    first, second = results.values()
    lines += [
        "",
        f"- Ratio {baseline} / this checkout: time {second['seconds'] / first['seconds']:.2f}x, "
        f"peak extra disk {second['disk'] / first['disk']:.2f}x",
    ]
    return lines


if __name__ == "__main__":
    if importlib.util.find_spec("openrealm") is None:
        sys.exit("install the package first: pip install -e .")
    main()
