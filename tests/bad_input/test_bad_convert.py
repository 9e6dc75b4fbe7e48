"""`openrealm convert` and model folders with bad input: config.json fields named with file and field, 4.x pickles
refused without suggesting to unpickle them, a full disk while weights are written leaves nothing."""

import os
import shutil

import pytest
from helpers import evaluate_argv, fixture_folder, full_disk, one_error_line, write_config

from openrealm.trainers.cli import main


@pytest.fixture()
def pickled_4x_folder(tmp_path):
    """The 4.x open-QA fixture whose pytorch_model.bin also pickles an argparse.Namespace (training arguments)."""
    import argparse as argparse_module

    import torch

    folder = shutil.copytree(fixture_folder("openqa", "hub"), tmp_path / "legacy")
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save({**weights, "args": argparse_module.Namespace(lr=1.0)}, folder / "pytorch_model.bin")
    return folder


def full_disk_in_safetensors(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def test_convert_of_a_missing_source_exits_2_with_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert one_error_line(capsys) == f"openrealm: error: SOURCE {tmp_path / 'nope'}: no such folder"
    assert os.listdir(tmp_path) == []


def test_convert_into_its_own_source_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "src" / "out")]) == 2
    assert "overlaps the source" in one_error_line(capsys)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"hidden_size": "32"}, "Field 'hidden_size' expected int, got str (value: '32')"),
        ({"reader_beam_size": 0}, "field 'reader_beam_size' must be at least 1, got 0"),
        ({"num_attention_heads": 0}, "field 'num_attention_heads' must be at least 1, got 0"),
        ({"hidden_dropout_prob": 1.5}, "field 'hidden_dropout_prob' must be a probability from 0 to 1, got 1.5"),
        ({"hidden_act": "nope"}, "field 'hidden_act' names no activation function: 'nope'"),
        ({"pad_token_id": 158}, "field 'pad_token_id' must be an id of the vocabulary (0 to 157), got 158"),
        ({"architectures": "RealmForOpenQA"}, "field 'architectures' must be a list of class names"),
    ],
    ids=["wrong-type", "beam-0", "heads-0", "dropout", "activation", "pad-id", "architectures"],
)
def test_convert_of_a_config_json_with_a_bad_field_exits_2_naming_file_and_field(tmp_path, capsys, fields, problem):
    source = write_config(tmp_path / "src", **fields)
    assert main(["convert", source, str(tmp_path / "out")]) == 2
    assert one_error_line(capsys).startswith(f"openrealm: error: {source}/config.json: {problem}")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_invalid_json_in_config_json_exits_2_naming_file_line_and_column(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{\n  "model_type": "realm",\n}\n', encoding="utf-8")
    argv = evaluate_argv(tmp_path, "--output", str(tmp_path / "r.json"))
    assert main(argv) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {tmp_path / 'model' / 'config.json'}: invalid JSON: Expecting property name enclosed in "
        "double quotes (line 3, column 1)"
    )
    assert not (tmp_path / "r.json").exists()


def test_realm_config_from_pretrained_names_the_file_and_the_field(tmp_path):
    from openrealm import RealmConfig

    folder = write_config(tmp_path / "model", max_span_width=-1)
    with pytest.raises(ValueError, match=r"model/config\.json: field 'max_span_width' must be at least 1, got -1$"):
        RealmConfig.from_pretrained(folder)


@pytest.mark.parametrize("command", ["convert", "ask"])
def test_a_4x_pickle_refused_by_weights_only_exits_2_without_suggesting_to_unpickle_it(
    pickled_4x_folder, tmp_path, capsys, command
):
    argv = {
        "convert": ["convert", str(pickled_4x_folder), str(tmp_path / "out")],
        "ask": ["ask", "--model", str(pickled_4x_folder), "where is paris ?"],
    }[command]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line == (
        f"openrealm: error: {pickled_4x_folder / 'pytorch_model.bin'} is a pickle holding objects besides tensors "
        "(argparse.Namespace), which OpenREALM does not load. If you trust the file, save its tensors as "
        "model.safetensors (docs/migrating.md), then openrealm convert the folder"
    )
    assert "weights_only" not in line
    assert sorted(os.listdir(tmp_path)) == ["legacy"]


@pytest.mark.parametrize("writer", [full_disk, full_disk_in_safetensors], ids=["oserror", "safetensors-error"])
def test_a_full_disk_while_convert_writes_the_weights_names_the_destination_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, writer
):
    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", writer)
    destination = tmp_path / "new" / "converted"
    assert main(["convert", str(fixture_folder("openqa", "hub")), str(destination)]) == 1
    assert one_error_line(capsys) == (
        f"openrealm: error: No space left on the device holding {destination} while writing it (No space left on "
        "device); nothing was written: free some space or choose another output"
    )
    assert os.listdir(tmp_path) == []
