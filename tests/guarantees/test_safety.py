"""Nothing lost, nothing half-written: `convert --overwrite` updates only a folder it wrote, keeping what it does not
write; saved folders get the user's umask (not mkdtemp's private modes), and an unwritable legacy cache is named with
the way out."""

import errno
import json
import os
import shutil
import stat
import tempfile

import pytest
from helpers import fixture_folder, fixture_tokenizer, make_openqa_model, tiny_realm_config

import openrealm
from openrealm import RealmEmbedder, RealmRetriever
from openrealm.file_utils import apply_umask_modes, current_umask
from openrealm.trainers.cli import main

LEGACY = fixture_folder("embedder", "hub")  # the smallest legacy folder: converts in a moment


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes_under(folder) -> tuple[set[int], set[int]]:
    """({modes of the folder and its sub-folders}, {modes of its files})."""
    folders, files = {mode(folder)}, set()
    for root, names, filenames in os.walk(folder):
        folders.update(mode(os.path.join(root, name)) for name in names)
        files.update(mode(os.path.join(root, name)) for name in filenames)
    return folders, files


@pytest.fixture
def umask():
    """Run the test under a chosen umask (umask(0o022) etc.), restored afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield os.umask
    os.umask(previous)


# ---------------------------------------------------------------------------------------------------------------------
# convert --overwrite
# ---------------------------------------------------------------------------------------------------------------------


def test_convert_overwrite_refuses_the_working_directory_and_leaves_it_intact(tmp_path, monkeypatch, capsys):
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("my work")
    monkeypatch.chdir(work)
    monkeypatch.delenv("OPENREALM_DEBUG", raising=False)
    assert main(["convert", str(LEGACY), ".", "--overwrite"]) != 0
    assert f"Refusing to replace {work}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="working directory"):
        openrealm.convert_legacy_folder(LEGACY, ".", overwrite=True)
    assert (work / "notes.txt").read_text() == "my work"
    assert sorted(os.listdir(work)) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["project"]  # no staging folder left beside it


def test_convert_overwrite_refuses_a_folder_holding_the_working_directory(tmp_path, monkeypatch):
    """Even a folder that is a converted REALM folder is kept when the working directory lies inside it."""
    converted = tmp_path / "converted"
    openrealm.convert_legacy_folder(LEGACY, converted)
    (converted / "sub").mkdir()
    monkeypatch.chdir(converted / "sub")
    with pytest.raises(ValueError, match="working directory"):
        openrealm.convert_legacy_folder(LEGACY, converted, overwrite=True)
    assert (converted / "sub").is_dir() and (converted / "model.safetensors").is_file()


def test_convert_overwrite_refuses_a_folder_with_an_unrelated_file(tmp_path):
    destination = tmp_path / "photos"
    destination.mkdir()
    (destination / "holiday.jpg").write_bytes(b"\xff\xd8 not a model")
    with pytest.raises(FileExistsError, match="not a converted REALM folder"):
        openrealm.convert_legacy_folder(LEGACY, destination, overwrite=True)
    assert sorted(os.listdir(destination)) == ["holiday.jpg"]
    assert (destination / "holiday.jpg").read_bytes() == b"\xff\xd8 not a model"


def test_convert_overwrite_refuses_a_realm_config_without_converted_weights(tmp_path):
    """A legacy (4.x) folder has a REALM config.json but pytorch_model.bin: not something convert wrote."""
    destination = tmp_path / "legacy-copy"
    shutil.copytree(LEGACY, destination)
    with pytest.raises(FileExistsError, match="model.safetensors"):
        openrealm.convert_legacy_folder(LEGACY, destination, overwrite=True)
    assert sorted(os.listdir(destination)) == sorted(os.listdir(LEGACY))


def test_convert_overwrite_keeps_the_card_git_and_checkpoints_and_drops_old_weights(tmp_path):
    """A clone of the Hub repository converted into again: as any save into an existing folder (docs/guarantees.md)."""
    destination = tmp_path / "clone"
    openrealm.convert_legacy_folder(LEGACY, destination)
    (destination / "README.md").write_text("my model card")
    (destination / ".git").mkdir()
    (destination / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (destination / "checkpoint-5").mkdir()
    (destination / "checkpoint-5" / "trainer_state.json").write_text("{}")
    (destination / "model-00002-of-00002.safetensors").write_bytes(b"an old shard")
    assert main(["convert", str(LEGACY), str(destination), "--overwrite"]) == 0
    assert (destination / "README.md").read_text() == "my model card"
    assert (destination / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (destination / "checkpoint-5" / "trainer_state.json").read_text() == "{}"
    assert not (destination / "model-00002-of-00002.safetensors").exists()
    assert json.loads((destination / "config.json").read_text())["model_type"] == "realm"
    assert (destination / "model.safetensors").is_file()
    assert sorted(os.listdir(tmp_path)) == ["clone"]  # the old folder and the staging folder are gone


def test_convert_overwrite_fills_an_empty_folder(tmp_path):
    destination = tmp_path / "empty"
    destination.mkdir()
    openrealm.convert_legacy_folder(LEGACY, destination, overwrite=True)
    assert (destination / "model.safetensors").is_file()


def test_convert_refuses_the_source_as_destination(tmp_path):
    source = tmp_path / "legacy"
    shutil.copytree(LEGACY, source)
    before = sorted(os.listdir(source))
    with pytest.raises(ValueError, match="is the source"):
        openrealm.convert_legacy_folder(source, source, overwrite=True)
    assert sorted(os.listdir(source)) == before


def test_convert_refuses_a_destination_inside_the_source(tmp_path):
    source = tmp_path / "legacy"
    shutil.copytree(LEGACY, source)
    with pytest.raises(ValueError, match="overlaps the source"):
        openrealm.convert_legacy_folder(source, source / "converted")
    assert not (source / "converted").exists()


def test_convert_refuses_a_converted_destination_that_holds_the_source(tmp_path):
    destination = tmp_path / "converted"
    openrealm.convert_legacy_folder(LEGACY, destination)
    source = destination / "legacy"
    shutil.copytree(LEGACY, source)
    with pytest.raises(ValueError, match="overlaps the source"):
        openrealm.convert_legacy_folder(source, destination, overwrite=True)
    assert sorted(os.listdir(source)) == sorted(os.listdir(LEGACY))


# ---------------------------------------------------------------------------------------------------------------------
# Permissions: the user's umask, not mkdtemp's 0700 / 0600
# ---------------------------------------------------------------------------------------------------------------------


def test_current_umask_reads_the_umask_without_changing_it(umask):
    umask(0o027)
    assert current_umask() == 0o027
    assert current_umask() == 0o027


def test_apply_umask_modes_opens_a_mkdtemp_folder_to_the_umask(tmp_path, umask):
    umask(0o022)
    staging = tempfile.mkdtemp(dir=tmp_path)
    os.makedirs(os.path.join(staging, "sub"), mode=0o700)
    for name in ("a.json", os.path.join("sub", "b.safetensors")):
        handle = os.open(os.path.join(staging, name), os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(handle)
    apply_umask_modes(staging)
    assert modes_under(staging) == ({0o755}, {0o644})


def test_a_saved_model_folder_is_0755_with_0644_files_under_umask_022(tmp_path, umask):
    umask(0o022)
    model = make_openqa_model(seed=0)
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "block_index").is_dir()
    assert modes_under(tmp_path / "model") == ({0o755}, {0o644})


def test_a_saved_model_folder_follows_a_group_only_umask(tmp_path, umask):
    umask(0o027)
    RealmEmbedder(tiny_realm_config()).save_pretrained(tmp_path / "embedder")
    assert modes_under(tmp_path / "embedder") == ({0o750}, {0o640})


def test_a_saved_retriever_folder_follows_the_umask(tmp_path, umask):
    umask(0o022)
    retriever = make_openqa_model(seed=0).retriever
    retriever.save_pretrained(tmp_path / "retriever")
    assert modes_under(tmp_path / "retriever") == ({0o755}, {0o644})


def test_a_converted_folder_follows_the_umask(tmp_path, umask):
    umask(0o027)  # not the 0755 the staging folder used to be given whatever the umask
    openrealm.convert_legacy_folder(LEGACY, tmp_path / "converted")
    assert modes_under(tmp_path / "converted") == ({0o750}, {0o640})


def test_a_saved_tower_follows_the_umask(tmp_path, umask):
    from openrealm.trainers.towers import save_tower

    umask(0o022)
    folder = save_tower(
        RealmEmbedder(tiny_realm_config()), tmp_path / "tower", fixture_tokenizer(), files={"summary.json": "{}"}
    )
    assert (folder / "summary.json").read_text() == "{}"
    assert modes_under(folder) == ({0o755}, {0o644})


# ---------------------------------------------------------------------------------------------------------------------
# The legacy cache must be writable, and the error says so
# ---------------------------------------------------------------------------------------------------------------------


def make_read_only(folder, monkeypatch) -> None:
    """chmod 0o500; where that does not stop writing (root), creating folders under it raises PermissionError."""
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    if not os.access(folder, os.W_OK):
        return
    real_mkdir = os.mkdir  # os.makedirs and tempfile.mkdtemp both create through os.mkdir
    inside = os.path.realpath(folder) + os.sep

    def refusing_mkdir(path, *args, **kwargs):
        if os.path.realpath(os.fspath(path)).startswith(inside):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refusing_mkdir)


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    folder = tmp_path / "read-only"
    make_read_only(folder, monkeypatch)
    yield folder
    folder.chmod(0o700)


def test_an_uncreatable_legacy_cache_names_the_folder_and_openrealm_cache(read_only, monkeypatch):
    cache = read_only / "cache"
    monkeypatch.setenv("OPENREALM_CACHE", str(cache))
    with pytest.raises(PermissionError) as raised:
        RealmRetriever.from_pretrained(fixture_folder("openqa", "hub"))
    message = str(raised.value)
    assert str(cache / "legacy_block_records") in message
    assert "Set OPENREALM_CACHE to a writable folder" in message
    assert os.listdir(read_only) == []


def test_an_unwritable_existing_legacy_cache_names_the_folder_and_openrealm_cache(tmp_path, monkeypatch):
    records = tmp_path / "cache" / "legacy_block_records"
    make_read_only(records, monkeypatch)
    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path / "cache"))
    try:
        with pytest.raises(PermissionError) as raised:
            RealmRetriever.from_pretrained(fixture_folder("openqa", "hub"))
        assert str(records) in str(raised.value)
        assert "Set OPENREALM_CACHE to a writable folder" in str(raised.value)
        assert os.listdir(records) == []
    finally:
        records.chmod(0o700)


def test_a_writable_legacy_cache_converts_the_records_once(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENREALM_CACHE", str(tmp_path / "cache"))
    retriever = RealmRetriever.from_pretrained(fixture_folder("openqa", "hub"))
    cached = list((tmp_path / "cache" / "legacy_block_records").glob("*/block_records.safetensors"))
    assert len(cached) == 1 and len(retriever.block_records) > 0
