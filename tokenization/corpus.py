"""The knowledge corpus: articles -> blocks of at most 288 wordpieces (Google's ORQA preprocessing,
wiki_preprocessor.py).

    build_corpus("wiki.jsonl", "corpus/", "bert-base-uncased", num_proc=8)     # or: openrealm corpus build ...
    blocks = load_corpus("corpus/")                                            # datasets.Dataset, memory-mapped
    retriever = openrealm.RealmRetriever.from_pretrained("corpus/")            # serves the same titles and texts

An article ({"title", "text"}) is HTML-unescaped, split into sentences by sentencex (rule-based, no model download),
and its sentences are packed greedily into blocks: a sentence joins the current block while
`3 + len(title_ids) + len(body so far) + len(sentence) <= max_block_length` ([CLS] title [SEP] body [SEP]), so the
title counts against the budget and blocks never cross articles. A block with the title and text of an earlier block is
dropped (`duplicate_rows`; `deduplicate=False` keeps it; docs/corpus.md says why). The output folder (written to a
temporary sibling, then renamed) holds:

    corpus_config.json          format, version, counts, tokenizer, sentence splitter, span annotators, source
    blocks/                     datasets Arrow (save_to_disk), one row per block, in block-id order (COLUMNS)
    block_records.safetensors   the same titles and texts as openrealm.BlockRecords (what RealmRetriever serves)
    tokenizer files             so that AutoTokenizer / RealmRetriever.from_pretrained(folder) load it

Articles come from JSONL, Parquet, CSV/TSV, save_to_disk folders or the Hub (tokenization/sources.py). With
passages_as_blocks each input row (a passage already split, e.g. DPR's psgs_w100.tsv) is one block instead, cut where
it is too long, and its id is kept: column passage_id of blocks/ and the passage ids of block_records.safetensors.

Departures from Google's code (each explained where it happens): sentencex instead of NLTK punkt; over-long
sentences are split at word boundaries instead of becoming over-long blocks; a title that leaves no room for the
body still gets a budget of 1 wordpiece; sentences without wordpieces are dropped; blocks are in input order
(Google's were not reproducible); uids are hex strings; offsets are python str offsets.

The module is long because the corpus folder is one format: building it (packing articles into blocks, dropping
duplicates), writing it and loading it live together, so that writer and reader cannot drift; input formats are
sources.py, JSONL is jsonl.py.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import html
import inspect
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from openrealm.block_records import BlockRecords
from openrealm.file_utils import atomic_directory, check_replaceable, full_disk_error, path_within
from openrealm.tokenization.jsonl import JsonlError, iter_jsonl, jsonl_id, jsonl_string
from openrealm.tokenization.sources import (
    PASSAGE_ID,
    InputOptions,
    input_kind,
    load_table_articles,
    standard_columns,
)

CORPUS_FORMAT = "openrealm.corpus"
CORPUS_FORMAT_VERSION = 1
CONFIG_NAME = "corpus_config.json"
BLOCKS_DIR = "blocks"
BLOCK_RECORDS_NAME = "block_records.safetensors"  # the name RealmRetriever.from_pretrained looks for
REMOVED_IDS_NAME = "removed_ids.safetensors"  # ids of removed blocks (openrealm corpus remove); absent when none
# Top-level names a corpus folder written before corpus_config.json listed its "files" may hold (tokenizer files).
_LEGACY_TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "added_tokens.json"}
)
MAX_BLOCK_LENGTH = 288
# Articles, or passages (passages_as_blocks), per map batch when the caller names none. A map batch's blocks are one
# Arrow record batch of the packed blocks (of 1,000 rows at most), and an open memory-mapped table holds Arrow's
# objects for each of its record batches: passages, one block each, go 1,000 at a time so that the packed blocks have
# as few record batches as blocks/ (benchmarks/RESULTS.md, "A corpus of DPR's layout at scale").
ARTICLES_PER_BATCH = 256
PASSAGES_PER_BATCH = 1000
COLUMNS = (
    "block_id",
    "article_id",
    "uid",
    "title",
    "text",
    "title_ids",
    "token_ids",
    "sentence_starts",
    "sentence_char_starts",
    "sentence_char_ends",
    "span_char_starts",
    "span_char_ends",
    "span_labels",
)
# Google's remove_doc (wiki_preprocessor.py): list, index and outline pages, and disambiguation pages.
_REMOVED_TITLE = re.compile(r"(List of .+)|(Index of .+)|(Outline of .+)|(.*\(disambiguation\).*)")

Span = tuple[int, int, str]
SpanAnnotator = Callable[[str], list[Span]]


def block_features(passages: bool = False):
    """The `datasets.Features` of the blocks/ dataset (COLUMNS order; a corpus of passages adds passage_id)."""
    from datasets import Features, List, Value

    ints = List(Value("int32"))
    features = Features(
        {
            "block_id": Value("int64"),
            "article_id": Value("int64"),
            "uid": Value("string"),
            "title": Value("string"),
            "text": Value("string"),
            "title_ids": ints,
            "token_ids": ints,
            "sentence_starts": ints,
            "sentence_char_starts": ints,
            "sentence_char_ends": ints,
            "span_char_starts": ints,
            "span_char_ends": ints,
            "span_labels": List(Value("string")),
        }
    )
    if passages:
        features[PASSAGE_ID] = Value("string")
    return features


def is_removed_page(title: str) -> bool:
    """Google's page filter: titles "List of …", "Index of …", "Outline of …", or containing "(disambiguation)"."""
    return _REMOVED_TITLE.match(title) is not None


def document_uid(title: str, text: str) -> str:
    """Google's document uid (`featurization.get_document_uid`) as hex: SHA-1 of f"{title} <sep> {text}"."""
    return hashlib.sha1(f"{title} <sep> {text}".encode()).hexdigest()


def duplicate_rows(uids) -> np.ndarray:
    """Rows [D] (ascending int64) whose uid equals an earlier row's: the duplicate blocks.

    A duplicate block has the same title and the same text as an earlier block (its document uid, SHA-1 of `title <sep>
    text`): the key Google's example generator compares, dropping every pre-training example whose K candidates hold
    two blocks of one uid (Google's example_generator.py). uids: strings, a pyarrow Array or a ChunkedArray (a corpus's
    `blocks.with_format("arrow")["uid"]`: counted in Arrow, no Python string per row).

    Memory: hex SHA-1 uids (document_uid's) are compared by their first 64 bits first (8 bytes a row, sorted in place
    in numpy, against some 400 bytes a row for hashing the strings in Arrow), and only the rows whose 64 bits repeat
    are compared whole (taken chunk by chunk): a 21M-block corpus is deduplicated in some 170 MB."""
    import pyarrow as pa

    column = uids if isinstance(uids, (pa.Array, pa.ChunkedArray)) else pa.array(list(uids), type=pa.string())
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    keys, start = np.empty(len(column), dtype=np.uint64), 0
    for chunk in chunks:  # filled chunk by chunk: 8 bytes a row, no second copy
        prefixes = _sha1_prefixes(chunk)
        if prefixes is None:  # not all hex SHA-1 uids: compare the strings
            del keys
            return _first_occurrence_duplicates(column, np.arange(len(column), dtype=np.int64))
        keys[start : start + len(chunk)] = prefixes
        start += len(chunk)
    keys.sort()  # in place
    repeated = np.unique(keys[1:][keys[1:] == keys[:-1]])  # prefixes held by more than one row (few)
    del keys
    if not len(repeated):
        return np.zeros(0, dtype=np.int64)
    candidates, values, start = [], [], 0
    for chunk in chunks:  # the rows whose prefix repeats: their uids are compared whole
        rows = np.flatnonzero(np.isin(_sha1_prefixes(chunk), repeated))
        candidates.append(start + rows)
        values.append(chunk.take(pa.array(rows)))  # chunk by chunk: a ChunkedArray's take joins all its chunks first
        start += len(chunk)
    candidates = np.concatenate(candidates).astype(np.int64)
    return _first_occurrence_duplicates(pa.chunked_array(values, type=column.type), candidates)


def _first_occurrence_duplicates(uids, rows: np.ndarray) -> np.ndarray:
    """rows[i] for each uids[i] equal to an earlier uids[j] (rows ascending): exact string comparison in Arrow."""
    import pyarrow as pa

    first = pa.table({"uid": uids, "row": pa.array(rows)}).group_by("uid").aggregate([("row", "min")])["row_min"]
    return np.setdiff1d(rows, first.to_numpy()).astype(np.int64)


_HEX_VALUES = np.zeros(256, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def _sha1_prefixes(chunk) -> np.ndarray | None:
    """The first 64 bits [n] (uint64) of a string Array of 40-character lowercase hex uids, read from its value
    buffer without a Python string per row; None when a value is null or not 40 hex characters."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(chunk) == 0:
        return np.zeros(0, dtype=np.uint64)
    if chunk.null_count or not pa.types.is_string(chunk.type):
        return None
    offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
    if (np.diff(offsets) != 40).any() or not pc.all(pc.match_substring_regex(chunk, "^[0-9a-f]{40}$")).as_py():
        return None
    text = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(-1, 40)
    nibbles = _HEX_VALUES[text[:, :16]]
    packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    return packed.view(">u8").reshape(-1).astype(np.uint64)


def count_distinct_in_order(column) -> int:
    """How many distinct values a non-decreasing int column (a ChunkedArray, e.g. blocks' article_id) holds: one plus
    the number of increases, counted chunk by chunk (no copy of the whole column)."""
    count, last = 0, None
    for chunk in column.chunks:
        values = chunk.to_numpy()
        if len(values):
            count += int((values[1:] != values[:-1]).sum()) + int(last is None or values[0] != last)
            last = values[-1]
    return count


def count_duplicate_blocks(uids, removed_ids=()) -> int:
    """How many live blocks (all rows but removed_ids) duplicate an earlier live block (see duplicate_rows)."""
    import pyarrow as pa

    column = uids if isinstance(uids, (pa.Array, pa.ChunkedArray)) else pa.array(list(uids), type=pa.string())
    if len(removed_ids):
        live = np.ones(len(column), dtype=bool)
        live[np.asarray(removed_ids, dtype=np.int64)] = False
        column = column.filter(pa.array(live))
    return len(duplicate_rows(column))


def drop_duplicate_blocks(blocks, scratch: str, drop: bool = True):
    """(blocks, number of rows duplicating an earlier row): without those rows when drop (the others keep their order;
    the new table is written to `scratch` by save_blocks), else as given. blocks: a datasets.Dataset with a "uid"
    column and no indices mapping (what pack_articles returns)."""
    from datasets import load_from_disk

    duplicates = duplicate_rows(blocks.data.column("uid"))
    if drop and len(duplicates):
        folder = os.path.join(scratch, f"deduplicated-{uuid.uuid4().hex}")
        save_blocks(blocks, folder, skip_rows=duplicates)
        blocks = load_from_disk(folder)
    return blocks, len(duplicates)


def save_blocks(
    blocks,
    directory: str | os.PathLike,
    skip_rows: np.ndarray | Sequence[int] = (),
    first_block_id: int | None = None,
    columns: Sequence[str] | None = None,
) -> int:
    """Write `blocks` less the rows `skip_rows` to `directory` as datasets' `save_to_disk` writes a folder (what
    `load_from_disk` and load_corpus read: its shards, record batches, state.json and dataset_info.json); returns the
    number of rows written.

    blocks: a datasets.Dataset without an indices mapping (what pack_articles returns). skip_rows: sorted row numbers
    [D] (duplicate_rows). first_block_id: add a "block_id" column (int64), first_block_id + the row's number among
    those written. columns: the columns written, in this order (default: those of blocks, then block_id).

    The rows go from the (memory-mapped) table to the shard files in record batches of at most 1,000 rows (as
    save_to_disk writes them), so that memory does not grow with the rows: no index of the rows kept, no copy of them
    but the one written (datasets' select + flatten_indices would hold 8 bytes a row and write the rows twice). As in
    save_to_disk, the shards are contiguous, of equal row counts, of about 500 MB at most (datasets.config.
    MAX_SHARD_SIZE; the size of the rows kept is estimated in proportion to their number)."""
    import pyarrow as pa
    from datasets import Features, Value, config
    from datasets.arrow_writer import ArrowWriter, get_writer_batch_size_from_data_size
    from datasets.utils.py_utils import asdict, convert_file_size_to_int

    if blocks._indices is not None:  # its table's rows are not its rows
        raise ValueError("save_blocks takes blocks without an indices mapping (call flatten_indices() first)")
    directory = os.fspath(directory)
    skip = np.asarray(skip_rows, dtype=np.int64)
    features = blocks.features.copy()
    if first_block_id is not None:
        features["block_id"] = Value("int64")
    columns = list(columns) if columns is not None else list(features)
    features = Features({name: features[name] for name in columns})
    table = blocks.data.table.select([name for name in columns if name != "block_id"])
    num_rows = table.num_rows - len(skip)
    nbytes = table.nbytes * num_rows // max(table.num_rows, 1) + (8 * num_rows if first_block_id is not None else 0)
    num_shards = max(1, min(num_rows, nbytes // convert_file_size_to_int(config.MAX_SHARD_SIZE) + 1))
    batch_rows = config.DEFAULT_MAX_BATCH_SIZE
    if nbytes:
        batch_rows = min(batch_rows, get_writer_batch_size_from_data_size(num_rows, nbytes))
    kept_before = skip - np.arange(len(skip))  # rows kept before each skipped row

    def table_row(k: int) -> int:  # the table's row of the k-th row written: k + the skipped rows before it
        return k + int(np.searchsorted(kept_before, k, side="right"))

    def rows(start: int, stop: int):  # the rows [start, stop) written, as one table
        first, last = table_row(start), table_row(stop - 1)
        piece = table.slice(first, last + 1 - first)
        inside = skip[np.searchsorted(skip, first) : np.searchsorted(skip, last + 1)] - first
        if len(inside):
            keep = np.ones(piece.num_rows, dtype=bool)
            keep[inside] = False
            piece = piece.filter(pa.array(keep))
        arrays = {name: piece.column(name) for name in piece.column_names}
        if first_block_id is not None:
            arrays["block_id"] = pa.array(np.arange(first_block_id + start, first_block_id + stop, dtype=np.int64))
        return pa.table([arrays[name] for name in columns], names=columns)

    os.makedirs(directory, exist_ok=True)
    names = [f"data-{shard:05d}-of-{num_shards:05d}.arrow" for shard in range(num_shards)]
    per_shard, extra = divmod(num_rows, num_shards)
    start = 0
    with _progress(None, num_rows, "Saving the dataset") as bar:  # an inner step: shown with --verbose only
        for shard, name in enumerate(names):
            stop = start + per_shard + (shard < extra)
            writer = ArrowWriter(features=features, path=os.path.join(directory, name), embed_local_files=True)
            try:
                for batch_start in range(start, stop, batch_rows):
                    batch_stop = min(batch_start + batch_rows, stop)
                    writer.write_table(rows(batch_start, batch_stop))
                    bar.update(batch_stop - batch_start)
                writer.finalize()
            finally:
                writer.close()
            pa.default_memory_pool().release_unused()
            start = stop
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": uuid.uuid4().hex[:16],  # as random as datasets' own (64 bits)
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None if blocks.split is None else str(blocks.split),
    }
    info = blocks.info.copy()
    info.features = features
    info = asdict(info)
    with open(os.path.join(directory, config.DATASET_STATE_JSON_FILENAME), "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    with open(os.path.join(directory, config.DATASET_INFO_FILENAME), "w", encoding="utf-8") as f:
        json.dump({key: info[key] for key in sorted(info)}, f, indent=2)  # as save_to_disk writes it
    return num_rows


# ---------------------------------------------------------------------------------------------------------------------
# Articles -> blocks
# ---------------------------------------------------------------------------------------------------------------------


class _Piece:
    """A unit of packing: one sentence (or one part of an over-long sentence) with its wordpieces and spans."""

    __slots__ = ("text", "ids", "spans")

    def __init__(self, text: str, ids: list[int], spans: list[Span]):
        self.text, self.ids, self.spans = text, ids, spans


def _is_factory(obj: Any) -> bool:
    """True for a callable that takes no argument (a factory of annotators), False for `(sentence) -> spans`."""
    try:
        inspect.signature(obj).bind()
    except TypeError:
        return False
    except ValueError:  # no signature available (some builtins): treat as an annotator
        return False
    return True


def annotator_names(span_annotator: Any) -> list[str]:
    """Names recorded in corpus_config.json: `.names` (a combined annotator), `.name`, or the callable's name."""
    if span_annotator is None:
        return []
    names = getattr(span_annotator, "names", None)
    if names is not None:
        return [str(name) for name in names]
    name = getattr(span_annotator, "name", None)
    if name is None:
        target = getattr(span_annotator, "func", span_annotator)  # functools.partial
        name = getattr(target, "__qualname__", type(target).__qualname__)
    return [str(name)]


class BlockBuilder:
    """The `datasets.map` function: a batch of articles -> their blocks (all COLUMNS but block_id).

    Picklable, so that `map(num_proc=N)` can ship it to worker processes. The span annotator, when given as a
    zero-argument factory, is constructed on first use in each process and never pickled (a spaCy or transformers
    model is then loaded once per process, not once per batch and not in the parent).
    """

    def __init__(
        self,
        tokenizer,
        max_block_length: int = MAX_BLOCK_LENGTH,
        span_annotator: SpanAnnotator | Callable[[], SpanAnnotator] | None = None,
        page_filter: bool = True,
        html_unescape: bool = True,
        language: str = "en",
        source_name: str = "<articles>",
        passages: bool = False,
        keep_ids: bool | None = None,
    ):
        if max_block_length < 4:
            raise ValueError(
                f"max_block_length must be at least 4 ([CLS] title [SEP] body [SEP]), got {max_block_length}"
            )
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(
                f"{type(tokenizer).__name__} is not a tokenizers-backed tokenizer; word offsets are needed"
            )
        self.tokenizer = tokenizer
        self.max_block_length = max_block_length
        self.page_filter = page_filter
        self.html_unescape = html_unescape
        self.language = language
        self.source_name = source_name
        self.passages = passages
        # Each block keeps its article's id (passage_id): a passage's own id, or a document's path in its folder.
        self.keep_ids = passages if keep_ids is None else keep_ids
        self._factory = span_annotator if span_annotator is not None and _is_factory(span_annotator) else None
        self._annotator = None if self._factory is not None else span_annotator
        self._backend = None  # the tokenizers.Tokenizer used by _tokenize (made on first use in each process)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_backend"] = None
        if state["_factory"] is not None:
            state["_annotator"] = None  # rebuilt in each process from the factory
        return state

    @property
    def annotator(self) -> SpanAnnotator | None:
        if self._annotator is None and self._factory is not None:
            self._annotator = self._factory()
        return self._annotator

    # -- the map function ----------------------------------------------------------------------------------------

    def __call__(self, titles: list, texts: list, *rest: list) -> dict[str, list]:
        """A batch of articles -> their blocks. rest: (indices,), or (passage_ids, indices) with keep_ids: every
        block of an article keeps its id. With passages each passage makes one block (its first `budget` wordpieces;
        "cut" says whether anything was left out)."""
        *passage_ids, indices = rest
        passage_ids = passage_ids[0] if passage_ids else [None] * len(indices)
        kept = [
            (i, title, text, passage_id)
            for i, title, text, passage_id in zip(indices, titles, texts, passage_ids)
            if self._keep(i, title, text)
        ]
        sentences = [self._sentences(text) for _, _, text, _ in kept]
        flat = [sentence for article in sentences for sentence in article]
        ids = self._tokenize([title for _, title, _, _ in kept]) if kept else []
        sentence_ids = iter(self._tokenize(flat)) if flat else iter(())
        spans = iter(self._annotate(flat)) if flat else iter(())
        columns: dict[str, list] = {name: [] for name in self.output_columns}
        for (article_id, title, _, passage_id), title_ids, article in zip(kept, ids, sentences):
            budget = self._budget(title_ids)
            pieces = []
            for sentence in article:
                sentence_spans, token_ids = next(spans), next(sentence_ids)
                if token_ids:  # text the tokenizer drops entirely (control characters only) adds nothing to a block
                    pieces.extend(self._pieces(sentence, token_ids, sentence_spans, budget))
            if not self.passages:
                for block in _pack(pieces, budget):
                    _append_block(columns, article_id, title, title_ids, block)
                    if self.keep_ids:
                        columns[PASSAGE_ID].append(passage_id)
            elif pieces:
                block, cut = self._passage_block(pieces, budget)
                _append_block(columns, article_id, title, title_ids, block)
                columns[PASSAGE_ID].append(passage_id)
                columns["cut"].append(cut)
        return columns

    @property
    def output_columns(self) -> list[str]:
        """The columns __call__ returns: COLUMNS but block_id; with keep_ids also passage_id, with passages cut."""
        names = [name for name in COLUMNS if name != "block_id"]
        return names + [PASSAGE_ID] * self.keep_ids + ["cut"] * self.passages

    def _passage_block(self, pieces: list[_Piece], budget: int) -> tuple[list[_Piece], bool]:
        """(the pieces of a passage that fit in one block, whether some were cut off): a piece that crosses the
        budget is cut at a word boundary (as an over-long sentence is), the rest of the passage left out."""
        block, length = [], 0
        for piece in pieces:  # each piece fits in the budget (_pieces): the first always fits whole
            room = budget - length
            if len(piece.ids) > room:
                if room > 0:
                    block.append(self._split_long_sentence(piece.text, piece.ids, piece.spans, room)[0])
                return block, True
            block.append(piece)
            length += len(piece.ids)
        return block, False

    def _keep(self, index: int, title: Any, text: Any) -> bool:
        for field, value in (("title", title), ("text", text)):
            if not isinstance(value, str):
                raise ValueError(
                    f"article {index} of {self.source_name}: {field} is {type(value).__name__}, not a string"
                )
        return not (self.page_filter and is_removed_page(title))

    def _sentences(self, text: str) -> list[str]:
        """Sentences without surrounding white space; empty ones dropped (sentencex keeps paragraph breaks)."""
        import sentencex

        if self.html_unescape:
            text = html.unescape(text)  # Google unescapes the text (not the title) of WikiExtractor's output
        # sentencex, not Google's NLTK punkt: punkt needs a downloaded (pickled) model; sentencex is rule-based.
        return [s for s in (s.strip() for s in sentencex.segment(self.language, text)) if s]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Wordpiece ids, no special tokens. Straight through the `tokenizers` backend: about twice as fast as the
        transformers call, whose per-text Python conversion dominates once the Rust side is done."""
        if self._backend is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None:
                return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            # A private copy: the shared backend keeps whatever truncation/padding its last call set (a checkpoint's
            # tokenizer.json may even ship truncation to 128), which the transformers call resets each time.
            self._backend = copy.deepcopy(backend)
            self._backend.no_truncation()
            self._backend.no_padding()
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)  # _fast: without offsets
        return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]

    def _annotate(self, sentences: list[str]) -> list[list[Span]]:
        annotator = self.annotator
        if annotator is None:
            return [[] for _ in sentences]
        batch = getattr(annotator, "annotate_batch", None)  # NER models are much faster on batches
        found = batch(sentences) if batch is not None else [annotator(sentence) for sentence in sentences]
        # A span must lie inside its sentence (Google drops spans that cross a sentence boundary).
        return [
            [(int(s), int(e), str(label)) for s, e, label in spans if 0 <= int(s) < int(e) <= len(sentence)]
            for sentence, spans in zip(sentences, found)
        ]

    def _budget(self, title_ids: list[int]) -> int:
        """Wordpieces left for the body: max_block_length - 3 - len(title_ids), and at least 1. A title that long
        (Google's featurization truncates it to max_block_length - 3, leaving the body nothing) would otherwise stop
        packing; with 1, its blocks hold one wordpiece each and the text is still kept."""
        return max(1, self.max_block_length - 3 - len(title_ids))

    def _pieces(self, sentence: str, token_ids: list[int], spans: list[Span], budget: int) -> list[_Piece]:
        if len(token_ids) <= budget:
            return [_Piece(sentence, token_ids, spans)]
        return self._split_long_sentence(sentence, token_ids, spans, budget)

    def _split_long_sentence(
        self, sentence: str, token_ids: list[int], spans: list[Span], budget: int
    ) -> list[_Piece]:
        """Cut a sentence longer than the budget into parts of at most `budget` wordpieces.

        Google lets such a sentence become an over-long block whose tail the retriever never sees (featurization
        truncates it to 288). Splitting keeps every word in some block. A cut goes at the last white space that
        fits, else between the last two words that fit (BERT's pre-tokenizer words: punctuation splits them), so
        each part re-tokenizes to its own wordpieces; only a single word longer than the budget is cut inside it
        (possible only with a title over max_block_length - 103 wordpieces, as a word has at most 100 pieces).
        Spans crossing a cut are dropped.
        """
        encoding = self.tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets, words = encoding["offset_mapping"], encoding.word_ids()
        cuts = [0]
        while len(token_ids) - cuts[-1] > budget:
            cuts.append(_cut(cuts[-1], cuts[-1] + budget, offsets, words))
        # Each part runs from its first wordpiece's character to the next part's, so nothing between is lost.
        char_cuts = [0] + [offsets[c][0] for c in cuts[1:]] + [len(sentence)]
        pieces = []
        for k, start in enumerate(cuts):
            end = cuts[k + 1] if k + 1 < len(cuts) else len(token_ids)
            char_start, char_end = char_cuts[k], char_cuts[k + 1]
            text = sentence[char_start:char_end].rstrip()
            inside = [
                (s - char_start, e - char_start, lab)
                for s, e, lab in spans
                if char_start <= s and e <= char_start + len(text)
            ]
            pieces.append(_Piece(text, token_ids[start:end], inside))
        return pieces


def _cut(start: int, limit: int, offsets: list[tuple[int, int]], words: list[int]) -> int:
    """Where to end a part that starts at wordpiece `start` and may not reach `limit`: see _split_long_sentence."""
    for end in range(limit, start, -1):
        if offsets[end][0] > offsets[end - 1][1]:  # characters (white space) between the two wordpieces
            return end
    for end in range(limit, start, -1):
        if words[end] != words[end - 1]:
            return end
    return limit


def _pack(pieces: list[_Piece], budget: int) -> Iterator[list[_Piece]]:
    """Google's greedy packing: a piece joins the block while the body stays within the budget."""
    block: list[_Piece] = []
    length = 0
    for piece in pieces:
        if block and length + len(piece.ids) > budget:
            yield block
            block, length = [], 0
        block.append(piece)
        length += len(piece.ids)
    if block:
        yield block


def _append_block(columns: dict[str, list], article_id: int, title: str, title_ids: list[int], block: list[_Piece]):
    text_parts, char_starts, char_ends, starts, token_ids = [], [], [], [], []
    span_starts, span_ends, span_labels = [], [], []
    position = 0
    for piece in block:
        if text_parts:
            position += 1  # the joining space
        char_starts.append(position)
        for s, e, label in piece.spans:
            span_starts.append(position + s)
            span_ends.append(position + e)
            span_labels.append(label)
        position += len(piece.text)
        char_ends.append(position)
        text_parts.append(piece.text)
        starts.append(len(token_ids))
        token_ids.extend(piece.ids)
    text = " ".join(text_parts)  # as Google's blocks.tfr: sentences joined by one space, no title
    row = {
        "article_id": article_id,
        "uid": document_uid(title, text),
        "title": title,
        "text": text,
        "title_ids": title_ids,
        "token_ids": token_ids,
        "sentence_starts": starts,
        "sentence_char_starts": char_starts,
        "sentence_char_ends": char_ends,
        "span_char_starts": span_starts,
        "span_char_ends": span_ends,
        "span_labels": span_labels,
    }
    for name, value in row.items():
        columns[name].append(value)


# ---------------------------------------------------------------------------------------------------------------------
# Building the folder
# ---------------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------------
# JSONL input (tokenization/jsonl.py reads it)
# ---------------------------------------------------------------------------------------------------------------------


def _article_rows(
    paths: list[str],
    title_column: str = "title",
    text_column: str = "text",
    id_column: str | None = None,
    id_required: bool = False,
) -> Iterator[dict]:
    """{"title", "text"} of each line (+ "passage_id" with an id_column: the field's string or number as a string,
    None where the line lacks it unless id_required)."""
    for path in paths:
        for number, row in iter_jsonl(path):
            article = {
                "title": jsonl_string(row, title_column, path, number),
                "text": jsonl_string(row, text_column, path, number),
            }
            if id_column is not None:
                article[PASSAGE_ID] = jsonl_id(row, id_column, id_required, path, number)
            yield article


def resolve_tokenizer(tokenizer) -> tuple[Any, str]:
    """A tokenizer object, or a name/path for AutoTokenizer (a REALM checkpoint folder works) -> (tokenizer, name)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer  # openrealm (imported with this package) registers RealmTokenizer

        name = os.fspath(tokenizer)
        return AutoTokenizer.from_pretrained(name), name
    if tokenizer is None:
        raise ValueError("a tokenizer is needed (an object, or a name/path for AutoTokenizer.from_pretrained)")
    return tokenizer, getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def load_articles(source, cache_dir: str, options: InputOptions | None = None, passages: bool = False):
    """Articles -> (Dataset with "title" and "text", and "passage_id" when passages, name for messages).

    source: a datasets.Dataset, or an --input path or list of them: JSONL files, Parquet and CSV/TSV files, globs of
    them, save_to_disk folders, a Hub dataset id (tokenization/sources.py). options: the columns to read, a Hub
    dataset's configuration and split (sources.InputOptions; default title, text). passages: also read each row's
    passage id (options.id_column: every row must have it; None: an "id" column where there is one, else None).
    """
    from datasets import Dataset

    options = options or InputOptions()
    if isinstance(source, Dataset):
        return _dataset_articles(source, options, passages)
    paths = _source_paths(source)
    if all(input_kind(path) == "jsonl" for path in paths):
        return _jsonl_articles(paths, cache_dir, options, passages), ", ".join(paths)

    def jsonl_loader(path: str):
        return _jsonl_articles([path], cache_dir, options, passages)

    return load_table_articles(paths, cache_dir, options, read_ids=passages, jsonl_loader=jsonl_loader)


def _dataset_articles(articles, options: InputOptions, passages: bool):
    """A datasets.Dataset given in Python -> (its title/text[/passage_id] columns under the standard names, name)."""
    name = articles.info.dataset_name or f"datasets.Dataset({len(articles)} rows)"
    columns = options.columns(passages, articles.column_names)
    for column in columns.values():
        if column not in articles.column_names:
            raise ValueError(f"{name} has no {column!r} field (fields: {', '.join(articles.column_names) or 'none'})")
    return standard_columns(articles, columns, passages), name


def _jsonl_articles(paths: list[str], cache_dir: str, options: InputOptions, passages: bool):
    """JSONL files -> Dataset with "title", "text" (and "passage_id" when passages); errors name the file and line."""
    from datasets import Dataset, Features, Value

    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"article file not found: {path}")
    name = ", ".join(paths)
    if all(next(iter_jsonl(path), None) is None for path in paths):
        raise ValueError(f"{name} holds no articles (empty file)")
    features = Features({"title": Value("string"), "text": Value("string")})
    gen_kwargs = {"paths": paths, "title_column": options.title_column, "text_column": options.text_column}
    if passages:
        features[PASSAGE_ID] = Value("string")
        gen_kwargs.update(id_column=options.columns(True)[PASSAGE_ID], id_required=options.id_column is not None)
    try:
        return Dataset.from_generator(_article_rows, gen_kwargs=gen_kwargs, features=features, cache_dir=cache_dir)
    except Exception as error:  # datasets wraps the generator's error in a generic one: report the line's
        cause = error
        while cause is not None and not isinstance(cause, (JsonlError, OSError)):
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, JsonlError):
            raise JsonlError(cause.path, cause.line, cause.problem) from None
        if cause is not None:  # e.g. a full disk while datasets writes its cache: not the input's fault
            raise cause from None
        raise


def _source_paths(source) -> list[str]:
    return [os.fspath(p) for p in source] if isinstance(source, (list, tuple)) else [os.fspath(source)]


def _written_by_build(output_dir: str) -> set[str]:
    """Top-level names of a corpus folder that `build_corpus` wrote: the "files" its corpus_config.json lists (older
    corpora: the corpus files and the usual tokenizer files)."""
    try:
        with open(os.path.join(output_dir, CONFIG_NAME), encoding="utf-8") as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    if isinstance(files, list) and all(isinstance(name, str) for name in files):
        return {CONFIG_NAME, *files}
    return {CONFIG_NAME, BLOCKS_DIR, BLOCK_RECORDS_NAME, *_LEGACY_TOKENIZER_FILES}


def _corpus_folder_problem(output_dir: str) -> str | None:
    """Why replacing the non-empty output_dir would delete something a build did not write, or None: a folder that
    is not a corpus (e.g. a home directory or notes), or a corpus folder holding other files."""
    if not os.path.isdir(output_dir):
        return "it exists and is not a directory"
    if not os.path.isfile(os.path.join(output_dir, CONFIG_NAME)):
        return f"it is not an openrealm corpus (no {CONFIG_NAME})"
    foreign = sorted(set(os.listdir(output_dir)) - _written_by_build(output_dir))
    if foreign:
        return (
            f"it holds files that corpus build did not write ({', '.join(foreign)}); move them out or choose another "
            "output"
        )
    return None


def _iter_records(blocks, passage_ids: bool = False, batch_size: int = 4096) -> Iterator[tuple]:
    """(title, text) of each block, (title, text, passage_id) with passage_ids."""
    names = ["title", "text", PASSAGE_ID] if passage_ids else ["title", "text"]
    for batch in blocks.select_columns(names).iter(batch_size=batch_size):
        yield from zip(*(batch[name] for name in names))


def _progress(iterable: Iterable | None, total: int, desc: str) -> Iterable:
    """A bar of `total` blocks over iterable (None: a bar moved by its update(n)); shown as datasets' bars are."""
    from datasets.utils import tqdm  # tqdm that follows datasets' enable/disable_progress_bars()

    return tqdm(iterable, total=total, desc=desc, unit=" blocks")


def build_corpus(
    source,
    output_dir: str | os.PathLike,
    tokenizer,
    max_block_length: int = MAX_BLOCK_LENGTH,
    num_proc: int = 1,
    span_annotator: SpanAnnotator | Callable[[], SpanAnnotator] | None = None,
    batch_size: int | None = None,
    overwrite: bool = False,
    page_filter: bool = True,
    html_unescape: bool = True,
    language: str = "en",
    progress: bool | None = None,
    deduplicate: bool = True,
    *,
    input_options: InputOptions | None = None,
    passages_as_blocks: bool = False,
):
    """Build the knowledge corpus folder `output_dir` from articles; returns its blocks (`load_corpus(output_dir)`).

    source: a JSONL path (or list of paths), one {"title", "text"} object (strings) per line (other fields are ignored,
        blank lines skipped; a bad line is a JsonlError naming the file and line), or a
        `datasets.Dataset` with "title" and "text" columns. Row i is article i (`article_id`). Also Parquet and
        CSV/TSV files, globs of them, folders written by datasets' save_to_disk, and a Hub dataset id, read by
        datasets' loaders (tokenization/sources.py); a bad row is a ValueError naming the file, the 1-based row and
        the column.
    input_options: the title, text and id columns (JSONL: fields) to read, a Hub dataset's configuration and split
        (sources.InputOptions; default: title, text, and id where there is one).
    passages_as_blocks: every input row is a passage already split (DPR's 100-word passages): it becomes one block,
        cut at a word boundary where it exceeds max_block_length (counted: corpus_config.json's num_passages_cut),
        and its id (input_options.id_column, else the "id" column where there is one) is kept as the block's
        passage_id, in blocks/ and in block_records.safetensors (what the retriever, `openrealm ask` and evaluate
        report). From a folder of documents, every block keeps its document's path in the folder as its passage_id
        (corpus_config.json's document_ids).
    tokenizer: a tokenizers-backed BERT/REALM tokenizer, or a name/path for AutoTokenizer (a REALM checkpoint folder).
    max_block_length: wordpieces of `[CLS] title [SEP] body [SEP]` per block (Google: 288).
    num_proc: processes for `datasets.map` (blocks are identical for any value, and in input order).
    span_annotator: `(sentence) -> [(char start, end, label)]` (e.g. `salient_spans.make_span_annotator("regex")`),
        or a zero-argument factory of one, called once in each process (use it for heavy models); it must pickle
        when num_proc > 1. Spans are stored as offsets in the block text; spans not inside their sentence are dropped.
        An annotator with `annotate_batch(sentences)` gets whole batches of sentences. None: no spans.
    batch_size: articles per `map` batch (default ARTICLES_PER_BATCH, 256; with passages_as_blocks PASSAGES_PER_BATCH,
        1,000 passages).
    progress: show the packing bar (True) or not (False) whatever datasets' progress-bar setting; None follows it.
    overwrite: replace an existing corpus at output_dir (only once the new one is complete). Refused when that would
        delete anything a build did not write: a folder that is not a corpus (unless empty), a corpus folder holding
        other files. An output_dir that is, holds or lies inside an input file or the tokenizer's folder is refused.
    page_filter: drop "List of …", "Index of …", "Outline of …" and "(disambiguation)" pages, as Google did.
    html_unescape: `html.unescape` the article text (not the title), as Google did for WikiExtractor output.
    language: sentencex language code.
    deduplicate: drop every block with the same title and text as an earlier block (`duplicate_rows`; docs/corpus.md
        says why this is the default); False keeps them. corpus_config.json records `deduplicate`,
        `num_duplicate_blocks` (duplicates the corpus holds) and `num_duplicates_dropped`.

    Everything is written to a temporary sibling of output_dir and renamed when complete: a failure leaves nothing.
    """
    from datasets import Dataset, load_from_disk

    output_dir = os.path.abspath(os.fspath(output_dir))
    inputs = [] if isinstance(source, Dataset) else _source_paths(source)
    if isinstance(tokenizer, (str, os.PathLike)):
        inputs.append(("the tokenizer", os.fspath(tokenizer)))  # a folder replacing would delete (not a Hub name)
    check_replaceable(output_dir, overwrite, _corpus_folder_problem, inputs)  # before any (long) work
    tokenizer, tokenizer_name = resolve_tokenizer(tokenizer)
    # A folder of documents: every block keeps its document's path (what `openrealm ask` and the pipeline report).
    document_ids = any(
        input_kind(path) == "documents" for path in ([] if isinstance(source, Dataset) else _source_paths(source))
    )
    keep_ids = passages_as_blocks or document_ids
    builder = BlockBuilder(
        tokenizer,
        max_block_length,
        span_annotator,
        page_filter,
        html_unescape,
        language,
        passages=passages_as_blocks,
        keep_ids=keep_ids,
    )
    try:
        with atomic_directory(output_dir, overwrite, _corpus_folder_problem, inputs=inputs) as staging:
            # datasets' cache files: inside the staging folder, removed below
            scratch = os.path.join(staging, ".scratch")
            articles, builder.source_name = load_articles(source, scratch, input_options, keep_ids)
            blocks, num_cut = pack_articles(
                articles, builder, scratch, num_proc=num_proc, batch_size=batch_size, progress=progress
            )
            # The articles' Arrow copy in the scratch folder (of a file input) is not read again: its memory and disk
            # go before blocks/ is written. A saved or Hub dataset's files are not in it.
            num_input_articles, copies = len(articles), [entry["filename"] for entry in articles.cache_files]
            del articles
            for path in copies:
                if path_within(path, scratch):
                    with contextlib.suppress(OSError):  # where a mapped file cannot go yet, it goes with the scratch
                        os.remove(path)
            duplicates = duplicate_rows(blocks.data.column("uid"))
            # blocks/ straight from the packed blocks, less the duplicates; block ids are the row numbers written
            # (known only once every process has packed its share)
            num_blocks = save_blocks(
                blocks,
                os.path.join(staging, BLOCKS_DIR),
                skip_rows=duplicates if deduplicate else (),
                first_block_id=0,
                columns=block_columns(keep_ids),
            )
            num_duplicates = len(duplicates)
            del blocks, duplicates
            shutil.rmtree(scratch, ignore_errors=True)
            saved = load_from_disk(os.path.join(staging, BLOCKS_DIR))
            num_articles = count_distinct_in_order(saved.data.column("article_id"))
            _write_block_records(os.path.join(staging, BLOCK_RECORDS_NAME), saved, keep_ids, document_ids)
            tokenizer.save_pretrained(staging)
            config = {
                "format": CORPUS_FORMAT,
                "format_version": CORPUS_FORMAT_VERSION,
                "build_id": uuid.uuid4().hex,  # this build's identity: an index records the build it embedded
                "version": 0,  # + 1 at each corpus add / remove / update
                "max_block_length": max_block_length,
                "num_blocks": num_blocks,
                "num_articles": num_articles,
                "num_input_articles": num_input_articles,
                "tokenizer": tokenizer_name,
                "sentence_splitter": f"sentencex {_version('sentencex')}",
                "span_annotators": annotator_names(span_annotator),
                "page_filter": page_filter,
                "html_unescape": html_unescape,
                "language": language,
                "deduplicate": deduplicate,
                "passages_as_blocks": passages_as_blocks,
                "document_ids": document_ids,
                "num_passages_cut": num_cut,
                "num_duplicate_blocks": 0 if deduplicate else num_duplicates,
                "num_duplicates_dropped": num_duplicates if deduplicate else 0,
                "source": builder.source_name,
                "files": sorted({CONFIG_NAME, *os.listdir(staging)}),  # what --overwrite may replace, nothing else
            }
            with open(os.path.join(staging, CONFIG_NAME), "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2, ensure_ascii=False)
                f.write("\n")
            del saved
    except OSError as error:  # a full disk names output_dir, not the input file datasets was reading
        full = full_disk_error(error, output_dir)
        if full is not None:
            raise full from error
        raise
    return load_corpus(output_dir)


@contextlib.contextmanager
def datasets_progress_bars(enabled: bool | None) -> Iterator[None]:
    """Show (True) or hide (False) datasets' progress bars inside the block, then restore the setting; None: as set."""
    import datasets

    before = datasets.is_progress_bar_enabled()
    if enabled is not None and enabled != before:
        (datasets.enable_progress_bars if enabled else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        if datasets.is_progress_bar_enabled() != before:
            (datasets.enable_progress_bars if before else datasets.disable_progress_bars)()


def pack_articles(
    articles,
    builder: BlockBuilder,
    scratch: str,
    num_proc: int = 1,
    batch_size: int | None = None,
    first_id: int = 0,
    progress: bool | None = None,
) -> tuple[Any, int]:
    """Articles (a Dataset with "title", "text"; row i = article first_id + i) -> (their blocks (all COLUMNS but
    block_id), in article order; the number of passages cut to fit a block (builder.passages; else 0)). With
    builder.keep_ids the articles also hold "passage_id", and so do the blocks. datasets' cache files go to
    `scratch`. Refuses input that makes no block. batch_size: articles per map batch (None: ARTICLES_PER_BATCH, or
    PASSAGES_PER_BATCH with builder.passages). progress: show the "Packing articles into blocks" bar or not,
    whatever datasets' setting (None: follow it)."""
    from datasets import Value

    if batch_size is None:
        batch_size = PASSAGES_PER_BATCH if builder.passages else ARTICLES_PER_BATCH

    features = block_features(passages=builder.keep_ids)
    del features["block_id"]
    if builder.passages:
        features["cut"] = Value("bool")
    with datasets_progress_bars(progress):
        blocks = articles.map(
            builder,
            batched=True,
            batch_size=batch_size,
            with_indices=True,
            input_columns=["title", "text", PASSAGE_ID] if builder.keep_ids else ["title", "text"],
            remove_columns=articles.column_names,
            features=features,
            num_proc=num_proc if num_proc > 1 else None,
            cache_file_name=os.path.join(scratch, "blocks.arrow"),
            load_from_cache_file=False,
            new_fingerprint=uuid.uuid4().hex,  # hashing the tokenizer for a fingerprint is slow and useless here
            desc="Packing articles into blocks",
        )
    if len(blocks) == 0:
        raise ValueError(f"{builder.source_name} produced no blocks (no article with text passed the page filter)")
    if first_id:
        shifted = blocks.data.column("article_id").to_numpy() + first_id
        blocks = blocks.remove_columns("article_id").add_column("article_id", shifted, feature=Value("int64"))
    num_cut = 0
    if builder.passages:
        import pyarrow.compute as pc

        num_cut = int(pc.sum(blocks.data.column("cut")).as_py() or 0)
        blocks = blocks.remove_columns("cut")
    return blocks, num_cut


def read_removed_block_ids(directory: str | os.PathLike) -> np.ndarray:
    """Sorted ids [R] of the blocks removed from a corpus folder (`openrealm corpus remove`): their rows stay, so
    other ids never change, but no index built from the corpus returns them. Empty when none were removed."""
    path = os.path.join(os.fspath(directory), REMOVED_IDS_NAME)
    config = read_corpus_config(directory)
    if not os.path.isfile(path):
        if config.get("num_removed", 0):
            raise FileNotFoundError(
                f"{CONFIG_NAME} of {os.fspath(directory)} says blocks were removed but {path} is missing"
            )
        return np.zeros(0, dtype=np.int64)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        ids = load_file(path).get("removed_ids")
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error})") from error
    if ids is None or ids.ndim != 1 or ids.dtype != np.int64:
        raise ValueError(f"{path} must hold one int64 vector 'removed_ids'")
    if ids.size and (ids.min() < 0 or ids.max() >= config["num_blocks"] or (np.diff(ids) <= 0).any()):
        raise ValueError(f"{path}: removed ids must be sorted, unique and in [0, {config['num_blocks']})")
    return ids


def write_removed_block_ids(path: str | os.PathLike, ids: np.ndarray) -> None:
    """Write removed block ids (sorted, unique int64) as safetensors."""
    from safetensors.numpy import save_file

    save_file({"removed_ids": np.asarray(ids, dtype=np.int64)}, os.fspath(path))


def _write_block_records(path: str, blocks, passage_ids: bool = False, ids_are_paths: bool = False) -> None:
    records = _progress(_iter_records(blocks, passage_ids), len(blocks), "Writing block records")
    BlockRecords.write(
        path, records, num_blocks_hint=len(blocks), passage_ids=passage_ids, ids_are_paths=ids_are_paths
    )


def block_columns(passage_ids: bool) -> list[str]:
    """The columns of a corpus's blocks/ dataset: COLUMNS, and passage_id in a corpus that keeps ids."""
    return [*COLUMNS, PASSAGE_ID] if passage_ids else list(COLUMNS)


def keeps_ids(config: Mapping) -> bool:
    """Whether the blocks of a corpus (its corpus_config.json) keep an id: a passage's (--passages-as-blocks) or the
    path of the document they come from (a folder of documents)."""
    return bool(config.get("passages_as_blocks", False) or config.get("document_ids", False))


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------------


def read_corpus_config(directory: str | os.PathLike) -> dict:
    """corpus_config.json of a corpus folder, with its format and version checked."""
    path = os.path.join(os.fspath(directory), CONFIG_NAME)
    if not os.path.isdir(os.fspath(directory)):
        raise FileNotFoundError(f"corpus folder not found: {os.fspath(directory)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{os.fspath(directory)} is not an openrealm corpus: {CONFIG_NAME} is missing")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(config, dict) or config.get("format") != CORPUS_FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise ValueError(f"{path}: format is {found!r}, expected {CORPUS_FORMAT!r}")
    if config.get("format_version") != CORPUS_FORMAT_VERSION:
        raise ValueError(
            f"{path}: unsupported format_version {config.get('format_version')!r} (this reader knows "
            f"{CORPUS_FORMAT_VERSION})"
        )
    num_blocks = config.get("num_blocks")
    if type(num_blocks) is not int or num_blocks < 0:
        raise ValueError(f"{path}: num_blocks {num_blocks!r} is not a non-negative integer")
    return config


def load_corpus(directory: str | os.PathLike):
    """The blocks of a corpus folder as a memory-mapped `datasets.Dataset` (COLUMNS), after checking that
    corpus_config.json, blocks/ and block_records.safetensors agree."""
    from datasets import load_from_disk

    directory = os.fspath(directory)
    config = read_corpus_config(directory)
    blocks_dir = os.path.join(directory, BLOCKS_DIR)
    if not os.path.isdir(blocks_dir):
        raise FileNotFoundError(f"{directory} is not a complete corpus: {BLOCKS_DIR}/ is missing")
    try:
        blocks = load_from_disk(blocks_dir)
    except Exception as error:  # noqa: BLE001 - datasets raises several types for a damaged folder
        raise ValueError(f"cannot load the blocks dataset {blocks_dir}: {error}") from error
    missing = [column for column in block_columns(keeps_ids(config)) if column not in blocks.column_names]
    if missing:
        raise ValueError(f"{blocks_dir} lacks the column(s) {', '.join(missing)}")
    if len(blocks) != config["num_blocks"]:
        raise ValueError(
            f"{blocks_dir} holds {len(blocks)} blocks but {os.path.join(directory, CONFIG_NAME)} says "
            f"{config['num_blocks']}"
        )
    records_path = os.path.join(directory, BLOCK_RECORDS_NAME)
    records = BlockRecords.open(records_path)
    if len(records) != len(blocks):
        raise ValueError(f"{records_path} holds {len(records)} blocks but {blocks_dir} holds {len(blocks)}")
    check_token_ids(blocks, blocks_dir, os.path.join(directory, "tokenizer.json"))
    return blocks


TOKEN_ID_COLUMNS = ("title_ids", "token_ids")


def token_id_range(blocks) -> tuple[int, int] | None:
    """(smallest, largest) wordpiece id of the blocks' title_ids and token_ids: min/max over the memory-mapped Arrow
    columns, no Python loop. None when the blocks hold no ids."""
    import pyarrow.compute as pc

    table = blocks.data.table if hasattr(blocks, "data") else blocks
    ranges = [pc.min_max(pc.list_flatten(table.column(column))) for column in TOKEN_ID_COLUMNS]
    ranges = [(bounds["min"].as_py(), bounds["max"].as_py()) for bounds in ranges]
    ranges = [bounds for bounds in ranges if bounds[0] is not None]
    return (min(low for low, _ in ranges), max(high for _, high in ranges)) if ranges else None


def check_token_ids(blocks, blocks_dir: str, tokenizer_file: str) -> None:
    """Every wordpiece id of the blocks is at least 0 and, where the corpus has its tokenizer.json, an id of that
    vocabulary: a ValueError naming the block otherwise (the blocks were changed by hand or by another tool), rather
    than an IndexError inside a model."""
    import pyarrow.compute as pc

    id_range = token_id_range(blocks)
    vocab_size = None
    if os.path.isfile(tokenizer_file):
        from tokenizers import Tokenizer

        try:
            vocab_size = Tokenizer.from_file(tokenizer_file).get_vocab_size(with_added_tokens=True)
        except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception for a damaged file
            raise ValueError(f"{tokenizer_file} is not a tokenizer file: {error}") from None
    if id_range is None or (id_range[0] >= 0 and (vocab_size is None or id_range[1] < vocab_size)):
        return
    table = blocks.data.table if hasattr(blocks, "data") else blocks
    for column in TOKEN_ID_COLUMNS:
        ids = table.column(column)
        flat = pc.list_flatten(ids)
        outside = (
            pc.less(flat, 0) if vocab_size is None else pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab_size))
        )
        position = pc.index(outside, True).as_py()
        if position >= 0:
            block = pc.list_parent_indices(ids)[position].as_py()
            allowed = (
                "0 or more" if vocab_size is None else f"0 to {vocab_size - 1}, the vocabulary of {tokenizer_file}"
            )
            raise ValueError(
                f"{blocks_dir}: block {block} holds wordpiece id {flat[position].as_py()} in {column}, outside "
                f"{allowed}: the blocks were changed after corpus build"
            )


# ---------------------------------------------------------------------------------------------------------------------
# Retriever inputs (Google's featurization.py)
# ---------------------------------------------------------------------------------------------------------------------


def block_retriever_inputs(
    title_ids: Sequence[int], token_ids: Sequence[int], tokenizer, max_length: int = MAX_BLOCK_LENGTH
) -> dict[str, list[int]]:
    """`[CLS] title [SEP] body [SEP]` of one block (Google's pad_or_truncate_pair, without the padding).

    The title is truncated first, to at most max_length - 3; the body gets what remains. Segment ids are 0 for
    `[CLS] title [SEP]` and 1 for `body [SEP]`. Returns lists input_ids, token_type_ids, attention_mask
    [<= max_length].
    """
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3 for [CLS] [SEP] [SEP], got {max_length}")
    title = list(title_ids[: max_length - 3])
    body = list(token_ids[: max_length - 3 - len(title)])
    input_ids = [tokenizer.cls_token_id, *title, tokenizer.sep_token_id, *body, tokenizer.sep_token_id]
    token_type_ids = [0] * (len(title) + 2) + [1] * (len(body) + 1)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}


def batch_retriever_inputs(
    rows: Sequence[Mapping] | Mapping[str, Sequence], tokenizer, max_length: int = MAX_BLOCK_LENGTH
) -> dict[str, torch.Tensor]:
    """`block_retriever_inputs` of B blocks, padded to the longest -> input_ids, token_type_ids, attention_mask [B, L].

    rows: dicts with "title_ids" and "token_ids" (rows of the blocks dataset), or a batch of columns (`blocks[a:b]`).
    """
    if isinstance(rows, Mapping):
        pairs = list(zip(rows["title_ids"], rows["token_ids"]))
    else:
        pairs = [(row["title_ids"], row["token_ids"]) for row in rows]
    if not pairs:
        raise ValueError("batch_retriever_inputs needs at least one block")
    encoded = [block_retriever_inputs(title, body, tokenizer, max_length) for title, body in pairs]
    length = max(len(e["input_ids"]) for e in encoded)
    out = {
        "input_ids": torch.full((len(encoded), length), tokenizer.pad_token_id, dtype=torch.long),
        "token_type_ids": torch.zeros((len(encoded), length), dtype=torch.long),
        "attention_mask": torch.zeros((len(encoded), length), dtype=torch.long),
    }
    for i, e in enumerate(encoded):
        for name, tensor in out.items():
            tensor[i, : len(e[name])] = torch.tensor(e[name], dtype=torch.long)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Command line: openrealm corpus build
# ---------------------------------------------------------------------------------------------------------------------


def passages_cut_note(num_cut: int, max_block_length: int) -> str:
    """The end of a corpus command's summary line when passages were cut to fit a block ("" when none)."""
    if not num_cut:
        return ""
    return f" ({num_cut} passage(s) longer than {max_block_length} wordpieces with their title: cut to fit one block)"


def duplicates_note(dropped: int) -> str:
    """The end of a corpus command's summary line when duplicate blocks were dropped ("" when none)."""
    if not dropped:
        return ""
    return f" ({dropped} duplicate block(s) dropped: the same title and text as an earlier block)"


def duplicates_warning(num_duplicates: int, num_blocks: int) -> str | None:
    """What a corpus command warns when the corpus keeps duplicate blocks (--no-deduplicate), else None."""
    if not num_duplicates:
        return None
    return (
        f"{num_duplicates} of {num_blocks} blocks duplicate an earlier block (the same title and text); REALM "
        "pre-training drops every example whose retrieved blocks include two copies of one, and copies take the "
        "places of other blocks among the retrieved ones. Rebuild it with `openrealm corpus build` (without "
        "--no-deduplicate) to drop them."
    )


__all__ = [
    "BlockBuilder",
    "COLUMNS",
    "CONFIG_NAME",
    "CORPUS_FORMAT",
    "CORPUS_FORMAT_VERSION",
    "annotator_names",
    "batch_retriever_inputs",
    "block_features",
    "block_retriever_inputs",
    "build_corpus",
    "count_duplicate_blocks",
    "document_uid",
    "drop_duplicate_blocks",
    "duplicate_rows",
    "is_removed_page",
    "load_articles",
    "load_corpus",
    "pack_articles",
    "read_corpus_config",
    "read_removed_block_ids",
    "save_blocks",
    "write_removed_block_ids",
]
