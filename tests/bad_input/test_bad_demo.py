"""`openrealm demo` and `openrealm quickstart` with bad options: refused by the parser, naming the option, before a
model loads or a folder is written."""

import pytest
from helpers import refused_argument

CASES = [
    ("demo --model M --port 0", "--port", "must be a port number from 1 to 65535, got 0"),
    ("demo --model M --port 65536", "--port", "must be a port number from 1 to 65535, got 65536"),
    ("demo --model M --num-retrieved 0", "--num-retrieved", "must be a positive integer (at least 1), got 0"),
    ("quickstart --output {out} --seed -1", "--seed", "must be an integer from 0 to 2147483647, got -1"),
]


@pytest.mark.parametrize(("argv", "flag", "message"), CASES, ids=[a.split(" --", 1)[1] for a, _, _ in CASES])
def test_a_demo_or_quickstart_option_out_of_its_range_is_refused_naming_it(tmp_path, capsys, argv, flag, message):
    argv = argv.format(out=tmp_path / "out").split()
    assert refused_argument(argv, capsys) == f"openrealm {argv[0]}: error: argument {flag}: {message}"
    assert not (tmp_path / "out").exists()
