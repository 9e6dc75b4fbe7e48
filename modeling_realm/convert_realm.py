"""One-call conversion of a transformers 4.x REALM folder to the OpenREALM layout.

    openrealm.convert_legacy_folder("realm-orqa-nq-openqa", "realm-orqa-nq-openqa-converted")

Weights become safetensors (tied aliases and the `block_emb` weight dropped), `block_records.npy` becomes the
memory-mapped `block_records.safetensors` (read without unpickling), `block_emb` becomes `block_index/`, and the
folder gains the tokenizer files and the Hub custom code.
"""

import os

from transformers import AutoTokenizer

from .configuration_realm import RealmConfig
from .file_utils import atomic_directory
from .index_realm import RealmBlockIndex
from .modeling_realm import REALM_MODEL_CLASSES

MODEL_CLASSES = {cls.__name__: cls for cls in REALM_MODEL_CLASSES}


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
    destination is refused unless `overwrite`, in which case it is replaced only once the new folder is complete.
    """
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

    with atomic_directory(destination, overwrite=overwrite) as staging:
        model.save_pretrained(staging)
        if retriever is None:
            AutoTokenizer.from_pretrained(source).save_pretrained(staging)
    return os.path.abspath(os.fspath(destination))


__all__ = ["convert_legacy_folder"]
