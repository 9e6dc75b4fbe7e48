"""Reading a folder of documents (`corpus build --input DIR`, tokenization/documents.py): files per second and peak
memory, at two folder sizes, to show the memory flat with the folder's size.

    python benchmarks/bench_documents.py [--sizes 1000,10000] [--work /tmp/openrealm-documents]

For each size a folder is generated (a third each of Markdown, HTML and plain-text files of about 2 KB, in 100
subfolders), then read in a fresh process by the corpus build's own reader, `load_articles` (streamed into an Arrow
file), and its peak resident memory (ru_maxrss) and time are reported, against the same process importing the
package and reading a 10-file folder (the baseline the folder's size adds to).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

READER = """
import json, resource, sys, tempfile, time
from openrealm.tokenization.articles import load_articles
started = time.perf_counter()
with tempfile.TemporaryDirectory() as scratch:
    articles, _ = load_articles(sys.argv[1], scratch)
    count = len(articles)
print(json.dumps({"count": count, "seconds": time.perf_counter() - started,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
WORDS = "river mill harbour grain bridge spring city north ships dock daily built stone old road market".split()


def make_folder(root: Path, num_files: int, seed: int = 0) -> None:
    """num_files documents of about 2 KB in 100 subfolders: Markdown, HTML and text in turn."""
    rng = random.Random(seed)
    for i in range(num_files):
        folder = root / f"part{i % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        body = " ".join(rng.choice(WORDS) for _ in range(300))
        kind = i % 3
        if kind == 0:
            markdown = f"# Document {i}\n\nSome **bold** text and a [link](x.html).\n\n{body}\n"
            (folder / f"doc{i}.md").write_text(markdown)
        elif kind == 1:
            html = f"<html><head><title>Page {i}</title></head><body><p>{body}</p></body></html>"
            (folder / f"doc{i}.html").write_text(html)
        else:
            (folder / f"doc{i}.txt").write_text(body + "\n")


def read_in_a_fresh_process(folder: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", READER, str(folder)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--work", default="/tmp/openrealm-documents")
    args = parser.parse_args()
    work = Path(args.work)
    rows = []
    for size in [10, *(int(s) for s in args.sizes.split(","))]:
        folder = work / f"folder-{size}"
        if not folder.exists():
            make_folder(folder, size)
        started = time.perf_counter()
        row = read_in_a_fresh_process(folder) | {"files": size}
        row["wall_seconds"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["peak_mb"]
    print(f"\n{platform.processor() or platform.machine()}, python {platform.python_version()}\n")
    print("| files | documents read | seconds reading | files/s | peak RSS (MB) | above the 10-file folder's |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['files']:,} | {row['count']:,} | {row['seconds']:.1f} | {row['files'] / row['seconds']:,.0f} | "
            f"{row['peak_mb']:.0f} | {row['peak_mb'] - base:+.0f} |"
        )


if __name__ == "__main__":
    main()
