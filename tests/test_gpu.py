"""What runs on a CUDA device gives what the CPU gives: exact search, half-precision storage, bf16 block embedding,
and a pre-training run whose index is rebuilt by an asynchronous builder process on the same GPU. Skipped without
CUDA (benchmarks/gpu_suite.sh runs them on a lent GPU)."""

import argparse
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import TINY_PRETRAIN, assert_same_top_k
from transformers import TrainerCallback

from openrealm import RealmConfig, RealmEmbedder
from openrealm.index_realm import RealmBlockIndex, torch_exact_search
from openrealm.trainers.embedding import embed_corpus
from openrealm.trainers.jobs import train_pretrain as pretrain
from openrealm.trainers.options import train_pretrain

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = "cuda"
BF16_RELATIVE_ERROR = 3e-2  # bf16 keeps 8 bits of mantissa (3e-3 per value); two layers compound it


def blocks_and_queries(num_blocks: int = 50_000, dim: int = 128, num_queries: int = 32):
    """LayerNorm-ed random rows with 100 exact duplicates (ties to break by id) and queries near some rows."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.nn.functional.layer_norm(torch.randn(num_blocks, dim, generator=g), (dim,))
    blocks[num_blocks - 100 :] = blocks[:100]
    evidence = torch.randint(100, (num_queries,), generator=g)
    queries = blocks[evidence] + 0.5 * torch.randn(num_queries, dim, generator=g)
    return blocks, queries


def test_exact_search_on_cuda_returns_the_ids_the_cpu_search_returns():
    blocks, queries = blocks_and_queries()
    on_cpu = RealmBlockIndex(blocks.clone(), "exact").search(queries, 10)
    on_gpu = RealmBlockIndex(blocks.clone(), "exact").to(DEVICE).search(queries.to(DEVICE), 10)
    assert on_gpu[1].device.type == "cuda"
    assert_same_top_k((on_gpu[0].cpu(), on_gpu[1].cpu()), on_cpu, rtol=1e-4, atol=1e-4)


def test_duplicate_blocks_on_cuda_come_back_lowest_id_first():
    blocks, queries = blocks_and_queries()
    scores, ids = torch_exact_search(blocks.to(DEVICE), queries.to(DEVICE), 2, chunk_size=4096)
    # Every query is nearest to one of the first 100 rows, duplicated at the end: the pair is (row, row + 49,900).
    assert (ids[:, 1] - ids[:, 0]).tolist() == [49_900] * len(queries)


def test_bfloat16_storage_on_cuda_ranks_by_the_float32_scores_of_the_stored_vectors():
    blocks, queries = blocks_and_queries()
    stored = blocks.to(torch.bfloat16)
    on_gpu = RealmBlockIndex(stored, "exact").to(DEVICE).search(queries.to(DEVICE), 5)
    expected = torch_exact_search(stored.float(), queries, 5)
    assert on_gpu[0].dtype == torch.float32
    assert_same_top_k((on_gpu[0].cpu(), on_gpu[1].cpu()), expected, rtol=1e-4, atol=1e-4)


def synthetic_blocks(num_blocks: int, length: int, vocab_size: int) -> pa.Table:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, length - 3, size=num_blocks)
    rows = [rng.integers(5, vocab_size, size=n).tolist() for n in lengths]
    return pa.table({"title_ids": [row[:4] for row in rows], "token_ids": [row[4:] for row in rows]})


class SpecialIds:
    cls_token_id, sep_token_id, pad_token_id = 2, 3, 0


def test_bfloat16_block_embeddings_on_cuda_agree_with_float32_on_the_cpu():
    torch.manual_seed(0)
    config = RealmConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    embedder = RealmEmbedder(config).eval()
    table = synthetic_blocks(300, 128, config.vocab_size)
    kwargs = dict(batch_size=64, max_length=128, progress=False)
    reference = embed_corpus(embedder, table, SpecialIds, device="cpu", dtype="float32", **kwargs)
    float32 = embed_corpus(embedder, table, SpecialIds, device=DEVICE, dtype="float32", **kwargs)
    bfloat16 = embed_corpus(embedder, table, SpecialIds, device=DEVICE, dtype="bfloat16", **kwargs)
    torch.testing.assert_close(float32, reference, rtol=1e-4, atol=1e-4)
    relative_error = ((bfloat16 - reference).norm() / reference.norm()).item()
    assert relative_error < BF16_RELATIVE_ERROR, relative_error


class DeviceRecorder(TrainerCallback):
    def __init__(self):
        self.devices: set[str] = set()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.devices.add(next(model.parameters()).device.type)


def test_pretraining_on_cuda_swaps_in_indexes_built_by_an_async_builder_on_the_same_gpu(world_corpus, tmp_path):
    output = tmp_path / "out"
    argv = ["--corpus", str(world_corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--max-steps", "9", "--refresh-every", "3", "--refresh-mode", "async", "--refresh-lag", "2"]
    argv += ["--batch-size", "4", "--logging-steps", "1", "--config-overrides", TINY_PRETRAIN]
    argv += ["--no-progress", "--bf16"]
    parser = argparse.ArgumentParser()
    train_pretrain(parser)
    recorder = DeviceRecorder()
    assert pretrain.run(parser.parse_args(argv), callbacks=[recorder]) == 0
    assert recorder.devices == {"cuda"}
    record = json.loads((output / "refresh" / "rank-0.json").read_text())
    # Builds start at the ends of steps 3 and 6 and swap in exactly two steps later (--refresh-lag 2).
    assert [(s["snapshot_step"], s["step"], s["version"]) for s in record["swaps"]] == [(3, 5, 1), (6, 8, 2)]
    # Each version's build_info.json names where it was embedded: v0 by the trainer, v1 and v2 by the builder process.
    devices = [
        json.loads((output / "index" / f"v{v:06d}" / "build_info.json").read_text())["device"] for v in range(3)
    ]
    assert devices == ["cuda:0"] * 3 or devices == ["cuda"] + ["cuda:0"] * 2, devices
