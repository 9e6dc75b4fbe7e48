"""Reference side of benchmarks/bench_pipeline.py; runs in the transformers 4.57.6 venv (the old REALM port).

Not meant to be run by hand: bench_pipeline.py calls it as a subprocess.

    python benchmarks/_port_reference.py build --folder DIR --vocab VOCAB --passages A.jsonl B.jsonl --num-blocks N
    TRUST_REMOTE_CODE=True python benchmarks/_port_reference.py serve --folder DIR     # questions on stdin

build  writes a legacy 4.x open-QA folder: a random-weight RealmForOpenQA with the published architecture
       (`RealmConfig()` defaults: BERT-base, retriever_proj_size 128, reader_beam_size 5, reader_seq_len 320), saved
       with save_pretrained(safe_serialization=False) (pytorch_model.bin holding `block_emb`), plus
       RealmRetriever(block_records, tokenizer).save_pretrained (block_records.npy, pickled) and the tokenizer.
serve  loads that folder with the port, then times `model(**tokenizer([q], return_tensors="pt"))` for each question
       sent on stdin (one JSON line, {"question": ...}), replying with one line per question.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

REPLY_PREFIX = "PORT-REPLY "


def read_passages(path: str) -> list[str]:
    """The text of every passage of a jsonl file, in file order, whitespace collapsed."""
    with open(path, encoding="utf-8") as f:
        return [" ".join(json.loads(line)["text"].split()) for line in f if line.strip()]


def cut_blocks(text: str, tokenizer, block_size: int) -> list[str]:
    """Cut text into consecutive blocks of at most block_size wordpieces, only where a whitespace-separated word
    starts (so that each block's text re-tokenizes to exactly its wordpieces)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    opens = [i == 0 or text[offsets[i][0] - 1].isspace() for i in range(len(offsets))]
    blocks, start = [], 0
    while start < len(offsets):
        end = min(start + block_size, len(offsets))
        if end < len(offsets):
            end = next((j for j in range(end, start, -1) if opens[j]), end)
        blocks.append(text[offsets[start][0] : offsets[end - 1][1]])
        start = end
    return blocks


def block_embeddings(token_ids: list[list[int]], num_blocks: int, vocab_size: int, dim: int, seed: int) -> np.ndarray:
    """[num_blocks, dim] float32. Block i is copy i // B of base block i % B (B = len(token_ids)).

    embedding = LayerNorm(unit(bag-of-wordpieces of the text through a fixed random projection) + unit(per-block
    noise)): blocks sharing vocabulary are near each other (a cheap stand-in for a learned passage encoder), and
    every copy of a tiled base block gets its own noise so that copies are distinct blocks and never tie in top-k.
    """
    rng = np.random.default_rng(seed)
    projection = rng.standard_normal((vocab_size, dim), dtype=np.float32)
    base = np.stack([projection[np.asarray(ids, dtype=np.int64)].sum(0) for ids in token_ids])
    base /= np.linalg.norm(base, axis=1, keepdims=True) + 1e-12
    out = np.empty((num_blocks, dim), dtype=np.float32)
    for start in range(0, num_blocks, 65536):
        stop = min(start + 65536, num_blocks)
        noise = rng.standard_normal((stop - start, dim), dtype=np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        rows = base[np.arange(start, stop) % len(token_ids)] + noise
        rows -= rows.mean(1, keepdims=True)
        rows /= rows.std(1, keepdims=True) + 1e-6
        out[start:stop] = rows
    return out


def build(args: argparse.Namespace) -> None:
    import torch
    from transformers.models.deprecated.realm import (
        RealmConfig,
        RealmForOpenQA,
        RealmRetriever,
        RealmTokenizerFast,
    )

    started = time.perf_counter()
    os.makedirs(args.folder, exist_ok=True)
    tokenizer = RealmTokenizerFast(vocab_file=args.vocab, do_lower_case=True)
    # Like REALM's Wikipedia blocks (nearly all a full 288 wordpieces): the passages of each file are read as one
    # running text, in file order, and cut into blocks; a block may thus end one passage and begin the next.
    passages = {path: read_passages(path) for path in args.passages}
    base_blocks = [
        block for texts in passages.values() for block in cut_blocks(" ".join(texts), tokenizer, args.block_size)
    ]
    base_ids = tokenizer(base_blocks, add_special_tokens=False)["input_ids"]
    lengths = np.asarray([len(ids) for ids in base_ids])
    if lengths.max() > args.block_size:
        raise RuntimeError(f"a block re-tokenizes to {lengths.max()} > {args.block_size} wordpieces")
    num_blocks = args.num_blocks
    texts = [base_blocks[i % len(base_blocks)] for i in range(num_blocks)]
    block_records = np.empty(num_blocks, dtype=object)
    block_records[:] = [text.encode("utf-8") for text in texts]

    config = RealmConfig(num_block_records=num_blocks, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(args.seed)
    model = RealmForOpenQA(config)
    emb = block_embeddings(base_ids, num_blocks, config.vocab_size, config.retriever_proj_size, args.seed)
    model.block_emb = torch.from_numpy(emb)
    model.save_pretrained(args.folder, safe_serialization=False)
    RealmRetriever(block_records, tokenizer).save_pretrained(args.folder)

    tiled_lengths = lengths[np.arange(num_blocks) % len(base_blocks)]
    info = {
        "num_blocks": num_blocks,
        "num_base_blocks": len(base_blocks),
        "num_passages": sum(len(texts) for texts in passages.values()),
        "block_size": args.block_size,
        "base_block_wordpieces": {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "p10": float(np.percentile(lengths, 10)),
            "max": int(lengths.max()),
            "share_full": float((lengths >= args.block_size - 8).mean()),
        },
        "tiled_mean_wordpieces": float(tiled_lengths.mean()),
        "seed": args.seed,
        "build_seconds": time.perf_counter() - started,
    }
    with open(os.path.join(args.folder, "BENCH_BUILD.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))


def serve(args: argparse.Namespace) -> None:
    """Load the folder with the port, then answer questions read from stdin (one JSON line each) one at a time,
    timing each `model(**tokenizer([q], return_tensors="pt"))` (wall and process CPU seconds); replies are stdout lines
    prefixed with REPLY_PREFIX. The caller interleaves these calls with its own, so both see the same machine load."""
    import platform
    import sys

    import torch
    import transformers
    from transformers.models.deprecated.realm import RealmForOpenQA, RealmRetriever

    torch.set_num_threads(args.threads)
    begin = time.perf_counter()
    retriever = RealmRetriever.from_pretrained(args.folder)
    model = RealmForOpenQA.from_pretrained(args.folder, retriever=retriever).eval()
    load_seconds = time.perf_counter() - begin
    tokenizer = retriever.tokenizer

    # Provenance for the parity check, recorded by thin wrappers (microseconds per question): the blocks the port
    # retrieved (it hands them to its retriever) and the reader's input shape [R, L].
    seen: dict = {}
    port_retriever = model.retriever

    def recording_retriever(retrieved_block_ids, *rest, **kwargs):
        seen["block_ids"] = retrieved_block_ids.reshape(-1).tolist()
        return port_retriever(retrieved_block_ids, *rest, **kwargs)

    def record_reader_shape(module, positional, keywords):
        seen["reader_shape"] = list(keywords["input_ids"].shape)

    model.retriever = recording_retriever
    model.reader.register_forward_pre_hook(record_reader_shape, with_kwargs=True)

    def reply(message: dict) -> None:
        sys.stdout.write(REPLY_PREFIX + json.dumps(message) + "\n")
        sys.stdout.flush()

    reply(
        {
            "load_seconds": load_seconds,
            "threads": torch.get_num_threads(),
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
        }
    )
    for line in sys.stdin:
        question = json.loads(line)["question"]
        seen.clear()
        with torch.inference_mode():
            wall, cpu = time.perf_counter(), time.process_time()
            output = model(**tokenizer([question], return_tensors="pt"))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        reply(
            {
                "seconds": wall,
                "cpu_seconds": cpu,
                "answer_ids": output.predicted_answer_ids.tolist(),
                "block_ids": seen["block_ids"],
                "reader_shape": seen["reader_shape"],
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build")
    build_parser.add_argument("--folder", required=True)
    build_parser.add_argument("--vocab", required=True)
    build_parser.add_argument("--passages", nargs="+", required=True)
    build_parser.add_argument("--num-blocks", type=int, required=True)
    build_parser.add_argument("--block-size", type=int, default=288)
    build_parser.add_argument("--seed", type=int, default=0)
    serve_parser = commands.add_parser("serve")
    serve_parser.add_argument("--folder", required=True)
    serve_parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    build(args) if args.command == "build" else serve(args)


if __name__ == "__main__":
    main()
