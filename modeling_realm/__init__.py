"""OpenREALM: REALM (Retrieval-Augmented Language Model pre-training) for transformers 5.

`import openrealm` registers the REALM classes with transformers' Auto classes (AutoConfig, AutoModel,
AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoTokenizer, including legacy configs that name
"RealmTokenizer") and the `pipeline("question-answering")` task.

This file is the package root of the distribution (setup.cfg maps `openrealm` to modeling_realm/). It is not shipped
as Hub custom code; the model files beside it are, and they import nothing outside modeling_realm/. Registering the
tokenizer is the one reason this root imports the `openrealm.tokenization` subpackage.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
)
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

from .block_records import BlockRecords, convert_legacy_block_records
from .configuration_realm import RealmConfig
from .convert_realm import convert_legacy_folder
from .index_realm import RealmBlockIndex, ShardedBlockIndex
from .modeling_realm import (
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
from .pipeline_realm import RealmQuestionAnsweringPipeline
from .retrieval_realm import RealmRetriever
from .tokenization import RealmTokenizer, RealmTokenizerFast

__version__ = "0.1.0"


def register_with_transformers() -> None:
    """Make transformers' Auto classes and `pipeline` know REALM (idempotent)."""
    AutoConfig.register("realm", RealmConfig, exist_ok=True)
    # One config type, five architectures: AutoModel picks the class named in config.architectures.
    AutoModel.register(RealmConfig, REALM_MODEL_CLASSES, exist_ok=True)
    AutoModelForMaskedLM.register(RealmConfig, RealmKnowledgeAugEncoder, exist_ok=True)
    AutoModelForQuestionAnswering.register(RealmConfig, RealmForOpenQA, exist_ok=True)
    AutoTokenizer.register(RealmConfig, tokenizer_class=RealmTokenizer, exist_ok=True)
    # transformers 5 removed the question-answering task; openrealm provides it again for REALM checkpoints.
    REMOVED_TASKS.pop("question-answering", None)
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


register_with_transformers()

__all__ = [
    "BlockRecords",
    "RealmBlockIndex",
    "ShardedBlockIndex",
    "RealmConfig",
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmQuestionAnsweringPipeline",
    "RealmReader",
    "RealmReaderOutput",
    "RealmRetriever",
    "RealmScorer",
    "RealmScorerOutput",
    "RealmTokenizer",
    "RealmTokenizerFast",
    "convert_legacy_block_records",
    "convert_legacy_folder",
]
