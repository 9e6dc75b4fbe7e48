"""Packaging: the editable install, the command line, and the wheel (its contents, and that it imports on its own).

setup.cfg maps four source folders onto one import root (`openrealm` <- modeling_realm/, `openrealm.tokenization` <-
tokenization/, `openrealm.trainers` <- trainers/, `openrealm.hub_cards` <- hub_cards/), so both the editable install
and the built wheel must resolve every subpackage to the right files.
"""

import configparser
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import openrealm
from openrealm.trainers.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
# import name -> source folder (setup.cfg package_dir)
PACKAGE_DIRS = {
    "openrealm": "modeling_realm",
    "openrealm.tokenization": "tokenization",
    "openrealm.trainers": "trainers",
    "openrealm.hub_cards": "hub_cards",
}
REQUIRED_WHEEL_FILES = (
    "openrealm/__init__.py",
    "openrealm/modeling_realm.py",
    "openrealm/configuration_realm.py",
    "openrealm/tokenization/tokenization_realm.py",
    "openrealm/trainers/cli.py",
    "openrealm/hub_cards/__init__.py",
    "openrealm/trainers/metrics/realm_open_qa/realm_open_qa.py",
)
# Top-level entries of the repo that are never part of a build (VCS, virtual environments, caches, build outputs).
NOT_SOURCES = (".*", "build", "dist", "*.egg-info", "__pycache__", "venv", "env")


def subcommands() -> list[str]:
    """The subcommands the `openrealm` parser defines, in definition order."""
    (action,) = [action for action in build_parser()._actions if action.dest == "command"]
    return list(action.choices)


def run_cli(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120"}  # argparse wraps help at the terminal width
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------------------------------------------------------
# Editable install and command line
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module_name", sorted(PACKAGE_DIRS))
def test_editable_install_imports_each_package_from_its_repo_folder(module_name):
    module = importlib.import_module(module_name)
    assert Path(module.__file__).resolve() == REPO / PACKAGE_DIRS[module_name] / "__init__.py"


@pytest.fixture(scope="module")
def python_m_help(tmp_path_factory) -> subprocess.CompletedProcess:
    return run_cli([sys.executable, "-m", "openrealm", "--help"], cwd=tmp_path_factory.mktemp("cli_cwd"))


def test_python_m_openrealm_help_exits_0_and_lists_every_subcommand(python_m_help):
    assert python_m_help.returncode == 0, python_m_help.stderr
    assert python_m_help.stdout.startswith("usage: openrealm ")
    names = subcommands()
    assert {"convert", "ask"} <= set(names)
    assert "{" + ",".join(names) + "}" in python_m_help.stdout
    listed = [
        line.split()[0] for line in python_m_help.stdout.splitlines() if line.startswith("    ") and line.strip()
    ]
    assert set(names) <= set(listed), python_m_help.stdout


def test_openrealm_console_script_is_installed_next_to_the_interpreter_and_runs_the_cli(python_m_help, tmp_path):
    script = Path(sys.executable).parent / ("openrealm.exe" if os.name == "nt" else "openrealm")
    assert script.is_file(), f"no console script at {script}"
    assert os.access(script, os.X_OK)
    result = run_cli([str(script), "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == python_m_help.stdout


# ------------------------------------------------------------------------------------------------------------------
# The wheel
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory) -> Path:
    """Build the wheel once, from a copy of the sources (setuptools builds in the source tree and never deletes stale
    files from build/lib, so building the checkout itself could ship a module that no longer exists)."""
    root = tmp_path_factory.mktemp("wheel_build")
    source = root / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for entry in REPO.iterdir():
        if any(entry.match(pattern) for pattern in NOT_SOURCES):
            continue
        if entry.is_dir():
            shutil.copytree(entry, source / entry.name, ignore=ignore)
        else:
            shutil.copy2(entry, source / entry.name)
    outdir = root / "dist"
    started = time.perf_counter()
    # Isolated build: pyproject's build requirements (setuptools, wheel) come from the package index.
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"wheel build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    print(f"wheel built in {time.perf_counter() - started:.1f}s")
    wheels = sorted(outdir.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel_path) -> list[str]:
    with zipfile.ZipFile(wheel_path) as wheel:
        return wheel.namelist()


def dist_info_file(wheel_path: Path, name: str) -> str:
    with zipfile.ZipFile(wheel_path) as wheel:
        (member,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}") and n.count("/") == 1]
        return wheel.read(member).decode()


@pytest.mark.slow
@pytest.mark.parametrize("member", REQUIRED_WHEEL_FILES)
def test_wheel_contains_required_module(wheel_names, member):
    assert member in wheel_names


@pytest.mark.slow
def test_wheel_contains_every_python_file_of_each_source_folder(wheel_names):
    for module_name, folder in PACKAGE_DIRS.items():
        prefix = module_name.replace(".", "/")
        expected = {f"{prefix}/{path.name}" for path in (REPO / folder).glob("*.py")}
        assert expected, folder
        assert expected <= set(wheel_names), sorted(expected - set(wheel_names))


@pytest.mark.slow
def test_wheel_metadata_names_openrealm_at_the_package_version(wheel_path):
    metadata = Parser().parsestr(dist_info_file(wheel_path, "METADATA"))
    assert metadata["Name"] == "openrealm"
    assert metadata["Version"] == openrealm.__version__
    assert wheel_path.name == f"openrealm-{openrealm.__version__}-py3-none-any.whl"


@pytest.mark.slow
def test_wheel_declares_the_openrealm_console_script(wheel_path):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(dist_info_file(wheel_path, "entry_points.txt"))
    assert dict(entry_points["console_scripts"]) == {"openrealm": "openrealm.trainers.cli:main"}


@pytest.mark.slow
def test_wheel_ships_only_the_openrealm_package_not_tests_or_benchmarks(wheel_names):
    top_level = {name.split("/", 1)[0] for name in wheel_names}
    assert top_level == {"openrealm", f"openrealm-{openrealm.__version__}.dist-info"}
    assert not [name for name in wheel_names if {"tests", "benchmarks", "reference"} & set(name.split("/"))]


TARGET_IMPORT_SCRIPT = r"""
import inspect, json, sys
import openrealm, openrealm.tokenization, openrealm.trainers, openrealm.hub_cards
from transformers import AutoConfig, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

config = AutoConfig.for_model("realm")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({
    "files": {name: sys.modules[name].__file__ for name in
              ("openrealm", "openrealm.tokenization", "openrealm.trainers", "openrealm.hub_cards")},
    "realm_config_class": [CONFIG_MAPPING["realm"].__name__, inspect.getfile(CONFIG_MAPPING["realm"])],
    "auto_config": [type(config).__name__, inspect.getfile(type(config)), config.model_type],
    "auto_tokenizer": [type(tokenizer).__name__, inspect.getfile(type(tokenizer))],
}))
"""


@pytest.fixture(scope="module")
def target_install_report(wheel_path, tmp_path_factory) -> tuple[Path, dict]:
    """Install the wheel alone into a --target folder and import it in a fresh interpreter (deps from this venv).

    The editable install's finder sits at the end of sys.meta_path, after the PathFinder that serves PYTHONPATH, so
    the target folder wins without isolating the interpreter; the report proves it for every subpackage."""
    target = tmp_path_factory.mktemp("wheel_target")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target)]
        + [str(wheel_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(target)
    neutral = tmp_path_factory.mktemp("neutral_cwd")
    tokenizer_folder = REPO / "tests" / "reference" / "fixtures" / "embedder_safetensors"
    result = subprocess.run(
        [sys.executable, "-c", TARGET_IMPORT_SCRIPT, str(tokenizer_folder)],
        cwd=neutral,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return target.resolve(), json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wheel_installed_to_target_imports_every_package_from_the_target(target_install_report):
    target, report = target_install_report
    for module_name in PACKAGE_DIRS:
        path = Path(report["files"][module_name]).resolve()
        assert path == target / module_name.replace(".", "/") / "__init__.py", (module_name, path)


@pytest.mark.slow
def test_wheel_installed_to_target_registers_realm_with_auto_config_and_auto_tokenizer(target_install_report):
    target, report = target_install_report
    assert report["realm_config_class"][0] == "RealmConfig"
    assert report["auto_config"][0] == "RealmConfig" and report["auto_config"][2] == "realm"
    assert report["auto_tokenizer"][0] == "RealmTokenizer"
    for _, source_file in (report["realm_config_class"], report["auto_config"][:2], report["auto_tokenizer"]):
        assert Path(source_file).resolve().is_relative_to(target), source_file


def test_the_package_root_exports_each_name_lazily_and_declares_it_for_type_checkers():
    import ast

    import openrealm

    source = (REPO / "modeling_realm" / "__init__.py").read_text()
    (block,) = [
        node for node in ast.parse(source).body if ast.unparse(getattr(node, "test", ast.Pass())) == "TYPE_CHECKING"
    ]
    declared = {(f".{node.module}", alias.name) for node in block.body for alias in node.names}
    assert declared == {(module, name) for name, module in openrealm._EXPORTS.items()}
    assert all(getattr(openrealm, name) is not None for name in openrealm.__all__)


def test_the_package_root_exports_every_public_name_of_the_model_file():
    # The root's lazy table spells the model file's names out (reading its __all__ would import torch).
    import openrealm
    from openrealm import modeling_realm

    exported = {name for name, module in openrealm._EXPORTS.items() if module == ".modeling_realm"}
    assert exported == set(modeling_realm.__all__)
