"""The corpus folder's format, read and written in one place so that writer and reader cannot drift:
corpus_config.json, blocks/ (Arrow), block_records.safetensors, removed_ids.safetensors and the tokenizer."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from openrealm.block_records import BlockRecords
from openrealm.retrieval_realm import BLOCK_RECORDS_NAME, CORPUS_CONFIG_NAME, CORPUS_REMOVED_IDS_NAME
from openrealm.tokenization.blocks import COLUMNS
from openrealm.tokenization.sources import (
    PASSAGE_ID,
)

CORPUS_FORMAT = "openrealm.corpus"
CORPUS_FORMAT_VERSION = 1
BLOCKS_DIR = "blocks"
# corpus_config.json, block_records.safetensors and removed_ids.safetensors (ids of removed blocks, absent when none):
# named where RealmRetriever.from_pretrained reads them, so that the two cannot disagree.
CONFIG_NAME, REMOVED_IDS_NAME = CORPUS_CONFIG_NAME, CORPUS_REMOVED_IDS_NAME


# Top-level names a corpus folder written before corpus_config.json listed its "files" may hold (tokenizer files).
_LEGACY_TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "added_tokens.json"}
)


def progress_bar(iterable: Iterable | None, total: int, desc: str) -> Iterable:
    """A bar of `total` blocks over iterable (None: a bar moved by its update(n)); shown as datasets' bars are."""
    from datasets.utils import tqdm  # tqdm that follows datasets' enable/disable_progress_bars()

    return tqdm(iterable, total=total, desc=desc, unit=" blocks")


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
    with progress_bar(None, num_rows, "Saving the dataset") as bar:  # an inner step: shown with --verbose only
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


def written_by_build(output_dir: str) -> set[str]:
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


def corpus_folder_problem(output_dir: str) -> str | None:
    """Why replacing the non-empty output_dir would delete something a build did not write, or None: a folder that
    is not a corpus (e.g. a home directory or notes), or a corpus folder holding other files."""
    if not os.path.isdir(output_dir):
        return "it exists and is not a directory"
    if not os.path.isfile(os.path.join(output_dir, CONFIG_NAME)):
        return f"it is not an openrealm corpus (no {CONFIG_NAME})"
    foreign = sorted(set(os.listdir(output_dir)) - written_by_build(output_dir))
    if foreign:
        return (
            f"it holds files that corpus build did not write ({', '.join(foreign)}); move them out or choose another "
            "output"
        )
    return None


def iter_block_records(blocks, passage_ids: bool = False, batch_size: int = 4096) -> Iterator[tuple]:
    """(title, text) of each block, (title, text, passage_id) with passage_ids."""
    names = ["title", "text", PASSAGE_ID] if passage_ids else ["title", "text"]
    for batch in blocks.select_columns(names).iter(batch_size=batch_size):
        yield from zip(*(batch[name] for name in names))


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


def without_rows(blocks, ids):
    """`blocks` (a Dataset) less the rows `ids` (e.g. read_removed_block_ids: the blocks `corpus remove` removed,
    whose rows stay in the corpus); `blocks` itself when there are none."""
    if not len(ids):
        return blocks
    return blocks.select(np.setdiff1d(np.arange(len(blocks)), ids))


def write_removed_block_ids(path: str | os.PathLike, ids: np.ndarray) -> None:
    """Write removed block ids (sorted, unique int64) as safetensors."""
    from safetensors.numpy import save_file

    save_file({"removed_ids": np.asarray(ids, dtype=np.int64)}, os.fspath(path))


def write_block_records(path: str, blocks, passage_ids: bool = False, ids_are_paths: bool = False) -> None:
    records = progress_bar(iter_block_records(blocks, passage_ids), len(blocks), "Writing block records")
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


__all__ = [
    "progress_bar",
    "BLOCKS_DIR",
    "BLOCK_RECORDS_NAME",
    "CONFIG_NAME",
    "CORPUS_FORMAT",
    "CORPUS_FORMAT_VERSION",
    "REMOVED_IDS_NAME",
    "TOKEN_ID_COLUMNS",
    "block_columns",
    "check_token_ids",
    "corpus_folder_problem",
    "iter_block_records",
    "keeps_ids",
    "load_corpus",
    "read_corpus_config",
    "read_removed_block_ids",
    "save_blocks",
    "token_id_range",
    "write_block_records",
    "without_rows",
    "write_removed_block_ids",
    "written_by_build",
]
