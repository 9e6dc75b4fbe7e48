"""Saving over an existing folder is all-or-nothing as a loader sees it (docs/guarantees.md): a save killed at any
moment leaves the old version whole, leftovers of killed saves are cleaned by the next write (or the old version
restored), and a new save never leaves old shards or an old index beside new weights."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import transformers
from helpers import make_openqa_model
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

from openrealm import RealmForOpenQA, file_utils
from openrealm.file_utils import clean_leftovers, exchange_paths, replace_folder, staging_folder


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def leftover_name(folder, kind: str, pid: int) -> str:
    """The name staging_folder gives a writer `pid` of `folder` on this machine."""
    own = os.path.basename(staging_folder(folder, kind))
    os.rmdir(os.path.join(os.path.dirname(folder), own))
    prefix = own.rsplit("-", 2)[0]  # ".NAME.KIND-HOST"
    return f"{prefix}-{pid}-crashed"


def fingerprint(folder) -> tuple[float, float]:
    """(a reader weight, the first block embedding) of a saved RealmForOpenQA: which version each part comes from."""
    model = RealmForOpenQA.from_pretrained(folder)
    weight = model.reader.qa_outputs.dense_intermediate.weight[0, 0].item()
    return weight, model.retriever.index.block_emb[0, 0].item()


@pytest.fixture(scope="module")
def versions():
    """Two RealmForOpenQA models whose reader weights and block embeddings differ in sign: (old, new)."""
    old, new = make_openqa_model(seed=0), make_openqa_model(seed=0)
    with torch.no_grad():
        old.reader.qa_outputs.dense_intermediate.weight[0, 0] = 1.0
        new.reader.qa_outputs.dense_intermediate.weight[0, 0] = -1.0
        old.retriever.index.block_emb[0, 0] = 1.0
        new.retriever.index.block_emb[0, 0] = -1.0
    return old, new


def test_exchange_paths_swaps_two_folders_in_one_step(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("b")
    if not exchange_paths(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this file system has no one-step exchange (renameat2 RENAME_EXCHANGE)")
    assert (tmp_path / "a" / "x").read_text() == "b"
    assert (tmp_path / "b" / "x").read_text() == "a"


def _save(model, folder) -> None:
    # A forked writer shares tqdm's write lock with this process: killed while it holds it (drawing the "Writing model
    # shards" bar), it would leave every later bar here waiting forever. The writer draws no bar and has its own locks,
    # for tqdm and for tqdm.auto's class (transformers' bars), which keeps its own lock once it has made one.
    transformers.utils.logging.disable_progress_bar()
    for bar in {tqdm, auto_tqdm}:
        bar.set_lock(multiprocessing.RLock())
    model.save_pretrained(folder)


def test_a_save_killed_at_any_moment_leaves_one_whole_version(versions, tmp_path):
    old, new = versions
    folder = tmp_path / "model"
    context = multiprocessing.get_context("fork")
    start = time.perf_counter()
    writer = context.Process(target=_save, args=(new, tmp_path / "timing"))
    writer.start()
    writer.join()
    duration = time.perf_counter() - start  # of a whole save in a forked writer, fork and exit included
    seen = []
    for attempt in range(10):
        old.save_pretrained(folder)
        writer = context.Process(target=_save, args=(new, folder))
        writer.start()
        time.sleep(duration * attempt / 8)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        weight, embedding = fingerprint(folder)
        assert weight == embedding, (
            f"kill after {duration * attempt / 8:.3f}s: reader {weight} beside index {embedding}"
        )
        seen.append(weight)
    assert set(seen) <= {1.0, -1.0}


def test_two_writers_saving_one_folder_at_once_leave_one_whole_version(versions, tmp_path):
    old, new = versions
    folder = tmp_path / "model"
    context = multiprocessing.get_context("fork")
    for _ in range(3):
        writers = [context.Process(target=_save, args=(model, folder)) for model in (old, new)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        assert [writer.exitcode for writer in writers] == [0, 0]
        weight, embedding = fingerprint(folder)
        assert weight == embedding
        assert [path.name for path in tmp_path.iterdir()] == ["model"]


def test_leftovers_of_a_killed_save_are_removed_by_the_next_save(versions, tmp_path):
    old, new = versions
    folder = tmp_path / "model"
    old.save_pretrained(folder)
    leftover = tmp_path / leftover_name(folder, "saving", dead_pid())
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    new.save_pretrained(folder)
    assert not leftover.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["model"]
    assert fingerprint(folder) == (-1.0, -1.0)


def test_a_live_writers_staging_folder_is_left_alone(tmp_path):
    folder = tmp_path / "model"
    live = tmp_path / leftover_name(folder, "saving", os.getpid())
    live.mkdir()
    assert clean_leftovers(folder) == []
    assert live.is_dir()


def test_the_old_version_is_restored_when_its_writer_died_between_two_renames(tmp_path):
    folder = tmp_path / "model"
    retired = tmp_path / leftover_name(folder, "replaced", dead_pid())
    retired.mkdir()
    (retired / "config.json").write_text("{}")
    clean_leftovers(folder)
    assert (folder / "config.json").read_text() == "{}"
    assert not retired.exists()


def test_a_new_save_drops_old_shards_and_index_but_keeps_the_folders_other_files(versions, tmp_path):
    old, _ = versions
    folder = tmp_path / "model"
    old.save_pretrained(folder)
    (folder / "README.md").write_text("my card")
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"an old shard")
    (folder / "checkpoint-10").mkdir()
    reader_only = RealmForOpenQA(old.config)  # no retriever: nothing of the old index may stay beside it
    reader_only.save_pretrained(folder)
    names = sorted(path.name for path in folder.iterdir())
    assert "README.md" in names and "checkpoint-10" in names
    assert "model-00002-of-00002.safetensors" not in names
    assert "block_index" not in names and "block_records.safetensors" not in names
    assert (folder / "README.md").read_text() == "my card"


def test_replace_folder_into_the_working_directory_replaces_each_entry(tmp_path, monkeypatch):
    folder = tmp_path / "here"
    folder.mkdir()
    (folder / "config.json").write_text("old")
    (folder / "notes.txt").write_text("kept")
    staging = staging_folder(folder)
    with open(os.path.join(staging, "config.json"), "w") as f:
        f.write("new")
    monkeypatch.chdir(folder)
    replace_folder(staging, folder, keep=lambda name: True)
    assert os.getcwd() == str(folder)
    assert (folder / "config.json").read_text() == "new"
    assert (folder / "notes.txt").read_text() == "kept"
    assert not os.path.exists(staging)


def test_without_one_step_exchange_the_old_folder_is_renamed_aside_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(file_utils, "exchange_paths", lambda first, second: False)
    destination = tmp_path / "checkpoint-5"
    destination.mkdir()
    (destination / "state.json").write_text("old")
    staging = tmp_path / ".staging" / "checkpoint-5"  # named like the destination, as a checkpoint's staging is
    staging.mkdir(parents=True)
    (staging / "state.json").write_text("new")
    replace_folder(staging, destination)
    assert (destination / "state.json").read_text() == "new"
    assert sorted(path.name for path in tmp_path.iterdir()) == [".staging", "checkpoint-5"]
    assert not staging.exists()


def test_write_text_atomic_replaces_the_file_whole_with_the_umask_mode(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    mask = os.umask(0o027)
    try:
        file_utils.write_text_atomic(path, "néw\n")
    finally:
        os.umask(mask)
    assert path.read_text(encoding="utf-8") == "néw\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    assert [entry.name for entry in tmp_path.iterdir()] == ["results.json"]


def test_a_failed_text_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "README.md"
    path.write_text("old card")

    def failing_replace(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_utils.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        file_utils.write_text_atomic(path, "new card")
    assert path.read_text() == "old card"
    assert [entry.name for entry in tmp_path.iterdir()] == ["README.md"]
