"""Tests for openrealm.index_realm: exact and faiss MIPS, persistence, validation."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import assert_same_top_k, duplicated_integer_blocks
from safetensors.torch import save_file

from openrealm import index_realm
from openrealm.index_realm import (
    BLOCK_EMB_NAME,
    FAISS_INDEX_NAME,
    INDEX_CONFIG_NAME,
    RealmBlockIndex,
    default_chunk_size,
    torch_exact_search,
)

NUM_BLOCKS, DIM, NUM_QUERIES = 5000, 32, 64
# Generous parameters: on this small clustered set each approximate index should find nearly all exact neighbours.
BUILD_PARAMS = {
    "exact": {},
    "flat": {},
    "ivf": {"nlist": 32, "nprobe": 8},
    "hnsw": {"m": 16, "ef_construction": 64, "ef_search": 128},
    "ivfpq": {"nlist": 32, "nprobe": 8, "pq_m": 8, "pq_bits": 8, "rerank": 10},
    "pq": {"pq_m": 8, "pq_bits": 6, "rerank": 20},
}
FAISS_TYPES = ["flat", "ivf", "hnsw", "ivfpq", "pq"]


def clustered(num_blocks: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm-ed blocks drawn around 50 centres, and queries that are noisy copies of random blocks."""
    g = torch.Generator().manual_seed(seed)
    centers = 2 * torch.randn(50, dim, generator=g)
    blocks = centers[torch.randint(50, (num_blocks,), generator=g)] + torch.randn(num_blocks, dim, generator=g)
    blocks = torch.nn.functional.layer_norm(blocks, (dim,))
    queries = blocks[torch.randint(num_blocks, (NUM_QUERIES,), generator=g)]
    queries = torch.nn.functional.layer_norm(queries + 0.5 * torch.randn(NUM_QUERIES, dim, generator=g), (dim,))
    return blocks, queries


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    return clustered(NUM_BLOCKS, DIM)


@pytest.fixture(scope="module")
def indexes(data) -> dict[str, RealmBlockIndex]:
    blocks, _ = data
    return {t: RealmBlockIndex.build(blocks, t, version=3, **params) for t, params in BUILD_PARAMS.items()}


def test_exact_matches_numpy_brute_force(data):
    blocks, queries = data
    scores, ids = RealmBlockIndex.build(blocks).search(queries, 5)
    all_scores = queries.double().numpy() @ blocks.double().numpy().T
    expected_ids = np.argsort(-all_scores, axis=1)[:, :5]
    np.testing.assert_array_equal(ids.numpy(), expected_ids)
    np.testing.assert_allclose(scores.numpy(), np.take_along_axis(all_scores, expected_ids, 1), rtol=1e-5, atol=1e-4)
    assert scores.dtype == torch.float32 and ids.dtype == torch.int64


def test_default_chunk_size_keeps_the_scores_of_a_chunk_near_4_mb_on_cpu_and_takes_2_20_rows_on_gpu():
    cpu = torch.device("cpu")
    assert [default_chunk_size(cpu, q) for q in (1, 8, 9, 16, 64, 4096)] == [2**17] * 2 + [2**16] * 4
    assert default_chunk_size(torch.device("cuda"), 1) == 2**20


def test_chunked_exact_equals_unchunked(data):
    blocks, queries = data
    scores, ids = torch_exact_search(blocks, queries, 7, chunk_size=NUM_BLOCKS)
    # 333 does not divide 5000 (ragged last chunk); chunks of 3 rows hold fewer blocks than k=7.
    for chunk_size in (333, 3):
        # other chunk shapes, other kernels: the same ids, the scores to float32 rounding
        assert_same_top_k(torch_exact_search(blocks, queries, 7, chunk_size=chunk_size), (scores, ids))


@pytest.mark.parametrize("chunk_size", [None, 7, 3, 1])
def test_equal_scores_go_to_the_lowest_ids_whatever_the_chunk_size(chunk_size):
    blocks, query = duplicated_integer_blocks()
    scores, ids = torch_exact_search(blocks, query, 4, chunk_size=chunk_size)
    assert ids.tolist() == [[5, 11, 12, 23]]  # 6 copies tie for the top: the 4 lowest ids, in order
    assert scores.tolist() == [[float(blocks[5] @ blocks[5])] * 4]  # exact: integer inner products


@pytest.mark.parametrize("tile_rows", [1, 4, 64, 256])
def test_tiled_exact_search_returns_what_the_chunked_top_k_returns(data, tile_rows, monkeypatch):
    monkeypatch.setattr(index_realm, "TILE_ROWS", tile_rows)
    blocks, queries = data
    expected = torch_exact_search(blocks, queries, 7, chunk_size=NUM_BLOCKS, tiled=False)
    for chunk_size in (NUM_BLOCKS, 333, 3):  # 333 and 3 are not whole tiles: rounded up to them
        assert_same_top_k(torch_exact_search(blocks, queries, 7, chunk_size=chunk_size, tiled=True), expected)


@pytest.mark.parametrize("tile_rows", [1, 4, 16])
def test_tiled_exact_search_gives_equal_scores_to_the_lowest_ids(tile_rows, monkeypatch):
    monkeypatch.setattr(index_realm, "TILE_ROWS", tile_rows)
    blocks, query = duplicated_integer_blocks()
    scores, ids = torch_exact_search(blocks, query, 4, chunk_size=7, tiled=True)
    assert ids.tolist() == [[5, 11, 12, 23]]
    assert scores.tolist() == [[float(blocks[5] @ blocks[5])] * 4]


def test_tiled_exact_search_never_returns_an_excluded_block():
    blocks, query = duplicated_integer_blocks()
    excluded = torch.tensor([5, 12])
    _, ids = torch_exact_search(blocks, query, 4, chunk_size=8, excluded=excluded, tiled=True)
    _, expected = torch_exact_search(blocks, query, 4, chunk_size=8, excluded=excluded, tiled=False)
    assert ids.tolist() == expected.tolist() == [[11, 23, 30, 38]]


def test_tiled_exact_search_over_half_precision_storage_matches_the_chunked_one():
    g = torch.Generator().manual_seed(0)
    blocks = torch.nn.functional.layer_norm(torch.randn(20_000, 64, generator=g), (64,)).to(torch.bfloat16)
    queries = blocks[:16].float() + 0.7 * torch.randn(16, 64, generator=g)
    tiled = torch_exact_search(blocks, queries, 5, chunk_size=4096, tiled=True)
    assert_same_top_k(tiled, torch_exact_search(blocks, queries, 5, chunk_size=4096, tiled=False))


@pytest.mark.parametrize("index_type", ["exact", "flat"])
def test_an_index_returns_tied_duplicate_blocks_in_id_order(index_type):
    blocks, query = duplicated_integer_blocks()
    _, ids = RealmBlockIndex.build(blocks, index_type).remove([11]).search(query, 6)
    assert ids[0, :5].tolist() == [5, 12, 23, 30, 38]


def test_flat_recall_is_exact(data, indexes):
    assert indexes["flat"].recall_at_k(data[1], 5) == 1.0


@pytest.mark.parametrize("index_type", ["ivf", "hnsw", "ivfpq", "pq"])
def test_approximate_recall_at_5_is_high(data, indexes, index_type):
    assert indexes[index_type].recall_at_k(data[1], 5) >= 0.9


def test_recall_against_an_explicit_reference(data, indexes):
    assert indexes["ivf"].recall_at_k(data[1], 5, reference=indexes["flat"]) == indexes["ivf"].recall_at_k(data[1], 5)


@pytest.mark.parametrize("index_type", FAISS_TYPES)
def test_faiss_scores_are_exact_inner_products_sorted(data, indexes, index_type):
    blocks, queries = data
    scores, ids = indexes[index_type].search(queries, 5)
    expected = torch.einsum("qd,qkd->qk", queries, blocks[ids])
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-4)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    assert (ids >= 0).all() and all(len(set(row)) == 5 for row in ids.tolist())


@pytest.mark.parametrize("index_type", ["exact", "flat", "hnsw"])
def test_k_equals_1_shapes(data, indexes, index_type):
    scores, ids = indexes[index_type].search(data[1], 1)
    assert scores.shape == ids.shape == (NUM_QUERIES, 1)


def test_search_accepts_other_float_dtypes(data, indexes):
    _, ids = indexes["exact"].search(data[1], 5)
    _, ids_double = indexes["ivf"].search(data[1].double(), 5)
    assert (ids_double == ids).float().mean() >= 0.9
    _, ids_bf16 = indexes["exact"].search(data[1].bfloat16(), 5)
    assert ids_bf16.shape == (NUM_QUERIES, 5)


def test_faiss_missing_results_fall_back_to_exact(data):
    # nprobe=1 over 100 lists of ~50 blocks: for k=60 faiss often finds too few blocks and pads with -1.
    blocks, queries = data
    index = RealmBlockIndex.build(blocks, "ivf", nlist=100, nprobe=1)
    scores, ids = index.search(queries, 60)
    assert (ids >= 0).all()
    exact_scores, _ = torch_exact_search(blocks, queries, 60)
    short = index.faiss_index.search(queries.numpy(), 60)[1].min(axis=1) < 0
    assert short.any()
    torch.testing.assert_close(scores[torch.from_numpy(short)], exact_scores[torch.from_numpy(short)])


def test_embeddings_returns_rows_for_any_id_shape(data, indexes):
    blocks, _ = data
    ids = torch.tensor([[0, 7], [4999, 12]])
    assert torch.equal(indexes["ivf"].embeddings(ids), blocks[ids])  # exact: rows copied out of block_emb
    with pytest.raises(IndexError, match="block ids"):
        indexes["exact"].embeddings(torch.tensor([-1]))


def test_set_search_params_changes_faiss(indexes):
    index = RealmBlockIndex.build(indexes["exact"].block_emb, "ivf", nlist=16, nprobe=2)
    index.set_search_params(nprobe=5)
    assert index.faiss_index.nprobe == 5 and index.params["nprobe"] == 5
    with pytest.raises(ValueError, match="ef_search"):
        index.set_search_params(ef_search=10)


@pytest.mark.parametrize("index_type", list(BUILD_PARAMS))
def test_save_load_roundtrip(data, indexes, tmp_path, index_type):
    index = indexes[index_type]
    index.save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    assert (loaded.index_type, loaded.version, loaded.params) == (index_type, 3, index.params)
    assert_same_top_k(loaded.search(data[1], 5), index.search(data[1], 5))
    expected_files = {INDEX_CONFIG_NAME, BLOCK_EMB_NAME} | ({FAISS_INDEX_NAME} if index_type != "exact" else set())
    assert {p.name for p in (tmp_path / "index").iterdir()} == expected_files


def test_loaded_embeddings_are_memory_mapped(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    path = tmp_path / "index" / BLOCK_EMB_NAME
    assert loaded.is_memory_mapped and not indexes["exact"].is_memory_mapped
    assert isinstance(loaded._mmap, np.memmap) and str(loaded._mmap.filename) == str(path)
    assert loaded.block_emb.data_ptr() == loaded._mmap.ctypes.data  # the tensor is a view of the mapping, no copy
    if sys.platform == "linux":  # the kernel lists the file among this process's memory mappings
        assert str(path) in open("/proc/self/maps").read()


@pytest.mark.skipif(sys.platform != "linux", reason="an unchanged mapping is recognised through /proc")
def test_saving_an_unchanged_loaded_index_links_its_embeddings_instead_of_rewriting(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    loaded.save_pretrained(tmp_path / "copy")
    loaded.save_pretrained(tmp_path / "index")  # over the folder it was loaded from
    files = [tmp_path / folder / BLOCK_EMB_NAME for folder in ("index", "copy")]
    assert files[0].stat().st_ino == files[1].stat().st_ino  # one file on disk, 6.8 GB not written twice
    # exact: saved and reloaded
    assert torch.equal(RealmBlockIndex.from_pretrained(tmp_path / "index").block_emb, indexes["exact"].block_emb)


def test_an_index_written_in_place_after_loading_saves_its_new_values(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    loaded.block_emb[3].fill_(0.5)  # a copy-on-write page: the file keeps the old values
    loaded.save_pretrained(tmp_path / "changed")
    saved = RealmBlockIndex.from_pretrained(tmp_path / "changed").block_emb
    assert torch.equal(saved[3], torch.full_like(saved[3], 0.5))  # exact: the value written, saved and reloaded
    # exact: the file it was loaded from, reloaded
    assert torch.equal(RealmBlockIndex.from_pretrained(tmp_path / "index").block_emb, indexes["exact"].block_emb)
    assert (tmp_path / "changed" / BLOCK_EMB_NAME).stat().st_nlink == 1


@pytest.mark.skipif(sys.platform != "linux", reason="the mapping is read from /proc")
def test_embeddings_mapped_by_safetensors_or_torch_load_count_as_memory_mapped(data, tmp_path):
    from safetensors import safe_open

    save_file({"block_emb": data[0]}, str(tmp_path / "model.safetensors"))
    torch.save({"block_emb": data[0]}, tmp_path / "pytorch_model.bin")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        from_safetensors = f.get_tensor("block_emb")
    from_torch = torch.load(tmp_path / "pytorch_model.bin", weights_only=True, mmap=True)["block_emb"]
    assert RealmBlockIndex(from_safetensors).is_memory_mapped and RealmBlockIndex(from_torch).is_memory_mapped
    assert not RealmBlockIndex(data[0].clone()).is_memory_mapped


def test_saved_embeddings_are_plain_safetensors(indexes, tmp_path):
    from safetensors import safe_open

    indexes["exact"].save_pretrained(tmp_path / "index")
    with safe_open(str(tmp_path / "index" / BLOCK_EMB_NAME), framework="pt") as f:
        assert torch.equal(f.get_tensor("block_emb"), indexes["exact"].block_emb)  # exact: saved and read back


def test_save_replaces_an_existing_index(data, indexes, tmp_path):
    indexes["ivf"].save_pretrained(tmp_path / "index")
    indexes["exact"].save_pretrained(tmp_path / "index")
    assert RealmBlockIndex.from_pretrained(tmp_path / "index").index_type == "exact"
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # no temporary or set-aside directory left


def test_save_over_the_directory_it_was_loaded_from(data, indexes, tmp_path):
    indexes["ivf"].save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")  # block_emb memory-maps the file being replaced
    loaded.version = 4
    loaded.save_pretrained(tmp_path / "index")
    reloaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    assert reloaded.version == 4 and torch.equal(reloaded.block_emb, data[0])  # exact: saved and reloaded
    assert_same_top_k(reloaded.search(data[1], 5), indexes["ivf"].search(data[1], 5))


def test_failed_save_leaves_previous_index_intact(data, indexes, tmp_path, monkeypatch):
    indexes["flat"].save_pretrained(tmp_path / "index")
    before = {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()}

    def failing_save_file(tensors, filename):
        open(filename, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(index_realm, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        indexes["ivf"].save_pretrained(tmp_path / "index")
    assert [p.name for p in tmp_path.iterdir()] == ["index"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()} == before


def test_save_refuses_to_replace_a_directory_with_other_files(indexes, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(FileExistsError, match="model.safetensors"):
        indexes["exact"].save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"


def test_error_k_larger_than_num_blocks(data, indexes):
    for index_type in ("exact", "ivf"):
        with pytest.raises(ValueError, match="k must be"):
            indexes[index_type].search(data[1], NUM_BLOCKS + 1)
    with pytest.raises(ValueError, match="k must be"):
        indexes["exact"].search(data[1], 0)


def test_error_wrong_query_dim(indexes):
    with pytest.raises(ValueError, match=f"dim={DIM}"):
        indexes["exact"].search(torch.randn(2, DIM + 1), 5)
    with pytest.raises(ValueError, match="query_emb"):
        indexes["flat"].search(torch.randn(DIM), 5)


def test_a_numpy_query_searches_like_its_tensor(indexes):
    queries = np.random.default_rng(0).standard_normal((3, DIM)).astype(np.float32)
    for index in (indexes["exact"], indexes["flat"]):
        assert torch.equal(index.search(queries, 5)[1], index.search(torch.from_numpy(queries), 5)[1])


def test_a_query_that_is_no_array_is_refused_with_its_type(indexes):
    with pytest.raises(TypeError, match="torch.Tensor or numpy array .* got <class 'list'>"):
        indexes["exact"].search([[0.0] * DIM], 5)


def test_error_missing_faiss_index_file(indexes, tmp_path):
    indexes["hnsw"].save_pretrained(tmp_path / "index")
    (tmp_path / "index" / FAISS_INDEX_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing faiss index .*{FAISS_INDEX_NAME}"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_error_faiss_index_size_differs_from_embeddings(data, indexes, tmp_path):
    indexes["flat"].save_pretrained(tmp_path / "index")
    smaller = RealmBlockIndex.build(data[0][:100], "flat")
    index_realm.faiss.write_index(smaller.faiss_index, str(tmp_path / "index" / FAISS_INDEX_NAME))
    with pytest.raises(ValueError, match=f"{FAISS_INDEX_NAME}'s header claims 100 x {DIM} vectors"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_error_embedding_rows_contradict_config(data, indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    save_file({"block_emb": data[0][:10].contiguous()}, str(tmp_path / "index" / BLOCK_EMB_NAME))
    with pytest.raises(ValueError, match=f"{BLOCK_EMB_NAME} holds 10 x {DIM} .*{INDEX_CONFIG_NAME} says"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_error_non_2d_embeddings_file(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    save_file({"block_emb": torch.zeros(NUM_BLOCKS * DIM)}, str(tmp_path / "index" / BLOCK_EMB_NAME))
    with pytest.raises(ValueError, match=f"{BLOCK_EMB_NAME}: block_emb must be 2-D"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_error_corrupted_config_json(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    (tmp_path / "index" / INDEX_CONFIG_NAME).write_text('{"index_type": "exact", ')
    with pytest.raises(ValueError, match=f"corrupted index config .*{INDEX_CONFIG_NAME}: not valid JSON"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")
    (tmp_path / "index" / INDEX_CONFIG_NAME).write_text(json.dumps({"index_type": "exact"}))
    with pytest.raises(ValueError, match=f"{INDEX_CONFIG_NAME}: 'format_version' missing"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_error_missing_directory_or_files(indexes, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RealmBlockIndex.from_pretrained(tmp_path / "nowhere")
    indexes["exact"].save_pretrained(tmp_path / "index")
    (tmp_path / "index" / BLOCK_EMB_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing block embeddings .*{BLOCK_EMB_NAME}"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_a_crafted_faiss_header_claiming_billions_of_vectors_is_refused_before_faiss_reads_it(indexes, tmp_path):
    indexes["flat"].save_pretrained(tmp_path / "index")
    path = tmp_path / "index" / FAISS_INDEX_NAME
    # 45 bytes: a flat inner-product index header claiming 3 << 28 vectors of 32 dimensions, and no data.
    path.write_bytes(b"IxFI" + struct.pack("<iqqq?i", 32, 3 << 28, 0, 0, True, 0) + bytes(4))
    with pytest.raises(ValueError, match=f"header claims {3 << 28} x 32 vectors but the block embeddings are"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_a_faiss_file_too_short_for_the_vectors_its_header_claims_is_refused(indexes, tmp_path):
    indexes["hnsw"].save_pretrained(tmp_path / "index")
    path = tmp_path / "index" / FAISS_INDEX_NAME
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"{FAISS_INDEX_NAME} is truncated: 1000 bytes cannot hold {NUM_BLOCKS}"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_a_block_emb_header_longer_than_safetensors_allows_is_refused_before_it_is_read(indexes, tmp_path):
    indexes["exact"].save_pretrained(tmp_path / "index")
    path = tmp_path / "index" / BLOCK_EMB_NAME
    with open(path, "wb") as file:  # a header length of 200 MB, and a (sparse) file that long
        file.write(struct.pack("<Q", 200_000_000))
        file.truncate(8 + 200_000_000)
    with pytest.raises(ValueError, match=f"{BLOCK_EMB_NAME} is not a safetensors file: header length 200000000"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def hnsw_neighbors_length_offset(data: bytes) -> int:
    """Where an IndexHNSWFlat file stores the length of its graph's neighbor list. The file is the fourcc and the index
    header (37 bytes), then the HNSW vectors, each a uint64 length and its items: assign_probas (float64),
    cum_nneighbor_per_level (int32), levels (int32), offsets (uint64), neighbors (int32)."""
    position = 37
    for item_size in (8, 4, 4, 8):
        position += 8 + item_size * struct.unpack_from("<Q", data, position)[0]
    return position


# Loads an index folder in a process whose address space is capped at 512 MiB above what it uses once imported:
# faiss allocating what a crafted length claims would fail there (std::bad_alloc) instead of taking the memory.
CAPPED_LOAD = """
import resource, sys
import faiss
from openrealm import RealmBlockIndex

used = next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (used + (512 << 20), resource.RLIM_INFINITY))
try:
    RealmBlockIndex.from_pretrained(sys.argv[1])
except ValueError as error:
    sys.exit(f"ValueError: {error}")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
@pytest.mark.parametrize("inner_length", ["hnsw neighbors", "ivf inverted lists"])
def test_a_crafted_length_inside_a_faiss_file_is_refused_before_faiss_allocates_it(indexes, tmp_path, inner_length):
    index_type = inner_length.split()[0]
    indexes[index_type].save_pretrained(tmp_path / "index")
    path = tmp_path / "index" / FAISS_INDEX_NAME
    data = bytearray(path.read_bytes())
    # 2**36 items: 256 GiB of neighbor ids, or 2**36 inverted lists (the count after the lists' "ilar" tag).
    offset = hnsw_neighbors_length_offset(data) if index_type == "hnsw" else data.find(b"ilar") + 4
    struct.pack_into("<Q", data, offset, 1 << 36)
    path.write_bytes(data)
    child = subprocess.run(
        [sys.executable, "-c", CAPPED_LOAD, str(tmp_path / "index")], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 1, child.stderr[-2000:]
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: {path} is corrupted: a length inside it exceeds what its {len(data):,} bytes")


def test_an_ivfpq_config_describing_more_centroids_than_its_faiss_file_holds_is_refused(indexes, tmp_path):
    # The config's nlist and pq sizes decide how much faiss may allocate for the table it derives from them.
    indexes["ivfpq"].save_pretrained(tmp_path / "index")
    config = json.loads((tmp_path / "index" / INDEX_CONFIG_NAME).read_text())
    config["params"]["nlist"] = 1 << 40
    (tmp_path / "index" / INDEX_CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{FAISS_INDEX_NAME} .* cannot hold the IVFPQ index its config describes"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3e25], ids=["nan", "inf", "overflowing"])
def test_saved_embeddings_with_a_bad_row_are_refused_on_load_naming_the_file_and_row(data, value, tmp_path):
    blocks = data[0].clone()
    RealmBlockIndex.build(blocks, "exact").save_pretrained(tmp_path / "index")
    blocks[777, 3] = value
    save_file({"block_emb": blocks.contiguous()}, str(tmp_path / "index" / BLOCK_EMB_NAME))
    with pytest.raises(ValueError, match=f"{BLOCK_EMB_NAME} contains NaN, inf or overflowing values .*row 777"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_build_rejects_nan(data):
    blocks = data[0].clone()
    blocks[1234, 5] = float("nan")
    with pytest.raises(ValueError, match="block_emb contains NaN, inf or overflowing values .*row 1234"):
        RealmBlockIndex.build(blocks, "exact")


def test_build_rejects_bad_inputs(data):
    with pytest.raises(ValueError, match="2-D"):
        RealmBlockIndex.build(data[0][0], "exact")
    with pytest.raises(ValueError, match="unknown index_type"):
        RealmBlockIndex.build(data[0], "scann")
    with pytest.raises(ValueError, match="unknown parameters \\['nprobe'\\]"):
        RealmBlockIndex.build(data[0], "hnsw", nprobe=4)


def test_build_accepts_numpy(data):
    index = RealmBlockIndex.build(data[0].numpy(), "exact")
    assert torch.equal(index.search(data[1], 5)[1], RealmBlockIndex.build(data[0]).search(data[1], 5)[1])


def test_faiss_types_need_faiss(data, monkeypatch):
    monkeypatch.setattr(index_realm, "faiss", None)
    with pytest.raises(ImportError, match="index type 'hnsw' needs faiss: pip install faiss-cpu"):
        RealmBlockIndex.build(data[0], "hnsw")
    assert RealmBlockIndex.build(data[0], "exact").search(data[1], 2)[1].shape == (NUM_QUERIES, 2)


def test_faiss_index_on_cuda_without_faiss_gpu_is_a_clear_error(indexes, monkeypatch):
    monkeypatch.setattr(index_realm.faiss, "get_num_gpus", lambda: 0)
    with pytest.raises(RuntimeError, match="faiss-gpu"):
        indexes["ivf"].to("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_exact_and_flat_match_cpu(data, indexes):
    blocks, queries = data
    cpu_scores, cpu_ids = indexes["exact"].search(queries, 5)
    exact = RealmBlockIndex.build(blocks, "exact").to("cuda")
    scores, ids = exact.search(queries.cuda(), 5)
    assert ids.device.type == "cuda"
    assert_same_top_k((scores.cpu(), ids.cpu()), (cpu_scores, cpu_ids), rtol=1e-4, atol=1e-3)
    if index_realm.faiss is not None and index_realm.faiss.get_num_gpus() > 0:
        flat = RealmBlockIndex.build(blocks, "flat").to("cuda")
        scores, ids = flat.search(queries.cuda(), 5)
        assert_same_top_k((scores.cpu(), ids.cpu()), (cpu_scores, cpu_ids), rtol=1e-4, atol=1e-3)


def test_metadata_round_trips_through_save_and_load(tmp_path):
    index = RealmBlockIndex.build(torch.randn(20, 8), version=3)
    index.metadata.update(corpus_fingerprint="abc123", embedder="tiny")
    index.save_pretrained(tmp_path / "index")
    loaded = RealmBlockIndex.from_pretrained(tmp_path / "index")
    assert loaded.metadata == {"corpus_fingerprint": "abc123", "embedder": "tiny"}
    assert loaded.version == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_search_over_half_precision_storage_ranks_by_the_float32_scores_of_the_stored_vectors(dtype):
    g = torch.Generator().manual_seed(0)
    blocks = torch.nn.functional.layer_norm(torch.randn(20_000, 64, generator=g), (64,))
    queries = blocks[:16] + 0.7 * torch.randn(16, 64, generator=g)
    stored = blocks.to(dtype)
    scores, ids = RealmBlockIndex(stored, "exact").search(queries, 5)
    assert scores.dtype == torch.float32
    assert_same_top_k((scores, ids), torch_exact_search(stored.float(), queries, 5), rtol=1e-4, atol=1e-4)


def test_exact_search_over_half_precision_storage_returns_duplicates_lowest_id_first():
    blocks = torch.nn.functional.layer_norm(torch.randn(1000, 32, generator=torch.Generator().manual_seed(1)), (32,))
    blocks[900:] = blocks[:100]
    scores, ids = torch_exact_search(blocks.to(torch.bfloat16), blocks[:10], 2, chunk_size=256)
    assert ids.tolist() == [[i, i + 900] for i in range(10)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nlist": 100}, "nlist=100 exceeds the 37 training blocks"),
        ({"nlist": 21, "train_size": 20}, "nlist=21 exceeds the 20 training blocks"),
        ({"seed": -1}, "parameter seed of index type 'ivf' must be a non-negative int, got -1"),
        ({"nprobe": 0}, "parameter nprobe of index type 'ivf' must be a positive int, got 0"),
    ],
    ids=["nlist", "nlist-train-size", "seed", "nprobe"],
)
def test_a_refused_index_parameter_says_the_bound_it_broke(params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        index_realm.resolve_index_params("ivf", 37, 16, params)
