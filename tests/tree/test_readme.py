"""The README's two commands stay true: CI runs exactly the README's test command; its safety claim is
docs/guarantees.md's."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)[:2]


def test_readme_gives_two_commands_that_set_up_a_virtual_environment_first():
    commands = readme_commands()
    assert len(commands) == 2
    for command in commands:
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && ")


def test_ci_runs_exactly_the_readme_test_command():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_readme_main_command_uses_only_existing_cli_subcommands():
    from openrealm.trainers.cli import build_parser

    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    used = set(re.findall(r"\.venv/bin/openrealm (\w+)", readme_commands()[0]))
    assert used and used <= subcommands


def test_readme_says_what_docs_guarantees_says_of_pickles():
    readme = (ROOT / "README.md").read_text()
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    assert "never unpickles" not in readme and "Nothing is unpickled" not in guarantees  # 4.x pickles are read
    assert "restricted readers that execute nothing" in " ".join(readme.split())
    assert '[docs/guarantees.md](docs/guarantees.md), "Untrusted files"' in readme
    assert "- **Untrusted files.** No file runs code" in guarantees
