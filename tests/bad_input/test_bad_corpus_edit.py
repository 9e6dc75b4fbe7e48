"""`openrealm corpus add | update | remove` with bad options: refused by the parser, naming the option, before the
corpus is read."""

import pytest
from helpers import refused_argument

CASES = [
    ("corpus remove --corpus C --ids 3 -1", "--ids", "must be a non-negative integer (0 or more), got -1"),
    ("corpus update --corpus C --input A.jsonl --batch-size 0", "--batch-size", "must be a positive integer (at "
     "least 1), got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "flag", "message"), CASES, ids=["remove --ids", "update --batch-size"])
def test_a_corpus_edit_option_out_of_its_range_is_refused_naming_it(capsys, argv, flag, message):
    command = " ".join(argv.split()[:2])
    assert refused_argument(argv.split(), capsys) == f"openrealm {command}: error: argument {flag}: {message}"
