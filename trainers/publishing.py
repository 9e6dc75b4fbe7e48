"""Publishing, the machinery of `openrealm push` (trainers/jobs/push.py): upload a RealmForOpenQA folder (weights,
tokenizer, knowledge corpus, index, custom code) to the Hub with a model card whose metadata carries the evaluation
results (`model-index`), the corpus and the citation."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from openrealm.configuration_realm import read_json_object
from openrealm.file_utils import writer_lock
from openrealm.hub_cards.model_card import openqa_model_card, write_model_card, written_by_openrealm
from openrealm.hub_cards.space_app import check_space_app_replaceable, write_space_app
from openrealm.index_realm import INDEX_CONFIG_NAME, index_folder
from openrealm.retrieval_realm import BLOCK_INDEX_DIR
from openrealm.trainers.evaluation import read_results
from openrealm.trainers.options import OPENQA_DEV_RESULTS_NAME, OPENQA_SUMMARY_NAME

# What a folder must hold to answer questions on its own (RealmForOpenQA.save_pretrained with a retriever).
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "block_records.safetensors")
# Never uploaded: hidden files (temporaries of atomic writes) and training checkpoints.
IGNORE_PATTERNS = [".*", "**/.*", "checkpoint-*", "checkpoint-*/**"]
# --readme: what push does with a README.md that openrealm did not write (or that was edited since)
README_CHOICES = ("keep", "replace")


def check_readme(folder: str | os.PathLike, readme: str | None) -> bool:
    """Whether push writes its card into FOLDER/README.md: yes when there is none or openrealm wrote it unedited
    (hub_cards.model_card.written_by_openrealm) or readme == "replace"; no with readme == "keep" (it is uploaded as
    it is); otherwise a FileExistsError, before anything is written: the Hub shows README.md as the model card, and a
    hand-written one is the user's (docs/publishing.md, "Your own README.md")."""
    if readme not in (None, *README_CHOICES):
        raise ValueError(f"readme must be one of {', '.join(README_CHOICES)} or None, got {readme!r}")
    path = Path(folder) / "README.md"
    if not path.exists():
        return True
    if readme is not None:
        return readme == "replace"
    if written_by_openrealm(path.read_text(encoding="utf-8", errors="replace")):
        return True
    raise FileExistsError(
        f"{path} is not a card openrealm wrote (or was edited since), and push would replace it: pass --readme keep "
        "to upload it as it is (without the card's results), or --readme replace to write openrealm's card over it"
    )


def searchable_blocks(folder: str | os.PathLike, config: dict) -> int | None:
    """How many blocks the folder's model retrieves from: its index's blocks less those `corpus remove` removed
    (index_config.json), else config.json's num_block_records. What the card says, not the records' rows."""
    try:
        index_config = read_json_object(index_folder(Path(folder) / BLOCK_INDEX_DIR) / INDEX_CONFIG_NAME)
        return int(index_config["num_blocks"]) - int(index_config.get("num_removed", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return config.get("num_block_records")


def check_openqa_folder(folder: str | os.PathLike) -> dict:
    """The folder's config.json, after checking that it is a complete RealmForOpenQA folder (weights, tokenizer,
    block records and index)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"No model folder {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not (folder / "block_index").is_dir():
        missing.append("block_index/")
    if missing:
        raise FileNotFoundError(
            f"{folder} is not a complete RealmForOpenQA folder: missing {', '.join(missing)} (save it with "
            "RealmForOpenQA.save_pretrained on a model that has its retriever, e.g. the output of openrealm train "
            "openqa)"
        )
    config = read_json_object(folder / "config.json")
    if "RealmForOpenQA" not in (config.get("architectures") or []):
        raise ValueError(f"{folder} holds {config.get('architectures')}, not a RealmForOpenQA model")
    return config


def push_openqa_model(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    eval_results: Sequence[str | os.PathLike] = (),
    training_summary: str | os.PathLike | None = None,
    corpus: str | None = None,
    datasets: Sequence[str] | None = None,
    private: bool = False,
    with_demo: bool = False,
    readme: str | None = None,
    api=None,
) -> str:
    """Write the model card into FOLDER/README.md (model-index from the evaluation JSONs) and, with `with_demo`, a
    Space-ready Gradio app (hub_cards/space_app.py); upload the folder to `repo_id` (created if needed). Returns what
    `upload_folder` returns (the commit URL). Without eval_results / training_summary, the folder's own dev results
    and fine-tuning summary (written by `openrealm train openqa`) are used when present. The whole push holds the
    folder's writer lock (file_utils.writer_lock): it waits for a save into the folder, whose swap would otherwise
    mix two versions in the upload and leave the card in the version replaced. readme: what to do with a README.md
    that openrealm did not write (check_readme): None refuses it, "keep" uploads it instead of the card, "replace"
    writes the card over it. The demo's files replace only files an earlier push wrote
    (space_app.check_space_app_replaceable)."""
    from huggingface_hub import HfApi

    with writer_lock(folder):
        config = check_openqa_folder(folder)
        write_card = check_readme(folder, readme)
        if with_demo:
            check_space_app_replaceable(folder)
        # what `openrealm train openqa` left in the folder, so that a push does not drop it from the card
        if not eval_results and (Path(folder) / OPENQA_DEV_RESULTS_NAME).is_file():
            eval_results = [Path(folder) / OPENQA_DEV_RESULTS_NAME]
        if training_summary is None and (Path(folder) / OPENQA_SUMMARY_NAME).is_file():
            training_summary = Path(folder) / OPENQA_SUMMARY_NAME
        evaluations = [read_results(path) for path in eval_results]
        summary = read_json_object(training_summary) if training_summary else None
        card = openqa_model_card(
            evaluations,
            model_name=repo_id,
            training_summary=summary,
            num_blocks=searchable_blocks(folder, config),
            corpus=corpus,
            datasets=list(datasets) if datasets else None,
            with_demo=with_demo,
        )
        if with_demo:
            write_space_app(folder, repo_id)
        if write_card:
            write_model_card(folder, card)
        api = api or HfApi()
        api.create_repo(repo_id, private=private, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message="Upload REALM open-QA model",
            ignore_patterns=IGNORE_PATTERNS,
        )


__all__ = [
    "README_CHOICES",
    "check_readme",
    "push_openqa_model",
]
