"""What every command does with bad input (`trainers/cli.py`): one line `openrealm: error: ...`, exit 2, no traceback
unless OPENREALM_DEBUG is set; an unexpected error keeps its traceback; a batch size below one is named by its flag."""

import os

import pytest
from helpers import full_disk, one_error_line

from openrealm.trainers.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        "index build --embedder E --corpus C --output O --batch-size 0",
        "corpus add --corpus C --input A.jsonl --batch-size 0",
        "train ict --corpus C --init random --output O --max-steps 1 --batch-size 0",
        "train mlm --corpus C --init random --output O --max-steps 1 --batch-size 0",
        "train pretrain --corpus C --embedder E --encoder E --output O --max-steps 1 --refresh-every 1 --batch-size 0",
        "train pretrain --corpus C --embedder E --encoder E --output O --max-steps 1 --refresh-every 1 "
        "--index-batch-size 0",
        "train openqa --model M --train Q.jsonl --output O --max-steps 1 --batch-size 0",
    ],
    ids=["index build", "corpus add", "ict", "mlm", "pretrain", "pretrain index", "openqa"],
)
def test_a_batch_size_below_one_is_refused_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv.split())
    assert exited.value.code == 2
    flag = argv.split()[-2]
    assert f"argument {flag}: must be a positive integer (at least 1), got 0" in capsys.readouterr().err


def test_openrealm_debug_re_raises_bad_input_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENREALM_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")])


def test_an_unexpected_error_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("openrealm.convert_legacy_folder", broken)
    (tmp_path / "src").mkdir()
    with pytest.raises(RuntimeError, match="a bug"):
        main(["convert", str(tmp_path / "src"), str(tmp_path / "out")])


def test_a_multi_line_message_is_printed_on_one_line(tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("first line\n  second line")

    monkeypatch.setattr("openrealm.convert_legacy_folder", failing)
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert one_error_line(capsys) == "openrealm: error: first line second line"


def test_a_message_longer_than_the_limit_is_cut_and_says_how_to_see_it_whole(tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("x" * 5000)

    monkeypatch.setattr("openrealm.convert_legacy_folder", failing)
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert line == "openrealm: error: " + "x" * 599 + "… (OPENREALM_DEBUG=1 prints it whole)"


def test_a_full_disk_while_a_results_file_is_written_names_the_file(tmp_path, monkeypatch):
    from openrealm.file_utils import FullDiskError, write_text_atomic

    monkeypatch.setattr("os.fsync", full_disk)
    with pytest.raises(FullDiskError, match=r"No space left on the device holding .*r\.json while writing it"):
        write_text_atomic(tmp_path / "r.json", "{}")
    assert os.listdir(tmp_path) == []


def test_an_allocation_this_machine_cannot_hold_fails_in_one_line_with_exit_1(tmp_path, capsys, monkeypatch):
    def allocating(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 98353152 bytes.")

    monkeypatch.setattr("openrealm.convert_legacy_folder", allocating)
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 1
    assert one_error_line(capsys) == (
        "openrealm: error: out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate 98353152 "
        "bytes."
    )
