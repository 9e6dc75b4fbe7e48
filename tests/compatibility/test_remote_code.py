"""Saved REALM folders run as Hugging Face custom code where openrealm is NOT installed.

A fresh virtual environment (no system site packages) gets only torch and transformers and their own dependencies,
this environment's installed copies linked in (pip installs them where links cannot be made). Its python loads an
open-QA folder with `pipeline("question-answering", trust_remote_code=True)` and an embedder folder with
AutoModel/AutoTokenizer, and must give exactly what openrealm gives in this process.

Set OPENREALM_REMOTE_VENV=/some/dir to keep that environment between sessions (it is rebuilt when its torch or
transformers pins no longer match this environment's versions).
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
import torch
import transformers
from helpers import fixture_tokenizer, make_openqa_model, tiny_realm_config
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from transformers import pipeline

import openrealm

pytestmark = pytest.mark.slow

CODE_FILES = (
    "modeling_realm.py",
    "configuration_realm.py",
    "retrieval_realm.py",
    "index_realm.py",
    "block_records.py",
    "file_utils.py",
    "pipeline_realm.py",
    "tokenization_realm.py",
)
QUESTIONS = ["where is paris ?", "what flows through london ?"]
CONTEXT_QUESTION = "who wrote hamlet ?"
CONTEXT = "Hamlet is a tragedy by William Shakespeare, written around 1600."
EMBEDDER_TEXTS = ["paris is the capital city of france .", "who was born in paris ?"]
MARKER = "openrealm-remote-requirements.json"


def remote_requirements() -> list[str]:
    """This environment's torch and transformers versions, pinned (local labels such as +cpu dropped)."""
    return [f"torch=={Version(torch.__version__).base_version}", f"transformers=={transformers.__version__}"]


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def dependency_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions of `names` and of everything they require (no extras), each once."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        try:
            found[name] = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # required only where this environment does not need it (its marker): pip skipped it too
        for line in found[name].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def link_distributions(distributions: list[importlib.metadata.Distribution], site_packages: Path) -> None:
    """Symlink each distribution's top-level packages, modules and metadata into `site_packages` (not its scripts)."""
    for distribution in distributions:
        tops = {Path(file).parts[0] for file in distribution.files or [] if not str(file).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            source, target = Path(distribution.locate_file(top)), site_packages / top
            if source.exists() and not target.exists():
                target.symlink_to(source, target_is_directory=source.is_dir())


def create_remote_venv(venv_dir: Path, requirements: list[str]) -> None:
    """A venv without system site packages holding this environment's torch and transformers and their dependencies:
    linked in (seconds), or installed by pip where links cannot be made (minutes)."""
    # pip >= 22.3 installs into another interpreter with --python, which spares the new venv its own pip.
    pip_can_target = Version(importlib.metadata.version("pip")) >= Version("22.3")
    venv.EnvBuilder(
        system_site_packages=False, clear=True, symlinks=os.name != "nt", with_pip=not pip_can_target
    ).create(venv_dir)
    python = venv_python(venv_dir)
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    try:
        link_distributions(dependency_closure(("torch", "transformers")), site_packages)
    except OSError:  # no symlinks here (Windows without the privilege): install them
        pip = [sys.executable, "-m", "pip", "--python", str(python)] if pip_can_target else [str(python), "-m", "pip"]
        result = subprocess.run(
            [*pip, "install", "-q", "--no-compile", "--disable-pip-version-check", *requirements],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert result.returncode == 0, (
            f"pip install {requirements} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    (venv_dir / MARKER).write_text(json.dumps(requirements))


@pytest.fixture(scope="session")
def remote_python(tmp_path_factory):
    """The python of an environment holding only torch, transformers and their dependencies."""
    cached = os.environ.get("OPENREALM_REMOTE_VENV")
    venv_dir = Path(cached) if cached else tmp_path_factory.mktemp("remote") / "venv"
    requirements = remote_requirements()
    marker = venv_dir / MARKER
    reusable = cached and marker.is_file() and json.loads(marker.read_text()) == requirements
    if not (reusable and venv_python(venv_dir).exists()):
        if venv_dir.exists() and any(venv_dir.iterdir()) and not (venv_dir / "pyvenv.cfg").is_file():
            pytest.fail(f"OPENREALM_REMOTE_VENV={venv_dir} exists and is not a virtual environment; not clearing it.")
        started = time.perf_counter()
        create_remote_venv(venv_dir, requirements)
        print(f"remote venv ({', '.join(requirements)}) created in {time.perf_counter() - started:.1f}s")
    yield venv_python(venv_dir)
    if not cached:
        shutil.rmtree(venv_dir, ignore_errors=True)  # links, or ~1 GB installed; pytest would keep the last basetemps


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """Open-QA and embedder folders saved by openrealm, and what openrealm answers from them in this process."""
    root = tmp_path_factory.mktemp("saved")
    qa_folder, embedder_folder = root / "openqa", root / "embedder"
    make_openqa_model().save_pretrained(qa_folder)
    torch.manual_seed(1)
    openrealm.RealmEmbedder(tiny_realm_config()).eval().save_pretrained(embedder_folder)
    fixture_tokenizer().save_pretrained(embedder_folder)

    qa = pipeline("question-answering", model=str(qa_folder))
    assert isinstance(qa, openrealm.RealmQuestionAnsweringPipeline)  # expectations come from openrealm itself
    embedder = openrealm.RealmEmbedder.from_pretrained(embedder_folder).eval()
    encoded = fixture_tokenizer()(EMBEDDER_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        projected_score = embedder(**encoded).projected_score
    return {
        "qa_folder": qa_folder,
        "embedder_folder": embedder_folder,
        "answers": qa(QUESTIONS),
        "top_k": qa(QUESTIONS[0], top_k=2),
        "context": qa(CONTEXT_QUESTION, context=CONTEXT),
        "embedder_inputs": {name: tensor.tolist() for name, tensor in encoded.items()},
        "projected_score": projected_score.tolist(),
    }


REMOTE_SCRIPT = r"""
import json, sys

spec = json.load(open(sys.argv[1]))
for name in ("openrealm", "datasets", "faiss"):
    try:
        __import__(name)
    except ImportError:
        continue
    sys.exit(f"{name} is importable in the remote environment: this run would prove nothing")

import torch
import transformers
from transformers import AutoModel, AutoTokenizer, pipeline

def where(obj):
    return [type(obj).__module__, type(obj).__name__]

qa = pipeline("question-answering", model=spec["qa_folder"], trust_remote_code=True)
results = {
    "answers": qa(spec["questions"]),
    "top_k": qa(spec["questions"][0], top_k=2),
    "context": qa(spec["context_question"], context=spec["context"]),
}
model = AutoModel.from_pretrained(spec["embedder_folder"], trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(spec["embedder_folder"], trust_remote_code=True)
inputs = {name: torch.tensor(rows) for name, rows in spec["embedder_inputs"].items()}
with torch.no_grad():
    results["projected_score"] = model(**inputs).projected_score.tolist()
results["token_ids"] = tokenizer(spec["embedder_texts"], padding=True)["input_ids"]
results["classes"] = {
    "pipeline": where(qa), "qa_model": where(qa.model), "qa_tokenizer": where(qa.tokenizer),
    "embedder": where(model), "embedder_tokenizer": where(tokenizer),
}
results["imported"] = sorted({name.split(".")[0] for name in sys.modules} & {"openrealm", "datasets", "faiss"})
results["environment"] = {
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "sys_path": sys.path,
    "transformers": transformers.__version__,
    "torch": torch.__version__,
}
json.dump(results, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def remote(remote_python, saved, tmp_path_factory) -> dict:
    """What the remote environment answers from the saved folders (one subprocess for every check)."""
    work = tmp_path_factory.mktemp("remote_run")
    spec = {
        "qa_folder": str(saved["qa_folder"]),
        "embedder_folder": str(saved["embedder_folder"]),
        "questions": QUESTIONS,
        "context_question": CONTEXT_QUESTION,
        "context": CONTEXT,
        "embedder_texts": EMBEDDER_TEXTS,
        "embedder_inputs": saved["embedder_inputs"],
    }
    (work / "spec.json").write_text(json.dumps(spec))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP") and not key.startswith("HF_")
    }
    # A fresh Hub cache: the custom code is copied into HF_HOME/modules from the folders, never from a stale cache.
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1")
    result = subprocess.run(
        [str(remote_python), "-c", REMOTE_SCRIPT, str(work / "spec.json"), str(work / "results.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"remote run failed:\n{result.stderr[-6000:]}"
    return json.loads((work / "results.json").read_text())


def assert_answers_match(remote_answers: list[dict], expected_answers: list[dict]) -> None:
    assert len(remote_answers) == len(expected_answers)
    for got, expected in zip(remote_answers, expected_answers):
        assert set(got) == set(expected)
        for key, value in expected.items():
            if key == "score":
                assert got[key] == pytest.approx(value, abs=1e-5), key
            elif key == "retrieval_score":
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
            else:
                assert got[key] == value, key


# ------------------------------------------------------------------------------------------------------------------
# What the saved folders declare
# ------------------------------------------------------------------------------------------------------------------


def test_saved_openqa_config_maps_auto_classes_and_question_answering_pipeline_to_folder_code(saved):
    config = json.loads((saved["qa_folder"] / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_realm.RealmConfig",
        "AutoModel": "modeling_realm.RealmForOpenQA",
    }
    qa_entry = config["custom_pipelines"]["question-answering"]
    assert qa_entry["impl"] == "pipeline_realm.RealmQuestionAnsweringPipeline"
    assert qa_entry["pt"] == ["AutoModel"]
    tokenizer_config = json.loads((saved["qa_folder"] / "tokenizer_config.json").read_text())
    assert tokenizer_config["auto_map"]["AutoTokenizer"][0] == "tokenization_realm.RealmTokenizer"


def test_saved_embedder_config_maps_auto_model_to_realm_embedder(saved):
    config = json.loads((saved["embedder_folder"] / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_realm.RealmConfig",
        "AutoModel": "modeling_realm.RealmEmbedder",
    }
    assert "custom_pipelines" not in config


def test_saved_openqa_folder_carries_the_package_code_files_unchanged(saved):
    sources = {name: Path(openrealm.__file__).parent / name for name in CODE_FILES}
    sources["tokenization_realm.py"] = Path(openrealm.tokenization.__file__).parent / "tokenization_realm.py"
    for name, source in sources.items():
        shipped = saved["qa_folder"] / name
        assert shipped.is_file(), name
        assert shipped.read_bytes() == source.read_bytes(), name


# ------------------------------------------------------------------------------------------------------------------
# The environment without openrealm
# ------------------------------------------------------------------------------------------------------------------


def test_remote_environment_is_an_isolated_venv_with_this_torch_and_transformers(remote):
    environment = remote["environment"]
    assert environment["prefix"] != environment["base_prefix"]
    assert environment["transformers"] == transformers.__version__
    assert Version(environment["torch"]).base_version == Version(torch.__version__).base_version
    site_dirs = [path for path in environment["sys_path"] if path.endswith(("site-packages", "dist-packages"))]
    assert site_dirs and all(path.startswith(environment["prefix"]) for path in site_dirs), site_dirs


def test_remote_run_never_imports_openrealm_datasets_or_faiss(remote):
    assert remote["imported"] == []


def test_remote_run_uses_the_classes_from_the_saved_folders_code(remote):
    expected = {
        "pipeline": "RealmQuestionAnsweringPipeline",
        "qa_model": "RealmForOpenQA",
        "qa_tokenizer": "RealmTokenizer",
        "embedder": "RealmEmbedder",
        "embedder_tokenizer": "RealmTokenizer",
    }
    for role, class_name in expected.items():
        module, name = remote["classes"][role]
        assert name == class_name, role
        assert module.startswith("transformers_modules."), (role, module)


def test_remote_pipeline_answers_questions_like_openrealm(remote, saved):
    assert len(remote["answers"]) == len(QUESTIONS)
    assert_answers_match(remote["answers"], saved["answers"])


def test_remote_pipeline_top_k_answers_match_openrealm(remote, saved):
    assert len(saved["top_k"]) == 2
    assert_answers_match(remote["top_k"], saved["top_k"])


def test_remote_pipeline_answer_from_given_context_matches_openrealm(remote, saved):
    assert_answers_match([remote["context"]], [saved["context"]])
    assert CONTEXT[saved["context"]["start"] : saved["context"]["end"]] == saved["context"]["answer"]


def test_remote_tokenizer_gives_the_same_ids_as_openrealm(remote, saved):
    assert remote["token_ids"] == saved["embedder_inputs"]["input_ids"]


def test_remote_embedder_projected_score_matches_openrealm(remote, saved):
    got = torch.tensor(remote["projected_score"])
    expected = torch.tensor(saved["projected_score"])
    assert got.shape == expected.shape == (len(EMBEDDER_TEXTS), tiny_realm_config().retriever_proj_size)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
