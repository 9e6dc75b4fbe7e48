"""Exact MIPS over REALM's corpus size on one device, against the memory and arithmetic ceilings measured in the same
run: RealmBlockIndex 'exact' (modeling_realm/index_realm.py: torch_exact_search) with float32 storage, and with
bfloat16 / float16 storage re-scored in float32.

    python benchmarks/bench_gpu_mips.py --device cuda                       # 13,353,718 x 128, batches 1, 64, 1024
    python benchmarks/bench_gpu_mips.py --device cpu --num-blocks 100000    # a quick check of the script

For each storage dtype and query batch: queries/s (median of --repeats timed searches, top-5) and the roofline, the
larger of two floors: the bytes that must be read (the block matrix once per batch) over the measured copy bandwidth,
and the multiply-adds (2 * batch * N * D) over the measured matrix-product rate of the dtype the scan computes in
(float32 without TF32, torch's default, or bf16/fp16 tensor cores). "of roofline" = floor / measured time. Half-
precision rows also report recall@5 against the float32 search (the storage's rounding, not the search, loses it).
The score buffer each chunk writes and the selection reads again is traffic beyond the floor: --chunk-sizes and
--tile-rows sweep it at batch 64. Method `tiled` (the library's default off the CPU: tiled_top_k_candidates keeps each
tile's best score, then scores the best tiles' rows again) is compared with `chunked` (a top-k of every chunk, merged;
the CPU's method) in the same run.

Synthetic embeddings: LayerNorm-ed rows around 4,096 random centres; queries = LayerNorm(a random block + noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _device_limits import DTYPES, copy_bandwidth, describe, matmul_tflops

from openrealm import index_realm
from openrealm.index_realm import HALF_PRECISION_RERANK, default_chunk_size, torch_exact_search


def make_blocks(num_blocks: int, dim: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """[num_blocks, dim] float32 LayerNorm-ed rows around 4,096 centres, generated on the device in chunks."""
    g = torch.Generator(device).manual_seed(seed)
    centres = torch.randn(4096, dim, generator=g, device=device)
    out = torch.empty(num_blocks, dim, device=device)
    step = 2**20
    for start in range(0, num_blocks, step):
        n = min(step, num_blocks - start)
        which = torch.randint(4096, (n,), generator=g, device=device)
        rows = 0.8 * centres[which] + torch.randn(n, dim, generator=g, device=device)
        out[start : start + n] = torch.nn.functional.layer_norm(rows, (dim,))
    return out


def make_queries(blocks: torch.Tensor, num: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(blocks.device).manual_seed(seed)
    evidence = torch.randint(blocks.shape[0], (num,), generator=g, device=blocks.device)
    noise = torch.randn(num, blocks.shape[1], generator=g, device=blocks.device)
    return torch.nn.functional.layer_norm(blocks[evidence] + 0.8 * noise, (blocks.shape[1],))


def time_search(search, queries: torch.Tensor, repeats: int) -> float:
    """Median seconds of search(queries) (a top-5 search), synchronised, after two warm-ups."""
    sync = torch.cuda.synchronize if queries.device.type == "cuda" else (lambda: None)
    for _ in range(2):
        search(queries)
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        search(queries)
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-blocks", type=int, default=13_353_718)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batches", default="1,64,1024")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--chunk-sizes", default="", help="comma list swept at batch 64 (default: the library's)")
    parser.add_argument("--tile-rows", default="", help="comma list of TILE_ROWS swept at batch 64 (tiled method)")
    parser.add_argument("--methods", default="tiled,chunked", help="tiled (batches 1, 64, 1024) and/or chunked")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()

    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    rates = {name: matmul_tflops(device, dtype) for name, dtype in DTYPES.items()}
    limits = {"copy_gb_s": bandwidth, "matmul_tflops": rates, "device": describe(device)}
    print(json.dumps(limits), flush=True)

    blocks32 = make_blocks(args.num_blocks, args.dim, device)
    batches = [int(b) for b in args.batches.split(",")]
    queries = {b: make_queries(blocks32, b, seed=b) for b in batches}
    rows = []
    reference_ids = {}
    default_tile = index_realm.TILE_ROWS
    for name in args.dtypes.split(","):
        blocks = blocks32 if name == "float32" else blocks32.to(DTYPES[name])
        settings = []  # (method, batch, chunk rows or None, tile rows or None)
        for batch in batches:
            settings.append(("tiled" if "tiled" in args.methods else "chunked", batch, None, None))
        if 64 in batches:
            chunks = [None] + [int(c) for c in args.chunk_sizes.split(",") if c]
            tiles = [None] + [int(t) for t in args.tile_rows.split(",") if t]
            if "tiled" in args.methods:
                settings += [("tiled", 64, c, t) for c in chunks for t in tiles if c or t]
            if "chunked" in args.methods and "tiled" in args.methods:
                settings += [("chunked", 64, c, None) for c in chunks]
            elif "chunked" in args.methods:
                settings += [("chunked", 64, c, None) for c in chunks if c]
        for method, batch, chunk, tile in settings:
            index_realm.TILE_ROWS = tile or default_tile

            def search(q, blocks=blocks, method=method, chunk=chunk):
                return torch_exact_search(blocks, q, 5, chunk_size=chunk, tiled=method == "tiled")

            seconds = time_search(search, queries[batch], args.repeats)
            read_bytes = blocks.numel() * blocks.element_size()
            flops = 2 * batch * blocks.numel()
            floor = max(read_bytes / (bandwidth * 1e9), flops / (rates[name] * 1e12))
            row = {
                "dtype": name,
                "method": method,
                "batch": batch,
                "chunk_size": chunk or default_chunk_size(device, batch),
                "tile_rows": (tile or default_tile) if method == "tiled" else None,
                "ms": seconds * 1e3,
                "queries_per_s": batch / seconds,
                "floor_ms": floor * 1e3,
                "bound": "memory" if read_bytes / (bandwidth * 1e9) >= flops / (rates[name] * 1e12) else "compute",
                "of_roofline": floor / seconds,
            }
            ids = search(queries[batch])[1]
            if name == "float32" and chunk is None and tile is None and method == settings[0][0]:
                reference_ids[batch] = ids
            elif batch in reference_ids:
                found = (ids.unsqueeze(2) == reference_ids[batch].unsqueeze(1)).any(dim=1)
                row["recall_at_5_vs_float32"] = found.float().mean().item()
            rows.append(row)
            print(json.dumps(row), flush=True)
        index_realm.TILE_ROWS = default_tile
        del blocks

    print(f"\n{limits['device']}; {args.num_blocks:,} x {args.dim}; copy {bandwidth:,.0f} GB/s (read + write);")
    print("matmul TFLOP/s " + ", ".join(f"{k} {v:,.1f}" for k, v in rates.items()))
    print(f"half precision re-scores {HALF_PRECISION_RERANK} x k candidates in float32\n")
    print(
        "| storage | method | batch | chunk rows | tile rows | ms / batch | queries/s | floor ms | bound "
        "| of roofline | recall@5 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        recall = f"{r['recall_at_5_vs_float32']:.4f}" if "recall_at_5_vs_float32" in r else "-"
        print(
            f"| {r['dtype']} | {r['method']} | {r['batch']} | {r['chunk_size']:,} | {r['tile_rows'] or '-'} | "
            f"{r['ms']:.2f} | {r['queries_per_s']:,.0f} | "
            f"{r['floor_ms']:.2f} | {r['bound']} | {r['of_roofline']:.1%} | {recall} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"limits": limits, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
