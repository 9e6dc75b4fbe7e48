"""A living corpus (docs/corpus.md, "Adding, updating and removing documents"): `openrealm corpus add | remove |
update` write a new version of a corpus folder or a model folder without re-embedding it; added blocks take the next
ids and the index's embedder snapshot, removed blocks are never retrieved again by any index type, the ids that stay
never change, a kill -9 leaves the previous version whole, and a running model or pipeline picks the new version up."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import (
    BLOCK_TEXTS,
    FACT,
    TEXTS,
    TITLES,
    direct_embedding,
    make_openqa_model,
    tiny_embedder,
    write_corpus,
    write_jsonl,
)

from openrealm import RealmBlockIndex, RealmForOpenQA, RealmRetriever
from openrealm.tokenization.corpus_folder import load_corpus, read_corpus_config, read_removed_block_ids
from openrealm.trainers.cli import main
from openrealm.trainers.indexing import build_index
from openrealm.trainers.living_corpus import edit_corpus


@pytest.fixture
def indexed_corpus(tmp_path):
    """A corpus folder with an exact index (and its embedder snapshot) in block_index/, and that embedder."""
    corpus = write_corpus(tmp_path / "corpus")
    embedder = tiny_embedder()
    build_index(embedder, corpus, corpus / "block_index", layout="plain", progress=False)
    return corpus, embedder


def test_index_build_stores_the_embedder_snapshot_beside_the_index(indexed_corpus):
    corpus, embedder = indexed_corpus
    stored = RealmRetriever.from_pretrained(corpus).index.load_embedder()
    for name, tensor in embedder.state_dict().items():
        assert torch.equal(stored.state_dict()[name], tensor), name  # exact: saved with the index, reloaded


def test_added_article_gets_the_next_id_and_the_embedding_a_full_rebuild_gives(indexed_corpus, tmp_path):
    corpus, embedder = indexed_corpus
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", write_jsonl(tmp_path / "new.jsonl", [FACT]),
                 "--quiet"]) == 0  # fmt: skip
    retriever = RealmRetriever.from_pretrained(corpus)
    new_id = len(TEXTS)
    assert retriever.block_records.record(new_id) == FACT
    assert load_corpus(corpus)[new_id]["block_id"] == new_id and read_corpus_config(corpus)["version"] == 1
    expected = direct_embedding(embedder, FACT["title"], FACT["text"])
    torch.testing.assert_close(retriever.index.block_emb[new_id], expected, atol=1e-5, rtol=1e-5)
    rebuilt = build_index(embedder, corpus, tmp_path / "rebuilt", layout="plain", progress=False)
    torch.testing.assert_close(retriever.index.block_emb, rebuilt.block_emb, atol=1e-5, rtol=1e-5)


def test_blocks_that_stay_keep_their_ids_records_and_embeddings(indexed_corpus, tmp_path):
    corpus, _ = indexed_corpus
    before = RealmRetriever.from_pretrained(corpus)
    old_emb, old_records = before.index.block_emb.clone(), [before.block_records.record(i) for i in range(len(TEXTS))]
    edit_corpus(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT]), progress=False)
    edit_corpus(corpus, remove_titles=["london city"])
    after = RealmRetriever.from_pretrained(corpus)
    assert [after.block_records.record(i) for i in range(len(TEXTS))] == old_records
    assert torch.equal(after.index.block_emb[: len(TEXTS)], old_emb)  # exact: rows kept, not re-embedded
    assert after.index.removed_ids.tolist() == [TITLES.index("london city")]


def test_a_running_pipeline_answers_an_added_fact_from_its_new_block(tmp_path):
    from transformers import pipeline

    model = make_openqa_model(seed=0)
    model.retriever.index.embedder = model.embedder  # the fixture's blocks were embedded by the model's embedder
    model.save_pretrained(tmp_path / "model")
    qa = pipeline("question-answering", model=str(tmp_path / "model"))
    assert qa("which moon was found in 2031 ?", num_blocks=1)["block_id"] < len(BLOCK_TEXTS)

    edit_corpus(tmp_path / "model", add=write_jsonl(tmp_path / "new.jsonl", [FACT]), progress=False)
    edit_corpus(tmp_path / "model", remove_titles=[f"title {i}" for i in range(len(BLOCK_TEXTS))])
    answer = qa("which moon was found in 2031 ?", num_blocks=1)  # the same pipeline object: no restart
    assert (answer["block_id"], answer["title"], answer["text"]) == (len(BLOCK_TEXTS), FACT["title"], FACT["text"])
    assert answer["answer"] in FACT["text"]
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "model")
    assert reloaded.retriever.index.num_searchable == 1


def test_retriever_reloads_records_and_index_together_only_when_the_folder_changed(indexed_corpus, tmp_path):
    corpus, _ = indexed_corpus
    retriever = RealmRetriever.from_pretrained(corpus)
    assert retriever.reload_if_updated() is False
    edit_corpus(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT]), progress=False)
    assert retriever.reload_if_updated() is True
    assert len(retriever.block_records) == retriever.index.num_blocks == len(TEXTS) + 1
    assert retriever.reload_if_updated() is False


@pytest.mark.parametrize("index_type", ["exact", "flat", "ivf", "hnsw", "ivfpq", "pq"])
def test_removed_blocks_are_never_returned_by_any_index_type(index_type, tmp_path):
    generator = torch.Generator().manual_seed(0)
    block_emb = torch.randn(3000, 16, generator=generator)
    params = {"nlist": 8, "nprobe": 8} if "ivf" in index_type else {}
    if "pq" in index_type:
        params.update(pq_m=8, pq_bits=6)
    index = RealmBlockIndex.build(block_emb, index_type=index_type, **params)
    removed = torch.arange(0, 3000, 7)  # 429 blocks, each query's own block among them for every 7th query
    queries = block_emb[:200] * 3
    index = index.remove(removed)
    index.save_pretrained(tmp_path / "index")
    for searched in (index, RealmBlockIndex.from_pretrained(tmp_path / "index")):
        _, ids = searched.search(queries, 20)
        assert not np.isin(ids.numpy(), removed.numpy()).any()
        assert (ids >= 0).all() and searched.num_searchable == 3000 - len(removed)


def test_exact_search_with_removed_blocks_equals_search_over_the_remaining_rows():
    block_emb = torch.randn(500, 8, generator=torch.Generator().manual_seed(1))
    keep = torch.ones(500, dtype=torch.bool)
    keep[::3] = False
    index = RealmBlockIndex.build(block_emb).remove(torch.arange(0, 500, 3))
    index.set_search_params(chunk_size=64)  # removed rows in every chunk
    scores, ids = index.search(block_emb[:10], 5)
    kept_ids = keep.nonzero().squeeze(1)
    expected_scores, expected = RealmBlockIndex.build(block_emb[keep]).search(block_emb[:10], 5)
    assert torch.equal(ids, kept_ids[expected]) and torch.allclose(scores, expected_scores)


def test_an_index_built_from_a_corpus_with_removed_blocks_leaves_them_out(indexed_corpus, tmp_path):
    corpus, embedder = indexed_corpus
    edit_corpus(corpus, remove_ids=[0, 3])
    assert read_removed_block_ids(corpus).tolist() == [0, 3]
    index = build_index(embedder, corpus, tmp_path / "index", progress=False)
    assert index.removed_ids.tolist() == [0, 3]
    _, ids = index.search(index.block_emb, index.num_searchable)
    assert not np.isin(ids.numpy(), [0, 3]).any()


def test_approximate_index_takes_additions_untrained_until_the_drift_then_says_rebuild():
    generator = torch.Generator().manual_seed(0)
    unit = lambda n: torch.nn.functional.normalize(torch.randn(n, 16, generator=generator), dim=1)  # noqa: E731
    index = RealmBlockIndex.build(unit(2000), index_type="ivf", nlist=8)  # unit rows: each is its own best match
    centroids = index.faiss_index.quantizer.reconstruct_n(0, 8).copy()
    grown = index.add(unit(150))  # 7.5% of the trained rows
    assert (grown.num_blocks, grown.faiss_index.ntotal, grown.needs_rebuild) == (2150, 2150, False)
    assert np.array_equal(grown.faiss_index.quantizer.reconstruct_n(0, 8), centroids)  # exact: not retrained
    _, ids = grown.search(grown.block_emb[2000:], 1)
    assert ids.squeeze(1).tolist() == list(range(2000, 2150))  # the added blocks are found
    assert grown.add(unit(60)).needs_rebuild  # 10.5% > max_drift 10%
    assert index.num_blocks == 2000  # the index in use is not changed


def test_exact_indexes_never_need_a_rebuild():
    index = RealmBlockIndex.build(torch.randn(100, 8), index_type="flat").add(torch.randn(100, 8))
    assert index.drift == 1.0 and not index.needs_rebuild


def test_cli_warns_when_an_approximate_index_needs_a_rebuild(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    build_index(tiny_embedder(), corpus, corpus / "block_index", layout="plain", index_type="hnsw", progress=False)
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", write_jsonl(tmp_path / "a.jsonl", [FACT]),
                 "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "rebuilt (openrealm index build)" in captured.err  # 1 block added to 7: 14% > 10%
    assert "added blocks 7..7" in captured.out


def test_adding_a_title_already_there_is_refused_and_update_replaces_its_blocks(indexed_corpus, tmp_path, capsys):
    corpus, _ = indexed_corpus
    changed = write_jsonl(tmp_path / "paris.jsonl", [{"title": "paris", "text": "paris hosted the 2024 olympics ."}])
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", changed, "--quiet"]) == 2
    assert "already in" in capsys.readouterr().err and read_corpus_config(corpus)["version"] == 0
    assert main(["corpus", "update", "--corpus", str(corpus), "--input", changed, "--quiet"]) == 0
    retriever = RealmRetriever.from_pretrained(corpus)
    old_paris = [i for i, title in enumerate(TITLES) if title == "paris"]
    assert retriever.index.removed_ids.tolist() == old_paris
    assert retriever.block_ids_of_titles(["paris"]) == [len(TEXTS)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--titles", "atlantis"], "no block of"),
        (["--ids", "99"], "block id 99 is not in"),
    ],
)
def test_removing_what_is_not_there_is_an_error_naming_it(indexed_corpus, capsys, argv, message):
    corpus, _ = indexed_corpus
    assert main(["corpus", "remove", "--corpus", str(corpus), *argv]) == 2
    assert message in capsys.readouterr().err and read_corpus_config(corpus)["version"] == 0


def test_removing_a_title_twice_says_its_blocks_were_removed_already(indexed_corpus, capsys):
    corpus, _ = indexed_corpus
    assert main(["corpus", "remove", "--corpus", str(corpus), "--titles", TITLES[0]]) == 0
    assert main(["corpus", "remove", "--corpus", str(corpus), "--titles", TITLES[0]]) == 2
    assert f"the blocks of {TITLES[0]!r} in {corpus} were removed already" in capsys.readouterr().err
    assert read_corpus_config(corpus)["version"] == 1


@pytest.mark.parametrize("command", [["add", "--input", "new.jsonl"], ["remove", "--titles", "atlantis"]])
def test_editing_a_missing_folder_names_it_and_makes_nothing(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "new.jsonl", [FACT])
    assert main(["corpus", command[0], "--corpus", "no-such-corpus", *command[1:], "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "no-such-corpus: no such folder" in error and "Repo id" not in error
    assert sorted(os.listdir(tmp_path)) == ["new.jsonl"]  # no folder, no lock file


def test_adding_to_an_index_without_an_embedder_snapshot_asks_for_one(tmp_path, capsys):
    model = make_openqa_model(seed=0)  # its index was built in memory: no snapshot
    model.save_pretrained(tmp_path / "model")
    new = write_jsonl(tmp_path / "new.jsonl", [FACT])
    assert main(["corpus", "add", "--corpus", str(tmp_path / "model"), "--input", new, "--quiet"]) == 2
    assert "--embedder" in capsys.readouterr().err
    model.embedder.save_pretrained(tmp_path / "embedder")
    assert main(["corpus", "add", "--corpus", str(tmp_path / "model"), "--input", new, "--quiet",
                 "--embedder", str(tmp_path / "embedder")]) == 0  # fmt: skip


def _add(corpus, path) -> subprocess.Popen:
    """`openrealm corpus add` in a process of its own (a fork of this one could deadlock in torch's thread pool)."""
    command = [sys.executable, "-m", "openrealm", "corpus", "add", "--corpus", str(corpus), "--input", path, "--quiet"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_an_add_killed_at_any_moment_leaves_one_whole_version_and_a_rerun_completes_it(indexed_corpus, tmp_path):
    pristine, _ = indexed_corpus
    new = write_jsonl(tmp_path / "new.jsonl", [FACT])
    shutil.copytree(pristine, tmp_path / "timing")
    start = time.perf_counter()
    assert _add(tmp_path / "timing", new).wait() == 0
    duration = time.perf_counter() - start  # of a whole add, process start included
    seen = set()
    for attempt in range(5):
        corpus = shutil.copytree(pristine, tmp_path / f"corpus-{attempt}")
        writer = _add(corpus, new)
        time.sleep(duration * (0.3 + 0.15 * attempt))  # the last ones land in the write of the new version
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        retriever = RealmRetriever.from_pretrained(corpus)  # records, index and blocks: all of one version
        version = read_corpus_config(corpus)["version"]
        assert len(retriever.block_records) == retriever.index.num_blocks == len(load_corpus(corpus))
        assert len(retriever.block_records) == len(TEXTS) + version
        seen.add(version)
        if version == 0:
            edit_corpus(corpus, add=new, progress=False)  # the re-run completes the change
        assert RealmRetriever.from_pretrained(corpus).block_ids_of_titles([FACT["title"]]) == [len(TEXTS)]
    assert seen <= {0, 1}
    for attempt in range(5):  # any later write of a folder removes the leftovers of its killed writers
        edit_corpus(tmp_path / f"corpus-{attempt}", remove_ids=[0])
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []


def test_a_pretraining_refresh_after_an_add_serves_the_new_corpus_version(indexed_corpus, tmp_path):
    from transformers import AutoTokenizer

    from openrealm.trainers.pretraining import RealmPretrainingExamples
    from openrealm.trainers.pretraining.refresh import IndexRefreshCallback

    corpus, embedder = indexed_corpus
    index = build_index(embedder, corpus, tmp_path / "index", progress=False)
    examples = RealmPretrainingExamples(AutoTokenizer.from_pretrained(corpus), load_corpus(corpus), embedder, index, 4)
    refresh = IndexRefreshCallback(examples, corpus, tmp_path / "index", refresh_every=1, mode="sync")
    edit_corpus(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT]), remove_ids=[2], progress=False)
    refresh.refresh_sync(embedder, global_step=1)
    assert examples.index.num_blocks == len(examples.blocks) == len(TEXTS) + 1
    assert examples.blocks[len(TEXTS)]["title"] == FACT["title"]
    assert examples.index.removed_ids.tolist() == [2]


def test_article_ids_of_later_adds_never_reuse_those_of_articles_the_page_filter_dropped(indexed_corpus, tmp_path):
    corpus, _ = indexed_corpus
    dropped = {"title": "List of moons", "text": "a list page that the page filter drops ."}
    edit_corpus(corpus, add=write_jsonl(tmp_path / "a.jsonl", [dropped, FACT]), progress=False)
    second = {"title": "quorblat", "text": "quorblat is another fictional moon ."}
    edit_corpus(corpus, add=write_jsonl(tmp_path / "b.jsonl", [second]), progress=False)
    article_ids = load_corpus(corpus)["article_id"]
    assert article_ids[len(TEXTS)] == len(TEXTS) + 1  # FACT: input row 1 of the first add
    assert article_ids[len(TEXTS) + 1] == len(TEXTS) + 2  # after both input rows of the first add
    config = read_corpus_config(corpus)
    assert (config["num_input_articles"], config["num_articles"]) == (len(TEXTS) + 3, len(TEXTS) + 2)


def test_add_says_how_many_articles_made_no_block_and_counts_them_in_the_config(indexed_corpus, tmp_path, capsys):
    corpus, _ = indexed_corpus
    dropped = [{"title": "List of moons", "text": "a list page ."}, {"title": "empty", "text": ""}]
    source = write_jsonl(tmp_path / "a.jsonl", [*dropped, FACT])
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", source, "--quiet"]) == 0
    assert capsys.readouterr().out.endswith(
        "(1 article(s) dropped by the page filter, which --no-page-filter turns off; 1 article(s) without text)\n"
    )
    config = read_corpus_config(corpus)
    assert (config["num_pages_filtered"], config["num_articles_without_text"]) == (1, 1)


def test_remove_without_an_index_says_how_many_blocks_are_left(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    assert main(["corpus", "remove", "--corpus", str(corpus), "--ids", "0", "1", "--quiet"]) == 0
    assert capsys.readouterr().out == (
        f"{corpus}: removed 2 block(s); {len(TEXTS)} blocks, {len(TEXTS) - 2} not removed (no index yet)\n"
    )


def test_the_duplicates_warning_counts_the_blocks_not_removed(indexed_corpus, tmp_path, capsys):
    corpus, _ = indexed_corpus
    assert main(["corpus", "remove", "--corpus", str(corpus), "--ids", "0", "1", "--quiet"]) == 0
    source = write_jsonl(tmp_path / "new.jsonl", [FACT, FACT])
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", source, "--no-deduplicate", "--quiet"]) == 0
    warning = capsys.readouterr().err.splitlines()[-1]
    assert warning.startswith(f"openrealm corpus add: warning: 1 of {len(TEXTS) - 2 + 2} blocks duplicate")


def test_add_drops_a_block_repeated_among_the_added_articles_and_says_so(indexed_corpus, tmp_path, capsys):
    corpus, _ = indexed_corpus
    other = {"title": "quux", "text": "quux is a fictional city ."}
    source = write_jsonl(tmp_path / "new.jsonl", [FACT, other, FACT])
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", source, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"added blocks {len(TEXTS)}..{len(TEXTS) + 1}" in out and "(1 duplicate block(s) dropped" in out
    retriever = RealmRetriever.from_pretrained(corpus)
    assert [retriever.block_records.record(i) for i in (len(TEXTS), len(TEXTS) + 1)] == [FACT, other]
    assert retriever.index.num_blocks == len(load_corpus(corpus)) == len(TEXTS) + 2
    config = read_corpus_config(corpus)
    assert (config["num_duplicate_blocks"], config["num_duplicates_dropped"]) == (0, 1)


def test_add_with_no_deduplicate_keeps_the_repeated_block_counts_it_and_warns(indexed_corpus, tmp_path, capsys):
    corpus, _ = indexed_corpus
    source = write_jsonl(tmp_path / "new.jsonl", [FACT, FACT])
    assert main(["corpus", "add", "--corpus", str(corpus), "--input", source, "--no-deduplicate", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert f"added blocks {len(TEXTS)}..{len(TEXTS) + 1}" in captured.out and "dropped" not in captured.out
    assert f"warning: 1 of {len(TEXTS) + 2} blocks duplicate an earlier block" in captured.err
    config = read_corpus_config(corpus)
    assert (config["num_duplicate_blocks"], config["num_duplicates_dropped"]) == (1, 0)


def test_edits_follow_the_corpus_deduplicate_setting_and_recount_its_live_duplicates(tmp_path):
    from datasets import Dataset
    from helpers import fixture_tokenizer

    from openrealm.tokenization.corpus import build_corpus

    source = Dataset.from_dict({"title": ["a", "b", "a"], "text": ["one city .", "two rivers .", "one city ."]})
    corpus = tmp_path / "corpus"
    build_corpus(source, corpus, fixture_tokenizer(), deduplicate=False)
    assert read_corpus_config(corpus)["num_duplicate_blocks"] == 1
    edit_corpus(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT, FACT]), progress=False)  # kept, as built
    assert len(load_corpus(corpus)) == 5 and read_corpus_config(corpus)["num_duplicate_blocks"] == 2
    edit_corpus(corpus, remove_ids=[2])  # the second "a": its first copy stays, alone
    assert read_corpus_config(corpus)["num_duplicate_blocks"] == 1
