"""Writers of one folder take turns and lose nothing that a command reported; no job writes where it reads; a
destination reached through a symbolic link is written where the link points (docs/guarantees.md)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import (
    FACT,
    LOCK_HOLDER,
    TEXTS,
    TINY,
    WAIT_SECONDS,
    files_under,
    fixture_folder,
    make_openqa_model,
    tiny_embedder,
    write_corpus,
    write_jsonl,
)

import openrealm
from openrealm import RealmRetriever, file_utils
from openrealm.file_utils import atomic_directory, write_text_atomic
from openrealm.tokenization.corpus_folder import load_corpus, read_corpus_config, read_removed_block_ids
from openrealm.trainers import indexing, living_corpus
from openrealm.trainers.cli import main
from openrealm.trainers.indexing import build_index

OTHER = {"title": "quorblat", "text": "quorblat is another fictional moon , seen first in 2040 ."}


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A corpus folder with an exact index (and its embedder snapshot) in block_index/."""
    folder = write_corpus(tmp_path / "corpus")
    build_index(tiny_embedder(), folder, folder / "block_index", layout="plain", progress=False)
    return folder


def race(monkeypatch, waiting, first, second, held=living_corpus) -> dict:
    """first() in one thread, held inside its embedding of blocks (`held.embed_corpus`: it has read the corpus), while
    second() runs in another; the first goes on once the second has finished or is waiting for it. Returns
    {"first": its result, "second": its result} (the exception where one raised)."""
    inside, go, results = threading.Event(), threading.Event(), {}
    embed = held.embed_corpus

    def held_embed(*args, **kwargs):
        if threading.current_thread().name == "first":
            inside.set()
            go.wait(WAIT_SECONDS)
        return embed(*args, **kwargs)

    monkeypatch.setattr(held, "embed_corpus", held_embed)
    threading.Thread(target=lambda: waiting.wait(WAIT_SECONDS) and go.set(), daemon=True).start()

    def call(name: str, function) -> None:
        try:
            results[name] = function()
        except Exception as error:  # noqa: BLE001 - returned to the test, which asserts on it
            results[name] = error
        finally:
            if name == "second":
                go.set()

    threads = {name: threading.Thread(target=call, args=(name, function), name=name)
               for name, function in (("first", first), ("second", second))}  # fmt: skip
    threads["first"].start()
    assert inside.wait(WAIT_SECONDS)
    threads["second"].start()
    for thread in threads.values():
        thread.join(WAIT_SECONDS)
    return results


def edit(corpus, **kwargs):
    """A corpus edit to race: edit_corpus(corpus, **kwargs) when called."""
    return lambda: living_corpus.edit_corpus(corpus, progress=False, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Writers that race
# ---------------------------------------------------------------------------------------------------------------------


def test_two_adds_at_once_keep_the_articles_of_both(corpus, tmp_path, monkeypatch, waiting):
    first = edit(corpus, add=write_jsonl(tmp_path / "first.jsonl", [FACT]))
    second = edit(corpus, add=write_jsonl(tmp_path / "second.jsonl", [OTHER]))
    results = race(monkeypatch, waiting, first, second)
    assert waiting.is_set()  # the second add waited for the first instead of building on the version it replaced
    assert sorted(summary["added_block_ids"] for summary in results.values()) == [
        [len(TEXTS), len(TEXTS) + 1],
        [len(TEXTS) + 1, len(TEXTS) + 2],
    ]
    blocks = load_corpus(corpus)  # config, Arrow blocks and records agree
    assert blocks["title"][len(TEXTS) :] == [FACT["title"], OTHER["title"]]
    assert read_corpus_config(corpus)["version"] == 2
    retriever = RealmRetriever.from_pretrained(corpus)
    assert retriever.index.num_blocks == len(TEXTS) + 2
    assert retriever.block_ids_of_titles([FACT["title"], OTHER["title"]]) == [len(TEXTS), len(TEXTS) + 1]


def test_a_remove_racing_an_add_is_not_undone(corpus, tmp_path, monkeypatch, waiting):
    add = edit(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT]))
    results = race(monkeypatch, waiting, add, edit(corpus, remove_ids=[0]))
    assert results["second"]["removed_block_ids"] == [0]
    assert sorted(summary["corpus_version"] for summary in results.values()) == [1, 2]
    assert read_removed_block_ids(corpus).tolist() == [0]
    retriever = RealmRetriever.from_pretrained(corpus)
    assert retriever.index.removed_ids.tolist() == [0]
    assert retriever.block_ids_of_titles([FACT["title"]]) == [len(TEXTS)]


def test_an_add_racing_an_index_build_into_the_corpus_keeps_records_and_index_together(
    corpus, tmp_path, monkeypatch, waiting
):
    tiny_embedder(seed=1).save_pretrained(tmp_path / "embedder")
    argv = ["index", "build", "--embedder", str(tmp_path / "embedder"), "--corpus", str(corpus), "--output",
            str(corpus / "block_index"), "--layout", "plain", "--quiet"]  # fmt: skip
    add = edit(corpus, add=write_jsonl(tmp_path / "new.jsonl", [FACT]))
    results = race(monkeypatch, waiting, lambda: main(argv), add, held=indexing)
    assert results["first"] == 0 and results["second"]["added_block_ids"] == [len(TEXTS), len(TEXTS) + 1]
    retriever = RealmRetriever.from_pretrained(corpus)  # records and index of one version
    assert retriever.index.num_blocks == len(load_corpus(corpus)) == len(TEXTS) + 1
    assert retriever.block_ids_of_titles([FACT["title"]]) == [len(TEXTS)]


def test_two_index_builds_into_one_root_at_once_write_one_version_each(corpus, tmp_path, monkeypatch, waiting):
    tiny_embedder(seed=1).save_pretrained(tmp_path / "embedder")
    argv = ["index", "build", "--embedder", str(tmp_path / "embedder"), "--corpus", str(corpus), "--output",
            str(tmp_path / "index"), "--quiet"]  # fmt: skip
    results = race(monkeypatch, waiting, lambda: main(argv), lambda: main(argv), held=indexing)
    assert results == {"first": 0, "second": 0}
    assert waiting.is_set()  # the second chose its version once the first had written its own
    assert indexing.list_versions(tmp_path / "index") == [0, 1]


@pytest.mark.parametrize("command", ["add", "remove"])
def test_a_corpus_whose_files_disagree_is_refused_by_every_writer(corpus, tmp_path, command):
    state_path = corpus / "blocks" / "state.json"
    state = json.loads(state_path.read_text())
    state["_data_files"] *= 2  # what two unserialised adds left: every Arrow row listed twice
    state_path.write_text(json.dumps(state))
    before = files_under(corpus)
    change = {"add": write_jsonl(tmp_path / "new.jsonl", [FACT])} if command == "add" else {"remove_ids": [1]}
    with pytest.raises(ValueError, match=f"holds {2 * len(TEXTS)} blocks but .*corpus_config.json says {len(TEXTS)}"):
        edit(corpus, **change)()
    assert files_under(corpus) == before


def test_a_writer_waits_for_a_writer_of_the_same_folder_in_another_process(tmp_path, waiting):
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "out")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    done = threading.Event()

    def write() -> None:
        with atomic_directory(tmp_path / "out") as staging:
            Path(staging, "mine").write_text("written after the other writer")
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert waiting.wait(WAIT_SECONDS)
    assert not done.is_set() and not (tmp_path / "out").exists()
    holder.communicate("\n", timeout=WAIT_SECONDS)
    writer.join(WAIT_SECONDS)
    assert (tmp_path / "out" / "mine").read_text() == "written after the other writer"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the lock file goes with its last holder


def test_a_writer_killed_while_holding_the_lock_does_not_block_the_next(tmp_path, waiting):
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "out")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert os.path.exists(file_utils.lock_path(tmp_path / "out"))  # left behind, but no longer held
    with atomic_directory(tmp_path / "out") as staging:
        Path(staging, "mine").write_text("x")
    assert not waiting.is_set()
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_one_thread_may_take_the_lock_again_inside_its_own_write(tmp_path):
    with file_utils.writer_lock(tmp_path / "out"):
        with atomic_directory(tmp_path / "out") as staging:
            Path(staging, "mine").write_text("x")
    assert (tmp_path / "out" / "mine").read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["out"]


# ---------------------------------------------------------------------------------------------------------------------
# Destinations behind symbolic links
# ---------------------------------------------------------------------------------------------------------------------


def test_corpus_remove_through_a_link_writes_where_the_link_points(corpus, tmp_path):
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "corpus"
    link.symlink_to(corpus)
    assert main(["corpus", "remove", "--corpus", str(link), "--ids", "0", "--quiet"]) == 0
    assert link.is_symlink() and link.resolve() == corpus
    assert read_removed_block_ids(corpus).tolist() == [0]
    assert read_corpus_config(corpus)["version"] == 1
    assert os.listdir(tmp_path / "links") == ["corpus"]
    assert [name for name in os.listdir(corpus.parent) if name.startswith(".")] == []


def test_convert_overwrite_through_a_link_in_the_parent_path_updates_the_real_folder(tmp_path):
    disk = tmp_path / "disk"
    openrealm.convert_legacy_folder(fixture_folder("embedder", "hub"), disk / "converted")
    (disk / "converted" / "model-00002-of-00002.safetensors").write_bytes(b"an old shard")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "models").symlink_to(disk)
    (tmp_path / "home" / "link").symlink_to(tmp_path / "home" / "models" / "converted")
    argv = ["convert", str(fixture_folder("embedder", "hub")), str(tmp_path / "home" / "link"), "--overwrite"]
    assert main(argv) == 0
    assert (tmp_path / "home" / "link").is_symlink() and (tmp_path / "home" / "models").is_symlink()
    assert not (disk / "converted" / "model-00002-of-00002.safetensors").exists()
    assert (disk / "converted" / "model.safetensors").is_file()
    assert sorted(os.listdir(tmp_path / "home")) == ["link", "models"]
    assert os.listdir(disk) == ["converted"]


def test_a_text_file_written_through_a_link_keeps_the_link(tmp_path):
    (tmp_path / "results.json").write_text("old")
    (tmp_path / "latest.json").symlink_to(tmp_path / "results.json")
    write_text_atomic(tmp_path / "latest.json", "new")
    assert (tmp_path / "latest.json").is_symlink()
    assert (tmp_path / "results.json").read_text() == "new"


# ---------------------------------------------------------------------------------------------------------------------
# Outputs that overlap inputs: refused before anything runs, the inputs left as they were
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def paths(tmp_path) -> dict[str, Path]:
    """A corpus, an open-QA model, an embedder and a questions file, as local inputs of the jobs."""
    model = make_openqa_model(seed=0)
    model.save_pretrained(tmp_path / "model")
    tiny_embedder().save_pretrained(tmp_path / "embedder")
    questions = [{"question": "where does the nile flow ?", "answers": ["egypt"]}]
    return {
        "corpus": write_corpus(tmp_path / "corpus"),
        "model": tmp_path / "model",
        "embedder": tmp_path / "embedder",
        "questions": Path(write_jsonl(tmp_path / "questions.jsonl", questions)),
        "articles": Path(write_jsonl(tmp_path / "articles.jsonl", [FACT])),
    }


TRAIN = f"--max-steps 1 --batch-size 2 --config-overrides {TINY} --quiet"
PRETRAIN = f"--embedder random --encoder random --refresh-every 100 --refresh-mode off --spans random_token {TRAIN}"
# case: (the command, with {name} standing for the paths of the fixture, the input it must leave as it was)
OVERLAPS = {
    "ict into its corpus": (
        "train ict --corpus {corpus} --init random --output {corpus} --overwrite " + TRAIN,
        "corpus",
    ),
    "ict inside its corpus": ("train ict --corpus {corpus} --init random --output {corpus}/ict " + TRAIN, "corpus"),
    "ict around its init": (
        "train ict --corpus {corpus} --init {embedder}/checkpoint-5 --output {embedder} --overwrite " + TRAIN,
        "embedder",
    ),
    "mlm into its corpus": (
        "train mlm --corpus {corpus} --init random --output {corpus} --overwrite " + TRAIN,
        "corpus",
    ),
    "pretrain into its corpus": ("train pretrain --corpus {corpus} --output {corpus} " + PRETRAIN, "corpus"),
    "pretrain index root in its corpus": (
        "train pretrain --corpus {corpus} --output {model}-run --index-root {corpus}/index " + PRETRAIN,
        "corpus",
    ),
    "openqa into its model": (
        "train openqa --model {model} --train {questions} --output {model} --max-steps 1 --quiet",
        "model",
    ),
    "versioned index into its corpus": (
        "index build --embedder {embedder} --corpus {corpus} --output {corpus} --quiet",
        "corpus",
    ),
    "evaluate into its model": (
        "evaluate --model {model} --dataset {questions} --output {model}/config.json --quiet",
        "model",
    ),
    "corpus build over its tokenizer": (
        "corpus build --input {articles} --tokenizer {corpus} --output {corpus} --overwrite --quiet",
        "corpus",
    ),
}


@pytest.mark.parametrize("case", OVERLAPS)
def test_every_job_refuses_an_output_that_is_holds_or_lies_inside_an_input(case, paths, capsys):
    command, victim = OVERLAPS[case]
    if case == "ict around its init":
        shutil.copytree(paths["embedder"], paths["embedder"] / "checkpoint-5")
    before = files_under(paths[victim])
    assert main(command.format(**paths).split()) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "apart from what the job reads" in error[0]
    assert files_under(paths[victim]) == before
    assert not (paths["model"].parent / "model-run").exists()


def test_a_plain_index_may_still_go_into_its_corpus_folder(paths):
    corpus = paths["corpus"]
    argv = ["index", "build", "--embedder", str(paths["embedder"]), "--corpus", str(corpus), "--output",
            str(corpus / "block_index"), "--layout", "plain", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert RealmRetriever.from_pretrained(corpus).index.num_blocks == len(TEXTS)


def test_a_versioned_index_may_read_an_embedder_kept_beside_its_versions(paths, capsys):
    # as the refresh of `train pretrain` does with a builder process per build: ROOT/.snapshots/step-N -> ROOT/vNNNNNN
    root = paths["corpus"].parent / "index"
    shutil.copytree(paths["embedder"], root / ".snapshots" / "step-2")
    argv = ["index", "build", "--embedder", str(root / ".snapshots" / "step-2"), "--corpus", str(paths["corpus"]),
            "--output", str(root), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert indexing.list_versions(root) == [0]
    # an embedder inside a version folder is one that pruning (--keep) would delete: refused
    shutil.copytree(paths["embedder"], root / "v000000" / "embedder")
    argv[3] = str(root / "v000000" / "embedder")
    assert main([*argv, "--keep", "1"]) == 2
    assert "apart from what the job reads" in capsys.readouterr().err


def test_world_refuses_a_tokenizer_output_that_would_replace_the_world(tmp_path, capsys):
    world = tmp_path / "world"
    argv = ["world", "--output", str(world), "--tokenizer-output", str(world), "--num-people", "4", "--overwrite",
            "--quiet"]  # fmt: skip
    assert main(argv) == 2
    assert "apart from" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_quickstart_overwrite_refuses_a_folder_of_other_files_and_leaves_it_intact(tmp_path, monkeypatch):
    from openrealm.trainers.quickstart import stages as quickstart

    monkeypatch.setattr(quickstart, "share_cpu_cores", lambda: pytest.fail("the quickstart started"))
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "thesis.tex").write_text("my work")
    with pytest.raises(FileExistsError, match=r"does not write \(thesis\.tex\); choose another --output"):
        quickstart.quickstart(tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["results.json", "thesis.tex"]


def test_quickstart_overwrite_replaces_an_interrupted_run(tmp_path, monkeypatch):
    from openrealm.trainers.quickstart import stages as quickstart

    class Started(Exception):
        pass

    def started():
        raise Started

    monkeypatch.setattr(quickstart, "share_cpu_cores", started)
    for folder in ("world", "corpus", "pretrain-stale-index", "realm-openqa", "logs"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part").write_text("x")
    (tmp_path / "results-realm.json").write_text("{}")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    with pytest.raises(Started):
        quickstart.quickstart(tmp_path, overwrite=True)
    assert os.listdir(tmp_path) == []  # the old run is gone before the new one starts


def test_quickstart_overwrite_refuses_the_working_directory_and_leaves_it_intact(tmp_path, monkeypatch):
    from openrealm.trainers.quickstart import stages as quickstart

    monkeypatch.setattr(quickstart, "share_cpu_cores", lambda: pytest.fail("the quickstart started"))
    (tmp_path / "notes.txt").write_text("my work")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="working directory"):
        quickstart.quickstart(".", overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "my work"
