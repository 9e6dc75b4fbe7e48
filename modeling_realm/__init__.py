"""OpenREALM: REALM (Retrieval-Augmented Language Model pre-training) for transformers 5.

`import openrealm` registers the REALM classes with transformers' Auto classes (AutoConfig, AutoModel,
AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoTokenizer, including legacy configs that name
"RealmTokenizer") and the `pipeline("question-answering")` task.

The public names are imported on first use; registering imports them all. The `openrealm` command itself registers
only when a command runs, so that `openrealm --help` needs neither torch nor transformers.

This file is the package root of the distribution (setup.cfg maps `openrealm` to modeling_realm/). It is not shipped
as Hub custom code; the model files beside it are, and they import nothing outside modeling_realm/. Registering the
tokenizer is the one reason this root imports the `openrealm.tokenization` subpackage.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Public name -> the submodule defining it. Imported on first use (PEP 562): the submodules pull in torch and
# transformers (3 s), which `openrealm --help` must not pay.
_EXPORTS = {
    "BlockRecords": ".block_records",
    "convert_legacy_block_records": ".block_records",
    "RealmConfig": ".configuration_realm",
    "convert_legacy_folder": ".convert_realm",
    "RealmBlockIndex": ".index_realm",
    "ShardedBlockIndex": ".index_realm",
    **dict.fromkeys(
        (
            "REALM_MODEL_CLASSES",
            "RealmEmbedder",
            "RealmEmbedderOutput",
            "RealmForOpenQA",
            "RealmForOpenQAOutput",
            "RealmKnowledgeAugEncoder",
            "RealmPreTrainedModel",
            "RealmReader",
            "RealmReaderOutput",
            "RealmScorer",
            "RealmScorerOutput",
        ),
        ".modeling_realm",
    ),
    "RealmQuestionAnsweringPipeline": ".pipeline_realm",
    "RealmRetriever": ".retrieval_realm",
    "RealmTokenizer": ".tokenization",
    "RealmTokenizerFast": ".tokenization",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports these (names in __all__)
    from .block_records import BlockRecords, convert_legacy_block_records  # noqa: F401
    from .configuration_realm import RealmConfig  # noqa: F401
    from .convert_realm import convert_legacy_folder  # noqa: F401
    from .index_realm import RealmBlockIndex, ShardedBlockIndex  # noqa: F401
    from .modeling_realm import (  # noqa: F401
        REALM_MODEL_CLASSES,
        RealmEmbedder,
        RealmEmbedderOutput,
        RealmForOpenQA,
        RealmForOpenQAOutput,
        RealmKnowledgeAugEncoder,
        RealmPreTrainedModel,
        RealmReader,
        RealmReaderOutput,
        RealmScorer,
        RealmScorerOutput,
    )
    from .pipeline_realm import RealmQuestionAnsweringPipeline  # noqa: F401
    from .retrieval_realm import RealmRetriever  # noqa: F401
    from .tokenization import RealmTokenizer, RealmTokenizerFast  # noqa: F401


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'openrealm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


_registered = False


def register_with_transformers() -> None:
    """Make transformers' Auto classes and `pipeline` know REALM (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForQuestionAnswering,
        AutoTokenizer,
        pipelines,
    )
    from transformers.pipelines import PIPELINE_REGISTRY

    from .configuration_realm import RealmConfig
    from .modeling_realm import REALM_MODEL_CLASSES, RealmForOpenQA, RealmKnowledgeAugEncoder
    from .pipeline_realm import RealmQuestionAnsweringPipeline
    from .tokenization import RealmTokenizer

    AutoConfig.register("realm", RealmConfig, exist_ok=True)
    # One config type, five architectures: AutoModel picks the class named in config.architectures.
    AutoModel.register(RealmConfig, REALM_MODEL_CLASSES, exist_ok=True)
    AutoModelForMaskedLM.register(RealmConfig, RealmKnowledgeAugEncoder, exist_ok=True)
    AutoModelForQuestionAnswering.register(RealmConfig, RealmForOpenQA, exist_ok=True)
    AutoTokenizer.register(RealmConfig, tokenizer_class=RealmTokenizer, exist_ok=True)
    # Later transformers 5 releases list question-answering among REMOVED_TASKS; openrealm provides it again for
    # REALM checkpoints (earlier 5.x releases, without that list, are overridden by the registration itself).
    getattr(pipelines, "REMOVED_TASKS", {}).pop("question-answering", None)
    PIPELINE_REGISTRY.register_pipeline(
        "question-answering",
        pipeline_class=RealmQuestionAnsweringPipeline,
        pt_model=AutoModelForQuestionAnswering,
        type="text",
    )
    # Saved folders carry auto_map + code files so they also run where only torch and transformers are installed.
    RealmConfig.register_for_auto_class()
    for model_class in REALM_MODEL_CLASSES:
        model_class.register_for_auto_class("AutoModel")
    RealmTokenizer.register_for_auto_class("AutoTokenizer")
    _registered = True


def _is_the_command_line() -> bool:
    """This process is the `openrealm` command (the console script or `python -m openrealm`): it registers REALM
    itself once a command runs (trainers/cli.py), so that `openrealm --help` starts without torch. A spawned
    multiprocessing child of the command (the quickstart's parallel stages) inherits its sys.argv but runs no command:
    its own command line (`python -c ... --multiprocessing-fork`) tells it apart, and it registers on import."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if "--multiprocessing-fork" in argv:
        return False
    console_script = os.path.basename(sys.argv[0]) in ("openrealm", "openrealm.exe")
    return console_script or any(a == "-m" and b == "openrealm" for a, b in zip(argv, argv[1:]))


if not _is_the_command_line():
    register_with_transformers()

__all__ = sorted(_EXPORTS)
