"""REALM configuration: every field of the transformers 4.x `RealmConfig`, with the same defaults."""

import json
import math
import os

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

CONFIG_NAME = "config.json"
# The smallest value of each size a model can be built with (a corpus may be empty: num_block_records 0).
MINIMUM_SIZES = {
    "vocab_size": 1,
    "hidden_size": 1,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "intermediate_size": 1,
    "max_position_embeddings": 1,
    "type_vocab_size": 1,
    "retriever_proj_size": 1,
    "span_hidden_size": 1,
    "max_span_width": 1,
    "reader_beam_size": 1,
    "searcher_beam_size": 1,
    "reader_seq_len": 1,
    "num_candidates": 1,
    "num_block_records": 0,
}
PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob")
POSITIVE_FLOATS = ("layer_norm_eps", "reader_layer_norm_eps")


class InvalidConfigError(ValueError):
    """A RealmConfig field of the wrong type or out of range (the message names the field; loaders add the file)."""


@strict
class RealmConfig(PreTrainedConfig):
    r"""
    Configuration of the REALM models (embedder, scorer, knowledge-augmented encoder, reader and open-QA model).

    The BERT fields (`vocab_size` … `layer_norm_eps`) size the shared BERT encoder. REALM adds:
    - `retriever_proj_size`: width of the retrieval embedding (128 in the published checkpoints).
    - `num_candidates`: documents per masked query in pre-training (K). The models read the actual count from their
      inputs; this value is only a default for data pipelines.
    - `span_hidden_size`, `max_span_width`, `reader_layer_norm_eps`: the reader's span scorer.
    - `reader_beam_size`: blocks the reader reads per question; `searcher_beam_size`: blocks retrieved per question
      in training mode (the retriever loss is computed over all of them); `reader_seq_len`: length of the reader input
      `[CLS] question [SEP] block [SEP]`.
    - `num_block_records`: size of the knowledge corpus the checkpoint was trained with (informational).
    - `copy_head`: the knowledge-augmented encoder also points at the document's wordpieces (`RealmCopyHead`), a
      departure from BERT's MLM head for small readers (docs/pretraining.md, "Departures"); off in every published
      checkpoint.

    `pad_token_id=1` is kept as published (the BERT vocabulary's `[PAD]` is 0): it only decides which embedding row
    gets no gradient, and keeping it lets the Hub configs round-trip unchanged. Unknown keys of legacy configs
    (`searcher_seq_len`, `use_scann`, …) are accepted and kept as attributes.
    """

    model_type = "realm"

    vocab_size: int = 30522
    hidden_size: int = 768
    retriever_proj_size: int = 128
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_candidates: int = 8
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float | int = 0.02
    layer_norm_eps: float | int = 1e-12
    span_hidden_size: int = 256
    max_span_width: int = 10
    reader_layer_norm_eps: float | int = 1e-3
    reader_beam_size: int = 5
    reader_seq_len: int = 320
    num_block_records: int = 13353718
    searcher_beam_size: int = 5000
    copy_head: bool = False
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    # Read by transformers' BERT modules, which REALM's encoders are built from.
    use_cache: bool = True
    is_decoder: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True

    @property
    def custom_pipelines(self) -> dict:
        """The `custom_pipelines` entry saved for environments without openrealm (Hub custom code).

        Where openrealm is imported, its own registered question-answering pipeline serves these checkpoints, so the
        entry is hidden: otherwise transformers would insist on trust_remote_code for a folder openrealm can run.
        """
        if openrealm_pipeline_registered():
            return {}
        return self.__dict__.get("_hub_custom_pipelines", {})

    @custom_pipelines.setter
    def custom_pipelines(self, value: dict) -> None:
        self.__dict__["_hub_custom_pipelines"] = value

    def to_dict(self) -> dict:
        output = super().to_dict()
        hub_custom_pipelines = output.pop("_hub_custom_pipelines", None)
        if hub_custom_pipelines:
            output["custom_pipelines"] = hub_custom_pipelines
        return output

    def __post_init__(self, **kwargs):
        # Before anything is set: a 4.x config asking for what transformers 5's BERT cannot do is a plain ValueError.
        check_bert_support(kwargs)
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Reject values no model can be built with (called by `strict` on init, after the field types)."""
        check_bert_support(self.__dict__)
        for name, minimum in MINIMUM_SIZES.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"field {name!r} must be at least {minimum}, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"field 'hidden_size' ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for name in PROBABILITIES:
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"field {name!r} must be a probability from 0 to 1, got {getattr(self, name)}")
        for name in POSITIVE_FLOATS:
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"field {name!r} must be a positive number, got {getattr(self, name)}")
        if not 0 <= self.initializer_range < math.inf:  # the std of new weights: nan or inf makes them nan
            raise ValueError(
                f"field 'initializer_range' must be a finite number of at least 0, got {self.initializer_range}"
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"field 'hidden_act' names no activation function: {self.hidden_act!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"field 'pad_token_id' must be an id of the vocabulary (0 to {self.vocab_size - 1}), got "
                f"{self.pad_token_id}"
            )
        architectures = self.architectures
        if architectures is not None and (
            not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures)
        ):
            raise ValueError(f"field 'architectures' must be a list of class names, got {architectures!r}")

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """transformers' from_dict (what AutoConfig and from_pretrained build a config with); a field of the wrong
        type or out of range is an InvalidConfigError naming the field, not `strict`'s nested error."""
        try:
            return super().from_dict(config_dict, **kwargs)
        except InvalidConfigError:
            raise
        except (StrictDataclassError, ValueError) as error:
            cause = error.__cause__ if isinstance(error, StrictDataclassError) and error.__cause__ else error
            raise InvalidConfigError(str(cause)) from error

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """transformers' from_pretrained; an invalid field is an InvalidConfigError naming the file and the field."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except InvalidConfigError as error:
            path = config_file_path(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
            raise InvalidConfigError(f"{path}: {error}") from error


def config_file_path(pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "") -> str:
    """The config file of a local folder, a local file, or a Hub repo (REPO/config.json), as errors name it."""
    name = os.fspath(pretrained_model_name_or_path)
    if os.path.isfile(name):
        return name
    return os.path.join(name, subfolder, CONFIG_NAME) if subfolder else os.path.join(name, CONFIG_NAME)


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object in the file at `path` (a config, a tokenizer file); a ValueError naming the file and, for
    invalid JSON, the line and column, when it is not UTF-8, not JSON or not an object."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def check_config_file(path: str | os.PathLike) -> None:
    """A ValueError naming `path` (and the line, or the field) unless it is a JSON object and, for a REALM config
    (model_type "realm"), one a model can be built from. Reads only the file: loaders call it before the weights."""
    config = read_json_object(path)
    if config.get("model_type") == RealmConfig.model_type:
        try:
            RealmConfig.from_dict(config)
        except InvalidConfigError as error:
            raise InvalidConfigError(f"{os.fspath(path)}: {error}") from error


def check_bert_support(fields: dict) -> None:
    """Refuse the 4.x RealmConfig fields whose values transformers 5's BertModel (REALM's towers) cannot honour.

    4.x's REALM read `position_embedding_type` (absent from RealmConfig, so only ever set by hand) and built
    relative-position attention with extra `distance_embedding` weights and no absolute position embeddings for
    "relative_key" / "relative_key_query"; it pruned attention heads listed in `pruned_heads`. transformers 5's BERT
    has absolute positions only and no head pruning, so such a config is an error rather than a different model.
    Every other 4.x field is honoured by BERT 5 (chunk_size_feed_forward, is_decoder, add_cross_attention, use_cache,
    tie_word_embeddings, output_*) or changes nothing REALM computes (torchscript, gradient_checkpointing).
    """
    position = fields.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"RealmConfig: position_embedding_type={position!r} is not supported; supported: 'absolute' (the only "
            "position embeddings of transformers 5's BertModel, and of every published REALM checkpoint). 4.x built "
            "relative-position attention (distance_embedding weights) for 'relative_key' and 'relative_key_query'."
        )
    pruned_heads = fields.get("pruned_heads") or {}
    if pruned_heads:
        raise ValueError(
            f"RealmConfig: pruned_heads={pruned_heads!r} is not supported; supported: {{}} (no pruned heads). "
            "transformers 5 no longer prunes attention heads, so the smaller attention weights of a pruned 4.x model "
            "cannot be built."
        )


def openrealm_pipeline_registered() -> bool:
    """True when openrealm's question-answering pipeline is registered with transformers in this process."""
    from transformers.pipelines import PIPELINE_REGISTRY

    impl = PIPELINE_REGISTRY.supported_tasks.get("question-answering", {}).get("impl")
    return getattr(impl, "__name__", "") == "RealmQuestionAnsweringPipeline"


__all__ = ["InvalidConfigError", "RealmConfig", "check_config_file", "read_json_object"]
