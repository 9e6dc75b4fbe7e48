"""Duplicate blocks: a block's uid (Google's SHA-1 of title and text), the rows that repeat an earlier one, and the
counts and notes the corpus commands print (docs/corpus.md, "Duplicate blocks")."""

from __future__ import annotations

import os
import uuid

import numpy as np

from openrealm.tokenization.corpus_folder import save_blocks


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
    "count_distinct_in_order",
    "count_duplicate_blocks",
    "drop_duplicate_blocks",
    "duplicate_rows",
    "duplicates_note",
    "duplicates_warning",
]
