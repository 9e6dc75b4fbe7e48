"""ShardedBlockIndex: exact search with the block embeddings split across 2 CPU processes (gloo)."""

import json
import multiprocessing

import pytest
import torch
from helpers import assert_same_top_k, duplicated_integer_blocks, tiny_embedder, write_corpus

from openrealm import RealmBlockIndex, ShardedBlockIndex
from openrealm.index_realm import save_block_emb_shard, write_sharded_index
from openrealm.trainers.indexing import build_index

NUM_BLOCKS, DIM, K = 1001, 16, 7
QUERIES_PER_RANK = (5, 3)  # ranks may ask different numbers of questions


def _search_on_rank(rank: int, folder: str, store: str, output: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        index = ShardedBlockIndex.from_pretrained(folder)
        queries = torch.randn(QUERIES_PER_RANK[rank], DIM, generator=torch.Generator().manual_seed(rank))
        scores, ids = index.search(queries, K)
        from_shards = ShardedBlockIndex.from_pretrained(f"{folder}-sharded")  # written in one file per rank
        shard_scores, shard_ids = from_shards.search(queries, K)
        result = {"rows": index.block_emb.shape[0], "offset": index.offset, "scores": scores, "ids": ids}
        result.update(shard_scores=shard_scores, shard_ids=shard_ids, shard_mapped=from_shards.is_memory_mapped)
        blocks, query = duplicated_integer_blocks()  # 6 copies of block 5, 3 in each half
        result["tied_ids"] = ShardedBlockIndex.from_pretrained(f"{folder}-ties").search(query, 4)[1]
        torch.save(result, output)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
    """Each rank's shard and search results, and the single-process index they must equal."""
    folder = tmp_path_factory.mktemp("sharded")
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    RealmBlockIndex.build(block_emb).save_pretrained(folder / "index")
    _sharded_folder(folder / "index-sharded", block_emb, 2)
    RealmBlockIndex.build(duplicated_integer_blocks()[0]).save_pretrained(folder / "index-ties")
    # spawn, not fork: a child forked after the parent ran OpenMP (faiss, torch) can hang in its first parallel region
    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(
            target=_search_on_rank, args=(rank, str(folder / "index"), str(folder / "store"), str(folder / f"{rank}"))
        )
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    assert [process.exitcode for process in ranks] == [0, 0]
    results = [torch.load(folder / f"{rank}", weights_only=True) for rank in range(2)]
    return results, RealmBlockIndex.from_pretrained(folder / "index")


def test_each_rank_holds_a_contiguous_half_of_the_blocks(sharded_results):
    results, _ = sharded_results
    assert [(r["offset"], r["rows"]) for r in results] == [(0, 501), (501, 500)]


def test_sharded_search_gives_the_ids_and_scores_of_one_process_holding_everything(sharded_results):
    results, whole = sharded_results
    for rank, result in enumerate(results):
        queries = torch.randn(QUERIES_PER_RANK[rank], DIM, generator=torch.Generator().manual_seed(rank))
        scores, ids = whole.search(queries, K)
        # each rank scored its half with other matrix shapes than one process scoring all: the same ids, the
        # scores to float32 rounding
        assert_same_top_k((result["scores"], result["ids"]), (scores, ids))
        assert (ids < 501).any() and (ids >= 501).any()  # the top-k merge took blocks from both shards


def test_sharded_search_breaks_ties_by_the_lowest_id_across_shards(sharded_results):
    results, _ = sharded_results
    for result in results:  # copies 5, 11, 12 on rank 0's half, 23, 30, 38 on rank 1's
        assert result["tied_ids"].tolist() == [[5, 11, 12, 23]]


def test_ranks_of_a_folder_written_in_shards_map_their_own_file_and_search_alike(sharded_results):
    results, _ = sharded_results
    for result in results:
        assert_same_top_k((result["shard_scores"], result["shard_ids"]), (result["scores"], result["ids"]))
        assert result["shard_mapped"]


def test_shard_ranges_tile_the_blocks_in_order():
    ranges = [ShardedBlockIndex.shard_range(10, rank, 4) for rank in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 8), (8, 10)]


# --- sharded index folders (pre-training with --shard-index) ---------------------------------------------------------


def _sharded_folder(folder, block_emb: torch.Tensor, num_shards: int, removed=None) -> None:
    """An exact index folder written in num_shards files, as the ranks of a sharded build write it."""
    folder.mkdir(parents=True)
    files = []
    for rank in range(num_shards):
        start, stop = ShardedBlockIndex.shard_range(block_emb.shape[0], rank, num_shards)
        files.append(folder / f"rank{rank}.tmp")
        save_block_emb_shard(files[-1], block_emb[start:stop])
    write_sharded_index(folder, files, block_emb.shape[0], version=3, removed_ids=removed)


def test_a_sharded_folder_loads_as_the_whole_index_with_its_removed_ids(tmp_path):
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    _sharded_folder(tmp_path / "index", block_emb, 3, removed=torch.tensor([5, 700]))
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == [
        "block_emb-00001-of-00003.safetensors",
        "block_emb-00002-of-00003.safetensors",
        "block_emb-00003-of-00003.safetensors",
        "index_config.json",
        "removed_ids.safetensors",
    ]
    index = RealmBlockIndex.from_pretrained(tmp_path / "index")
    assert torch.equal(index.block_emb, block_emb) and index.version == 3  # exact: saved and reloaded
    assert index.removed_ids.tolist() == [5, 700]


def test_a_rank_of_a_sharded_folder_maps_exactly_its_own_file(tmp_path):
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    _sharded_folder(tmp_path / "index", block_emb, 2)
    shard = ShardedBlockIndex.from_pretrained(tmp_path / "index", shard=(1, 2))
    assert (shard.offset, shard.num_blocks, shard.version) == (501, NUM_BLOCKS, 3)
    assert torch.equal(shard.block_emb, block_emb[501:])  # exact: saved and reloaded
    assert shard.is_memory_mapped  # the file's pages, not a copy


def test_rows_spanning_two_shard_files_are_read_from_both(tmp_path):
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    _sharded_folder(tmp_path / "index", block_emb, 3)  # files of 334, 334, 333 rows; 2 ranks hold 501 and 500
    shard = ShardedBlockIndex.from_pretrained(tmp_path / "index", shard=(0, 2))
    assert torch.equal(shard.block_emb, block_emb[:501])  # exact: saved and reloaded


def test_one_process_without_a_group_searches_every_block_like_realm_block_index(tmp_path):
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    RealmBlockIndex.build(block_emb).remove([3, 9]).save_pretrained(tmp_path / "index")
    queries = torch.randn(4, DIM, generator=torch.Generator().manual_seed(1))
    sharded = ShardedBlockIndex.from_pretrained(tmp_path / "index")
    whole = RealmBlockIndex.from_pretrained(tmp_path / "index")
    assert_same_top_k(sharded.search(queries, K), whole.search(queries, K))


def test_searching_a_shard_outside_its_group_is_refused(tmp_path):
    RealmBlockIndex.build(torch.randn(NUM_BLOCKS, DIM)).save_pretrained(tmp_path / "index")
    shard = ShardedBlockIndex.from_pretrained(tmp_path / "index", shard=(0, 2))
    with pytest.raises(
        RuntimeError, match=r"holds rows \[0, 501\) but rank 0 of 1 processes searches rows \[0, 1001\]"
    ):
        shard.search(torch.randn(1, DIM), K)


def test_a_sharded_config_of_an_approximate_index_is_refused(tmp_path):
    block_emb = torch.randn(NUM_BLOCKS, DIM)
    _sharded_folder(tmp_path / "index", block_emb, 2)
    config = json.loads((tmp_path / "index" / "index_config.json").read_text())
    (tmp_path / "index" / "index_config.json").write_text(json.dumps({**config, "index_type": "flat"}))
    with pytest.raises(ValueError, match="num_shards=2"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_a_missing_shard_file_is_named(tmp_path):
    _sharded_folder(tmp_path / "index", torch.randn(NUM_BLOCKS, DIM), 2)
    (tmp_path / "index" / "block_emb-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="block_emb-00002-of-00002.safetensors"):
        RealmBlockIndex.from_pretrained(tmp_path / "index")


def test_a_sharded_build_writes_the_embeddings_of_an_unsharded_one(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    embedder = tiny_embedder()
    whole = build_index(embedder, corpus, tmp_path / "whole", progress=False)
    first = build_index(embedder, corpus, tmp_path / "sharded", num_shards=2, progress=False)
    folder = tmp_path / "sharded" / "v000000" / "block_index"
    assert sorted(p.name for p in folder.glob("block_emb*")) == [
        "block_emb-00001-of-00002.safetensors",
        "block_emb-00002-of-00002.safetensors",
    ]
    # each rank embedded its half in batches of other shapes than one process embedding all: equal to float32
    # rounding, not bit for bit
    torch.testing.assert_close(
        RealmBlockIndex.from_pretrained(folder).block_emb, whole.block_emb, rtol=1e-5, atol=1e-6
    )
    assert (first.offset, first.block_emb.shape[0]) == (0, (whole.num_blocks + 1) // 2)  # shard 0 is returned
    info = json.loads((tmp_path / "sharded" / "v000000" / "build_info.json").read_text())
    assert info["num_shards"] == 2
    assert not list((tmp_path / "sharded").glob(".*"))  # the ranks' scratch folder is gone
    assert (folder / "embedder" / "config.json").is_file()  # corpus add can embed new blocks alike


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"index_type": "flat"}, "use index type 'exact'"), ({"layout": "plain"}, "versioned layout")],
)
def test_a_sharded_build_that_cannot_be_written_is_refused_before_embedding(tmp_path, kwargs, message):
    corpus = write_corpus(tmp_path / "corpus")
    with pytest.raises(ValueError, match=message):
        build_index(tiny_embedder(), corpus, tmp_path / "out", num_shards=2, progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_loading_onto_accelerates_cpu_0_device_keeps_the_shard_memory_mapped(tmp_path):
    # accelerate names a CPU process's device "cpu:0"; Tensor.to("cpu:0") would copy the mapped rows into RAM.
    _sharded_folder(tmp_path / "index", torch.randn(NUM_BLOCKS, DIM), 2)
    shard = ShardedBlockIndex.from_pretrained(tmp_path / "index", device=torch.device("cpu", 0), shard=(0, 2))
    assert shard.is_memory_mapped


def test_an_unsharded_index_loaded_onto_cpu_0_stays_memory_mapped(tmp_path):
    RealmBlockIndex.build(torch.randn(NUM_BLOCKS, DIM)).save_pretrained(tmp_path / "index")
    assert RealmBlockIndex.from_pretrained(tmp_path / "index", device=torch.device("cpu", 0)).is_memory_mapped
