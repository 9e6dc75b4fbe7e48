"""Top-k retrieval benchmark: the old transformers port vs RealmBlockIndex (exact torch, faiss flat and ANN indexes).

    python benchmarks/bench_retrieval.py                                      # 1M x 128, CPU, 2 threads
    python benchmarks/bench_retrieval.py --device cuda --num-blocks 13353718 --threads 16  # REALM's corpus size, GPU

Compared on the same synthetic block embeddings and the same batches of queries:
  port   the old transformers REALM port: scores = einsum("BD,QD->QB", block_emb, q); topk(scores, k)
  exact  RealmBlockIndex 'exact' (torch matmul + top-k, chunked over blocks)
  flat   RealmBlockIndex 'flat' (faiss IndexFlatIP, exact)
  ivf / hnsw / ivfpq  approximate faiss indexes (scores re-computed exactly), with recall@k against the exact top-k
         and build time; each search setting given (e.g. --ivf-nprobe 16,32) is one row, without rebuilding.
With --device cuda: port and exact run on the GPU; faiss types run on the GPU when faiss has GPU support (hnsw has no
faiss GPU version and is skipped), otherwise they are skipped.

Synthetic data (not i.i.d. Gaussian, which is the worst case for ANN search and unlike real REALM embeddings, which are
LayerNorm-ed projections of passage encodings with topic structure):
  * num_topics topic centres ~ N(0, I); num_clusters cluster centres = 0.7 * (a random topic) + 0.7 * N(0, I);
  * cluster sizes follow a Zipf-like law (weight ~ rank^-0.8): a few large clusters, many small ones;
  * block = cluster centre + anisotropic noise, per-axis std = cluster_spread * s_j * exp(0.3 * N(0, 1)) with s_j
    decaying log-linearly from 1 to 0.1 over the axes, rotated by one of 16 random orthogonal matrices (per cluster),
    so clusters have different elongated shapes;
  * every row is LayerNorm-ed (zero mean, unit variance over dim), then scaled/shifted by fixed gamma ~ 1 + 0.1 N(0, 1)
    and beta ~ 0.05 N(0, 1), like REALM's projection layer;
  * query = LayerNorm(pre-norm vector of a random "evidence" block + query_noise * N(0, I)): close to its evidence
    but not a copy (defaults: cosine ~0.6 to it; the evidence is in the exact top-5 for ~97% of queries).
Everything is seeded. Recall and speed on real REALM embeddings may differ.
"""

from __future__ import annotations

import os

# torch and faiss-cpu each bundle their own OpenMP runtime. With the default wait policy the idle threads of one keep
# spinning while the other works, which on a 2-core machine makes faiss searches ~3x slower. Passive waiting is read
# when the runtimes load, so it is set before importing torch (an explicit OMP_WAIT_POLICY in the environment wins).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from openrealm.index_realm import RealmBlockIndex, default_chunk_size, faiss  # noqa: E402


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[1],)) * gamma + beta


def make_data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> block_emb [num_blocks, dim] float32 (CPU), queries [batch * num_batches, dim], the queries' evidence ids,
    and each block's cluster id. Generated in chunks so 13M x 128 needs no more than the output in RAM."""
    n, dim, num_queries = args.num_blocks, args.dim, args.batch * args.num_batches
    g = torch.Generator().manual_seed(args.seed)
    topics = torch.randn(args.num_topics, dim, generator=g)
    topic_of = torch.randint(args.num_topics, (args.num_clusters,), generator=g)
    centers = 0.7 * topics[topic_of] + 0.7 * torch.randn(args.num_clusters, dim, generator=g)
    num_rotations = 16
    rotations = torch.linalg.qr(torch.randn(num_rotations, dim, dim, generator=g))[0]
    rotation_of = torch.randint(num_rotations, (args.num_clusters,), generator=g)
    spectrum = torch.logspace(0, -1, dim)
    scales = args.cluster_spread * spectrum * torch.exp(0.3 * torch.randn(args.num_clusters, dim, generator=g))
    weights = torch.arange(1, args.num_clusters + 1, dtype=torch.float64) ** -0.8
    cluster_of = torch.multinomial(weights, n, replacement=True, generator=g)
    gamma, beta = 1 + 0.1 * torch.randn(dim, generator=g), 0.05 * torch.randn(dim, generator=g)
    sources = torch.randint(n, (num_queries,), generator=g)

    block_emb, source_raw = torch.empty(n, dim), torch.empty(num_queries, dim)
    for start in range(0, n, 2**18):
        stop = min(start + 2**18, n)
        clusters = cluster_of[start:stop]
        noise = torch.randn(stop - start, dim, generator=g) * scales[clusters]
        x = centers[clusters]
        for r in range(num_rotations):  # grouped by rotation: one matmul each, not a [rows, dim, dim] gather
            members = (rotation_of[clusters] == r).nonzero().squeeze(1)
            x[members] += noise[members] @ rotations[r]
        in_chunk = ((sources >= start) & (sources < stop)).nonzero().squeeze(1)
        source_raw[in_chunk] = x[sources[in_chunk] - start]
        block_emb[start:stop] = layer_norm(x, gamma, beta)
    queries = layer_norm(source_raw + args.query_noise * torch.randn(num_queries, dim, generator=g), gamma, beta)
    return block_emb, queries, sources, cluster_of


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_search(search, queries: torch.Tensor, batch: int, num_batches: int) -> tuple[float, torch.Tensor]:
    """Run search(batch_of_queries) -> (scores, ids) over num_batches batches; -> (queries/s, ids [Q, k] on CPU).

    queries/s = batch / median seconds per batch: the median shrugs off a batch slowed by another process."""
    batches = queries[: batch * num_batches].split(batch)
    search(batches[0])  # warm-up (allocator, page cache, lazy init), same for every method
    seconds, ids = [], []
    for b in batches:
        sync(queries.device)
        start = time.perf_counter()
        ids.append(search(b)[1])
        sync(queries.device)
        seconds.append(time.perf_counter() - start)
    return batch / float(np.median(seconds)), torch.cat(ids).cpu()


def recall(ids: torch.Tensor, ref_ids: torch.Tensor) -> float:
    """Fraction of ref_ids [Q, k] found in ids [Q, k], averaged over queries."""
    return (ids.unsqueeze(2) == ref_ids[: len(ids)].unsqueeze(1)).any(1).float().mean().item()


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-blocks", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--num-batches", type=int, default=20)
    parser.add_argument("--exhaustive-batches", type=int, default=10, help="timed batches for port, exact and flat")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch and faiss CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-topics", type=int, default=50)
    parser.add_argument("--num-clusters", type=int, default=2000)
    parser.add_argument("--cluster-spread", type=float, default=1.5)
    parser.add_argument("--query-noise", type=float, default=1.5)
    parser.add_argument("--index-types", default="flat,ivf,hnsw,ivfpq", help="faiss types to benchmark")
    parser.add_argument("--chunk-size", type=int, default=None, help="exact search chunk (default: library's)")
    # Defaults sized for 1M blocks on 2 cores (total run < 10 min); None = the library's default for the data size.
    parser.add_argument("--ivf-nlist", type=int, default=4096)
    parser.add_argument("--ivf-train-size", type=int, default=40 * 4096)
    parser.add_argument("--ivf-nprobe", type=int_list, default=[16, 24, 32, 48])
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--hnsw-ef-construction", type=int, default=64)
    parser.add_argument("--hnsw-ef-search", type=int_list, default=[64, 256, 1024])
    parser.add_argument("--ivfpq-nlist", type=int, default=4096)
    parser.add_argument("--ivfpq-train-size", type=int, default=40 * 4096)
    parser.add_argument("--ivfpq-nprobe", type=int_list, default=[24, 32, 48])
    parser.add_argument("--ivfpq-pq-m", type=int, default=64)
    parser.add_argument("--ivfpq-rerank", type=int, default=10)
    parser.add_argument("--output", default=None, help="also write the markdown report here")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if faiss is not None:
        faiss.omp_set_num_threads(args.threads)
    lines = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    start = time.perf_counter()
    block_emb, queries, sources, cluster_of = make_data(args)
    gen_s = time.perf_counter() - start
    block_dev, queries = block_emb.to(device), queries.to(device)
    k, batch = args.k, args.batch
    cpu_name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    emit(
        f"Top-{k} MIPS over {args.num_blocks:,} x {args.dim} float32 blocks, batches of {batch} queries, "
        f"device {device}{f' ({gpu_name})' if gpu_name else ''}, {args.threads} CPU threads ({cpu_name})."
    )
    emit(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"faiss {getattr(faiss, '__version__', 'not installed')}, numpy {np.__version__}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}."
    )

    rows = []  # (method, params, build_s, qps, ids, port_qps measured just before it)
    # Reference top-k for recall and for the data statistics, over every query (untimed).
    reference = RealmBlockIndex.build(block_dev, "exact")
    ref_ids = torch.cat([reference.search(b, k)[1] for b in queries.split(batch)]).cpu()
    evidence_top_k = (ref_ids == sources[:, None]).any(1).float().mean().item()
    same_cluster = (cluster_of[ref_ids] == cluster_of[sources, None]).float().mean().item()
    emit(
        f"Synthetic data ({gen_s:.0f} s to generate): {args.num_clusters} clusters in {args.num_topics} topics, "
        f"cluster_spread={args.cluster_spread}, query_noise={args.query_noise}, seed={args.seed}; evidence block in "
        f"exact top-{k}: {evidence_top_k:.1%}; exact top-{k} in the evidence's cluster: {same_cluster:.1%}."
    )

    def port_search(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.einsum("BD,QD->QB", block_dev, q)
        return torch.topk(scores, k)

    exhaustive_batches = min(args.exhaustive_batches or args.num_batches, args.num_batches)

    def time_port() -> tuple[float, torch.Tensor]:
        # Re-timed next to each method: on a shared machine the load drifts, and a ratio should compare like with like.
        with torch.no_grad():
            return time_search(port_search, queries, batch, exhaustive_batches)

    port_qps, port_ids = time_port()
    rows.append(("port: einsum + topk", "", None, port_qps, port_ids, port_qps))

    exact_params = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
    exact = RealmBlockIndex.build(block_dev, "exact", **exact_params)
    exact_qps, exact_ids = time_search(lambda q: exact.search(q, k), queries, batch, exhaustive_batches)
    chunk_size = exact.params.get("chunk_size") or default_chunk_size(device, batch)
    rows.append(("exact (torch, chunked)", f"chunk_size={chunk_size}", None, exact_qps, exact_ids, port_qps))

    sweeps = {
        "flat": ({}, [{}]),
        "ivf": (
            {"nlist": args.ivf_nlist, "train_size": args.ivf_train_size},
            [{"nprobe": p} for p in args.ivf_nprobe],
        ),
        "hnsw": (
            {"m": args.hnsw_m, "ef_construction": args.hnsw_ef_construction},
            [{"ef_search": e} for e in args.hnsw_ef_search],
        ),
        "ivfpq": (
            {
                "nlist": args.ivfpq_nlist,
                "pq_m": args.ivfpq_pq_m,
                "rerank": args.ivfpq_rerank,
                "train_size": args.ivfpq_train_size,
            },
            [{"nprobe": p} for p in args.ivfpq_nprobe],
        ),
    }
    notes = []
    for index_type in [t for t in args.index_types.split(",") if t]:
        if faiss is None:
            notes.append(f"{index_type}: skipped, faiss is not installed.")
            continue
        if device.type == "cuda" and (faiss.get_num_gpus() == 0 or index_type == "hnsw"):
            why = "faiss has no GPU HNSW" if index_type == "hnsw" else "this faiss build has no GPU support"
            notes.append(f"{index_type}: skipped on cuda ({why}).")
            continue
        build_params, settings = sweeps[index_type]
        build_params = {name: value for name, value in build_params.items() if value is not None}
        start = time.perf_counter()
        # Built from the device copy (faiss trains and adds on CPU, in chunks), so no second GPU copy is made.
        index = RealmBlockIndex.build(block_dev, index_type, **build_params).to(device)
        build_s = time.perf_counter() - start
        num_batches = exhaustive_batches if index_type == "flat" else args.num_batches
        adjacent_port_qps, _ = time_port()
        for setting in settings:
            index.set_search_params(**setting)
            qps, ids = time_search(lambda q, index=index: index.search(q, k), queries, batch, num_batches)
            shown = {n: v for n, v in index.params.items() if n not in ("seed",)}
            params = ", ".join(f"{n}={v}" for n, v in shown.items())
            rows.append((index_type, params, build_s, qps, ids, adjacent_port_qps))
            print(f"  {index_type} {setting}: {qps:,.0f} q/s, recall@{k} {recall(ids, ref_ids):.4f}", flush=True)
        del index

    emit()
    emit(f"| method | parameters | build (s) | queries/s | port queries/s (adjacent) | vs port | recall@{k} |")
    emit("|---|---|---:|---:|---:|---:|---:|")
    for method, params, build_s, qps, ids, port in rows:
        build = "-" if build_s is None else f"{build_s:.1f}"
        emit(
            f"| {method} | {params} | {build} | {qps:,.0f} | {port:,.0f} | {qps / port:.2f}x | "
            f"{recall(ids, ref_ids):.4f} |"
        )
    for note in notes:
        emit(f"\n{note}")
    emit(
        f"\nqueries/s = {batch} / median seconds per batch, after one warm-up batch; {args.num_batches} timed batches "
        f"for approximate indexes, {exhaustive_batches} for port, exact and flat. recall@{k}: fraction of the exact "
        f"top-{k} ids returned, averaged over the timed queries. Build = RealmBlockIndex.build (training + adding). "
        f"vs port = queries/s / the port's queries/s re-measured just before that index type (first row: the port)."
    )
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
