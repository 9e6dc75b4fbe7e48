"""One-call conversion of a transformers 4.x REALM folder to the OpenREALM layout.

    openrealm.convert_legacy_folder("realm-orqa-nq-openqa", "realm-orqa-nq-openqa-converted")

Weights become safetensors (tied aliases and the `block_emb` weight dropped), `block_records.npy` becomes the
memory-mapped `block_records.safetensors` (read without unpickling), `block_emb` becomes `block_index/`, and the
folder gains the tokenizer files and the Hub custom code.
"""

import json
import os

from transformers import AutoTokenizer

from .configuration_realm import RealmConfig
from .file_utils import atomic_directory, check_replaceable, path_within
from .index_realm import RealmBlockIndex
from .modeling_realm import REALM_MODEL_CLASSES, kept_beside_model

MODEL_CLASSES = {cls.__name__: cls for cls in REALM_MODEL_CLASSES}
# A folder `convert_legacy_folder` wrote: config.json of model_type "realm" beside safetensors weights (and the custom
# code). Only such a folder, or an empty one, is updated with overwrite=True.
CONVERTED_WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json")
CONVERTED_CODE_NAME = "modeling_realm.py"


def converted_folder_problem(folder: str | os.PathLike) -> str | None:
    """None when `folder` is a REALM folder as convert_legacy_folder writes it (config.json with model_type "realm",
    safetensors weights and the custom code modeling_realm.py), else what it lacks."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return "it is not a folder."
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "realm":
        return 'it is not a converted REALM folder (no config.json with model_type "realm"); remove it yourself.'
    if not any(os.path.isfile(os.path.join(folder, name)) for name in CONVERTED_WEIGHT_NAMES):
        return (
            f"it holds no {' or '.join(CONVERTED_WEIGHT_NAMES)}, so it is not a converted folder; remove it yourself."
        )
    if not os.path.isfile(os.path.join(folder, CONVERTED_CODE_NAME)):
        return f"it holds no {CONVERTED_CODE_NAME}, so it is not a converted folder; remove it yourself."
    return None


def convert_legacy_folder(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    index_type: str = "exact",
    overwrite: bool = False,
    **index_params,
) -> str:
    """Convert `source` (local folder or Hub id) into `destination` (written atomically); returns destination.

    The model class comes from config.architectures. For an open-QA folder, `index_type` / `index_params` choose
    the MIPS index built over the legacy block embeddings (default: exact, as the 4.x port searched). An existing
    destination is refused unless `overwrite`, and then only when it is empty or a folder this function converted
    earlier (see `converted_folder_problem`): it is updated as any save into an existing folder is
    (docs/guarantees.md), all at once once the new files are complete: weights, config, index and records replaced
    (old shards and an old index dropped), everything a conversion does not write kept (a model card, `.git` of a
    clone of the Hub repository, checkpoints). A destination that is, holds or lies inside a local source, or holds
    the working directory, is refused.
    """
    if os.path.exists(os.fspath(source)):
        if path_within(source, destination) or path_within(destination, source):
            relation = "is" if os.path.realpath(source) == os.path.realpath(destination) else "overlaps"
            raise ValueError(
                f"The destination {os.path.abspath(destination)} {relation} the source {os.path.abspath(source)}: "
                "convert into a separate folder (the source is never replaced or written into)."
            )
    check_replaceable(destination, overwrite, converted_folder_problem)  # before the (possibly long) load
    config = RealmConfig.from_pretrained(source)
    architecture = next((name for name in (config.architectures or []) if name in MODEL_CLASSES), None)
    if architecture is None:
        raise ValueError(
            f"{source}: config.architectures {config.architectures} names no REALM class ({', '.join(MODEL_CLASSES)})."
        )
    model = MODEL_CLASSES[architecture].from_pretrained(source)
    retriever = getattr(model, "retriever", None)
    if retriever is not None and index_type != "exact":
        retriever.swap_index(RealmBlockIndex.build(retriever.index.block_emb, index_type=index_type, **index_params))

    with atomic_directory(destination, overwrite, converted_folder_problem, keep=kept_beside_model) as staging:
        model.save_pretrained(staging)
        if retriever is None:
            AutoTokenizer.from_pretrained(source).save_pretrained(staging)
    return os.path.abspath(os.fspath(destination))


__all__ = ["convert_legacy_folder", "converted_folder_problem"]
