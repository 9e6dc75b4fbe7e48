"""The layout is the architecture: modules named by role, jobs that only wire parts, one home for each shared piece
(README.md, "Layout")."""

import ast
from pathlib import Path

from openrealm.trainers.cli import JOBS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"modeling_realm": "openrealm", "tokenization": "openrealm.tokenization", "trainers": "openrealm.trainers",
            "hub_cards": "openrealm.hub_cards"}  # fmt: skip


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


def test_every_command_is_a_module_of_the_jobs_folder():
    assert {module for module, _, _ in JOBS.values()} <= set(modules())
    assert all(module.startswith("openrealm.trainers.jobs.") for module, _, _ in JOBS.values())


def test_nothing_imports_from_the_jobs_folder():
    jobs = "openrealm.trainers.jobs"
    importers = {
        name: sorted(module for module in imported_modules(path) if module.startswith(jobs + "."))
        for name, path in modules().items()
    }
    assert {name: found for name, found in importers.items() if found} == {}


def test_modeling_realm_imports_nothing_from_the_other_folders():
    others = ("openrealm.tokenization", "openrealm.trainers", "openrealm.hub_cards")
    for path in sorted((ROOT / "modeling_realm").glob("*.py")):
        if path.name == "__main__.py":  # `python -m openrealm` runs the command line
            continue
        assert not [name for name in imported_modules(path) if name.startswith(others)], path.name


def test_every_module_declares_its_public_names():
    missing = [name for name, path in modules().items() if "__all__" not in path.read_text()]
    assert missing == ["openrealm.__main__"]
