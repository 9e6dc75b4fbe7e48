"""REALM's full corpus size on CPU (issue 17 §3): converting a legacy block_records.npy, and saving a loaded index.

    .venv/bin/python benchmarks/bench_full_corpus.py --workdir /tmp/full_corpus            # 13,353,718 blocks
    .venv/bin/python benchmarks/bench_full_corpus.py --workdir /tmp/small --blocks 100000  # a quick look

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="folder for the generated files (about 40 GB at full size)")
    parser.add_argument("--blocks", type=int, default=13_353_718)
    parser.add_argument("--text-bytes", type=int, default=940, help="bytes per record (published file: ~944)")
    parser.add_argument("--baseline", default="133f911", help="git revision of the conversion to compare with")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
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
    saves = save_timings(args.blocks, args.workdir)

    import torch

    gib = 1 << 30
    lines = [
        f"- {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Command: `python benchmarks/bench_full_corpus.py --workdir {args.workdir} --blocks {args.blocks}`",
        f"- Legacy file: {args.blocks:,} records, {npy_bytes / gib:.2f} GiB (generated in {generate_seconds:.0f} s)",
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
        f"- Ratio baseline / this checkout: time {second['seconds'] / first['seconds']:.2f}x, "
        f"peak extra disk {second['disk'] / first['disk']:.2f}x",
        f"- Saving {args.blocks:,} x 128 embeddings ({saves['bytes'] / gib:.2f} GiB): from RAM "
        f"{saves['save_in_ram']:.1f} s; loaded and unchanged {saves['save_loaded_unchanged']:.2f} s "
        f"(hard-linked: {saves['linked']}; is_memory_mapped: {saves['is_memory_mapped']})",
    ]
    report = "\n".join(lines)
    print(report)
    print(json.dumps({"conversion": results, "save": saves}))
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    if importlib.util.find_spec("openrealm") is None:
        sys.exit("install the package first: pip install -e .")
    main()
