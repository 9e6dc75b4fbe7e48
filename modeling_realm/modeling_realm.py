"""REALM models for transformers 5.

REALM's encoders are plain BERT: every class below holds transformers' own `BertModel` under the prefix `realm.`
(state-dict names identical to the published checkpoints, SDPA/flash attention and gradient checkpointing come with
it) and adds only what REALM adds: the retrieval projection, the marginal MLM loss over retrieved documents, the span
reader and the retrieve-then-read open-QA model.

Shapes: B = questions/queries, C = candidate documents per query, L = sequence length, P = retriever_proj_size,
S = blocks retrieved per question, R = blocks read per question (R <= S), V = vocabulary size.

The module is long because, as in a transformers model file, every REALM model class reads in one place.
"""

import contextlib
import contextvars
import glob
import json
import logging as stdlib_logging
import os
import pickle
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from transformers import BertModel, PreTrainedModel
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertLayer,
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertSelfAttention,
)
from transformers.utils import ModelOutput, logging

from .configuration_realm import RealmConfig
from .file_utils import atomic_directory
from .index_realm import INDEX_CONFIG_NAME, RealmBlockIndex, weights_fingerprint
from .retrieval_realm import (
    BLOCK_INDEX_DIR,
    BLOCK_RECORDS_NAME,
    LEGACY_BLOCK_RECORDS_NAME,
    RealmRetriever,
    load_legacy_block_emb,
    normalize_answer_ids,
    refused_pickle_error,
    resolve_folder,
)

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class RealmEmbedderOutput(ModelOutput):
    """`projected_score` [B, P]: the retrieval embedding (LayerNorm(dense(tanh-pooled [CLS])))."""

    projected_score: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class RealmScorerOutput(ModelOutput):
    """`relevance_score` [B, C] = query_score [B, P] · candidate_score [B, C, P]."""

    relevance_score: torch.FloatTensor | None = None
    query_score: torch.FloatTensor | None = None
    candidate_score: torch.FloatTensor | None = None


@dataclass
class RealmReaderOutput(ModelOutput):
    """
    For one question: `loss` = `retriever_loss` + `reader_loss` (+ `passage_loss` with gold passages) (scalars);
    `retriever_correct` [S]; `reader_correct` [R, num_spans]; `block_idx` (0-d, index inside the R blocks read),
    `candidate` (0-d span index),
    `start_pos` / `end_pos` [1] (token positions in the reader input); `reader_logits` [R, num_spans] on request
    (spans listed width-major, see `span_candidates`). For a batch of questions every field gains a
    leading batch axis and `loss` is the mean over questions.
    """

    loss: torch.FloatTensor | None = None
    retriever_loss: torch.FloatTensor | None = None
    reader_loss: torch.FloatTensor | None = None
    retriever_correct: torch.BoolTensor | None = None
    reader_correct: torch.BoolTensor | None = None
    block_idx: torch.LongTensor | None = None
    candidate: torch.LongTensor | None = None
    start_pos: torch.IntTensor | None = None
    end_pos: torch.IntTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    # Only with output_reader_logits=True: span logits + retrieval logit [R, num_spans] (spans listed width-major).
    reader_logits: torch.FloatTensor | None = None
    # Only with gold passages (REALM++ passage supervision): its loss (included in `loss`) and the gold blocks [S].
    passage_loss: torch.FloatTensor | None = None
    passage_correct: torch.BoolTensor | None = None


@dataclass
class RealmForOpenQAOutput(ModelOutput):
    """
    `reader_output`: the reader's prediction (and losses when answers were given).
    `predicted_answer_ids`: the answer's wordpiece ids ([span_len] for one question, a list of them for a batch).
    Provenance: `retrieved_block_ids` [B, S] and `retrieved_logits` [B, S] (q · block embedding, sorted);
    `predicted_block_ids` [B]: the corpus id of the block each answer was read from.
    `reader_input_ids` [B, R, L]: what the reader read (to map the span back to text).
    `loss`: reader_output.loss (what the Trainer optimises), when answers or gold passages were given.
    """

    loss: torch.FloatTensor | None = None
    reader_output: RealmReaderOutput | None = None
    predicted_answer_ids: torch.LongTensor | list[torch.LongTensor] | None = None
    retrieved_block_ids: torch.LongTensor | None = None
    retrieved_logits: torch.FloatTensor | None = None
    predicted_block_ids: torch.LongTensor | None = None
    reader_input_ids: torch.LongTensor | None = None


# ---------------------------------------------------------------------------------------------------------------------
# Heads: what REALM adds to BERT
# ---------------------------------------------------------------------------------------------------------------------


class RealmScorerProjection(nn.Module):
    """The embedder head: LayerNorm(dense(pooled_output)) -> [B, P].

    `predictions` is an MLM head the forward never uses; it exists so the published checkpoints' keys load.
    """

    def __init__(self, config: RealmConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.dense = nn.Linear(config.hidden_size, config.retriever_proj_size)
        self.LayerNorm = nn.LayerNorm(config.retriever_proj_size, eps=config.layer_norm_eps)

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(pooled_output))


class RealmCopyHead(nn.Module):
    """A pointer over the document's wordpieces beside the MLM head (Merity et al. 2017, "Pointer Sentinel Mixture
    Models"; with See et al. 2017's gate, "Get To The Point", section 2.2): p(w) = g * sum_{j in document, x_j = w}
    a_j + (1 - g) * p_MLM(w), a = softmax_j(q(h) . k(h_j) / sqrt(d)) over the document's wordpieces,
    g = sigmoid(gate(h)) (0.5 at initialisation); g = 0 where the document is empty (the null document).

    Why: a small MLM head puts its probability on one wordpiece of the document or on none; it cannot spread it over
    the k names a document holds when it does not tell which one answers, while a pointer can
    (benchmarks/research/reader_that_reads.md, "A head that can hedge"). A departure from BERT, off by default
    (`RealmConfig.copy_head`).
    """

    def __init__(self, config: RealmConfig):
        super().__init__()
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.key.bias.requires_grad_(False)  # q . b_k is the same for every wordpiece: no effect on the output
        self.gate = nn.Linear(config.hidden_size, 1)

    def scores(self, hidden_at: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """q(h) . k(h_j) / sqrt(d) up to a term constant over j, [..., M, L] (float32), for hidden_at [..., M, D] and
        hidden [..., L, D]. q . (W_k h_j + b_k) = (q W_k) . h_j + q . b_k: the last term is the same for every
        wordpiece and cancels in the softmax, so no key is projected (one [M, D] x [D, D] product instead of one per
        wordpiece of every row)."""
        query = self.query(hidden_at) @ self.key.weight  # [..., M, D]
        return torch.einsum("...md,...ld->...ml", query, hidden).float() / hidden.shape[-1] ** 0.5

    def forward(
        self,
        hidden_at: torch.Tensor,
        vocab_log_prob: torch.Tensor,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        document_mask: torch.Tensor,
    ) -> torch.Tensor:
        """hidden_at [..., M, D] and the MLM head's vocab_log_prob [..., M, V] at M positions of sequences whose
        hidden states are hidden [..., L, D], wordpieces input_ids [..., L] and document wordpieces document_mask
        [..., L] -> log p [..., M, V] (float32)."""
        scores = self.scores(hidden_at, hidden)
        document = document_mask.bool()[..., None, :].expand_as(scores)
        attention = scores.masked_fill(~document, torch.finfo(scores.dtype).min).softmax(-1)
        index = input_ids[..., None, :].expand_as(scores)
        copy = torch.zeros_like(vocab_log_prob).scatter_add(-1, index, attention * document)
        gate = self.gate(hidden_at).float()  # [..., M, 1]
        mixed = torch.logaddexp(
            nn.functional.logsigmoid(gate) + copy.clamp_min(1e-30).log(),
            nn.functional.logsigmoid(-gate) + vocab_log_prob,
        )
        has_document = document_mask.bool().any(-1)[..., None, None]
        return torch.where(has_document, mixed, vocab_log_prob)


def document_mask(token_type_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The document's wordpieces in `[CLS] query [SEP] document [SEP]` rows [..., L]: segment B without its closing
    [SEP] (a bool mask [..., L]; none for the null document, whose segment B is the [SEP] alone)."""
    document = (token_type_ids == 1) & attention_mask.bool()
    closing = document & (document.long().cumsum(-1) == document.long().sum(-1, keepdim=True))
    return document & ~closing


def span_candidates(seq_len: int, max_span_width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """All spans of width 1..max_span_width, listed width-major (as the published reader was trained).

    Returns starts, ends [num_spans] with num_spans = W*L - W*(W-1)/2 (end inclusive).
    """
    starts = torch.cat([torch.arange(seq_len - width + 1, device=device) for width in range(1, max_span_width + 1)])
    ends = torch.cat([torch.arange(width - 1, seq_len, device=device) for width in range(1, max_span_width + 1)])
    return starts, ends


def mask_to_score(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where mask is true, the dtype's most negative number elsewhere (an additive logit mask)."""
    return (1.0 - mask.to(dtype)) * torch.finfo(dtype).min


class RealmReaderProjection(nn.Module):
    """Span scorer: dense(2*span_hidden) split into start/end halves, relu(start[s] + end[e]), LayerNorm, then dense
    -> 1."""

    def __init__(self, config: RealmConfig):
        super().__init__()
        self.max_span_width = config.max_span_width
        self.dense_intermediate = nn.Linear(config.hidden_size, config.span_hidden_size * 2)
        self.dense_output = nn.Linear(config.span_hidden_size, 1)
        self.layer_normalization = nn.LayerNorm(config.span_hidden_size, eps=config.reader_layer_norm_eps)
        self.relu = nn.ReLU()

    def forward(
        self, hidden_states: torch.Tensor, block_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden_states [R, L, H], block_mask [R, L] -> span logits [R, num_spans], starts, ends [num_spans].

        A span is valid only when both its start and its end lie in the evidence block.
        """
        starts, ends = span_candidates(hidden_states.shape[1], self.max_span_width, hidden_states.device)
        start_projection, end_projection = self.dense_intermediate(hidden_states).chunk(2, dim=-1)
        span_hidden = start_projection.index_select(1, starts) + end_projection.index_select(1, ends)
        span_hidden = self.layer_normalization(self.relu(span_hidden))
        logits = self.dense_output(span_hidden).squeeze(-1)
        valid = block_mask.index_select(1, starts) & block_mask.index_select(1, ends)
        return logits + mask_to_score(valid, logits.dtype), starts, ends


def marginal_log_loss(logits: torch.Tensor, is_correct: torch.Tensor) -> torch.Tensor:
    """-log sum_{correct} p: logsumexp(all logits) - logsumexp(correct logits), over the last axis."""
    log_numerator = torch.logsumexp(logits + mask_to_score(is_correct, logits.dtype), dim=-1)
    return torch.logsumexp(logits, dim=-1) - log_numerator


# The BERT config fields a REALM config takes over when starting from a BERT checkpoint.
BERT_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)


def find_corrupt_weights(folder) -> str | None:
    """After a failed load: the weights file of a local folder that is truncated or garbled, if any."""
    import zipfile

    from safetensors import safe_open

    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return None
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        try:
            if name.endswith(".safetensors"):
                with safe_open(path, framework="pt") as weights:
                    weights.keys()
            elif name.endswith(".bin"):
                with zipfile.ZipFile(path) as archive:
                    if archive.testzip() is not None:
                        return path
        except Exception:  # noqa: BLE001 - any failure to open means the file is unusable
            return path
    return None


# A key of BERT itself (the backbone every REALM tower holds under `realm.`), as opposed to the heads REALM adds.
BACKBONE_KEY = re.compile(r"(^|\.)realm\.")
# Checkpoint keys a load may leave new or unused without a word, while set (see expected_load_changes).
_EXPECTED_LOAD_CHANGES: contextvars.ContextVar[tuple[tuple[str, ...], tuple[str, ...]]] = contextvars.ContextVar(
    "expected_load_changes", default=((), ())
)


# Starting from BERT: the model keys that may start fresh (REALM's heads, the pooler) and BERT's heads that may go
# unused.
BERT_START_NEW_KEYS = (r"^(?!realm\.)", r"^realm\.pooler\.")
BERT_HEAD_KEYS = (r"^cls\.",)


# The checkpoint a from_pretrained in progress reads, and whether it must hold the backbone (None: not loading).
_LOADING: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar("loading", default=None)


def check_tokenizer_fits(tokenizer, vocab_size: int, source) -> None:
    """A ValueError naming `source` when the tokenizer makes ids the model has no embedding for (len(tokenizer) >
    config.vocab_size): refused when a model, retriever or pipeline is loaded, not an IndexError at the first
    question."""
    if tokenizer is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"{source}: the tokenizer has {len(tokenizer)} tokens but config.json's vocab_size is {vocab_size}, so "
            f"ids from {vocab_size} on have no embedding: use the tokenizer the model was trained with"
        )


def same_vocabulary(tokenizer, other) -> bool:
    """Whether two tokenizers map text to the same ids: the same vocabulary (added tokens included) and casing."""
    return tokenizer.get_vocab() == other.get_vocab() and getattr(tokenizer, "do_lower_case", None) == getattr(
        other, "do_lower_case", None
    )


def document_tower_fingerprint(source, **hub_kwargs) -> str | None:
    """The weights_fingerprint of the document tower an open-QA folder (or Hub repo) records in its own index
    (block_index/index_config.json), else None."""
    path = os.fspath(source)
    name = f"{BLOCK_INDEX_DIR}/{INDEX_CONFIG_NAME}"
    if os.path.isdir(path):
        config_path = os.path.join(path, name)
    else:
        from huggingface_hub import hf_hub_download

        try:
            config_path = hf_hub_download(path, name, **hub_kwargs)
        except Exception:  # noqa: BLE001 - a repo without its own index, no network: nothing recorded
            return None
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        return (json.load(f).get("metadata") or {}).get("embedder_fingerprint")


def model_tokenizer(source, **hub_kwargs):
    """The tokenizer saved with a model (folder or Hub repo), or None when it has none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **hub_kwargs)
    except (OSError, ValueError):
        return None


def corpus_retriever(model_source, corpus, index=None, **hub_kwargs) -> RealmRetriever:
    """The retriever of a user's corpus folder (or Hub repo) and its index (default CORPUS/block_index) for the model
    `model_source`; refused (naming the command that fixes it) when the folder is no corpus, when it was tokenized
    with another vocabulary than the model's, or when it has no index."""
    model_source, name = os.fspath(model_source), os.fspath(corpus)
    folder = resolve_folder(corpus, **hub_kwargs)
    build = f"openrealm corpus build --input YOUR_DOCUMENTS --tokenizer {model_source} --output CORPUS"
    if not any(os.path.isfile(os.path.join(folder, file)) for file in (BLOCK_RECORDS_NAME, LEGACY_BLOCK_RECORDS_NAME)):
        raise FileNotFoundError(f"{name} is not a corpus (no {BLOCK_RECORDS_NAME}): build one with: {build}")
    if index is None and not os.path.isdir(os.path.join(folder, BLOCK_INDEX_DIR)):
        records_only = RealmRetriever.from_pretrained(folder)
        tokenizer = model_tokenizer(model_source, **hub_kwargs)
        if tokenizer is not None and not same_vocabulary(records_only.tokenizer, tokenizer):
            raise ValueError(vocabulary_mismatch(records_only.tokenizer, tokenizer, model_source))
        raise FileNotFoundError(
            f"The corpus {name} has no index ({BLOCK_INDEX_DIR}/): build one with the model: openrealm index build "
            f"--embedder {model_source} --corpus {name} --output {os.path.join(name, BLOCK_INDEX_DIR)}"
        )
    return RealmRetriever.from_pretrained(folder, index=index, require_index=True)


def vocabulary_mismatch(corpus_tokenizer, tokenizer, source) -> str:
    return (
        f"The corpus was tokenized with another vocabulary ({len(corpus_tokenizer)} wordpieces) than the model "
        f"{source} ({len(tokenizer)}): build the corpus with the model's tokenizer (openrealm corpus build "
        f"--tokenizer {source})"
    )


def check_retriever_fits(model, retriever: RealmRetriever, source, tokenizer=None, **hub_kwargs) -> None:
    """Refuse, with a ValueError naming what differs, a retriever (a user's corpus and index) that the open-QA model
    `model`, loaded from `source`, cannot answer from:
    - a corpus tokenized with another vocabulary than the model's `tokenizer` (its reader would read other words);
    - an index whose embeddings are not of the model's dimension (config.retriever_proj_size);
    - an index made by another tower than the model's: the index records the weights_fingerprint of the tower that
      embedded its blocks, which must be the model's question tower or the document tower of its own index.
    An index that records no tower (made in Python, or a 4.x checkpoint's) is served with a warning."""
    if tokenizer is not None and not same_vocabulary(retriever.tokenizer, tokenizer):
        raise ValueError(vocabulary_mismatch(retriever.tokenizer, tokenizer, source))
    check_tokenizer_fits(retriever.tokenizer, model.config.vocab_size, source)
    if not retriever.has_index:
        return
    index = retriever.index
    if index.dim != model.config.retriever_proj_size:
        raise ValueError(
            f"The index holds {index.dim}-d block embeddings but the model {source} embeds questions in "
            f"{model.config.retriever_proj_size} dimensions: build the index with the model (openrealm index build "
            f"--embedder {source})"
        )
    recorded = index.metadata.get("embedder_fingerprint")
    if recorded is None and index.embedder is not None:
        recorded = weights_fingerprint(index.load_embedder())
    if recorded is None:
        logger.warning(
            f"The index records no tower that embedded its blocks: it cannot be checked against the model {source}."
        )
        return
    document_tower = document_tower_fingerprint(source, **hub_kwargs)  # read from the model's own index (JSON)
    if recorded != document_tower and recorded != weights_fingerprint(model.embedder):  # hashed only if needed
        made_by = index.metadata.get("embedder") or "another model"
        raise ValueError(
            f"The index was built by {made_by}, not by the model {source} (its embedder's weights differ): its "
            f"embeddings are not comparable with the model's questions; build the index with the model (openrealm "
            f"index build --embedder {source})"
        )


class MissingWeightsError(ValueError):
    """A checkpoint lacks backbone (BERT) weights the model needs: loading it would leave them randomly initialised."""


def key_prefixes(keys: Iterable[str], depth: int = 2) -> list[str]:
    """The sorted distinct first `depth` dotted components of keys: "realm.encoder.layer.0.x" -> "realm.encoder"."""
    return sorted({".".join(key.split(".")[:depth]) for key in keys})


def check_backbone_loaded(source, missing: Iterable[str], found: Iterable[str]) -> None:
    """Raise MissingWeightsError when a backbone key (`...realm.*`) is missing from the checkpoint `source`.

    missing: the model's keys the checkpoint did not provide, less those an `expected_load_changes` block expects new
    (e.g. the pooler of a BERT saved without one); found: the checkpoint keys it did provide (loaded or left unused).
    The message names the folder, the missing key prefixes and the prefixes found instead, so a checkpoint of another
    layout (e.g. `bert.*` keys given to from_pretrained) is recognisable at a glance.
    """
    lacking = [key for key in missing if BACKBONE_KEY.search(key)]
    if lacking:
        found = key_prefixes(found)
        hint = ""
        if any(prefix.startswith("bert.") for prefix in found):
            hint = (
                " These are BERT keys: a BERT checkpoint loads with from_bert_pretrained; a REALM folder that "
                "OpenREALM "
                "0.1 saved under them loads with from_pretrained(..., key_mapping={r'^bert\\.': 'realm.'})."
            )
        raise MissingWeightsError(
            f"{os.fspath(source)} lacks the backbone weights {key_prefixes(lacking)} ({len(lacking)} tensors); it "
            f"holds {found or 'no weights'} instead. Loading it would train or predict with random weights. Give a "
            "checkpoint of this model (or a BERT checkpoint through from_bert_pretrained), or pass "
            f"allow_missing_backbone=True to start those weights fresh on purpose.{hint}"
        )


class _HeldLoadReports(stdlib_logging.Filter):
    """Keeps transformers' load reports instead of printing them (see held_load_reports); other records pass."""

    def __init__(self):
        super().__init__()
        self.records: list[stdlib_logging.LogRecord] = []

    def filter(self, record: stdlib_logging.LogRecord) -> bool:
        if "LOAD REPORT" not in record.getMessage():
            return True
        self.records.append(record)
        return False


@contextlib.contextmanager
def held_load_reports() -> Iterator[None]:
    """transformers' load report (the table of missing, unexpected and mismatched keys) is printed once the block
    succeeds, and dropped when it fails: the error then says what went wrong, and a failed load prints no table."""
    report_logger = stdlib_logging.getLogger("transformers.modeling_utils")  # transformers' log_state_dict_report
    held = _HeldLoadReports()
    report_logger.addFilter(held)
    try:
        yield
    finally:
        report_logger.removeFilter(held)
    for record in held.records:
        report_logger.handle(record)


class _ExpectedNewTieFilter(stdlib_logging.Filter):
    """Drops transformers' "This checkpoint seem corrupted ... tie X to Y, but both are absent" when X and Y are both
    heads expected to start fresh (a BERT without an MLM head): nothing is corrupted, the tie is made."""

    def __init__(self, new: Iterable[str]):
        super().__init__()
        self.new = re.compile("|".join(new))

    def filter(self, record: stdlib_logging.LogRecord) -> bool:
        message = record.getMessage()
        tied = re.search(r"tie (\S+) to (\S+), but both are absent", message)
        return tied is None or not all(self.new.search(name) for name in tied.groups())


def check_finite_weights(model: nn.Module, source) -> None:
    """Refuse weights holding NaN or inf (a corrupted or crafted file would otherwise load and answer NaN)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{os.fspath(source)}: the weight {name} holds NaN or inf values; the file is corrupted.")


@contextlib.contextmanager
def expected_load_changes(new: Iterable[str] = (), unused: Iterable[str] = ()) -> Iterator[None]:
    """While in this block, loads leave out of transformers' load report the model keys matching a regex of `new`
    (heads the caller creates) and the checkpoint keys matching one of `unused` (heads of another task); every other
    missing or unexpected key is still reported."""
    token = _EXPECTED_LOAD_CHANGES.set((tuple(new), tuple(unused)))
    tie_logger = stdlib_logging.getLogger("transformers.modeling_utils")
    tie_filter = _ExpectedNewTieFilter(new) if new else None
    if tie_filter is not None:
        tie_logger.addFilter(tie_filter)
    try:
        yield
    finally:
        if tie_filter is not None:
            tie_logger.removeFilter(tie_filter)
        _EXPECTED_LOAD_CHANGES.reset(token)


def use_fused_gelu_tanh(model: nn.Module) -> None:
    """Swap transformers' `gelu_new` (the published REALM activation, built from six elementwise ops) for torch's
    fused tanh-approximate GELU: the same formula (differences below 1e-6) at a fraction of the cost; on CPU the
    reader spends about a fifth of its time in this activation. config.hidden_act stays "gelu_new"."""
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, GELUTanh())
        for attribute in ("intermediate_act_fn", "transform_act_fn"):
            if isinstance(getattr(module, attribute, None), NewGELUActivation):
                setattr(module, attribute, GELUTanh())


# What a model's save writes into its folder: on a new save these are replaced or, when the new version lacks them
# (other shards, no retriever), dropped, so that old shards or an old index never sit beside new weights. Every other
# entry of the folder (a model card, checkpoints, notes, .git) is kept.
_WRITTEN_BY_MODEL_SAVE = re.compile(
    r"^(config\.json|generation_config\.json|pipeline_realm\.py|block_index|block_records\.(safetensors|npy)"
    r"|(model|pytorch_model|tf_model|flax_model)[-.\w]*\.(safetensors|bin|h5|msgpack)(\.index\.json)?)$"
)


def kept_beside_model(name: str) -> bool:
    """Whether an entry `name` of a model folder is kept by a new save into it (see replace_folder's keep)."""
    return _WRITTEN_BY_MODEL_SAVE.match(name) is None


def flatten_candidates(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """[B, C, L] -> [B*C, L]; 2-D inputs pass through."""
    if tensor is None or tensor.dim() <= 2:
        return tensor
    return tensor.reshape(-1, tensor.shape[-1])


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


class RealmPreTrainedModel(PreTrainedModel):
    config: RealmConfig
    config_class = RealmConfig
    base_model_prefix = "realm"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertEmbeddings", "BertLayer"]
    _can_record_outputs = {"hidden_states": BertLayer, "attentions": BertSelfAttention}

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *model_args, allow_missing_backbone: bool = False, **kwargs
    ):
        """transformers' from_pretrained, refusing a checkpoint that lacks this model's BERT weights
        (MissingWeightsError naming the folder, the missing and the found key prefixes) unless allow_missing_backbone,
        and with errors that name the problem and the folder for weights that contradict the config and for corrupted
        weight files."""
        token = _LOADING.set((os.fspath(pretrained_model_name_or_path), not allow_missing_backbone))
        try:
            with held_load_reports():
                return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except MissingWeightsError:
            raise
        except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met an object that is not a tensor
            source = os.fspath(pretrained_model_name_or_path)
            pickles = sorted(glob.glob(os.path.join(glob.escape(source), "*.bin")))
            raise refused_pickle_error(
                pickles[0] if pickles else os.path.join(source, "pytorch_model.bin"), error
            ) from None
        except Exception as error:
            if isinstance(error, RuntimeError) and "ignore_mismatched_sizes" in str(error):
                with held_load_reports():  # the retry's table is dropped: the ValueError says what it would
                    _, info = super().from_pretrained(
                        pretrained_model_name_or_path,
                        *model_args,
                        **{**kwargs, "ignore_mismatched_sizes": True, "output_loading_info": True},
                    )
                    details = "; ".join(
                        f"{key}: weights {tuple(stored)} vs config {tuple(expected)}"
                        for key, stored, expected in list(info["mismatched_keys"])[:4]
                    )
                    raise ValueError(
                        f"The config of {pretrained_model_name_or_path} contradicts its weights ({details}). Fix "
                        "config.json or pass ignore_mismatched_sizes=True to re-initialise the mismatched weights."
                    ) from error
            corrupt = find_corrupt_weights(pretrained_model_name_or_path)
            if corrupt is not None:
                raise ValueError(
                    f"The weights file {corrupt} is corrupted or truncated ({type(error).__name__}: {error})."
                ) from error
            raise
        finally:
            _LOADING.reset(token)

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """transformers' filtering of the load report, less the keys an `expected_load_changes` block expects; then,
        before the report is printed, the checks of from_pretrained: finite weights, and the backbone."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        new, unused = _EXPECTED_LOAD_CHANGES.get()
        if new:
            expected = re.compile("|".join(new))
            # kept on the model: a caller can tell which heads start untrained (towers: an encoder without MLM head)
            self.started_fresh_keys = sorted(key for key in loading_info.missing_keys if expected.search(key))
            loading_info.missing_keys = {key for key in loading_info.missing_keys if not expected.search(key)}
        if unused:
            expected = re.compile("|".join(unused))
            loading_info.unexpected_keys = {key for key in loading_info.unexpected_keys if not expected.search(key)}
        loading = _LOADING.get()
        if loading is None:
            return
        source, check_backbone = loading
        check_finite_weights(self, source)
        if check_backbone:
            missing = set(loading_info.missing_keys)
            found = (set(self.state_dict()) - missing) | set(loading_info.unexpected_keys)
            try:
                check_backbone_loaded(source, missing, found)
            except MissingWeightsError:
                # transformers prints its report in a `finally` after this: the error says the same in a few lines.
                loading_info.missing_keys, loading_info.unexpected_keys = set(), set()
                raise

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """transformers' save_pretrained in REALM's key layout, all at once as a loader sees it: everything is written
        to a staging folder beside save_directory, which then replaces it in one step (file_utils.replace_folder).
        Entries of an existing folder that a save does not write (a model card, checkpoints) are kept; old weights,
        shards and index are not."""
        if not kwargs.get("is_main_process", True):
            return super().save_pretrained(save_directory, *args, **kwargs)
        save_directory = os.path.abspath(os.fspath(save_directory))
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory {save_directory} is a file, not a folder.")
        # Always REALM's own layout: transformers would otherwise write the keys back as they were read (a model
        # started from a `bert.*` checkpoint would be saved under `bert.*` and reload with a random encoder).
        kwargs.setdefault("save_original_format", False)
        if kwargs.get("push_to_hub"):  # transformers names the repo after the folder it writes: the staging one here
            kwargs.setdefault("repo_id", os.path.basename(save_directory))
        with atomic_directory(save_directory, keep=kept_beside_model) as staging:
            super().save_pretrained(staging, *args, **kwargs)
            self.save_extra_files(staging)

    def save_extra_files(self, save_directory: str) -> None:
        """Files a subclass saves beside weights and config (none by default)."""

    @classmethod
    def from_bert_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """Start from a plain BERT checkpoint (`bert.*` keys of BertFor*, or the bare keys of a saved BertModel such
        as all-MiniLM-L6-v2): its encoder loads under `realm.`, REALM's own heads are newly initialised (BERT's MLM
        head becomes RealmKnowledgeAugEncoder's). The model saves under REALM's keys; a checkpoint without the BERT
        encoder raises MissingWeightsError.

        RealmConfig fields in kwargs (e.g. retriever_proj_size) override those taken from the BERT config. Only the
        single-encoder classes (RealmEmbedder, RealmKnowledgeAugEncoder, RealmReader) load this way; build a
        RealmScorer or RealmForOpenQA from them.
        """
        from transformers import AutoConfig

        if cls not in (RealmEmbedder, RealmKnowledgeAugEncoder, RealmReader):
            raise ValueError(
                f"{cls.__name__} holds several encoders: load RealmEmbedder/RealmReader.from_bert_pretrained and "
                f"assign them (e.g. model.embedder = RealmEmbedder.from_bert_pretrained(...))."
            )
        realm_fields = {name for name in RealmConfig.__dataclass_fields__}
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in realm_fields}
        bert_config = AutoConfig.from_pretrained(pretrained_model_name_or_path)
        if getattr(bert_config, "model_type", None) != "bert":
            raise ValueError(
                f"{pretrained_model_name_or_path} is a {bert_config.model_type!r} checkpoint; from_bert_pretrained "
                "takes BERT checkpoints."
            )
        fields = {name: getattr(bert_config, name) for name in BERT_CONFIG_FIELDS if hasattr(bert_config, name)}
        config = RealmConfig(**{**fields, **overrides})
        key_mapping = {r"^bert\.": "realm.", r"^(embeddings|encoder|pooler)\.": r"realm.\1."}
        # REALM's heads (and the pooler, absent from BertForMaskedLM checkpoints) start fresh; BERT's own pre-training
        # heads that this class has no place for are left behind. Neither is worth a load report; anything else is.
        with expected_load_changes(new=BERT_START_NEW_KEYS, unused=BERT_HEAD_KEYS):
            return cls.from_pretrained(pretrained_model_name_or_path, config=config, key_mapping=key_mapping, **kwargs)

    def post_init(self) -> None:
        super().post_init()
        use_fused_gelu_tanh(self)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init: normal(0, initializer_range) for Linear/Embedding, 1/0 for LayerNorm, zero biases."""
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            module.bias.zero_()
        elif isinstance(module, BertEmbeddings):
            module.position_ids.copy_(torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            module.token_type_ids.zero_()


class RealmEmbedder(RealmPreTrainedModel):
    """The retriever tower: BERT -> tanh pooler -> dense(P) -> LayerNorm. Embeds queries and blocks alike."""

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = BertModel(config)
        self.cls = RealmScorerProjection(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RealmEmbedderOutput | tuple:
        """input_ids [B, L] -> projected_score [B, P]."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.realm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        projected_score = self.cls(outputs.pooler_output)
        output = RealmEmbedderOutput(
            projected_score=projected_score, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class RealmScorer(RealmPreTrainedModel):
    """Scores C candidate documents per query: relevance_score [B, C] = q · d.

    As in the published checkpoints and Google's code, the query and document towers are one module unless a separate
    `query_embedder` is given.
    """

    # Shared towers: every query_embedder parameter is the embedder's. Buffers (position_ids, token_type_ids) are not
    # parameters, and decoder.bias is already tied inside each embedder (a chained tie would not resolve on load).
    _tied_weights_keys = {
        r"query_embedder\.(?!.*(_ids|decoder\.bias)$)": r"embedder\.(?!.*(_ids|decoder\.bias)$)",
    }

    def __init__(self, config: RealmConfig, query_embedder: RealmEmbedder | None = None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.query_embedder = query_embedder if query_embedder is not None else self.embedder
        if query_embedder is not None:
            self._tied_weights_keys = {}
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        candidate_input_ids: torch.LongTensor | None = None,
        candidate_attention_mask: torch.Tensor | None = None,
        candidate_token_type_ids: torch.LongTensor | None = None,
        candidate_inputs_embeds: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RealmScorerOutput | tuple:
        """Query input_ids [B, L] and candidate_input_ids [B, C, L'] (or candidate_inputs_embeds [B*C, L', H])."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if input_ids is None and inputs_embeds is None:
            raise ValueError("RealmScorer needs the query: pass input_ids or inputs_embeds.")
        if candidate_input_ids is None and candidate_inputs_embeds is None:
            raise ValueError("RealmScorer needs the candidates: pass candidate_input_ids or candidate_inputs_embeds.")
        query_score = self.query_embedder(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        ).projected_score
        candidate_score = self.embedder(
            flatten_candidates(candidate_input_ids),
            attention_mask=flatten_candidates(candidate_attention_mask),
            token_type_ids=flatten_candidates(candidate_token_type_ids),
            position_ids=position_ids,
            inputs_embeds=candidate_inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        ).projected_score
        # The candidate count comes from the inputs (the 4.x port reshaped by config.num_candidates).
        candidate_score = candidate_score.view(query_score.shape[0], -1, query_score.shape[-1])
        relevance_score = torch.einsum("bd,bnd->bn", query_score, candidate_score)
        output = RealmScorerOutput(
            relevance_score=relevance_score, query_score=query_score, candidate_score=candidate_score
        )
        return output if return_dict else output.to_tuple()


class RealmKnowledgeAugEncoder(RealmPreTrainedModel):
    """BERT MLM over `[CLS] query [SEP] document [SEP]` for each of C retrieved documents, with REALM's loss:
    each masked token is marginalised separately over the documents,
    loss = -mean_j logsumexp_c [log p(z_c|x) + log p(y_j|z_c, x)], p(z|x) = softmax(relevance_score) over C.
    """

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "realm.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = BertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.copy_head = RealmCopyHead(config) if config.copy_head else None
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def prediction_scores(
        self,
        hidden_states: torch.Tensor,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """The MLM head's logits at every position of rows hidden_states [S, L, D] -> [S, L, V]; with
        `config.copy_head`, log p (float32, normalised): the head's softmax mixed with the pointer over each row's
        document (input_ids / token_type_ids / attention_mask [S, L], read only then)."""
        scores = self.cls(hidden_states)
        if self.copy_head is None:
            return scores
        document = document_mask(token_type_ids, attention_mask)
        return self.copy_head(hidden_states, scores.float().log_softmax(-1), hidden_states, input_ids, document)

    def masked_log_prob(
        self,
        hidden_states: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """log p(.|z, x) (float32) at N positions: `rows` [N] and `positions` [N] of hidden_states [B, ..., L, D]
        (e.g. [B, K, L, D], one row per candidate) with input_ids / token_type_ids / attention_mask [B, ..., L] ->
        [N, ..., V]: the MLM head's softmax there (the head runs at those positions only), mixed with the copy head's
        pointer over each row's document where `config.copy_head`."""
        hidden_at = hidden_states[rows, ..., positions, :]
        vocab_log_prob = self.cls(hidden_at).float().log_softmax(-1)
        if self.copy_head is None:
            return vocab_log_prob
        document = document_mask(token_type_ids[rows], attention_mask[rows])
        return self.copy_head(
            hidden_at[..., None, :], vocab_log_prob[..., None, :], hidden_states[rows], input_ids[rows], document
        ).squeeze(-2)

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        mlm_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> MaskedLMOutput | tuple:
        """input_ids [B, C, L] (or [B*C, L]), relevance_score [B, C], labels [B, L] (-100 = not a target),
        mlm_mask [B, L] (1 at the masked positions; defaults to labels != -100) -> loss, logits [B*C, L, V] (with
        `config.copy_head`, log p: the MLM head mixed with the pointer over the document, `RealmCopyHead`).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None and relevance_score is None:
            raise ValueError("RealmKnowledgeAugEncoder needs relevance_score [B, C] to compute the loss from labels.")
        if self.copy_head is not None and (input_ids is None or token_type_ids is None or attention_mask is None):
            raise ValueError(
                "the copy head (config.copy_head) needs input_ids, token_type_ids and attention_mask: it points at "
                "the document's wordpieces"
            )
        outputs = self.realm(
            flatten_candidates(input_ids),
            attention_mask=flatten_candidates(attention_mask),
            token_type_ids=flatten_candidates(token_type_ids),
            position_ids=position_ids,
            inputs_embeds=flatten_candidates(inputs_embeds)
            if inputs_embeds is not None and inputs_embeds.dim() > 3
            else inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        prediction_scores = self.prediction_scores(
            outputs.last_hidden_state,
            flatten_candidates(input_ids),
            flatten_candidates(token_type_ids),
            flatten_candidates(attention_mask),
        )

        loss = None
        if labels is not None:
            loss = self.marginal_mlm_loss(prediction_scores, relevance_score, labels, mlm_mask)
        output = MaskedLMOutput(
            loss=loss, logits=prediction_scores, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def marginal_mlm_loss(
        prediction_scores: torch.Tensor,
        relevance_score: torch.Tensor,
        labels: torch.Tensor,
        mlm_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """prediction_scores [B*C, L, V], relevance_score [B, C], labels [B, L] -> scalar loss.

        Departure from the 4.x port: without `mlm_mask` it averaged over every position (unlabelled ones count as
        log-prob 0), diluting the loss; here the default mask is `labels != -100`, which equals the port whenever the
        port was given its mask.
        """
        batch_size, seq_len = labels.shape
        num_candidates = relevance_score.shape[1]
        if mlm_mask is None:
            mlm_mask = labels != -100
        mlm_mask = mlm_mask.to(torch.float32)
        targets = labels.repeat(1, num_candidates).view(-1)
        # log p(y_j | z_c, x) per position; ignored labels give 0.
        token_log_prob = -nn.functional.cross_entropy(
            prediction_scores.view(-1, prediction_scores.shape[-1]).float(), targets, reduction="none"
        ).view(batch_size, num_candidates, seq_len)
        candidate_log_prob = relevance_score.float().log_softmax(-1).unsqueeze(-1)
        marginal_log_prob = (candidate_log_prob + token_log_prob).logsumexp(1)
        return -torch.nansum(torch.sum(marginal_log_prob * mlm_mask) / torch.sum(mlm_mask))


class RealmReader(RealmPreTrainedModel):
    """Reads R blocks `[CLS] question [SEP] block [SEP]` and scores every answer span (width <= max_span_width)
    jointly with the block's retrieval logit: one softmax over (block, span) pairs.

    `cls` is an MLM head the forward never uses; it exists so the published reader checkpoints' keys load.
    """

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = BertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.qa_outputs = RealmReaderProjection(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        block_mask: torch.BoolTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        has_answers: torch.BoolTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_reader_logits: bool = False,
    ) -> RealmReaderOutput | tuple:
        """input_ids [R, L]; relevance_score [S] (S >= R, the first R belong to the inputs); block_mask [S or R, L];
        start_positions / end_positions [S, A] (inclusive, -1 = padding); has_answers [S].
        The loss is computed when all three labels are given.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if relevance_score is None:
            raise ValueError("RealmReader needs relevance_score [S]: the retrieval logits of the blocks.")
        if block_mask is None:
            raise ValueError("RealmReader needs block_mask [R, L]: True on the evidence-block tokens.")
        seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if seq_len < self.config.max_span_width:
            raise ValueError(
                f"The reader input length ({seq_len}) must be at least config.max_span_width "
                f"({self.config.max_span_width})."
            )
        outputs = self.realm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        output = self.read(
            outputs.last_hidden_state,
            relevance_score,
            block_mask,
            start_positions,
            end_positions,
            has_answers,
            output_reader_logits=output_reader_logits,
        )
        output.hidden_states = outputs.hidden_states
        output.attentions = outputs.attentions
        return output if return_dict else output.to_tuple()

    def read(
        self,
        sequence_output: torch.Tensor,
        relevance_score: torch.Tensor,
        block_mask: torch.Tensor,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        has_answers: torch.Tensor | None = None,
        output_reader_logits: bool = False,
    ) -> RealmReaderOutput:
        """Span prediction and losses for one question from the encoded blocks sequence_output [R, L, H]."""
        num_read = sequence_output.shape[0]
        span_logits, starts, ends = self.qa_outputs(sequence_output, block_mask[:num_read].bool())
        # [R, num_spans]: the block's retrieval logit is added to each of its spans (one joint softmax).
        reader_logits = span_logits + relevance_score[:num_read, None].to(span_logits.dtype)
        block_idx = torch.argmax(torch.max(reader_logits, dim=1).values)
        candidate = torch.argmax(torch.max(reader_logits, dim=0).values)
        output = RealmReaderOutput(
            block_idx=block_idx,
            candidate=candidate,
            start_pos=starts.index_select(0, candidate.view(1)),
            end_pos=ends.index_select(0, candidate.view(1)),
            reader_logits=reader_logits if output_reader_logits else None,
        )
        if start_positions is None or end_positions is None or has_answers is None:
            return output

        # Gold positions outside the input (e.g. cut by truncation) can never match a candidate span.
        start_positions = start_positions.clamp(-1, sequence_output.shape[1])[:num_read]
        end_positions = end_positions.clamp(-1, sequence_output.shape[1])[:num_read]
        is_gold_start = starts.view(1, 1, -1) == start_positions.unsqueeze(-1)
        is_gold_end = ends.view(1, 1, -1) == end_positions.unsqueeze(-1)
        reader_correct = (is_gold_start & is_gold_end).any(1)
        retriever_correct = has_answers.bool()

        relevance_score = relevance_score.float()
        reader_logits = reader_logits.float()
        # Each loss is zeroed when nothing is correct (ORQA's masked marginal log-likelihood).
        retriever_loss = marginal_log_loss(relevance_score, retriever_correct) * retriever_correct.any().float()
        reader_loss = marginal_log_loss(reader_logits.view(-1), reader_correct.view(-1)) * reader_correct.any().float()
        output.loss = retriever_loss + reader_loss
        output.retriever_loss = retriever_loss
        output.reader_loss = reader_loss
        output.retriever_correct = retriever_correct
        output.reader_correct = reader_correct
        return output


class RealmForOpenQA(RealmPreTrainedModel):
    """Retrieve-then-read open-domain QA: embed the question, search the retriever's index for the top S blocks,
    read the top R, predict the answer span; with `answer_ids`, ORQA's retriever + reader losses.

    The knowledge corpus and its MIPS index belong to `self.retriever` (a `RealmRetriever`). The legacy `block_emb`
    weight of the 4.x checkpoints is read by the retriever, not held by the model. As in 4.x, a retriever of block
    records alone (no index) is accepted: the model then searches an exact index over all-zero block embeddings
    [config.num_block_records, retriever_proj_size], with a warning, until embeddings are given (`block_emb`).
    """

    # `block_emb` of legacy checkpoints is loaded into the retriever's index (see RealmRetriever.from_pretrained).
    _keys_to_ignore_on_load_unexpected = [r"^block_emb$"]

    def __init__(self, config: RealmConfig, retriever: RealmRetriever | None = None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.reader = RealmReader(config)
        self.retriever = retriever
        self._zero_index = None  # the all-zero placeholder index given to a retriever without one (see _block_index)
        self._zero_index_warned = False
        # Saved into config.json so that `pipeline("question-answering", model=folder, trust_remote_code=True)` runs
        # where openrealm is not installed (where it is, RealmConfig hides this entry; see configuration_realm.py).
        config.custom_pipelines = {
            "question-answering": {
                "impl": "pipeline_realm.RealmQuestionAnsweringPipeline",
                "pt": ["AutoModel"],
                "tf": [],
                "type": "text",
            }
        }
        self.post_init()

    @property
    def searcher_beam_size(self) -> int:
        """Blocks retrieved per question: config.searcher_beam_size in training, config.reader_beam_size in eval."""
        return self.config.searcher_beam_size if self.training else self.config.reader_beam_size

    @property
    def block_emb(self) -> torch.Tensor:
        """The block embeddings [num_blocks, P] of the retriever's index (the 4.x buffer of the same name); for a
        retriever without an index, the all-zero placeholder, which `model.block_emb.copy_(embeddings)` fills in place
        as in 4.x."""
        return self._block_index(warn_if_empty=False).block_emb

    @block_emb.setter
    def block_emb(self, block_emb: torch.Tensor) -> None:
        """`model.block_emb = embeddings` [num_blocks, P]: the retriever searches them exactly from now on."""
        self._require_retriever().swap_index(RealmBlockIndex.build(block_emb, index_type="exact"))

    def block_embedding_to(self, device: str | torch.device) -> None:
        """Move the retriever's index (block embeddings) to `device`."""
        retriever = self._require_retriever()
        retriever.swap_index(self._block_index(warn_if_empty=False).to(device))

    def _block_index(self, warn_if_empty: bool = True) -> RealmBlockIndex:
        """The retriever's index; a retriever of block records alone (as 4.x's, whose embeddings were the model's
        `block_emb` buffer) first gets an exact index over all-zero embeddings [config.num_block_records, P]. With
        warn_if_empty (the forward pass), a warning says so once while those embeddings are still all zero."""
        retriever = self._require_retriever()
        if not retriever.has_index:
            num_blocks, dim = self.config.num_block_records, self.config.retriever_proj_size
            if len(retriever.block_records) != num_blocks:
                raise ValueError(
                    f"The retriever holds {len(retriever.block_records)} block records and no index, and "
                    f"config.num_block_records is {num_blocks}: set config.num_block_records to the number of "
                    "records, or give the block embeddings (retriever.swap_index(RealmBlockIndex.build(block_emb)))."
                )
            self._zero_index = RealmBlockIndex(torch.zeros(num_blocks, dim), index_type="exact")
            self._zero_index_warned = False
            retriever.swap_index(self._zero_index)
        index = retriever.index
        if warn_if_empty and index is self._zero_index and not self._zero_index_warned and not index.block_emb.any():
            logger.warning(
                "RealmForOpenQA: the retriever has no block embeddings, so its index is empty: all "
                f"{index.num_blocks} "
                f"x {index.dim} block embeddings are zero (as 4.x's block_emb before loading), every block scores 0 "
                "and retrieval is arbitrary. Give them with model.block_emb = embeddings (or "
                "model.block_emb.copy_(embeddings)), or retriever.swap_index(RealmBlockIndex.build(embeddings))."
            )
            self._zero_index_warned = True
        return index

    def _require_retriever(self) -> RealmRetriever:
        if self.retriever is None:
            raise ValueError(
                "RealmForOpenQA has no retriever: load it with RealmForOpenQA.from_pretrained(folder) from a folder "
                "that holds block records and an index, or pass retriever=RealmRetriever.from_pretrained(...)."
            )
        return self.retriever

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path,
        *model_args,
        retriever: RealmRetriever | None = None,
        corpus: str | os.PathLike | None = None,
        index: RealmBlockIndex | str | os.PathLike | None = None,
        **kwargs,
    ):
        """Load the model; attach `retriever`, or else the retriever found in the same folder or Hub repo.

        corpus (and index): answer from a corpus folder of the user's instead of the model's own, as
        retriever=RealmRetriever.from_pretrained(corpus, index=index) does (the model's own corpus is not loaded). A
        given retriever that the model cannot answer from is refused (`check_retriever_fits`).

        A given retriever of block records alone (e.g. a folder of 4.x's `RealmRetriever.save_pretrained`) gets the
        `block_emb` weight of a local 4.x checkpoint folder as its exact index, as 4.x loaded it into the model.
        """
        if corpus is not None and retriever is not None:
            raise ValueError("give a retriever or a corpus (with its index), not both")
        if index is not None and corpus is None:
            raise ValueError("index= names the index of a corpus: give the corpus too (corpus=...)")
        if corpus is not None:  # before the model: a corpus that cannot serve it costs no model download
            retriever = corpus_retriever(pretrained_model_name_or_path, corpus, index)
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) with output_loading_info
        path = None if pretrained_model_name_or_path is None else os.fspath(pretrained_model_name_or_path)
        hub_kwargs = {
            key: kwargs[key]
            for key in ("revision", "cache_dir", "token", "local_files_only", "force_download")
            if key in kwargs
        }
        if retriever is not None and path is not None:  # a corpus and index of the user's: do they fit the model?
            check_retriever_fits(model, retriever, path, tokenizer=model_tokenizer(path, **hub_kwargs), **hub_kwargs)
        if retriever is not None and not retriever.has_index and path is not None and os.path.isdir(path):
            block_emb = load_legacy_block_emb(path)
            if block_emb is not None:
                retriever.swap_index(RealmBlockIndex(block_emb, index_type="exact"))
        if retriever is None and pretrained_model_name_or_path is not None:
            retriever = RealmRetriever.from_pretrained(
                pretrained_model_name_or_path,
                missing_ok=True,
                require_index=True,
                trust_remote_code=kwargs.get("trust_remote_code"),
                **hub_kwargs,
            )
        if retriever is not None:
            check_tokenizer_fits(retriever.tokenizer, model.config.vocab_size, path)
        model.retriever = retriever
        return loaded

    def save_extra_files(self, save_directory: str) -> None:
        """Beside weights and config: the pipeline code and, with a retriever, everything needed to answer questions
        from the folder alone (tokenizer, block records, block embeddings and index)."""
        pipeline_code = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_realm.py")
        if os.path.isfile(pipeline_code):
            shutil.copyfile(pipeline_code, os.path.join(save_directory, "pipeline_realm.py"))
        if self.retriever is not None:
            self.retriever.write_files(save_directory)  # save_directory is staged already

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        answer_ids: list | torch.Tensor | None = None,
        return_dict: bool | None = None,
        reader_beam_size: int | None = None,
        searcher_beam_size: int | None = None,
        output_reader_logits: bool = False,
        retrieved_block_ids: torch.LongTensor | None = None,
        answer_patterns: list | None = None,
        gold_block_ids: list | torch.Tensor | None = None,
        gold_passages: list | None = None,
        min_passage_overlap: float = 0.5,
    ) -> RealmForOpenQAOutput | tuple:
        """input_ids [B, Lq] questions; answer_ids: for one question a list of answers (each a list of wordpiece ids,
        no special tokens) or a tensor [A, len] padded with -1; for B questions a list of B such lists (or [B, A,
        len]).

        reader_beam_size / searcher_beam_size override the config for this call (e.g. read 100 blocks at inference,
        as REALM++ does). retrieved_block_ids [B, S]: read and score these blocks instead of searching the index
        (e.g. BM25's); their logits are still q · the index's block embeddings, and the first R of them are read.
        Both beams are capped at the corpus size.

        answer_patterns: per question a list of regular expressions (or None): regex distant supervision, e.g. for
        CuratedTrec, alone or beside answer_ids (see RealmRetriever.build_reader_inputs).
        gold_block_ids (per question a list of block ids, or [B, G] padded with -1) and gold_passages (per question
        the gold passage text, or None): REALM++ passage supervision. The retrieved blocks that are gold (the id, or
        >= min_passage_overlap of the passage's words in the block) add -log sum_{gold} p(block | question) over the S
        retrieved blocks to the loss; zero for a question with no gold block retrieved.
        Returns the answer, losses when answers are given, and provenance.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        retriever = self._require_retriever()
        if not self.training:  # serving: a new corpus version written to the retriever's folder is picked up here
            retriever.reload_if_updated()
        self._block_index()
        if input_ids is None:
            raise ValueError("RealmForOpenQA needs input_ids [B, L] of the questions.")
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        batch_size = input_ids.shape[0]
        num_blocks = retriever.index.num_blocks
        num_searchable = retriever.index.num_searchable  # removed blocks are never retrieved
        num_read = min(reader_beam_size or self.config.reader_beam_size, num_searchable)
        if retrieved_block_ids is not None:
            retrieved_block_ids = check_retrieved_block_ids(retrieved_block_ids, batch_size, num_blocks)
            num_read = min(num_read, retrieved_block_ids.shape[1])
        if searcher_beam_size is None:
            searcher_beam_size = self.config.searcher_beam_size if self.training else num_read
        num_retrieved = min(max(searcher_beam_size, num_read), num_searchable)
        answers = normalize_answer_ids(answer_ids, batch_size)
        gold_block_ids = normalize_gold_block_ids(gold_block_ids, batch_size)
        if gold_passages is not None and len(gold_passages) != batch_size:
            raise ValueError(f"gold_passages must hold one passage text (or None) per question ({batch_size}).")

        # [B, P]
        question_projection = self.embedder(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).projected_score
        # The index only chooses the blocks; their logits are recomputed from the current question embedding so the
        # retriever loss reaches the query tower (document embeddings stay frozen, as in ORQA).
        if retrieved_block_ids is None:
            _, retrieved_block_ids = retriever.search(question_projection.detach(), num_retrieved)
        retrieved_block_emb = retriever.index.embeddings(retrieved_block_ids).to(question_projection)
        retrieved_logits = torch.einsum("bd,bsd->bs", question_projection, retrieved_block_emb)

        question_ids = retriever.question_token_ids(input_ids, attention_mask)
        reader_inputs = retriever.build_reader_inputs(
            question_ids,
            retrieved_block_ids,
            answers,
            max_length=self.config.reader_seq_len,
            answer_patterns=answer_patterns,
        )
        passage_supervised = gold_block_ids is not None or gold_passages is not None
        if passage_supervised:
            passage_correct = retriever.gold_passage_mask(
                retrieved_block_ids, gold_block_ids, gold_passages, min_overlap=min_passage_overlap
            )
        device = self.reader.device
        read_ids = reader_inputs["input_ids"][:, :num_read].to(device)
        seq_len = read_ids.shape[-1]
        sequence_output = self.reader.realm(
            read_ids.reshape(-1, seq_len),
            attention_mask=reader_inputs["attention_mask"][:, :num_read].reshape(-1, seq_len).to(device),
            token_type_ids=reader_inputs["token_type_ids"][:, :num_read].reshape(-1, seq_len).to(device),
            return_dict=True,
        ).last_hidden_state.view(batch_size, -1, seq_len, self.config.hidden_size)

        per_question = []
        for b in range(batch_size):
            labels = {}
            if "has_answers" in reader_inputs:
                labels = {
                    "has_answers": reader_inputs["has_answers"][b].to(device),
                    "start_positions": reader_inputs["start_positions"][b].to(device),
                    "end_positions": reader_inputs["end_positions"][b].to(device),
                }
            per_question.append(
                self.reader.read(
                    sequence_output[b],
                    retrieved_logits[b].to(device),
                    reader_inputs["block_mask"][b].to(device),
                    **labels,
                    output_reader_logits=output_reader_logits,
                )
            )
        if passage_supervised:
            for b, out in enumerate(per_question):
                add_passage_loss(out, retrieved_logits[b].to(device), passage_correct[b].to(device))
        answer_spans = [
            read_ids[b, out.block_idx, out.start_pos.item() : out.end_pos.item() + 1]
            for b, out in enumerate(per_question)
        ]
        predicted_block_ids = torch.stack(
            [
                retrieved_block_ids[b, out.block_idx.to(retrieved_block_ids.device)]
                for b, out in enumerate(per_question)
            ]
        )
        if batch_size == 1:
            reader_output, predicted_answer_ids = per_question[0], answer_spans[0]
        else:
            reader_output, predicted_answer_ids = stack_reader_outputs(per_question), answer_spans

        output = RealmForOpenQAOutput(
            loss=reader_output.loss,
            reader_output=reader_output,
            predicted_answer_ids=predicted_answer_ids,
            retrieved_block_ids=retrieved_block_ids,
            retrieved_logits=retrieved_logits,
            predicted_block_ids=predicted_block_ids,
            reader_input_ids=read_ids,
        )
        if not return_dict:
            # The 4.x tuple: (reader_output, predicted_answer_ids).
            return reader_output, predicted_answer_ids
        return output


def add_passage_loss(output: RealmReaderOutput, retrieved_logits: torch.Tensor, passage_correct: torch.Tensor) -> None:
    """REALM++: -log sum_{gold} p(block | question) over the retrieved blocks [S], zeroed without a gold block;
    added to the question's loss."""
    passage_loss = marginal_log_loss(retrieved_logits.float(), passage_correct) * passage_correct.any().float()
    output.passage_loss = passage_loss
    output.passage_correct = passage_correct
    output.loss = passage_loss if output.loss is None else output.loss + passage_loss


def normalize_gold_block_ids(gold_block_ids, batch_size: int) -> list[list[int]] | None:
    """Per question a list of gold block ids, from lists or a tensor [B, G] padded with -1."""
    if gold_block_ids is None:
        return None
    if isinstance(gold_block_ids, torch.Tensor):
        gold_block_ids = gold_block_ids.reshape(batch_size, -1).tolist()
    if len(gold_block_ids) != batch_size:
        raise ValueError(f"gold_block_ids must hold one list of block ids per question ({batch_size}).")
    return [[int(i) for i in (ids or []) if int(i) >= 0] for ids in gold_block_ids]


def check_retrieved_block_ids(block_ids, batch_size: int, num_blocks: int) -> torch.LongTensor:
    """Given block ids as a LongTensor [B, S] (a 1-D row is one question's); errors name what is wrong."""
    block_ids = torch.as_tensor(block_ids)
    if block_ids.dim() == 1:
        block_ids = block_ids.unsqueeze(0)
    if block_ids.dim() != 2 or block_ids.shape[0] != batch_size or block_ids.shape[1] == 0:
        raise ValueError(
            f"retrieved_block_ids must be [num_questions={batch_size}, S >= 1], got shape {tuple(block_ids.shape)}."
        )
    if block_ids.dtype.is_floating_point or block_ids.dtype == torch.bool:
        raise ValueError(f"retrieved_block_ids must hold integer block ids, got {block_ids.dtype}.")
    if block_ids.min() < 0 or block_ids.max() >= num_blocks:
        raise ValueError(
            f"retrieved_block_ids must lie in [0, {num_blocks}) (the corpus has {num_blocks} blocks), got ids "
            f"from {block_ids.min().item()} to {block_ids.max().item()}."
        )
    return block_ids.long()


def stack_reader_outputs(outputs: list[RealmReaderOutput]) -> RealmReaderOutput:
    """Per-question reader outputs -> one output with a leading batch axis; loss = mean over questions."""
    stacked = RealmReaderOutput()
    for field in (
        "retriever_loss",
        "reader_loss",
        "retriever_correct",
        "reader_correct",
        "block_idx",
        "candidate",
        "start_pos",
        "end_pos",
        "reader_logits",
        "passage_loss",
        "passage_correct",
    ):
        values = [getattr(out, field) for out in outputs]
        if values[0] is not None:
            stacked[field] = torch.stack(values)
    if outputs[0].loss is not None:
        stacked["loss"] = torch.stack([out.loss for out in outputs]).mean()
    return stacked


# The five architectures of the published checkpoints (config.architectures names one of them).
REALM_MODEL_CLASSES = (RealmEmbedder, RealmScorer, RealmKnowledgeAugEncoder, RealmReader, RealmForOpenQA)

__all__ = [
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
]
