"""`openrealm push` with bad input: a results file that is not JSON is named before the card is written; a README.md
or demo file that push did not write is refused before anything is written or uploaded."""

import os
from pathlib import Path

import pytest
from helpers import RecordingHfApi, model_copy, one_error_line, write_lines

from openrealm.trainers.cli import main


@pytest.mark.parametrize("flag", ["--training-summary", "--eval-results"])
def test_push_with_a_results_file_that_is_not_json_exits_2_naming_it_before_writing_the_card(
    saved_model, tmp_path, capsys, flag
):
    model = model_copy(saved_model, tmp_path)
    bad = write_lines(tmp_path / "bad.json", "{", '  "loss": 1,,')
    assert main(["push", "--model", model, "--repo-id", "someone/realm", flag, bad]) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {bad}: invalid JSON: Expecting property name enclosed in double quotes (line 2, column 13)"
    )
    assert not os.path.exists(os.path.join(model, "README.md"))


def push_argv(model: str, *extra: str) -> list[str]:
    return ["push", "--model", model, "--repo-id", "someone/realm", *extra]


def test_push_refuses_a_hand_written_readme_before_writing_or_uploading(saved_model, tmp_path, capsys, monkeypatch):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    model = model_copy(saved_model, tmp_path)
    readme = os.path.join(model, "README.md")
    write_lines(Path(readme), "# My model", "", "Notes of my own.")
    assert main(push_argv(model, "--with-demo")) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {readme} is not a card openrealm wrote (or was edited since), and push would replace it: "
        "pass --readme keep to upload it as it is (without the card's results), or --readme replace to write "
        "openrealm's card over it"
    )
    assert Path(readme).read_text() == "# My model\n\nNotes of my own.\n"
    assert api.repos == [] and not os.path.exists(os.path.join(model, "app.py"))


def test_push_refuses_a_card_edited_since_openrealm_wrote_it(saved_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.HfApi", RecordingHfApi)
    model = model_copy(saved_model, tmp_path)
    assert main(push_argv(model)) == 0
    readme = Path(model) / "README.md"
    readme.write_text(readme.read_text().replace("## Training corpus", "My note.\n\n## Training corpus"))
    edited = readme.read_text()
    assert main(push_argv(model)) == 2
    assert "is not a card openrealm wrote (or was edited since)" in one_error_line(capsys)
    assert readme.read_text() == edited


@pytest.mark.parametrize("name", ["app.py", "requirements.txt"])
def test_push_with_demo_refuses_a_demo_file_of_the_users_own(saved_model, tmp_path, capsys, monkeypatch, name):
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    model = model_copy(saved_model, tmp_path)
    mine = write_lines(Path(model) / name, "print('my own Space')")
    assert main(push_argv(model, "--with-demo")) == 2
    assert one_error_line(capsys) == (
        f"openrealm: error: {mine} was not written by openrealm push --with-demo, which would replace it with the "
        "demo's: move it out of the folder, or push without --with-demo"
    )
    assert Path(mine).read_text() == "print('my own Space')\n"
    assert api.repos == [] and not os.path.exists(os.path.join(model, "README.md"))
