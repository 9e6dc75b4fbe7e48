"""Every command in the README and docs/ stays runnable: each `openrealm` command line of a bash block parses with the
real command-line parser (its command and options exist, its required options are given), and each Python block
compiles and imports only names that exist. Every link of the README, docs/ and benchmarks/ reaches an existing file
and, where it names one, an existing heading; so does every path to a page of docs/, benchmarks/ or tests/ that code,
scripts and templates cite. Each research page says its status."""

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


LINKED_PAGES = [*PAGES, *sorted((ROOT / "benchmarks").rglob("*.md"))]
FENCE = re.compile(r"^ *```.*?^ *```", flags=re.S | re.M)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown page: lower case, punctuation dropped, spaces to hyphens,
    a repeated anchor numbered -1, -2, ..."""
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text()), flags=re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.lower())
        anchor = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def broken(target: Path, anchor: str) -> str | None:
    """Why a link to target#anchor is broken, or None."""
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in heading_anchors(target):
        return f"no heading #{anchor}"
    return None


def relative_links(page: Path) -> list[tuple[str, str]]:
    """(path, anchor) of every link of a markdown page that is not a URL (an empty path: the page itself)."""
    links = []
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))  # code is not a link
    for target in re.findall(r"\]\(<?([^)\s>]+)>?(?: \"[^\"]*\")?\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        links.append((path, anchor))
    return links


@pytest.mark.parametrize("page", LINKED_PAGES, ids=[str(page.relative_to(ROOT)) for page in LINKED_PAGES])
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    problems = []
    for path, anchor in relative_links(page):
        target = (page.parent / path) if path else page
        reason = broken(target, anchor)
        if reason:
            problems.append(f"{path}#{anchor}: {reason}")
    assert problems == [], f"{page.relative_to(ROOT)} links to what does not exist"


CITING = [
    path
    for pattern in ("*.py", "*.sh", "*.md", "*.toml", "*.cfg")
    for path in sorted(ROOT.rglob(pattern))
    if not {".venv", ".git", "build", "dist"} & set(path.relative_to(ROOT).parts)
    and not path.relative_to(ROOT).parts[0].endswith(".egg-info")
]


def test_every_cited_page_of_the_repository_exists_with_its_heading():
    # Code comments, docstrings, scripts and templates cite a page by its path from the repository root, with the
    # anchor of a heading where they cite a section.
    pattern = re.compile(r"(?<![\w/.])((?:benchmarks|docs|tests)/[\w./-]*?\.md)(?:#([\w-]+))?")
    problems = []
    for path in CITING:
        for cited, anchor in pattern.findall(path.read_text(errors="replace")):
            reason = broken(ROOT / cited, anchor)
            if reason:
                problems.append(f"{path.relative_to(ROOT)}: {cited}#{anchor}: {reason}")
    assert problems == []


RESEARCH = ROOT / "benchmarks" / "research"
RESEARCH_PAGES = sorted(page for page in RESEARCH.glob("*.md") if page.name != "README.md")


def test_each_research_page_opens_with_its_status_and_is_listed_in_the_index():
    index_rows = [  # | date | experiment | status | finding |
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in (RESEARCH / "README.md").read_text().splitlines()
        if line.startswith("| ")
    ]
    assert RESEARCH_PAGES
    for page in RESEARCH_PAGES:
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# "), page.name
        status = re.match(r"Status: (current|historical|superseded by \[[^\]]+\]\(([\w.-]+\.md)\))", lines[1])
        assert status, f"{page.name}: the line after the title is not its status"
        if status.group(2):
            assert (RESEARCH / status.group(2)).is_file(), page.name
        rows = [row for row in index_rows if row[1].endswith(f"]({page.name})")]
        assert len(rows) == 1, f"{page.name} is not listed once in benchmarks/research/README.md"
        assert rows[0][2].split(" by ")[0] == status.group(1).split(" by ")[0], f"{page.name}: another status listed"
