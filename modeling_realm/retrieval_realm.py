"""The REALM retriever: the knowledge corpus (block records), its MIPS index, and the reader's inputs.

Folder layout (what `save_pretrained` writes beside the model weights, and what a Hub repo holds):
    block_records.safetensors   titles and texts, memory-mapped (see block_records.py)
    block_index/                block embeddings + index + index_config.json (see index_realm.py)
    vocab.txt, tokenizer files  the tokenizer, loaded through AutoTokenizer
Legacy 4.x open-QA folders hold `block_records.npy` (a pickled object array, read here WITHOUT unpickling) and keep
the block embeddings as the `block_emb` weight of the model checkpoint; both are read as the 4.x port did.

The module is long because it is the whole retriever: records, index, reader inputs, updates and legacy folders.
"""

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer, BatchEncoding
from transformers.utils import logging

from .block_records import (
    BlockRecords,
    convert_legacy_block_records,
    index_block_bytes,
    legacy_block_records_count,
)
from .file_utils import apply_umask_modes, atomic_directory, link_or_copy, missing_folders, remove_empty_folders
from .index_realm import RealmBlockIndex, index_folder

logger = logging.get_logger(__name__)

BLOCK_RECORDS_NAME = "block_records.safetensors"
LEGACY_BLOCK_RECORDS_NAME = "block_records.npy"
BLOCK_INDEX_DIR = "block_index"
LEGACY_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
LEGACY_WEIGHT_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_PATTERNS = ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
# A corpus folder (`openrealm corpus build`): its config (version, build id) and the ids of its removed blocks.
CORPUS_CONFIG_NAME = "corpus_config.json"
CORPUS_REMOVED_IDS_NAME = "removed_ids.safetensors"


def legacy_cache_dir() -> str:
    """Where converted legacy block records are kept (OPENREALM_CACHE, default ~/.cache/openrealm)."""
    return os.environ.get("OPENREALM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "openrealm"))


def unwritable_cache_error(folder: str, error: OSError) -> PermissionError:
    """The error for a legacy cache folder that cannot be created or written, naming it and OPENREALM_CACHE."""
    return PermissionError(
        f"Cannot write the OpenREALM cache folder {folder} ({error.strerror or error}): loading a legacy 4.x folder "
        "converts its block_records.npy once into this cache. Set OPENREALM_CACHE to a writable folder "
        "(e.g. OPENREALM_CACHE=/tmp/openrealm-cache)."
    )


class _DerivedRecordAccess:
    """The 4.x-style accessors of in-memory block records, from their `texts`, `titles` and `text_bytes`."""

    def text(self, block_id: int) -> str:
        return self.texts([block_id])[0]

    def title(self, block_id: int) -> str:
        return self.titles([block_id])[0]

    def record(self, block_id: int) -> dict[str, str]:
        """One block as {"title": ..., "text": ...} (decoded)."""
        return {"title": self.title(block_id), "text": self.text(block_id)}

    def __getitem__(self, key) -> bytes | np.ndarray:
        """The 4.x `block_records[key]`: bytes for an integer, a numpy object array of bytes for a slice, integer ids
        or a boolean mask (see `index_block_bytes`)."""
        return index_block_bytes(key, len(self), self.text_bytes)

    def __iter__(self) -> Iterator[bytes]:
        return (self.text_bytes(i) for i in range(len(self)))

    @property
    def has_passage_ids(self) -> bool:
        return False

    def passage_ids(self, ids) -> list[str | None]:
        """Passage ids of `ids` (see BlockRecords.passage_ids): None for every block here."""
        return [None] * np.asarray(ids, dtype=np.int64).size


class SequenceBlockRecords(_DerivedRecordAccess):
    """Block records held in memory: a sequence of texts (bytes or str), as the 4.x `RealmRetriever` took them."""

    def __init__(self, texts: Sequence, titles: Sequence | None = None):
        self._texts = texts
        self._titles = titles

    def __len__(self) -> int:
        return len(self._texts)

    @staticmethod
    def _decode(value, block_id: int) -> str:
        if isinstance(value, (bytes, np.bytes_)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"block {block_id} of the in-memory block records is not valid UTF-8: {error}"
                ) from error
        return str(value)

    def texts(self, ids) -> list[str]:
        return [self._decode(self._texts[i], i) for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist()]

    def titles(self, ids) -> list[str]:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        if self._titles is None:
            return ["" for _ in ids]
        return [self._decode(self._titles[i], i) for i in ids]

    def text_bytes(self, block_id: int) -> bytes:
        """One block's text as UTF-8 bytes (texts given as str are encoded)."""
        value = self._texts[block_id]
        return bytes(value) if isinstance(value, (bytes, np.bytes_)) else str(value).encode("utf-8")


class ExtendedBlockRecords(_DerivedRecordAccess):
    """Block records with blocks appended in memory (`RealmRetriever.add_blocks`): ids 0..len(base)-1 are base's,
    the next ones the added (title, text) pairs. `save_pretrained` writes them all into one block records file."""

    def __init__(
        self, base, titles: Sequence[str], texts: Sequence[str], passage_ids: Sequence[str | None] | None = None
    ):
        passage_ids = list(passage_ids) if passage_ids is not None else [None] * len(texts)
        if isinstance(base, ExtendedBlockRecords):  # one level: the base records plus every added block
            titles, texts = [*base.added._titles, *titles], [*base.added._texts, *texts]
            base, passage_ids = base.base, [*base.added_passage_ids, *passage_ids]
        self.base = base
        self.added = SequenceBlockRecords(list(texts), list(titles))
        self.added_passage_ids = passage_ids

    def __len__(self) -> int:
        return len(self.base) + len(self.added)

    def _split(self, field: str, ids) -> list[str]:
        ids = np.asarray(ids.detach().cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise IndexError(f"block ids must be in [0, {len(self)}), got [{ids.min()}, {ids.max()}]")
        out, n = [""] * ids.size, len(self.base)
        for part, records, shift in ((ids < n, self.base, 0), (ids >= n, self.added, n)):
            if part.any():
                for j, value in zip(np.flatnonzero(part), getattr(records, field)(ids[part] - shift)):
                    out[j] = value
        return out

    def texts(self, ids) -> list[str]:
        return self._split("texts", ids)

    def titles(self, ids) -> list[str]:
        return self._split("titles", ids)

    @property
    def has_passage_ids(self) -> bool:
        return self.base.has_passage_ids or any(i is not None for i in self.added_passage_ids)

    @property
    def ids_are_paths(self) -> bool:
        return getattr(self.base, "ids_are_paths", False)

    def passage_ids(self, ids) -> list[str | None]:
        """Passage ids of `ids` (see BlockRecords.passage_ids): the base's, then the added blocks' (None: none)."""
        ids = np.asarray(ids.detach().cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).reshape(-1)
        n = len(self.base)
        base = iter(self.base.passage_ids(ids[ids < n]))
        return [next(base) if i < n else self.added_passage_ids[i - n] for i in ids.tolist()]

    def text_bytes(self, block_id: int) -> bytes:
        n = len(self.base)
        return self.base.text_bytes(block_id) if block_id < n else self.added.text_bytes(block_id - n)


def normalize_answer_ids(answer_ids, batch_size: int) -> list[list[list[int]]] | None:
    """Answers as one list of wordpiece-id lists per question.

    Accepts, for one question, a list of answers (lists or 1-D tensors) or a tensor [A, len] padded with -1/-100; for
    B questions, a list of B such values or a tensor [B, A, len]. (The 4.x port silently found no answer when given a
    tensor.)
    """
    if answer_ids is None:
        return None

    def clean(answer) -> list[int]:
        values = answer.tolist() if isinstance(answer, (torch.Tensor, np.ndarray)) else list(answer)
        return [int(v) for v in values if int(v) >= 0]

    def per_question(answers) -> list[list[int]]:
        if isinstance(answers, (torch.Tensor, np.ndarray)):
            if answers.ndim == 1:
                answers = answers[None]
            if answers.ndim != 2:
                raise ValueError(
                    f"answer_ids of one question must be [num_answers, length], got shape {answers.shape}"
                )
        cleaned = [clean(answer) for answer in answers]
        return [answer for answer in cleaned if answer]

    def depth(value) -> int:
        if isinstance(value, (torch.Tensor, np.ndarray)):
            return value.ndim
        if isinstance(value, (list, tuple)):
            # The deepest element: a question without answers ([]) sits beside questions with some.
            return 1 + max((depth(item) for item in value), default=1)
        return 0

    if depth(answer_ids) == 2 and batch_size == 1:
        answer_ids = [answer_ids]
    if depth(answer_ids) != 3 or len(answer_ids) != batch_size:
        raise ValueError(
            f"answer_ids must hold one list of answers per question ({batch_size} question(s)); each answer is a list "
            "of wordpiece ids without special tokens."
        )
    return [per_question(answers) for answers in answer_ids]


def find_answer_spans(block_ids: list[int], offset: int, answers: list[list[int]]) -> tuple[list[int], list[int]]:
    """Every occurrence of every answer (exact wordpiece match) in block_ids; positions shifted by offset,
    inclusive."""
    starts, ends = [], []
    for answer in answers:
        width = len(answer)
        for idx in range(len(block_ids) - width + 1):
            if block_ids[idx] == answer[0] and block_ids[idx : idx + width] == answer:
                starts.append(offset + idx)
                ends.append(offset + idx + width - 1)
    return starts, ends


def compile_answer_patterns(
    answer_patterns: Sequence[Sequence[str] | str | None] | None, batch_size: int
) -> list[list[re.Pattern]] | None:
    """Per question, its answer regexes compiled as ORQA's CuratedTrec scorer does (IGNORECASE | UNICODE |
    MULTILINE); a question may have None. An invalid pattern is an error naming it."""
    if answer_patterns is None:
        return None
    if isinstance(answer_patterns, str) or len(answer_patterns) != batch_size:
        raise ValueError(f"answer_patterns must hold one list of regular expressions per question ({batch_size}).")
    compiled = []
    for b, patterns in enumerate(answer_patterns):
        patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
        question_patterns = []
        for pattern in patterns:
            try:
                question_patterns.append(re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE))
            except re.error as error:
                raise ValueError(
                    f"answer pattern {pattern!r} of question {b} is not a valid regular expression: {error}"
                ) from error
        compiled.append(question_patterns)
    return compiled


def find_pattern_spans(
    text: str, offsets: Sequence[tuple[int, int]], offset: int, patterns: Sequence[re.Pattern]
) -> tuple[list[int], list[int]]:
    """Regex distant supervision: wordpiece spans of `text` matched by any of `patterns` (re.finditer).

    offsets: (char start, end) of each wordpiece of the (possibly truncated) block. A match, stripped of surrounding
    whitespace, counts when it neither starts nor ends inside a word and both ends fall on wordpiece boundaries
    (a match cut by the truncation is dropped). Positions are shifted by offset, end inclusive.
    """
    token_at_start, token_at_end = {}, {}
    for position, (start, end) in enumerate(offsets):
        token_at_start.setdefault(start, position)
        token_at_end[end] = position
    starts, ends = [], []
    for pattern in patterns:
        for match in pattern.finditer(text):
            start, end = match.span()
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            inside_word = (start > 0 and is_word_char(text[start - 1]) and is_word_char(text[start])) or (
                end < len(text) and is_word_char(text[end - 1]) and is_word_char(text[end])
            )
            if start == end or inside_word or start not in token_at_start or end not in token_at_end:
                continue
            first, last = token_at_start[start], token_at_end[end]
            if first <= last:
                starts.append(offset + first)
                ends.append(offset + last)
    return starts, ends


def is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def passage_words(text: str) -> set[str]:
    """The distinct lower-cased words of a text (runs of letters, digits and underscores)."""
    return set(re.findall(r"\w+", text.lower()))


def word_overlap(passage: str, block: str) -> float:
    """The fraction of the passage's distinct words that occur in the block (0 for a passage without words)."""
    words = passage_words(passage)
    return len(words & passage_words(block)) / len(words) if words else 0.0


class RealmRetriever:
    """Owns the knowledge corpus (`block_records`: one record per block, title and text), its MIPS index
    (`RealmBlockIndex`, swappable at run time) and the tokenizer, and builds the reader's inputs.

    As in 4.x, `block_records[i]` is block i's text as UTF-8 bytes and `block_records[ids]` (a slice, a list, an
    integer array or a boolean mask) a numpy object array of bytes; `block_records.record(i)` gives
    {"title", "text"}, and `texts(ids)` / `titles(ids)` decoded strings.

    Args:
        block_records: `BlockRecords` (memory-mapped), or a sequence of block texts (bytes or str) as in 4.x.
        tokenizer: a BERT WordPiece tokenizer (`AutoTokenizer` of the checkpoint).
        index: the `RealmBlockIndex` over the blocks' embeddings (row i = block i). Needed to search.
    """

    def __init__(self, block_records, tokenizer, index: RealmBlockIndex | None = None):
        if not hasattr(block_records, "texts"):
            block_records = SequenceBlockRecords(block_records)
        self.block_records = block_records
        self.tokenizer = tokenizer
        self._index_lock = threading.Lock()
        self._index = None
        if index is not None:
            self.swap_index(index)
        # The local folder this retriever was loaded from and the identity of its files then: `reload_if_updated`
        # compares them to pick up a new version written there (corpus add / remove) without a restart.
        self.source_folder: str | None = None
        self._source_stamp: tuple | None = None

    # ----------------------------------------------------------------------------------------------------------------
    # Index
    # ----------------------------------------------------------------------------------------------------------------

    @property
    def index(self) -> RealmBlockIndex:
        if self._index is None:
            raise ValueError("This RealmRetriever has no index: pass index= or load one with from_pretrained.")
        return self._index

    @property
    def has_index(self) -> bool:
        """False for a retriever of block records alone (as 4.x's RealmRetriever always was)."""
        return self._index is not None

    @property
    def index_version(self) -> int | None:
        return None if self._index is None else self._index.version

    def swap_index(self, index: RealmBlockIndex) -> None:
        """Replace the index (e.g. after a refresh); takes effect for the next search. Row count must match."""
        if index.num_blocks != len(self.block_records):
            raise ValueError(
                f"The index has {index.num_blocks} block embeddings but the block records hold "
                f"{len(self.block_records)} blocks: row i of the embeddings must be block i."
            )
        with self._index_lock:
            self._index = index

    def search(self, query_emb: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query_emb [Q, P] -> (scores [Q, k], block ids [Q, k]), best first."""
        with self._index_lock:
            index = self.index
        if k > index.num_searchable:
            raise ValueError(f"Cannot retrieve {k} blocks from a corpus of {index.num_searchable} blocks.")
        return index.search(query_emb, k)

    # ----------------------------------------------------------------------------------------------------------------
    # A living corpus: add and remove blocks, pick up a new version
    # ----------------------------------------------------------------------------------------------------------------

    def add_blocks(
        self,
        titles: Sequence[str],
        texts: Sequence[str],
        block_emb: torch.Tensor | None = None,
        embedder: torch.nn.Module | None = None,
        max_length: int = 288,
        batch_size: int = 32,
        passage_ids: Sequence[str | None] | None = None,
    ) -> list[int]:
        """Append blocks (one title and one block-sized text each) to the corpus and the index; returns their ids,
        num_blocks .. num_blocks + M - 1. Existing ids never change, so provenance stays valid.

        block_emb [M, P]: their embeddings; else they are embedded as `[CLS] title [SEP] text [SEP]` by `embedder`,
        by default the index's own snapshot (`index.load_embedder()`: the tower that embedded the other blocks). A
        block longer than max_length wordpieces is refused (split articles into blocks first: `openrealm corpus add`
        does). passage_ids: the blocks' passage ids (BlockRecords.passage_ids; None: none). Takes effect for the next
        search; `save_pretrained` writes the new version."""
        titles, texts = [str(title) for title in titles], [str(text) for text in texts]
        if len(titles) != len(texts) or not texts:
            raise ValueError(
                f"add_blocks needs as many titles as texts, at least one: got {len(titles)} and {len(texts)}"
            )
        if passage_ids is not None and len(passage_ids) != len(texts):
            raise ValueError(f"add_blocks got {len(passage_ids)} passage ids for {len(texts)} blocks")
        if not self.has_index:  # records alone (a corpus not indexed yet): the index built later embeds them
            with self._index_lock:
                first = len(self.block_records)
                self.block_records = ExtendedBlockRecords(self.block_records, titles, texts, passage_ids)
            return list(range(first, first + len(texts)))
        index = self.index
        if block_emb is None:
            embedder = embedder if embedder is not None else index.load_embedder()
            if embedder is None:
                raise ValueError(
                    "The index stores no embedder snapshot (e.g. it was converted from a 4.x checkpoint): pass the "
                    "embedder that made its block embeddings (embedder=RealmEmbedder.from_pretrained(...))."
                )
            block_emb = self.embed_blocks(embedder, titles, texts, max_length, batch_size)
        elif tuple(block_emb.shape) != (len(texts), index.dim):
            raise ValueError(f"block_emb must be [{len(texts)}, {index.dim}], got {tuple(block_emb.shape)}")
        new_index = index.add(block_emb)
        with self._index_lock:
            first = len(self.block_records)
            self.block_records = ExtendedBlockRecords(self.block_records, titles, texts, passage_ids)
            self._index = new_index
        return list(range(first, first + len(texts)))

    def embed_blocks(
        self,
        embedder: torch.nn.Module,
        titles: Sequence[str],
        texts: Sequence[str],
        max_length: int = 288,
        batch_size: int = 32,
    ) -> torch.Tensor:
        """`[CLS] title [SEP] text [SEP]` of each block through `embedder` (eval mode, no grad) -> float32 CPU [M,
        P]."""
        device = next(embedder.parameters()).device
        out = []
        was_training = embedder.training
        embedder.eval()
        try:
            for start in range(0, len(texts), batch_size):
                pair = (list(titles[start : start + batch_size]), list(texts[start : start + batch_size]))
                encoded = self.tokenizer(*pair, padding=True, return_tensors="pt")
                too_long = (encoded["attention_mask"].sum(1) > max_length).nonzero()
                if len(too_long):
                    i = start + int(too_long[0, 0])
                    raise ValueError(
                        f"block {i} ({titles[i]!r}) has {int(encoded['attention_mask'][i - start].sum())} wordpieces "
                        f"with its title; a block holds at most {max_length}: split the text into blocks first"
                    )
                with torch.no_grad():
                    out.append(embedder(**encoded.to(device)).projected_score.float().cpu())
        finally:
            embedder.train(was_training)
        return torch.cat(out)

    def remove_blocks(self, block_ids) -> None:
        """Never retrieve these blocks again (their rows and records stay, so other ids and old provenance hold)."""
        new_index = self.index.remove(block_ids)
        with self._index_lock:
            self._index = new_index

    def block_ids_of_titles(self, titles: Sequence[str], exclude=None) -> list[int]:
        """Ids of the blocks whose title is one of `titles` (a document's blocks share its title), leaving out
        `exclude` (default: the index's removed blocks)."""
        if exclude is None:
            exclude = self.index.removed_ids if self.has_index else ()
        wanted, gone, found, step = set(titles), set(np.asarray(exclude).tolist()), [], 4096
        for start in range(0, len(self.block_records), step):
            chunk = self.block_records.titles(range(start, min(start + step, len(self.block_records))))
            found.extend(start + i for i, title in enumerate(chunk) if title in wanted and start + i not in gone)
        return found

    def reload_if_updated(self) -> bool:
        """Pick up a new version of the folder this retriever was loaded from (written by `corpus add` / `remove`,
        an index build, or a save): records and index are swapped together for the next search. Returns whether it
        did. Costs two stat calls when nothing changed; called by the pipeline between requests and by
        RealmForOpenQA's forward outside training. A version that cannot be loaded (being replaced) is retried at
        the next call."""
        if self.source_folder is None or _folder_stamp(self.source_folder) == self._source_stamp:
            return False
        try:
            fresh = type(self).from_pretrained(self.source_folder, tokenizer=self.tokenizer)
        except (OSError, ValueError) as error:
            logger.warning(
                f"{self.source_folder} changed but cannot be loaded yet ({error}); keeping the current version"
            )
            return False
        index = fresh._index
        if index is not None and self._index is not None and self._index.device != index.device:
            index = index.to(self._index.device)
        with self._index_lock:
            self.block_records, self._index, self._source_stamp = fresh.block_records, index, fresh._source_stamp
        logger.info(
            f"{self.source_folder}: now serving {len(self.block_records)} blocks (index version "
            f"{index.version if index else None})"
        )
        return True

    # ----------------------------------------------------------------------------------------------------------------
    # Reader inputs
    # ----------------------------------------------------------------------------------------------------------------

    def question_token_ids(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> list[list[int]]:
        """The question wordpieces without [CLS]/[SEP]/padding, taken from the ids as given (the 4.x port decoded
        and re-tokenized them, which dropped out-of-vocabulary words)."""
        questions = []
        for row, ids in enumerate(input_ids.tolist()):
            if attention_mask is not None:
                ids = [i for i, keep in zip(ids, attention_mask[row].tolist()) if keep]
            else:
                ids = [i for i in ids if i != self.tokenizer.pad_token_id]
            if ids and ids[0] == self.tokenizer.cls_token_id:
                ids = ids[1:]
            if ids and ids[-1] == self.tokenizer.sep_token_id:
                ids = ids[:-1]
            questions.append(ids)
        return questions

    def block_token_ids(self, block_ids: Sequence[int]) -> list[list[int]]:
        """Wordpieces of the blocks' texts (no title: REALM's reader reads the body only)."""
        texts = self.block_records.texts(block_ids)
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def build_reader_inputs(
        self,
        question_ids: list[list[int]],
        block_ids: torch.Tensor,
        answer_ids: list[list[list[int]]] | None = None,
        max_length: int | None = None,
        answer_patterns: Sequence[Sequence[str] | str | None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """`[CLS] question [SEP] block [SEP]` for each question and each of its retrieved blocks.

        question_ids: B lists of wordpieces; block_ids [B, S]; answer_ids: per question a list of answers (wordpiece
        ids, matched exactly); answer_patterns: per question a list of regular expressions (CuratedTrec), matched
        case-insensitively in the block text; a match counts when it starts and ends on word boundaries that are also
        wordpiece boundaries (see `find_pattern_spans`). A question may have both, or None for either.
        Returns input_ids, attention_mask, token_type_ids, block_mask [B, S, L] (L = longest row; block_mask is True
        on block wordpieces only), and with answers or patterns has_answers [B, S] and start_positions / end_positions
        [B, S, A] (inclusive, padded with -1). The question is kept whole and the block is cut to fit max_length, as in
        ORQA; a question longer than half of max_length is truncated with a warning.
        """
        cls_id, sep_id, pad_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id
        max_length = max_length or self.tokenizer.model_max_length
        block_ids = torch.as_tensor(block_ids).reshape(len(question_ids), -1)
        patterns = compile_answer_patterns(answer_patterns, len(question_ids))
        texts = self.block_records.texts(block_ids.reshape(-1).tolist())
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=patterns is not None)
        block_tokens = encoded["input_ids"]
        num_blocks = block_ids.shape[1]
        supervised = answer_ids is not None or patterns is not None

        rows, type_rows, spans = [], [], []
        for b, question in enumerate(question_ids):
            if len(question) > max_length // 2:
                logger.warning(
                    f"Question {b} has {len(question)} wordpieces; truncated to {max_length // 2} (half of the reader "
                    f"input length {max_length})."
                )
                question = question[: max_length // 2]
            budget = max_length - len(question) - 3
            for s in range(num_blocks):
                flat = b * num_blocks + s
                block = block_tokens[flat][:budget]
                rows.append([cls_id, *question, sep_id, *block, sep_id])
                type_rows.append([0] * (len(question) + 2) + [1] * (len(block) + 1))
                if not supervised:
                    continue
                starts, ends = [], []
                if answer_ids is not None:
                    starts, ends = find_answer_spans(block, len(question) + 2, answer_ids[b])
                if patterns is not None and patterns[b]:
                    offsets = encoded["offset_mapping"][flat][: len(block)]
                    more_starts, more_ends = find_pattern_spans(texts[flat], offsets, len(question) + 2, patterns[b])
                    starts, ends = starts + more_starts, ends + more_ends
                spans.append((starts, ends))

        seq_len = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
        token_type_ids = torch.zeros((len(rows), seq_len), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), seq_len), dtype=torch.long)
        block_mask = torch.zeros((len(rows), seq_len), dtype=torch.bool)
        for r, (row, types) in enumerate(zip(rows, type_rows)):
            input_ids[r, : len(row)] = torch.tensor(row)
            token_type_ids[r, : len(row)] = torch.tensor(types)
            attention_mask[r, : len(row)] = 1
            block_start = types.index(1) if 1 in types else len(row)
            block_mask[r, block_start : len(row) - 1] = True

        shape = (len(question_ids), num_blocks, seq_len)
        inputs = {
            "input_ids": input_ids.view(shape),
            "attention_mask": attention_mask.view(shape),
            "token_type_ids": token_type_ids.view(shape),
            "block_mask": block_mask.view(shape),
        }
        if supervised:
            max_answers = max(len(starts) for starts, _ in spans)
            starts = torch.full((len(rows), max_answers), -1, dtype=torch.long)
            ends = torch.full((len(rows), max_answers), -1, dtype=torch.long)
            for r, (row_starts, row_ends) in enumerate(spans):
                starts[r, : len(row_starts)] = torch.tensor(row_starts, dtype=torch.long)
                ends[r, : len(row_ends)] = torch.tensor(row_ends, dtype=torch.long)
            inputs["has_answers"] = torch.tensor([len(s) > 0 for s, _ in spans]).view(shape[:2])
            inputs["start_positions"] = starts.view(*shape[:2], max_answers)
            inputs["end_positions"] = ends.view(*shape[:2], max_answers)
        return inputs

    def gold_passage_mask(
        self,
        block_ids: torch.Tensor,
        gold_block_ids: list[list[int]] | None = None,
        gold_passages: Sequence[str | None] | None = None,
        min_overlap: float = 0.5,
    ) -> torch.BoolTensor:
        """REALM++ passage supervision: which retrieved blocks [B, S] are a question's gold evidence.

        A block is gold when its id is one of the question's gold_block_ids, or when at least `min_overlap` of the
        distinct words of the question's gold passage text occur in the block (`word_overlap`; REALM++ used 50%).
        """
        block_ids = torch.as_tensor(block_ids)
        mask = torch.zeros(block_ids.shape, dtype=torch.bool)
        if gold_block_ids is not None:
            for b, ids in enumerate(gold_block_ids):
                if ids:
                    mask[b] = torch.isin(block_ids[b].cpu(), torch.tensor(ids, dtype=torch.long))
        if gold_passages is not None:
            for b, passage in enumerate(gold_passages):
                if passage:
                    texts = self.block_records.texts(block_ids[b].tolist())
                    overlaps = torch.tensor([word_overlap(passage, text) for text in texts])
                    mask[b] |= overlaps >= min_overlap
        return mask

    def __call__(self, retrieved_block_ids, question_input_ids, answer_ids=None, max_length=None, return_tensors="pt"):
        """The 4.x call for one question: -> (has_answers, start_pos, end_pos, concat_inputs).

        has_answers (list of S bools), start_pos / end_pos (S lists of inclusive positions, padded with -1; S empty
        lists when no block holds an answer) are Python lists, or all None without answer_ids. concat_inputs is a
        BatchEncoding of input_ids, attention_mask, token_type_ids and special_tokens_mask [S, L] int64 arrays:
        torch tensors for return_tensors="pt", numpy arrays for "np". special_tokens_mask is 1 on [CLS], the two [SEP]
        and padding only, as 4.x's tokenizer call with return_special_tokens_mask=True gives.
        """
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}.")
        question_input_ids = torch.as_tensor(question_input_ids).cpu()
        if question_input_ids.dim() == 1:
            question_input_ids = question_input_ids.unsqueeze(0)
        questions = self.question_token_ids(question_input_ids[:1])
        block_ids = torch.as_tensor(retrieved_block_ids).cpu().reshape(1, -1)
        answers = normalize_answer_ids(answer_ids, 1)
        inputs = self.build_reader_inputs(questions, block_ids, answers, max_length=max_length)
        attention_mask, token_type_ids = inputs["attention_mask"][0], inputs["token_type_ids"][0]
        # [CLS] at 0, the first [SEP] just before the block (the first type-1 position), the last [SEP] at the end of
        # each row, and padding.
        special_tokens_mask = 1 - attention_mask
        rows = torch.arange(attention_mask.shape[0])
        special_tokens_mask[rows, 0] = 1
        special_tokens_mask[rows, token_type_ids.argmax(dim=1) - 1] = 1
        special_tokens_mask[rows, attention_mask.sum(dim=1) - 1] = 1
        concat_inputs = BatchEncoding(
            {
                "input_ids": inputs["input_ids"][0],
                "attention_mask": attention_mask,
                "token_type_ids": token_type_ids,
                "special_tokens_mask": special_tokens_mask,
            }
        )
        if return_tensors == "np":
            concat_inputs = BatchEncoding({key: value.numpy() for key, value in concat_inputs.items()})
        if answers is None:
            return None, None, None, concat_inputs
        return (
            inputs["has_answers"][0].tolist(),
            inputs["start_positions"][0].tolist(),
            inputs["end_positions"][0].tolist(),
            concat_inputs,
        )

    # ----------------------------------------------------------------------------------------------------------------
    # Loading and saving
    # ----------------------------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        tokenizer=None,
        index: RealmBlockIndex | str | os.PathLike | None = None,
        missing_ok: bool = False,
        require_index: bool = False,
        trust_remote_code: bool | None = None,
        **hub_kwargs,
    ) -> "RealmRetriever | None":
        """Load the retriever of a local folder or Hub repo: the new layout (block_records.safetensors + block_index/)
        or a legacy 4.x folder: block_records.npy with the `block_emb` weight of an open-QA checkpoint, or without
        weights as 4.x's `RealmRetriever.save_pretrained` wrote it (records and tokenizer only: no index). With
        missing_ok, return None when the folder holds no block records (e.g. a reader-only checkpoint); with
        require_index, records without an index are an error. `trust_remote_code` is passed to
        AutoTokenizer: where openrealm is not installed, the folder's tokenizer is its custom code (auto_map).

        index: a RealmBlockIndex, or the path of one built elsewhere (an index folder, or an index root of versions:
        its newest), instead of the folder's own block_index/. An index built from a corpus folder records that
        corpus's build and version: one built from another corpus, or older than a `corpus add` / `update` (fewer
        rows), is refused; blocks removed from the corpus since (`corpus remove`) are never returned.

        A legacy block_records.npy is converted once into the cache (`legacy_cache_dir()`), and only after
        everything else has loaded and agreed with it, through a temporary folder renamed into place: a failed load
        leaves nothing behind.
        """
        folder = resolve_folder(pretrained_model_name_or_path, **hub_kwargs)
        index_name = os.path.join(folder, BLOCK_INDEX_DIR)  # how messages name the index
        if index is not None and not isinstance(index, RealmBlockIndex):
            index_name = os.fspath(index)
            index = RealmBlockIndex.from_pretrained(index_folder(index))
        stamp = _folder_stamp(folder)  # before reading: a version written meanwhile is picked up by the next reload
        new_records = os.path.join(folder, BLOCK_RECORDS_NAME)
        legacy_records = os.path.join(folder, LEGACY_BLOCK_RECORDS_NAME)
        if os.path.isfile(new_records):
            records = BlockRecords.open(new_records)
            index_dir = os.path.join(folder, BLOCK_INDEX_DIR)
            if index is None and os.path.isdir(index_dir):  # an index folder, or a root of versions (the newest)
                index = RealmBlockIndex.from_pretrained(index_folder(index_dir))
            elif index is None and require_index:
                raise FileNotFoundError(
                    f"{folder} has block records but no {BLOCK_INDEX_DIR}/: embed the blocks and build an index "
                    "(RealmBlockIndex.build + save_pretrained) before answering questions from it."
                )
        elif os.path.isfile(legacy_records):
            # Everything that can fail is checked before the conversion, the only step that writes.
            num_records = legacy_block_records_count(legacy_records)
            if index is None:
                block_emb = load_legacy_block_emb(folder)
                if block_emb is not None:
                    index = RealmBlockIndex(block_emb, index_type="exact", version=0)
                elif require_index:
                    raise FileNotFoundError(
                        f"{folder} has {LEGACY_BLOCK_RECORDS_NAME} but no model weights holding `block_emb` "
                        f"({', '.join(LEGACY_WEIGHT_NAMES)}): the block embeddings of a 4.x open-QA checkpoint."
                    )
            if index is not None and index.num_blocks != num_records:
                raise ValueError(
                    f"The block embeddings in {folder} have {index.num_blocks} rows but {LEGACY_BLOCK_RECORDS_NAME} "
                    f"holds {num_records} blocks."
                )
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
            records = open_legacy_block_records(legacy_records)
        elif missing_ok:
            return None
        else:
            raise FileNotFoundError(
                f"No block records in {folder}: expected {BLOCK_RECORDS_NAME} (with {BLOCK_INDEX_DIR}/) or the legacy "
                f"{LEGACY_BLOCK_RECORDS_NAME}."
            )
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        if index is not None and os.path.isfile(os.path.join(folder, CORPUS_CONFIG_NAME)):
            index = fit_index_to_corpus(index, folder, index_name)
        if index is not None and index.num_blocks != len(records):
            raise ValueError(
                f"The block embeddings in {folder} have {index.num_blocks} rows but the block records hold "
                f"{len(records)} blocks."
            )
        retriever = cls(records, tokenizer, index=index)
        if os.path.isfile(new_records) and os.path.isdir(os.fspath(pretrained_model_name_or_path)):
            retriever.source_folder, retriever._source_stamp = folder, stamp
        return retriever

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write block records, index and tokenizer into save_directory, all at once as a loader sees it (staged, then
        file_utils.replace_folder): records and index of one version are never beside those of another. Other entries
        of the folder (e.g. a model's weights) are kept."""
        with atomic_directory(save_directory, keep=_kept_beside_retriever) as staging:
            self.write_files(staging)

    def write_files(self, directory: str) -> None:
        """Write block records, index and tokenizer into `directory`, a folder being staged (save_pretrained's, or a
        model's that saves its retriever beside its weights)."""
        target = os.path.join(directory, BLOCK_RECORDS_NAME)
        source = getattr(self.block_records, "path", None)
        if source is None:
            with_ids = self.block_records.has_passage_ids
            BlockRecords.write(
                target,
                self.iter_records(with_ids),
                num_blocks_hint=len(self.block_records),
                passage_ids=with_ids,
                ids_are_paths=getattr(self.block_records, "ids_are_paths", False),
            )
        else:
            link_or_copy(source, target)
        if self._index is not None:
            os.mkdir(os.path.join(directory, BLOCK_INDEX_DIR))
            self._index.write_files(os.path.join(directory, BLOCK_INDEX_DIR))
        self.tokenizer.save_pretrained(directory)

    def iter_records(self, passage_ids: bool = False, batch_size: int = 4096):
        """Yield (title, text) for every block, in block order; (title, text, passage id) with passage_ids."""
        records = self.block_records
        for start in range(0, len(records), batch_size):
            ids = range(start, min(start + batch_size, len(records)))
            fields = [records.titles(ids), records.texts(ids)] + ([records.passage_ids(ids)] if passage_ids else [])
            yield from zip(*fields)

    def push_to_hub(self, repo_id: str, commit_message: str = "Upload REALM retriever", **kwargs) -> str:
        """Upload block records, index and tokenizer to a Hub model repo; returns the commit URL."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=kwargs.pop("token", None))
        api.create_repo(repo_id, exist_ok=True, private=kwargs.pop("private", None))
        with tempfile.TemporaryDirectory() as tmp:
            self.save_pretrained(tmp)
            return api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message, **kwargs)


def fit_index_to_corpus(index: RealmBlockIndex, corpus: str, source: str | os.PathLike) -> RealmBlockIndex:
    """The index, checked against the corpus folder it serves and with the corpus's removed blocks excluded.

    An index that `openrealm index build` made records the corpus's build id and version (index metadata
    corpus_build_id, corpus_version): one built from another corpus, or from an earlier version that held fewer
    blocks (a `corpus add` or `update` since), is refused (ValueError naming both and the command that rebuilds it).
    Blocks removed since (`corpus remove`) are served masked, as the corpus's own index serves them: never returned."""
    with open(os.path.join(corpus, CORPUS_CONFIG_NAME), encoding="utf-8") as f:
        config = json.load(f)
    built_from, version = index.metadata.get("corpus_build_id"), index.metadata.get("corpus_version")
    embedder = index.metadata.get("embedder", "MODEL")
    rebuild = f"rebuild it: openrealm index build --embedder {embedder} --corpus {corpus} --output {source}"
    if built_from is not None and config.get("build_id") is not None and built_from != config["build_id"]:
        raise ValueError(
            f"The index {source} was built from another corpus than {corpus} (corpus build {built_from[:12]}, not "
            f"{config['build_id'][:12]}): {rebuild}"
        )
    if index.num_blocks != config.get("num_blocks", index.num_blocks):
        built = f"version {version} of the corpus" if version is not None else "the corpus"
        older = index.num_blocks < config["num_blocks"]
        raise ValueError(
            f"The index {source} {'is older than' if older else 'does not match'} the corpus {corpus}: it was built "
            f"from {built} with {index.num_blocks} blocks, which is now version {config.get('version', 0)} with "
            f"{config['num_blocks']} blocks{' (corpus add or update since)' if older else ''}: {rebuild}"
        )
    removed_path = os.path.join(corpus, CORPUS_REMOVED_IDS_NAME)
    if os.path.isfile(removed_path):
        from safetensors.numpy import load_file

        removed = torch.from_numpy(load_file(removed_path)["removed_ids"].astype(np.int64))
        if removed.numel() and not bool(torch.isin(removed, index.removed_ids).all()):
            logger.info(f"{source}: blocks removed from {corpus} since the index was built are not served.")
            index = index.remove(removed)
            index.version -= 1  # the same index, masked: not a new version of it
    return index


def _folder_stamp(folder: str) -> tuple:
    """Identity of a retriever folder's version: (device, inode, mtime) of its block records and index config; every
    write replaces both files, so any new version changes it."""
    stamp = []
    for path in (os.path.join(folder, BLOCK_RECORDS_NAME), os.path.join(folder, BLOCK_INDEX_DIR, "index_config.json")):
        try:
            info = os.stat(path)
            stamp.append((info.st_dev, info.st_ino, info.st_mtime_ns))
        except OSError:
            stamp.append(None)
    return tuple(stamp)


def _kept_beside_retriever(name: str) -> bool:
    """Whether an entry of a folder survives a retriever's save into it: everything but records and index."""
    return name not in (BLOCK_RECORDS_NAME, LEGACY_BLOCK_RECORDS_NAME, BLOCK_INDEX_DIR)


def resolve_folder(pretrained_model_name_or_path: str | os.PathLike, **hub_kwargs) -> str:
    """A local folder as is; a Hub repo id downloaded (retriever, tokenizer and legacy weight files only)."""
    path = os.fspath(pretrained_model_name_or_path)
    if os.path.isdir(path):
        return path
    from huggingface_hub import snapshot_download

    patterns = [
        BLOCK_RECORDS_NAME,
        f"{BLOCK_INDEX_DIR}/*",
        LEGACY_BLOCK_RECORDS_NAME,
        *TOKENIZER_PATTERNS,
        *LEGACY_WEIGHT_NAMES,
        *LEGACY_WEIGHT_INDEX_NAMES,
        "*.safetensors",
        "*.bin",
    ]
    return snapshot_download(path, allow_patterns=patterns, **hub_kwargs)


def open_legacy_block_records(npy_path: str) -> BlockRecords:
    """The legacy pickled records, converted once (streaming, without unpickling) into a memory-mapped cache file.

    The conversion is written into a temporary folder beside the cache entry and renamed into place when complete;
    if it fails (a refused or damaged file), the temporary folder and any cache folders created for it are removed.
    """
    stat = os.stat(npy_path)
    key = hashlib.sha256(f"{os.path.realpath(npy_path)}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    parent = os.path.join(legacy_cache_dir(), "legacy_block_records")
    entry = os.path.join(parent, key)
    cached = os.path.join(entry, BLOCK_RECORDS_NAME)
    if os.path.isfile(cached):
        return BlockRecords.open(cached)
    logger.info(
        f"Converting legacy {npy_path} to {cached} (once; no pickle is executed; OPENREALM_CACHE sets the cache "
        "folder)."
    )
    created = missing_folders(parent)  # cache folders this call creates, removed again if the conversion fails
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=parent)
    except OSError as error:
        remove_empty_folders(created)
        if isinstance(error, PermissionError) or error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise unwritable_cache_error(parent, error) from error
        raise
    try:
        convert_legacy_block_records(npy_path, os.path.join(staging, BLOCK_RECORDS_NAME), progress=True)
        apply_umask_modes(staging)  # a shared OPENREALM_CACHE stays usable by the group mkdtemp would shut out
        try:
            os.rename(staging, entry)
        except OSError:
            if not os.path.isfile(cached):  # not another process having converted the same file meanwhile
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
        remove_empty_folders(created)  # only empty ones: none after a successful conversion
    return BlockRecords.open(cached)


def load_legacy_block_emb(folder: str) -> torch.Tensor | None:
    """The `block_emb` weight [num_blocks, P] of a 4.x RealmForOpenQA checkpoint, memory-mapped where possible;
    None when no weights file of the folder holds it (e.g. a folder of 4.x's RealmRetriever.save_pretrained)."""
    for index_name in LEGACY_WEIGHT_INDEX_NAMES:
        index_path = os.path.join(folder, index_name)
        if os.path.isfile(index_path):
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            if "block_emb" in weight_map:
                return read_weight(os.path.join(folder, weight_map["block_emb"]), "block_emb")
    for name in LEGACY_WEIGHT_NAMES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            try:
                return read_weight(path, "block_emb")
            except KeyError:  # the weights of another class (e.g. a reader) beside the records
                continue
    return None


def refused_pickle_error(path: str, error: Exception) -> ValueError:
    """The error for a weights pickle that torch.load(weights_only=True) refuses (it holds objects besides tensors,
    e.g. a 4.x training script's arguments): OpenREALM never unpickles them, and says how to convert the file."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    holding = f" ({found.group(1)})" if found else ""
    return ValueError(
        f"{path} is a pickle holding objects besides tensors{holding}, which OpenREALM does not load. If you trust "
        "the file, save its tensors as model.safetensors (docs/migrating.md), then openrealm convert the folder"
    )


def read_weight(path: str, name: str) -> torch.Tensor:
    """One tensor from a safetensors file or a legacy .bin (torch.load with weights_only=True, memory-mapped)."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if name not in f.keys():
                raise KeyError(f"{path} has no tensor named {name!r}.")
            return f.get_tensor(name)
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise refused_pickle_error(path, error) from None
    except Exception as error:  # noqa: BLE001 - any failure here means the file cannot be used
        raise ValueError(f"Cannot read weights from {path}: {error}") from error
    if name not in state_dict:
        raise KeyError(f"{path} has no tensor named {name!r}.")
    return state_dict[name]


__all__ = ["RealmRetriever", "find_pattern_spans", "normalize_answer_ids", "word_overlap"]
