"""ShardedBlockIndex: exact search with the block embeddings split across 2 CPU processes (gloo)."""

import multiprocessing

import pytest
import torch

from openrealm import RealmBlockIndex, ShardedBlockIndex

NUM_BLOCKS, DIM, K = 1001, 16, 7
QUERIES_PER_RANK = (5, 3)  # ranks may ask different numbers of questions


def _search_on_rank(rank: int, folder: str, store: str, output: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        index = ShardedBlockIndex.from_pretrained(folder)
        queries = torch.randn(QUERIES_PER_RANK[rank], DIM, generator=torch.Generator().manual_seed(rank))
        scores, ids = index.search(queries, K)
        torch.save({"rows": index.block_emb.shape[0], "offset": index.offset, "scores": scores, "ids": ids}, output)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
    """Each rank's shard and search results, and the single-process index they must equal."""
    folder = tmp_path_factory.mktemp("sharded")
    block_emb = torch.randn(NUM_BLOCKS, DIM, generator=torch.Generator().manual_seed(0))
    RealmBlockIndex.build(block_emb).save_pretrained(folder / "index")
    context = multiprocessing.get_context("fork")
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
        assert torch.equal(result["ids"], ids)
        assert torch.equal(result["scores"], scores)
        assert (ids < 501).any() and (ids >= 501).any()  # the top-k merge took blocks from both shards


def test_shard_ranges_tile_the_blocks_in_order():
    ranges = [ShardedBlockIndex.shard_range(10, rank, 4) for rank in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 8), (8, 10)]
