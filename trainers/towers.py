"""Loading, checking and saving REALM's towers: the one place every command (`train ict`, `train pretrain`, `train
openqa`, `index build`, the quickstart) gets its models from and writes them to.

The towers are the embedder (RealmEmbedder: the retriever, queries and blocks alike) and the encoder
(RealmKnowledgeAugEncoder in pre-training; its `realm.*` BERT becomes the reader of RealmForOpenQA). A command takes
each as
- "random": a fresh model sized by config overrides, with the tokenizer's vocabulary;
- a BERT checkpoint (`bert.*` keys of BertForMaskedLM / BertForPreTraining, or the bare keys of a BertModel such as a
  sentence-transformers folder): its encoder loads under `realm.`, REALM's heads start fresh;
- a REALM checkpoint: the tower itself, or the tower inside a RealmScorer / RealmForOpenQA folder.
A checkpoint lacking backbone weights stops the load with MissingWeightsError (folder, missing and found key prefixes):
nothing here trains on random weights by accident. Saved towers are in REALM's key layout and reload bit-exactly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, set_seed
from transformers.utils import logging

from openrealm import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder, RealmScorer
from openrealm.configuration_realm import CONFIG_NAME, check_config_file, read_json_object
from openrealm.file_utils import atomic_directory
from openrealm.index_realm import EMBEDDER_DIR
from openrealm.modeling_realm import BERT_CONFIG_FIELDS, expected_load_changes, kept_beside_model
from openrealm.retrieval_realm import BLOCK_INDEX_DIR

logger = logging.get_logger(__name__)

# The tower inside a multi-tower REALM checkpoint: {architecture: the prefix of its weights}.
EMBEDDER_INSIDE = {"RealmScorer": "embedder.", "RealmForOpenQA": "embedder.", "IctModel": "embedder."}
ENCODER_INSIDE = {"RealmForOpenQA": "reader."}
# Fields of the towers' configs that must agree: RealmForOpenQA holds one config for its embedder and reader.
# The JSON files of a tokenizer saved beside a model (read by AutoTokenizer, whose errors name no file).
TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ARCHITECTURE_FIELDS = tuple(name for name in BERT_CONFIG_FIELDS if not name.endswith("dropout_prob"))


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------

MLM_HEAD = "cls.predictions.transform."  # BERT's MLM head apart from the decoder, which is tied to the word embeddings


def untrained_mlm_head_message(source: str, flag: str) -> str:
    """What `load_encoder` warns when a BERT checkpoint has no masked-LM head."""
    return (
        f"{flag} {source} has no masked-LM head (no cls.predictions.* weights, as in sentence-transformers models): "
        "it "
        "starts untrained, so REALM's encoder cannot fill a [MASK] from a retrieved block and the retriever learns "
        f"from noise. Train it on the corpus first: openrealm train mlm --corpus CORPUS --init {source} --output "
        "ENCODER, then pass --encoder ENCODER (docs/pretraining.md)"
    )


def looks_like_local_path(name: str) -> bool:
    """A name that can only mean a local path, not a Hub id (`name` or `owner/name`): ./x, ../x, /x, ~/x, C:\\x,
    a/b/c."""
    return name.startswith((".", "/", "~")) or "\\" in name or os.path.isabs(name) or name.count("/") > 1


def check_model_folder(name: str, flag: str = "--model") -> None:
    """FileNotFoundError "no such folder" for a model named by a local path that does not exist (transformers would
    call it a malformed Hub repo id); NotADirectoryError for a file; a ValueError naming the file and the line or
    field for a tokenizer file that is not a JSON object or a config.json that no model can be built from
    (check_config_file). A Hub id (`name`, `owner/name`) passes."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"{flag} {name}: not a folder")
        for name in TOKENIZER_JSON_FILES:
            if (path / name).is_file():
                read_json_object(path / name)
        if (path / CONFIG_NAME).is_file():
            check_config_file(path / CONFIG_NAME)
        return
    if looks_like_local_path(name):
        raise FileNotFoundError(f"{flag} {name}: no such folder")


def _checkpoint_config(source: str, flag: str):
    """The config of a checkpoint folder or Hub id, with errors naming the flag and the folder."""
    check_model_folder(source, flag)
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise FileNotFoundError(f"{flag} {source}: cannot read a model config ({error})") from error


# The most parameters a tower may have: training holds 16 bytes a parameter (float32 weights, gradients and AdamW's two
# moments) on each device, and 10 billion (160 GB) is more than the largest accelerator holds.
MAX_TOWER_PARAMETERS = 10**10


def tower_parameters(config) -> int:
    """About how many parameters a BERT tower of `config` (a REALM or BERT config) has, computed from the config alone
    so that a size is refused before anything is allocated: the embeddings, the layers' attention and feed-forward
    matrices, the pooler and the MLM head's transform. Biases, LayerNorms and the embedder's own heads are left out,
    so the count is low (by 30% at most for a tiny tower, far less for a large one), never high."""
    hidden, inner = config.hidden_size, config.intermediate_size
    rows = config.vocab_size + config.max_position_embeddings + getattr(config, "type_vocab_size", 2)
    layers = config.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)
    return rows * hidden + layers + 2 * hidden * hidden


def check_tower_size(config, name: str) -> None:
    """A ValueError naming `name` (e.g. "--init random with --config-overrides ...") when a tower of `config` has more
    than MAX_TOWER_PARAMETERS parameters: no machine trains it, and allocating it fails with a traceback or swaps."""
    count = tower_parameters(config)
    if count > MAX_TOWER_PARAMETERS:
        raise ValueError(
            f"{name}: a tower of hidden_size {config.hidden_size}, {config.num_hidden_layers} layers, "
            f"intermediate_size {config.intermediate_size} and {config.vocab_size} wordpieces has about {count:.2g} "
            f"parameters, more than the {MAX_TOWER_PARAMETERS / 1e9:g} billion that training fits on one device (16 "
            f"bytes each: {16 * MAX_TOWER_PARAMETERS / 1e9:g} GB): give smaller sizes"
        )


def _random_config(tokenizer, config_overrides: dict) -> RealmConfig:
    if tokenizer is None:
        raise ValueError("a random tower needs the tokenizer (its vocabulary size and padding id)")
    overrides = dict(config_overrides)
    overrides.setdefault("vocab_size", len(tokenizer))
    overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    return RealmConfig(**overrides)


def _checked_size(config, overrides: dict, source: str, flag: str) -> None:
    """check_tower_size of the tower built from `config` (a random tower's, or a checkpoint's) with `overrides`."""
    given = f" with --config-overrides {','.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""
    check_tower_size(SimpleNamespace(**{**config.to_dict(), **overrides}), f"{flag} {source}{given}")


def _load_inner(cls, source: str, prefix: str, **kwargs):
    """Only the weights under `prefix` of a multi-tower checkpoint; the other towers' keys are expected leftovers."""
    inner = "^" + re.escape(prefix)
    with expected_load_changes(unused=(r"^(?!realm\.|cls\.)",)):
        return cls.from_pretrained(source, key_mapping={inner: ""}, **kwargs)


def load_embedder(
    source: str | os.PathLike,
    tokenizer=None,
    config_overrides: dict | None = None,
    seed: int = 0,
    flag: str = "--embedder",
    **kwargs,
) -> RealmEmbedder:
    """A RealmEmbedder from "random", a BERT checkpoint, a RealmEmbedder, or the `embedder` of a RealmScorer /
    RealmForOpenQA folder (an ORQA-fine-tuned one was tuned for questions while its blocks stayed frozen) or of an
    ICT checkpoint (OUTPUT/checkpoint-N of `openrealm train ict`).
    config_overrides: RealmConfig fields (sizes of a random model; e.g. retriever_proj_size of a new head); seed: the
    new heads' (and a random model's) initialisation; flag: how the command names this input in errors; kwargs go to
    from_pretrained."""
    overrides = dict(config_overrides or {})
    set_seed(seed)
    source = os.fspath(source)
    if source == "random":
        config = _random_config(tokenizer, overrides)
        _checked_size(config, overrides, source, flag)
        return RealmEmbedder(config)
    config = _checkpoint_config(source, flag)
    _checked_size(config, overrides, source, flag)
    kwargs.setdefault("attn_implementation", "sdpa")
    if config.model_type == "bert":
        return RealmEmbedder.from_bert_pretrained(source, **overrides, **kwargs)
    if config.model_type != "realm":
        raise ValueError(f"{flag} {source} is a {config.model_type!r} checkpoint; it takes REALM or BERT checkpoints")
    architecture = (config.architectures or ["RealmEmbedder"])[0]
    if architecture == "RealmEmbedder":
        return RealmEmbedder.from_pretrained(source, **overrides, **kwargs)
    if architecture not in EMBEDDER_INSIDE:
        raise ValueError(f"{flag} {source} holds a {architecture}, which has no block embedder")
    return _load_inner(RealmEmbedder, source, EMBEDDER_INSIDE[architecture], **overrides, **kwargs)


def document_tower_folder(source: str | os.PathLike) -> Path | None:
    """The document tower saved in a RealmForOpenQA folder (or Hub repo): block_index/embedder/, the tower that
    embedded the blocks its question tower was fine-tuned against (ORQA keeps block embeddings frozen). None when it
    holds none (a 4.x checkpoint keeps only its block embeddings)."""
    source = os.fspath(source)
    inside = Path(BLOCK_INDEX_DIR, EMBEDDER_DIR)
    if os.path.isdir(source):
        folder = Path(source) / inside
        return folder if (folder / CONFIG_NAME).is_file() else None
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(source, allow_patterns=[f"{inside.as_posix()}/*"])) / inside
    except OSError:
        return None
    return folder if (folder / CONFIG_NAME).is_file() else None


def load_block_tower(source: str | os.PathLike, flag: str = "--embedder") -> RealmEmbedder:
    """The tower that embeds a corpus's blocks for an index: of an open-QA checkpoint, its document tower
    (`document_tower_folder`) when it has one, else its question tower; of any other checkpoint, load_embedder's."""
    source = os.fspath(source)
    if source != "random":
        config = _checkpoint_config(source, flag)
        if (config.architectures or [None])[0] == "RealmForOpenQA":
            folder = document_tower_folder(source)
            if folder is not None:
                logger.info(f"{flag} {source}: embedding blocks with its document tower ({folder})")
                return RealmEmbedder.from_pretrained(folder, attn_implementation="sdpa")
    return load_embedder(source, flag=flag)


def load_encoder(
    source: str | os.PathLike,
    tokenizer=None,
    config_overrides: dict | None = None,
    seed: int = 0,
    flag: str = "--encoder",
    warn_untrained_head: bool = True,
    **kwargs,
) -> RealmKnowledgeAugEncoder:
    """A RealmKnowledgeAugEncoder from "random", a BERT checkpoint (its MLM head loaded when it has one), a REALM
    checkpoint whose `realm.*` is the encoder (RealmKnowledgeAugEncoder, RealmReader), or the reader of a
    RealmForOpenQA folder. Arguments as load_embedder; a BERT checkpoint without an MLM head (a sentence-transformers
    model) logs a warning that its head starts untrained, unless warn_untrained_head is False (`train mlm`, which
    trains it)."""
    overrides = dict(config_overrides or {})
    set_seed(seed)
    source = os.fspath(source)
    if source == "random":
        config = _random_config(tokenizer, overrides)
        _checked_size(config, overrides, source, flag)
        return RealmKnowledgeAugEncoder(config)
    config = _checkpoint_config(source, flag)
    _checked_size(config, overrides, source, flag)
    if config.model_type == "bert":
        encoder = RealmKnowledgeAugEncoder.from_bert_pretrained(source, **overrides, **kwargs)
        if warn_untrained_head and any(key.startswith(MLM_HEAD) for key in getattr(encoder, "started_fresh_keys", ())):
            logger.warning(untrained_mlm_head_message(source, flag))
        return encoder
    if config.model_type != "realm":
        raise ValueError(f"{flag} {source} is a {config.model_type!r} checkpoint; it takes REALM or BERT checkpoints")
    architecture = (config.architectures or ["RealmKnowledgeAugEncoder"])[0]
    if architecture in ENCODER_INSIDE:
        return _load_inner(RealmKnowledgeAugEncoder, source, ENCODER_INSIDE[architecture], **kwargs)
    if architecture == "RealmScorer":
        raise ValueError(f"{flag} {source} holds a RealmScorer (the retriever): give it as the embedder")
    # A reader's or an embedder's `realm.*` is the same BERT; heads it lacks (the MLM head) start fresh.
    with expected_load_changes(new=(r"^cls\.",), unused=(r"^(cls|qa_outputs)\.",)):
        return RealmKnowledgeAugEncoder.from_pretrained(source, **overrides, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------------------------------


def check_tokenizer(model: torch.nn.Module, tokenizer, source: str, flag: str) -> None:
    """The model embeds every id of the tokenizer, and a checkpoint that ships its own tokenizer ships the same
    vocabulary (else the corpus ids would mean other words)."""
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"the corpus tokenizer has {len(tokenizer)} tokens but {flag} {source} embeds only "
            f"{model.config.vocab_size}: build the corpus with the model's tokenizer (openrealm corpus build "
            f"--tokenizer {source})"
        )
    if source != "random" and any(os.path.isfile(os.path.join(source, f)) for f in ("tokenizer.json", "vocab.txt")):
        from transformers import AutoTokenizer

        if AutoTokenizer.from_pretrained(source).get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"{flag} {source}'s vocabulary differs from the corpus tokenizer's: the corpus token ids would mean "
                f"other words. Build the corpus with this model's tokenizer (openrealm corpus build --tokenizer "
                f"{source}), or pass --tokenizer."
            )


def fit_length(model: torch.nn.Module, length: int, name: str, setting: str, explicit: bool = False) -> int:
    """The sequence length to feed `model` (named `name` in messages): `length` when it reads that many positions;
    else, for a default length, the model's maximum with a log line; for one the user chose (explicit), an error naming
    the flag (`setting`) to change. A longer sequence would fail later, deep inside the model."""
    limit = model.config.max_position_embeddings
    if length <= limit:
        return length
    if explicit:
        raise ValueError(
            f"{name} reads at most {limit} positions but {setting} {length} was asked for: pass {setting} {limit}"
        )
    logger.warning(f"{setting} lowered from {length} to {limit}: {name} reads at most {limit} positions")
    return limit


def check_same_architecture(embedder: torch.nn.Module, encoder: torch.nn.Module) -> None:
    """RealmForOpenQA has one config for both encoders: their BERT architectures must agree."""
    differences = [
        f"{name}: embedder {getattr(embedder.config, name, None)} vs encoder {getattr(encoder.config, name, None)}"
        for name in ARCHITECTURE_FIELDS
        if getattr(embedder.config, name, None) != getattr(encoder.config, name, None)
    ]
    if differences:
        raise ValueError(
            "The embedder and the encoder must share one BERT architecture for RealmForOpenQA; they differ in "
            + "; ".join(differences)
        )


def check_corpus_ids(blocks, model: torch.nn.Module, corpus_dir: str | os.PathLike, name: str) -> None:
    """Every wordpiece id of the corpus blocks is a row of the model's embedding table (the same vocabulary)."""
    from openrealm.tokenization.corpus_folder import token_id_range

    id_range = token_id_range(blocks)
    if id_range is not None and id_range[1] >= model.config.vocab_size:
        raise ValueError(
            f"corpus {corpus_dir} holds wordpiece id {id_range[1]} but {name} has a vocabulary of "
            f"{model.config.vocab_size}: the corpus was tokenized with another vocabulary"
        )


# ---------------------------------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------------------------------


def scorer_from_embedder(embedder: RealmEmbedder) -> RealmScorer:
    """A RealmScorer (shared query / document tower) holding the embedder's weights."""
    scorer = RealmScorer(embedder.config)
    scorer.embedder.load_state_dict(embedder.state_dict())
    return scorer


def save_tower(
    model: torch.nn.Module, folder: str | os.PathLike, tokenizer=None, files: dict[str, str] | None = None
) -> Path:
    """Write the model (REALM's key layout), the tokenizer and `files` ({name: text}, e.g. a summary JSON or a model
    card) into folder, which is replaced all at once (file_utils.replace_folder): a reader never sees a half-written
    folder or new weights beside old ones; entries a save does not write (checkpoint-* folders, an index) are kept."""
    folder = Path(folder).absolute()
    with atomic_directory(folder, keep=kept_beside_model) as staging:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        for name, text in (files or {}).items():
            Path(staging, name).write_text(text, encoding="utf-8")
    return folder


def freeze_unused_mlm_head(embedder: RealmEmbedder) -> None:
    """Freeze the MLM head inside a RealmEmbedder: it exists only so published checkpoints load and takes no part in
    retrieval. Frozen, it needs no gradient and DDP needs no unused-parameter search. Parameters the head shares with
    the encoder (none in the published layout) stay trainable."""
    used = {id(p) for name, p in embedder.named_parameters() if not name.startswith("cls.predictions.")}
    for parameter in embedder.cls.predictions.parameters():
        if id(parameter) not in used:
            parameter.requires_grad_(False)


__all__ = [
    "check_corpus_ids",
    "check_model_folder",
    "check_same_architecture",
    "check_tokenizer",
    "fit_length",
    "freeze_unused_mlm_head",
    "document_tower_folder",
    "load_block_tower",
    "load_embedder",
    "load_encoder",
    "save_tower",
    "scorer_from_embedder",
]
