"""The layout is the architecture: modules named by role, jobs that only wire parts, one home for each shared piece,
and the old module paths still importable until openrealm 0.2 (README.md, "Layout")."""

import ast
import importlib
import warnings
from pathlib import Path

import pytest

from openrealm.trainers.cli import JOBS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"modeling_realm": "openrealm", "tokenization": "openrealm.tokenization", "trainers": "openrealm.trainers",
            "hub_cards": "openrealm.hub_cards"}  # fmt: skip
# Module paths of an earlier layout -> where the module lives now (each old path is an alias of the new module).
MOVED = {
    "openrealm.trainers.refresh": "openrealm.trainers.pretraining.refresh",
    "openrealm.trainers.pretrain_eval": "openrealm.trainers.pretraining.evaluation",
    "openrealm.trainers.synthetic_world": "openrealm.trainers.world.synthetic_world",
    "openrealm.trainers.reading_warmup": "openrealm.trainers.world.reading_warmup",
}
MAX_LINES = 600


def modules() -> dict[str, Path]:
    """Import path -> file of every module of the package."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def imported_modules(path: Path) -> set[str]:
    """The openrealm modules a file imports, at any depth (a `from package import module` counts as the module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("openrealm")}


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_is_the_new_module_with_a_deprecation_warning(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.invalidate_caches()
        import sys

        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_no_job_module_is_imported_by_another_module_of_the_package():
    jobs = {module for module, _, _ in JOBS.values()}
    importers = {
        name: sorted(imported_modules(path) & jobs - {name}) for name, path in modules().items() if name not in MOVED
    }
    assert {name: jobs_ for name, jobs_ in importers.items() if jobs_} == {}


def test_modeling_realm_imports_nothing_from_the_other_folders():
    others = ("openrealm.tokenization", "openrealm.trainers", "openrealm.hub_cards")
    for path in sorted((ROOT / "modeling_realm").glob("*.py")):
        if path.name == "__main__.py":  # `python -m openrealm` runs the command line
            continue
        assert not [name for name in imported_modules(path) if name.startswith(others)], path.name


def test_every_module_declares_its_public_names():
    missing = [name for name, path in modules().items() if name not in MOVED and "__all__" not in path.read_text()]
    assert missing == ["openrealm.__main__"]


def test_a_module_longer_than_600_lines_says_why_in_its_docstring():
    too_long = []
    for name, path in modules().items():
        if name in MOVED:
            continue
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > MAX_LINES and "is long because" not in " ".join(docstring.split()):
            too_long.append(name)
    assert too_long == []
