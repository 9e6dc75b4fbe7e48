"""`openrealm push` with bad input: a results file that is not JSON is named before the card is written."""

import os

import pytest
from helpers import model_copy, one_error_line, write_lines

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
