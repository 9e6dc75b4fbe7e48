"""Every command in the README and docs/ stays runnable: each `openrealm` command line of a bash block parses with the
real command-line parser (its command and options exist, its required options are given), and each Python block
compiles and imports only names that exist."""

import ast
import re
import shlex
from pathlib import Path

import pytest

from openrealm.trainers.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(page: Path, language: str) -> list[tuple[int, str]]:
    """(line number, code) of each fenced block of `language` in page (indented blocks of list items included)."""
    text = page.read_text()
    blocks = []
    for match in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", text, flags=re.S | re.M):
        indent = len(match.group(1))
        code = "\n".join(line[indent:] for line in match.group(2).splitlines())
        blocks.append((text[: match.start()].count("\n") + 1, code))
    return blocks


def openrealm_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `openrealm`) of every openrealm command line in a bash block; `...` marks elided options."""
    found = []
    for page in PAGES:
        for line_number, code in code_blocks(page, "bash"):
            for command in code.replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True)
                for i, word in enumerate(words):
                    if word.endswith("openrealm") and (i == 0 or words[i - 1] in ("-m", "&&") or "/" in word):
                        argv = words[i + 1 : words.index("&&", i) if "&&" in words[i:] else len(words)]
                        if "..." not in argv:
                            found.append((f"{page.name}:{line_number}", argv))
    return found


COMMANDS = openrealm_commands()


def test_the_pages_hold_commands_of_every_stage():
    named = {" ".join(argv[:2]) for _, argv in COMMANDS}
    for stage in (
        "quickstart --output",
        "corpus build",
        "train ict",
        "train pretrain",
        "train openqa",
        "evaluate --model",
    ):
        assert any(name.startswith(stage.split(" --")[0]) for name in named), stage


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[f"{w}:{' '.join(a[:2])}" for w, a in COMMANDS])
def test_each_documented_command_parses(where, argv):
    try:
        build_parser(argv).parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"{where}: `openrealm {' '.join(argv)}` does not parse (exit {error.code})")


PYTHON_BLOCKS = [(f"{page.name}:{line}", code) for page in PAGES for line, code in code_blocks(page, "python")]


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[where for where, _ in PYTHON_BLOCKS])
def test_each_python_block_compiles_and_imports_existing_names(where, code):
    import importlib

    tree = ast.parse(code, filename=where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "openrealm":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"{where}: {node.module} has no {alias.name}"
                )


def test_every_relative_link_points_to_an_existing_file():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
