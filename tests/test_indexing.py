"""`openrealm index build`: embedding every corpus block (sorted, batched, sharded) and writing versioned indexes."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    ACCELERATE_ENV,
    TEXTS,
    TITLES,
    accelerate_launch,
    direct_embedding,
    fixture_folder,
    fixture_tokenizer,
    tiny_embedder,
    write_corpus,
)
from transformers import BertConfig, BertModel

from openrealm import RealmBlockIndex, RealmEmbedder, RealmForOpenQA, RealmRetriever, RealmScorer
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.trainers import indexing, stage_utils
from openrealm.trainers.cli import main as openrealm_main
from openrealm.trainers.embedding import embed_corpus, shard_range
from openrealm.trainers.indexing import build_index, latest_index_dir, list_versions, load_index
from openrealm.trainers.stage_utils import leave_process_group
from openrealm.trainers.towers import load_embedder


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


@pytest.mark.parametrize("sort_by_length", [True, False], ids=["sorted", "block-order"])
def test_embeddings_equal_a_direct_forward_of_each_block(corpus, sort_by_length):
    embedder = tiny_embedder()
    emb = embed_corpus(embedder, load_corpus(corpus), fixture_tokenizer(), batch_size=3, sort_by_length=sort_by_length)
    expected = torch.stack([direct_embedding(embedder, t, x) for t, x in zip(TITLES, TEXTS)])
    assert emb.shape == (len(TEXTS), 16) and emb.dtype == torch.float32
    torch.testing.assert_close(emb, expected, atol=1e-5, rtol=1e-5)


def test_input_worker_processes_give_the_same_embeddings(corpus):
    embedder, blocks, tokenizer = tiny_embedder(), load_corpus(corpus), fixture_tokenizer()
    in_process = embed_corpus(embedder, blocks, tokenizer, batch_size=2, progress=False)
    with_workers = embed_corpus(embedder, blocks, tokenizer, batch_size=2, num_workers=2, progress=False)
    # exact: workers only tokenize; the embedder sees the same batches in the same process
    torch.testing.assert_close(with_workers, in_process, atol=0, rtol=0)


def test_bf16_autocast_on_cpu_stays_close_to_float32(corpus):
    embedder, blocks, tokenizer = tiny_embedder(), load_corpus(corpus), fixture_tokenizer()
    full = embed_corpus(embedder, blocks, tokenizer, dtype="float32", progress=False)
    half = embed_corpus(embedder, blocks, tokenizer, dtype="bfloat16", progress=False)
    assert half.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(full, half).min() > 0.99


def test_embedding_leaves_a_training_embedder_in_train_mode(corpus):
    embedder = tiny_embedder().train()
    embed_corpus(embedder, load_corpus(corpus), fixture_tokenizer(), progress=False)
    assert embedder.training


def test_shard_ranges_are_contiguous_balanced_and_cover_every_block():
    for num_blocks in (0, 1, 7, 10):
        ranges = [shard_range(num_blocks, rank, 3) for rank in range(3)]
        assert ranges[0][0] == 0 and ranges[-1][1] == num_blocks
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [stop - start for start, stop in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_built_index_serves_a_retriever_that_finds_each_block_by_its_own_text(corpus, tmp_path):
    embedder = tiny_embedder()
    build_index(embedder, corpus, tmp_path / "index", index_type="exact", progress=False)
    retriever = RealmRetriever.from_pretrained(corpus, index=load_index(tmp_path / "index"))
    queries = torch.stack([direct_embedding(embedder, t, x) for t, x in zip(TITLES, TEXTS)])
    _, ids = retriever.search(queries, k=1)
    assert ids[:, 0].tolist() == list(range(len(TEXTS)))


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_faiss_index_types_build_and_find_each_block(corpus, tmp_path, index_type):
    embedder = tiny_embedder()
    index = build_index(embedder, corpus, tmp_path / "index", index_type=index_type, progress=False)
    loaded = RealmBlockIndex.from_pretrained(latest_index_dir(tmp_path / "index"))
    assert loaded.index_type == index.index_type == index_type
    _, ids = loaded.search(loaded.block_emb.clone(), k=1)
    assert ids[:, 0].tolist() == list(range(len(TEXTS)))


def test_versions_count_up_and_are_recorded_with_provenance(corpus, tmp_path):
    embedder, root = tiny_embedder(), tmp_path / "index"
    first = build_index(embedder, corpus, root, progress=False)
    second = build_index(embedder, corpus, root, progress=False)
    assert (first.version, second.version) == (0, 1)
    assert list_versions(root) == [0, 1] and latest_index_dir(root) == root / "v000001" / "block_index"
    assert RealmBlockIndex.from_pretrained(root / "v000001" / "block_index").version == 1
    info = json.loads((root / "v000001" / "build_info.json").read_text())
    uids = load_corpus(corpus)["uid"]
    assert info["version"] == 1 and info["num_blocks"] == len(TEXTS) and info["corpus"] == str(corpus.absolute())
    assert info["corpus_fingerprint"] == hashlib.sha256("".join(f"{u}\n" for u in uids).encode()).hexdigest()


def test_explicit_version_is_used_and_an_existing_version_is_refused(corpus, tmp_path):
    embedder, root = tiny_embedder(), tmp_path / "index"
    assert build_index(embedder, corpus, root, version=500, progress=False).version == 500
    with pytest.raises(FileExistsError, match="v000500"):
        build_index(embedder, corpus, root, version=500, progress=False)


def test_keep_prunes_all_but_the_newest_versions(corpus, tmp_path):
    embedder, root = tiny_embedder(), tmp_path / "index"
    for _ in range(4):
        build_index(embedder, corpus, root, keep=2, progress=False)
    assert list_versions(root) == [2, 3]


def test_keep_never_removes_the_version_just_written(corpus, tmp_path):
    embedder, root = tiny_embedder(), tmp_path / "index"
    build_index(embedder, corpus, root, version=3, progress=False)
    # Version 1 is older than the newest, 3: it is kept with it (the newest KEEP, and the one written).
    assert build_index(embedder, corpus, root, version=1, keep=1, progress=False).version == 1
    assert list_versions(root) == [1, 3]
    assert load_index(root, 1).version == 1


@pytest.mark.parametrize(("setting", "value"), [("version", -1), ("keep", 0), ("keep", -1)])
def test_a_negative_version_or_a_keep_below_one_is_refused_before_writing(corpus, tmp_path, setting, value):
    embedder, root = tiny_embedder(), tmp_path / "index"
    build_index(embedder, corpus, root, progress=False)
    with pytest.raises(ValueError, match=f"{setting} must be"):
        build_index(embedder, corpus, root, progress=False, **{setting: value})
    assert sorted(os.listdir(root)) == ["v000000"]


def write_stray_folder(root: Path, name: str) -> Path:
    """A user's folder with a version-like name under an index root, holding no index."""
    (root / name).mkdir(parents=True)
    (root / name / "notes.txt").write_text("mine")
    return root / name


def test_a_folder_with_a_version_name_but_no_index_is_neither_listed_nor_pruned(corpus, tmp_path):
    embedder, root = tiny_embedder(), tmp_path / "index"
    build_index(embedder, corpus, root, version=3, progress=False)
    stray = write_stray_folder(root, "v000007")
    assert list_versions(root) == [3] and latest_index_dir(root) == root / "v000003" / "block_index"
    assert build_index(embedder, corpus, root, keep=1, progress=False).version == 8  # never a stray folder's number
    assert list_versions(root) == [8]
    assert (stray / "notes.txt").read_text() == "mine"


def test_cli_names_the_version_folder_it_wrote(corpus, tmp_path, capsys):
    root = tmp_path / "index"
    build_index(tiny_embedder(), corpus, root, version=3, progress=False)
    tiny_embedder().save_pretrained(tmp_path / "embedder")
    argv = ["--embedder", str(tmp_path / "embedder"), "--corpus", str(corpus), "--output", str(root), "--quiet"]
    assert openrealm_main(["index", "build", *argv, "--version", "1", "--keep", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"Wrote exact index version 1 of {len(TEXTS)} x 16 to {root / 'v000001'}" in printed
    assert f"{root / 'v000003'} is newer" in printed


@pytest.mark.parametrize("layout", ["versioned", "plain"])
def test_failed_write_leaves_the_previous_index_intact_and_no_temporary_folder(corpus, tmp_path, monkeypatch, layout):
    embedder, root = tiny_embedder(), tmp_path / "index"
    build_index(embedder, corpus, root, layout=layout, progress=False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "corpus" not in p.parts)

    def fail_half_way(self, directory):
        (Path(directory) / "index_config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(RealmBlockIndex, "write_files", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        build_index(embedder, corpus, root, layout=layout, progress=False)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "corpus" not in p.parts)
    assert after == before
    loaded = load_index(root) if layout == "versioned" else RealmBlockIndex.from_pretrained(root)
    assert loaded.version == 0


def test_plain_layout_into_the_corpus_makes_it_a_retriever_folder(corpus):
    build_index(tiny_embedder(), corpus, corpus / "block_index", layout="plain", index_type="flat", progress=False)
    retriever = RealmRetriever.from_pretrained(corpus)
    assert retriever.index.index_type == "flat" and retriever.index.num_blocks == len(TEXTS)


def test_cli_builds_from_a_bert_checkpoint_folder(corpus, tmp_path, capsys):
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=158, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, max_position_embeddings=288))  # fmt: skip
    bert.save_pretrained(tmp_path / "bert")
    argv = ["--embedder", str(tmp_path / "bert"), "--corpus", str(corpus), "--output", str(tmp_path / "index")]
    assert openrealm_main(["index", "build", *argv, "--index-type", "hnsw", "--index-param", "m=8", "--quiet"]) == 0
    index = load_index(tmp_path / "index")
    assert (index.index_type, index.num_blocks, index.dim, index.params["m"]) == ("hnsw", len(TEXTS), 128, 8)
    assert "Wrote hnsw index version 0" in capsys.readouterr().out


def test_cli_help_names_the_options(capsys):
    with pytest.raises(SystemExit):
        openrealm_main(["index", "build", "--help"])
    help_text = capsys.readouterr().out
    for option in ("--embedder", "--corpus", "--output", "--index-type", "--batch-size", "--dtype", "--layout"):
        assert option in help_text


@pytest.mark.parametrize(("model_class", "folder"), [(RealmForOpenQA, "openqa"), (RealmScorer, "scorer")])
@pytest.mark.parametrize("layout", ["safetensors", "hub"])
def test_open_qa_and_scorer_folders_give_their_embedder_tower(model_class, folder, layout):
    embedder = load_embedder(fixture_folder(folder, layout))
    expected = model_class.from_pretrained(fixture_folder(folder, layout)).embedder.state_dict()
    assert type(embedder) is RealmEmbedder and embedder.state_dict().keys() == expected.keys()
    assert all(torch.equal(embedder.state_dict()[key], value) for key, value in expected.items())  # exact: loaded


def test_missing_corpus_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        build_index(tiny_embedder(), tmp_path / "nowhere", tmp_path / "index", progress=False)


def test_missing_embedder_folder_is_an_error_naming_it(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "no-model")):
        build_index(tmp_path / "no-model", corpus, tmp_path / "index", progress=False)


def test_embedder_of_another_dimension_than_the_existing_index_is_refused(corpus, tmp_path):
    root = tmp_path / "index"
    build_index(tiny_embedder(), corpus, root, progress=False)
    with pytest.raises(ValueError, match=f"{root / 'v000000' / 'block_index'}.*16-d"):
        build_index(tiny_embedder(retriever_proj_size=8), corpus, root, progress=False)


@pytest.mark.parametrize(
    "index_type, params, problem",
    [("ivf", {"nprobe": -1}, "nprobe .* must be a positive int"), ("hnsw", {"nlist": 4}, "unknown parameters"),
     ("ivf", {"nlist": 100}, "nlist=100 exceeds"), ("annoy", {}, "unknown index_type 'annoy'")],
)  # fmt: skip
def test_bad_index_parameters_are_refused_before_any_block_is_embedded(corpus, tmp_path, monkeypatch, index_type,
                                                                       params, problem):  # fmt: skip
    def embed_corpus(*args, **kwargs):
        raise AssertionError("embedded the corpus before checking the index parameters")

    monkeypatch.setattr(indexing, "embed_corpus", embed_corpus)
    with pytest.raises(ValueError, match=problem):
        build_index(tiny_embedder(), corpus, tmp_path / "index", index_type=index_type, index_params=params,
                    progress=False)  # fmt: skip
    assert not (tmp_path / "index").exists()


def test_corpus_ids_outside_the_embedder_vocabulary_are_refused(corpus, tmp_path):
    with pytest.raises(ValueError, match=f"{corpus}.*vocabulary of 20"):
        build_index(tiny_embedder(vocab_size=20), corpus, tmp_path / "index", progress=False)


def test_two_processes_under_accelerate_join_to_the_single_process_embeddings(corpus, tmp_path):
    embedder = tiny_embedder()
    embedder.save_pretrained(tmp_path / "embedder")
    command = [
        *accelerate_launch(), "-m", "openrealm", "index", "build",
        "--embedder", str(tmp_path / "embedder"), "--corpus", str(corpus), "--output", str(tmp_path / "index"),
        "--batch-size", "2", "--quiet",
    ]  # fmt: skip
    env = {**os.environ, **ACCELERATE_ENV}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "index" / "v000000" / "build_info.json").read_text())
    assert info["world_size"] == 2
    expected = embed_corpus(embedder, load_corpus(corpus), fixture_tokenizer(), progress=False)
    torch.testing.assert_close(load_index(tmp_path / "index").block_emb, expected, atol=1e-5, rtol=1e-5)


class RecordingState:
    """A PartialState stand-in that records the calls leave_process_group makes."""

    def __init__(self, num_processes: int, calls: list):
        self.num_processes, self.calls = num_processes, calls

    def wait_for_everyone(self):
        self.calls.append("barrier")

    def destroy_process_group(self):
        self.calls.append("destroy")


@pytest.mark.parametrize(
    "num_processes, expected", [(2, ["barrier", "sleep", "destroy"]), (1, ["barrier", "destroy"])]
)
def test_leaving_the_process_group_releases_the_gil_between_the_last_barrier_and_the_teardown(
    monkeypatch, num_processes, expected
):
    """gloo's workers free the barrier's work after it returns, which needs the GIL; the group's teardown joins them
    while holding it. So ranks sleep (GIL released) in between; a single process has no workers to wait for."""
    calls = []
    monkeypatch.setattr(stage_utils.time, "sleep", lambda seconds: calls.append("sleep"))
    leave_process_group(RecordingState(num_processes, calls))
    assert calls == expected


def test_plain_layout_keeps_the_build_provenance_in_the_index_config(corpus, tmp_path):
    """The versioned layout writes build_info.json; both layouts carry it in index_config.json's metadata."""
    build_index(tiny_embedder(), corpus, tmp_path / "plain", layout="plain", progress=False)
    metadata = json.loads((tmp_path / "plain" / "index_config.json").read_text())["metadata"]
    assert len(metadata["corpus_fingerprint"]) == 64
    assert RealmBlockIndex.from_pretrained(tmp_path / "plain").metadata == metadata


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie whose parent is gone counts: nothing of it runs any more)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state


def wait_until_gone(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not process_gone(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.1)


def test_a_builder_whose_trainer_was_killed_exits_without_writing_a_version(corpus, tmp_path):
    tiny_embedder().save_pretrained(tmp_path / "embedder")
    fixture_tokenizer().save_pretrained(tmp_path / "embedder")
    output = tmp_path / "index"
    # The stand-in trainer starts the builder as the async refresh does (with its own pid), then dies by SIGKILL.
    trainer = (
        "import os, signal, subprocess, sys\n"
        "builder = subprocess.Popen([sys.executable, '-m', 'openrealm.trainers.pretraining.builder',"
        " '--embedder', sys.argv[1], '--corpus', sys.argv[2], '--output', sys.argv[3], '--quiet',"
        " '--parent-pid', str(os.getpid())])\n"
        "print(builder.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    argv = [sys.executable, "-c", trainer, str(tmp_path / "embedder"), str(corpus), str(output)]
    killed = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    wait_until_gone(int(killed.stdout.split()[0]))
    assert not output.exists() or list_versions(output) == []


def test_a_builder_exits_within_a_second_of_its_trainer_dying_mid_build(tmp_path):
    child = (
        "import sys, time\n"
        "from openrealm.trainers.indexing import exit_with_parent\n"
        "exit_with_parent(int(sys.argv[1]))\n"
        "print('watching', flush=True)\n"
        "time.sleep(60)\n"
    )
    trainer = (
        "import os, signal, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE, "
        "text=True)\n"
        "assert child.stdout.readline().strip() == 'watching'\n"
        "print(child.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", trainer, child], capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    wait_until_gone(int(killed.stdout.split()[0]), timeout=2.0)


def test_an_index_version_is_readable_by_other_users_under_umask_022(corpus, tmp_path):
    previous = os.umask(0o022)
    try:
        build_index(tiny_embedder(), corpus, tmp_path / "index", progress=False)
    finally:
        os.umask(previous)
    version = latest_index_dir(tmp_path / "index").parent
    modes = {path.relative_to(version).as_posix(): path.stat().st_mode & 0o777 for path in version.rglob("*")}
    assert version.stat().st_mode & 0o777 == 0o755
    assert modes["block_index"] == 0o755 and modes["block_index/block_emb.safetensors"] == 0o644
    assert set(modes.values()) == {0o755, 0o644}


def test_cli_refuses_a_sharded_faiss_index_before_loading_the_embedder(tmp_path, capsys):
    from openrealm.trainers.cli import main

    empty = tmp_path / "embedder"  # would fail to load: the refusal must come first
    empty.mkdir()
    argv = ["index", "build", "--embedder", str(empty), "--corpus", str(tmp_path), "--output", str(tmp_path / "out")]
    assert main([*argv, "--num-shards", "2", "--index-type", "ivf"]) == 2
    assert (
        "--num-shards 2: a sharded index searches exactly: use index type 'exact', not 'ivf'"
        in capsys.readouterr().err
    )
