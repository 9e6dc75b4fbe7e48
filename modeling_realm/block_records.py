"""Knowledge-corpus records ("block records") of REALM: storage, and a safe reader for legacy files.

`block_records.safetensors` holds the title and text of every block as UTF-8 bytes, concatenated, with offsets:

    title_offsets int64 [N+1], text_offsets int64 [N+1], title_bytes uint8 [T1], text_bytes uint8 [T2]
    metadata {"format": "openrealm.block_records", "format_version": "1", "num_blocks": "N"}

Block i's text is text_bytes[text_offsets[i]:text_offsets[i + 1]]. The int64 tensors come first so that they are
8-byte aligned in the file. Reading memory-maps the file; nothing is loaded whole. A corpus of passages kept as
blocks (`openrealm corpus build --passages-as-blocks`, docs/corpus.md) also stores each block's passage id, e.g. DPR's
psgs_w100.tsv id: passage_id_offsets int64 [N+1] after text_offsets and passage_id_bytes uint8 [T3] last (an empty
id: the block has none). A file without them is what every earlier version wrote. A corpus built from a folder of
documents stores each block's document path (relative to the folder) the same way, marked by the metadata entry
"passage_ids": "paths".

The legacy `block_records.npy` of transformers 4.x is a pickled numpy object array of bytes. It is read here by
interpreting the pickle opcodes with a whitelist; nothing named by the file is ever imported or called.

The module is long because the safe reader of legacy pickles (an opcode whitelist) lives beside the format.
"""

from __future__ import annotations

import json
import operator
import os
import pickletools
import shutil
import struct
import tempfile
import tokenize
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import numpy as np
import torch

from .file_utils import atomic_file

FORMAT = "openrealm.block_records"
FORMAT_VERSION = "1"
# Tensor order in the file: int64 tensors first, so that every tensor is aligned to its item size.
_LAYOUT = (("title_offsets", "I64", 8), ("text_offsets", "I64", 8), ("title_bytes", "U8", 1), ("text_bytes", "U8", 1))
# The same with each block's passage id (optional; see the module docstring).
_LAYOUT_WITH_IDS = (
    *_LAYOUT[:2],
    ("passage_id_offsets", "I64", 8),
    *_LAYOUT[2:],
    ("passage_id_bytes", "U8", 1),
)
MAX_SAFETENSORS_HEADER = 100_000_000  # bytes of JSON header: the limit safetensors itself enforces
_CHUNK = 1 << 20


class BlockRecords:
    """Memory-mapped (title, text) records of N blocks, read from a `block_records.safetensors` file."""

    def __init__(self, path: str, data: np.memmap, spans: dict[str, tuple[int, int]]):
        self.path = path
        self._spans = spans  # tensor name -> (start, end) byte range in the file, for error messages
        self._title_offsets = data[slice(*spans["title_offsets"])].view("<i8")
        self._text_offsets = data[slice(*spans["text_offsets"])].view("<i8")
        self._title_bytes = data[slice(*spans["title_bytes"])]
        self._text_bytes = data[slice(*spans["text_bytes"])]
        self.has_passage_ids = "passage_id_bytes" in spans
        self.ids_are_paths = False  # passage ids that are documents' paths (metadata "passage_ids": "paths")
        if self.has_passage_ids:
            self._passage_id_offsets = data[slice(*spans["passage_id_offsets"])].view("<i8")
            self._passage_id_bytes = data[slice(*spans["passage_id_bytes"])]

    @classmethod
    def open(cls, path: str | os.PathLike) -> BlockRecords:
        """Open and validate a `block_records.safetensors` file; the byte buffers are memory-mapped read-only."""
        path = os.fspath(path)
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path} is a directory; pass the block_records.safetensors file in it")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"block records file not found: {path}")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ValueError(f"{path} is not a block records file: {size} bytes is too short for a header")
            header_len = struct.unpack("<Q", prefix)[0]
            if header_len > min(MAX_SAFETENSORS_HEADER, size - 8):
                raise ValueError(f"{path} is not a block records file: header length {header_len} exceeds the file")
            try:
                header = json.loads(f.read(header_len))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{path} is not a block records file: header is not JSON ({e})") from None
        spans = _validate_header(path, header, data_start=8 + header_len, data_size=size - 8 - header_len)
        records = cls(path, np.memmap(path, dtype=np.uint8, mode="r"), spans)
        records.ids_are_paths = records.has_passage_ids and header["__metadata__"].get("passage_ids") == "paths"
        records._validate_offsets("title")
        records._validate_offsets("text")
        if records.has_passage_ids:
            records._validate_offsets("passage_id")
        return records

    def _validate_offsets(self, field: str) -> None:
        offsets, data = getattr(self, f"_{field}_offsets"), getattr(self, f"_{field}_bytes")
        if offsets[0] != 0 or offsets[-1] != len(data):
            raise ValueError(
                f"{self.path} is corrupt: {field}_offsets run from {offsets[0]} to {offsets[-1]}, "
                f"expected 0 to {len(data)} (the length of {field}_bytes)"
            )
        # Chunked so that validating 13M offsets does not allocate a full-size temporary.
        for start in range(0, len(offsets) - 1, _CHUNK):
            bad = np.flatnonzero(np.diff(offsets[start : start + _CHUNK + 1]) < 0)
            if len(bad):
                block = start + int(bad[0])
                raise ValueError(f"{self.path} is corrupt: {field}_offsets decrease at block {block}")

    def __len__(self) -> int:
        return len(self._text_offsets) - 1

    def __repr__(self) -> str:
        return f"BlockRecords({self.path!r}, num_blocks={len(self)})"

    def _check_id(self, block_id: Any) -> int:
        i = operator.index(block_id)
        if not 0 <= i < len(self):
            raise IndexError(f"block id {i} is out of range for {len(self)} blocks in {self.path}")
        return i

    def _ids(self, ids: Any) -> list[int]:
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TypeError(f"block ids must be integers, got an array of {ids.dtype}")
            ids = ids.reshape(-1).tolist()
        return [self._check_id(i) for i in ids]

    def _decode(self, field: str, i: int) -> str:
        offsets, data = getattr(self, f"_{field}_offsets"), getattr(self, f"_{field}_bytes")
        start = int(offsets[i])
        try:
            return data[start : int(offsets[i + 1])].tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            where = self._spans[f"{field}_bytes"][0] + start + e.start
            raise ValueError(
                f"invalid UTF-8 in the {field} of block {i} of {self.path} (byte {where} of the file)"
            ) from None

    def text_bytes(self, block_id: int) -> bytes:
        """Raw UTF-8 bytes of one block's text."""
        i = self._check_id(block_id)
        return self._text_bytes[int(self._text_offsets[i]) : int(self._text_offsets[i + 1])].tobytes()

    def text(self, block_id: int) -> str:
        return self._decode("text", self._check_id(block_id))

    def title(self, block_id: int) -> str:
        return self._decode("title", self._check_id(block_id))

    def texts(self, ids: Iterable[int] | np.ndarray | torch.Tensor) -> list[str]:
        """Texts of `ids` (any shape, flattened in C order) -> list of len(ids.flatten())."""
        return [self._decode("text", i) for i in self._ids(ids)]

    def titles(self, ids: Iterable[int] | np.ndarray | torch.Tensor) -> list[str]:
        """Titles of `ids` (any shape, flattened in C order) -> list of len(ids.flatten())."""
        return [self._decode("title", i) for i in self._ids(ids)]

    def passage_ids(self, ids: Iterable[int] | np.ndarray | torch.Tensor) -> list[str | None]:
        """Passage ids of `ids` (any shape, flattened in C order): the id column of the passages the blocks were
        built from (`corpus build --passages-as-blocks`); None for a block without one, or every block of a file
        that stores none."""
        ids = self._ids(ids)
        if not self.has_passage_ids:
            return [None] * len(ids)
        return [self._decode("passage_id", i) or None for i in ids]

    def __getitem__(self, key: Any) -> bytes | np.ndarray:
        """The 4.x `block_records[key]`: a block's text as UTF-8 bytes for an integer, and for a slice, a list, an
        integer array or a boolean mask a numpy object array of bytes shaped like numpy's indexing result (4.x's
        block records were a numpy object array of bytes). Titles: `record(i)` or `titles(ids)`."""
        return index_block_bytes(key, len(self), self.text_bytes)

    def __iter__(self) -> Iterator[bytes]:
        """Each block's text as UTF-8 bytes, in block order (as iterating 4.x's object array gives)."""
        return (self.text_bytes(i) for i in range(len(self)))

    def record(self, block_id: int) -> dict[str, str]:
        """One block as {"title": ..., "text": ...} (decoded)."""
        i = self._check_id(block_id)
        return {"title": self._decode("title", i), "text": self._decode("text", i)}

    @classmethod
    def write(
        cls,
        path: str | os.PathLike,
        records: Iterable[tuple] | Iterable[dict],
        num_blocks_hint: int | None = None,
        passage_ids: bool = False,
        ids_are_paths: bool = False,
    ) -> BlockRecords:
        """Stream (title, text) pairs, or dicts with "title" and "text", atomically into `path`; return it opened.

        passage_ids: also store each block's passage id: records are then (title, text, passage_id) triples or dicts
        with a "passage_id" (None or "" for a block without one); ids_are_paths: those ids are documents' paths.
        If `num_blocks_hint` is given, a different number of records is an error (so a truncated source is caught).
        """
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        layout = _LAYOUT_WITH_IDS if passage_ids else _LAYOUT
        # Scratch files are anonymous (unlinked at once where the OS allows), so they never outlive the process.
        scratch = {name: tempfile.TemporaryFile(dir=directory, buffering=_CHUNK) for name, _, _ in layout}
        try:
            num_blocks, lengths = _write_scratch(path, records, scratch)
            if num_blocks_hint is not None and num_blocks != num_blocks_hint:
                raise ValueError(f"expected {num_blocks_hint} blocks for {path} but the records held {num_blocks}")
            header = _header(num_blocks, lengths, ids_are_paths=passage_ids and ids_are_paths)
            with atomic_file(path) as out:
                out.write(header)
                for name, _, _ in layout:
                    scratch[name].seek(0)
                    shutil.copyfileobj(scratch[name], out, 16 * _CHUNK)
        finally:
            for f in scratch.values():
                f.close()
        return cls.open(path)


def index_block_bytes(key: Any, num_blocks: int, text_bytes: Callable[[int], bytes]) -> bytes | np.ndarray:
    """numpy indexing of a 1-D object array of N block texts, without building the array.

    key: an integer (negative counts from the end) -> bytes; a slice, a sequence or array of integers (any shape), a
    boolean mask of length N, or a torch tensor of these -> numpy object array of bytes with numpy's result shape.
    Out-of-range ids raise IndexError as numpy does.
    """
    if isinstance(key, torch.Tensor):
        key = key.detach().cpu().numpy()
    if isinstance(key, tuple):  # numpy: arr[(i,)] is arr[i]; a 1-D array takes no second index
        if len(key) != 1:
            raise IndexError(f"too many indices for the 1-D block records: {len(key)} were given")
        return index_block_bytes(key[0], num_blocks, text_bytes)
    if isinstance(key, slice):
        ids = np.arange(num_blocks)[key]
    elif isinstance(key, (bool, np.bool_)):
        raise IndexError("block records are indexed by block id; a single boolean is not a block id")
    elif not isinstance(key, (list, np.ndarray)):
        try:
            i = operator.index(key)
        except TypeError:
            raise IndexError(
                f"block records take an integer, a slice, integer ids or a boolean mask, not {type(key).__name__}"
            ) from None
        if not -num_blocks <= i < num_blocks:
            raise IndexError(f"index {i} is out of bounds for {num_blocks} block records")
        return text_bytes(i % num_blocks)
    else:
        ids = np.asarray(key)
        if ids.dtype == np.bool_:
            if ids.shape != (num_blocks,):
                raise IndexError(f"a boolean mask must have shape ({num_blocks},), got {ids.shape}")
            ids = np.flatnonzero(ids)
        elif ids.size == 0:
            ids = ids.astype(np.int64)
        elif ids.dtype.kind not in "iu":
            raise IndexError(f"block ids must be integers or booleans, got an array of {ids.dtype}")
        if ids.size and (ids.min() < -num_blocks or ids.max() >= num_blocks):
            bad = int(ids.min() if ids.min() < -num_blocks else ids.max())
            raise IndexError(f"index {bad} is out of bounds for {num_blocks} block records")
    result = np.empty(ids.size, dtype=object)
    for j, i in enumerate(ids.reshape(-1).tolist()):
        result[j] = text_bytes(i % num_blocks)
    return result.reshape(ids.shape)


def _validate_header(path: str, header: Any, data_start: int, data_size: int) -> dict[str, tuple[int, int]]:
    """Check the safetensors header against the block records format -> {tensor: (file start, file end)}."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"{path} is not a valid block records file: {reason}")

    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise bad(f"metadata format is {meta.get('format') if isinstance(meta, dict) else None!r}, not {FORMAT!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise bad(f"unsupported format_version {meta.get('format_version')!r} (this reader knows {FORMAT_VERSION!r})")
    num_blocks = meta.get("num_blocks")
    if not isinstance(num_blocks, str) or not num_blocks.isdigit():
        raise bad(f"num_blocks {num_blocks!r} is not a non-negative integer")
    layout = _LAYOUT_WITH_IDS if "passage_id_bytes" in header else _LAYOUT
    names = {name for name, _, _ in layout}
    if set(header) - {"__metadata__"} != names:
        raise bad(f"tensors are {sorted(set(header) - {'__metadata__'})}, expected {sorted(names)}")
    ranges = []
    for name, dtype, itemsize in layout:
        info = header[name] if isinstance(header[name], dict) else {}
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if info.get("dtype") != dtype:
            raise bad(f"{name} has dtype {info.get('dtype')!r}, expected {dtype!r}")
        if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and shape[0] >= 0):
            raise bad(f"{name} has shape {shape!r}, expected one non-negative dimension")
        if name.endswith("_offsets") and shape[0] != int(num_blocks) + 1:
            raise bad(f"{name} has {shape[0]} entries, expected num_blocks + 1 = {int(num_blocks) + 1}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise bad(f"{name} has data_offsets {offsets!r}")
        if offsets[1] - offsets[0] != shape[0] * itemsize:
            raise bad(f"{name} has data_offsets {offsets} for {shape[0]} items of {itemsize} bytes")
        ranges.append((offsets[0], offsets[1], name))
    # safetensors requires the tensors to tile the data section exactly; here also in the expected order.
    end = 0
    for start, stop, name in ranges:
        if start != end:
            raise bad(f"{name} starts at data byte {start}, expected {end}")
        end = stop
    if end != data_size:
        raise bad(f"tensors end at data byte {end} but the file holds {data_size} data bytes (truncated?)")
    return {name: (data_start + start, data_start + stop) for start, stop, name in ranges}


def _header(
    num_blocks: int, byte_lengths: dict[str, int], size: int | None = None, ids_are_paths: bool = False
) -> bytes:
    """Serialized safetensors header (8-byte length + JSON padded with spaces to a multiple of 8, or to `size` bytes
    in all: a header reserved before the lengths were known is overwritten in place by one of the same size).
    byte_lengths: bytes of each *_bytes tensor ("passage_id_bytes" present: the layout with passage ids)."""
    layout = _LAYOUT_WITH_IDS if "passage_id_bytes" in byte_lengths else _LAYOUT
    counts = {name: byte_lengths[name] if name.endswith("_bytes") else num_blocks + 1 for name, _, _ in layout}
    header: dict[str, Any] = {
        "__metadata__": {"format": FORMAT, "format_version": FORMAT_VERSION, "num_blocks": str(num_blocks)}
    }
    if ids_are_paths:
        header["__metadata__"]["passage_ids"] = "paths"
    start = 0
    for name, dtype, itemsize in layout:
        stop = start + counts[name] * itemsize
        header[name] = {"dtype": dtype, "shape": [counts[name]], "data_offsets": [start, stop]}
        start = stop
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8 if size is None else size - 8 - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def _utf8(value: Any, field: str, index: int, path: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{field} of block {index} for {path} cannot be UTF-8 encoded ({e.reason})") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{field} of block {index} for {path} is not valid UTF-8 (at byte {e.start})") from None
        return value
    raise TypeError(f"{field} of block {index} for {path} is {type(value).__name__}, expected str or bytes")


def _write_scratch(path: str, records: Iterable[Any], scratch: dict[str, BinaryIO]) -> tuple[int, dict[str, int]]:
    """Append every record's bytes and end offsets to the scratch files -> (num_blocks, byte length per *_bytes
    tensor). With a passage_id scratch file, records are (title, text, passage_id) or dicts with one."""
    fields = ("title", "text", "passage_id") if "passage_id_bytes" in scratch else ("title", "text")
    ends = {field: 0 for field in fields}
    pending: dict[str, list] = {name: [] if name.endswith("_bytes") else [0] for name in scratch}

    def flush() -> None:  # one write per field per few thousand records: much cheaper than one per record
        for name, values in pending.items():
            scratch[name].write(b"".join(values) if name.endswith("_bytes") else np.asarray(values, "<i8").tobytes())
            values.clear()

    num_blocks = 0
    for index, record in enumerate(records):
        if isinstance(record, dict):
            values = tuple(record.get(field) for field in fields)
        elif isinstance(record, (tuple, list)) and len(record) == len(fields):
            values = record
        else:
            expected = "(title, text, passage_id)" if len(fields) == 3 else "(title, text)"
            raise TypeError(f"block {index} for {path} is {type(record).__name__}, expected {expected} or a dict")
        for field, value in zip(fields, values, strict=True):
            data = _utf8("" if value is None and field == "passage_id" else value, field, index, path)
            ends[field] += len(data)
            pending[f"{field}_bytes"].append(data)
            pending[f"{field}_offsets"].append(ends[field])
        num_blocks = index + 1
        if num_blocks % 4096 == 0:
            flush()
    flush()
    return num_blocks, {f"{field}_bytes": end for field, end in ends.items()}


# --- Legacy `block_records.npy` (transformers 4.x) ----------------------------------------------------------------
#
# np.save of a 1-D object array pickles `_reconstruct(ndarray, (0,), b"b")`, then BUILDs it with the state
# (1, shape, dtype("O8", False, True) BUILT with _DTYPE_STATE, is_fortran, [element, ...]). The reader below is a
# stack machine over exactly those opcodes; anything else is refused. It never imports or calls what the file names.

_REFUSAL_HINT = "only numpy's object-array reconstruction of bytes is accepted"
_GLOBALS = {
    "numpy.core.multiarray _reconstruct": "_reconstruct",
    "numpy._core.multiarray _reconstruct": "_reconstruct",
    "numpy ndarray": "ndarray",
    "numpy dtype": "dtype",
    "_codecs encode": "encode",  # protocol 2 spells bytes as _codecs.encode(str, "latin1") ...
    "__builtin__ bytes": "bytes",  # ... and b"" as bytes()
    "builtins bytes": "bytes",
}
_DTYPE_STATE = (3, "|", None, None, None, -1, -1, 63)
_PUSH_ARG = {"BININT", "BININT1", "BININT2", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}
_PUSH_ARG |= {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_PUT, _GET = {"BINPUT", "LONG_BINPUT", "MEMOIZE"}, {"BINGET", "LONG_BINGET"}
_OTHER = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_LIST", "APPEND", "APPENDS", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}
_ALLOWED_OPS = _PUSH_ARG | set(_CONSTANTS) | _PUT | _GET | _OTHER | {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD"}


class LegacyBlockRecordsError(ValueError):
    """A legacy block_records.npy that is not a plain 1-D numpy object array of bytes (or is damaged)."""


class _Node:
    """A whitelisted object of the pickle: a callable, the array, its dtype or the element list (with its count)."""

    __slots__ = ("kind", "count")

    def __init__(self, kind: str):
        self.kind, self.count = kind, 0


class _BoundedReader:
    """File view for pickletools.genops: refuses reads past the end instead of allocating what a length claims."""

    __slots__ = ("file", "pos", "size")

    def __init__(self, file: BinaryIO, pos: int, size: int):
        self.file, self.pos, self.size = file, pos, size

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise ValueError(f"truncated: {n} bytes needed at byte {self.pos}, {self.size - self.pos} left")
        self.pos += n
        return self.file.read(n)

    def readline(self) -> bytes:
        line = self.file.readline(1024)  # GLOBAL names are short: a line without end is refused, not read whole
        self.pos += len(line)
        return line

    def tell(self) -> int:
        return self.pos


def _same(value: Any, expected: Any) -> bool:
    """Equality that also requires equal types (so that False does not pass for 0), recursing into tuples."""
    if type(value) is not type(expected):
        return False
    if isinstance(expected, tuple):
        return len(value) == len(expected) and all(_same(v, e) for v, e in zip(value, expected, strict=True))
    return value == expected


def _describe(value: Any) -> str:
    if isinstance(value, _Node):
        return f"<{value.kind}>"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refusal(path: str, what: str, pos: int | None) -> LegacyBlockRecordsError:
    return LegacyBlockRecordsError(f"refused {what} at byte {pos} of {path}: {_REFUSAL_HINT}")


def _ops(path: str, file: BinaryIO, start: int, size: int) -> Iterator[tuple[str, Any, int]]:
    """(opcode name, argument, byte position) of each pickle opcode up to STOP; checks that nothing follows."""
    reader = _BoundedReader(file, start, size)
    ops = pickletools.genops(reader)
    while True:
        try:
            op, arg, pos = next(ops)
        except StopIteration:
            break
        except ValueError as e:  # genops' (and _BoundedReader's) complaints about a damaged stream
            raise LegacyBlockRecordsError(
                f"{path} holds a damaged pickle stream after byte {reader.pos}: {e}"
            ) from None
        if op.name not in _ALLOWED_OPS:
            raise _refusal(path, f"opcode {op.name}", pos)
        yield op.name, arg, pos
    if reader.pos != size:
        raise LegacyBlockRecordsError(f"{path} has {size - reader.pos} bytes of trailing data after the pickle's STOP")


def _read_npy_header(path: str, file: BinaryIO) -> int:
    """Check the .npy header (parsed by numpy without unpickling) -> number of elements it declares."""
    try:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(file)
        else:
            raise LegacyBlockRecordsError(f"{path} has .npy format version {version}, expected 1.0 or 2.0")
    except LegacyBlockRecordsError:
        raise
    except (ValueError, SyntaxError, TypeError, EOFError, tokenize.TokenError) as e:  # numpy tokenizes old headers
        raise LegacyBlockRecordsError(f"{path} is not a readable .npy file: {e}") from None
    if dtype != np.dtype(object):
        raise LegacyBlockRecordsError(
            f"{path} holds a {dtype} array, but a legacy block_records.npy holds a numpy object array of bytes"
        )
    if len(shape) != 1:
        raise LegacyBlockRecordsError(f"{path} holds an array of shape {shape}, expected a 1-D object array of bytes")
    return shape[0]


def legacy_block_records_count(path: str | os.PathLike) -> int:
    """The number of blocks a legacy block_records.npy declares, from its .npy header alone (nothing unpickled).

    Cheap enough to check a file against its block embeddings before converting it; the conversion still checks
    that the pickle holds exactly this many bytes elements.
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        return _read_npy_header(path, file)


def _fetched_memo(path: str, file: BinaryIO, start: int, size: int) -> set[int]:
    """A first pass for the rare pickle that fetches an element back from its memo -> the memo indices ever fetched,
    so that the interpreter's pass keeps only those (what it refuses, it refuses in its own pass)."""
    return {arg for name, arg, _ in _ops(path, file, start, size) if name in _GET}


class _ElementFetched(Exception):
    """The pickle fetches an element back from its memo (np.save of one bytes object twice), which the single pass
    did not keep: iter_legacy_block_records then finds what is fetched and reads the file again."""


def iter_legacy_block_records(
    path: str | os.PathLike, batch_size: int = 10000, progress: Callable[[int, int], None] | None = None
) -> Iterator[list[bytes]]:
    """Stream the elements of a legacy block_records.npy in lists of `batch_size` (the last may be shorter).

    One pass over the file, in constant memory: the memo keeps everything but the elements, which np.save fetches
    back only when one bytes object fills two places (a file that does is read a second time, keeping exactly the
    fetched entries). Batches come as the pickle's APPENDS arrive; a problem found later raises
    LegacyBlockRecordsError at that point. `progress(bytes read, file size)` is called after each batch.
    """
    path = os.fspath(path)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    with open(path, "rb") as file:
        expected = _read_npy_header(path, file)
        start, size = file.tell(), os.fstat(file.fileno()).st_size
        produced = 0
        try:
            for batch in _interpret(path, file, start, size, expected, None, batch_size):
                produced += len(batch)
                if progress is not None:
                    progress(file.tell(), size)
                yield batch
            return
        except _ElementFetched:
            pass
        file.seek(start)
        fetched = _fetched_memo(path, file, start, size)
        file.seek(start)
        for batch in _interpret(path, file, start, size, expected, fetched, batch_size):
            skip, produced = min(produced, len(batch)), produced - min(produced, len(batch))
            if progress is not None:
                progress(file.tell(), size)
            if batch[skip:]:
                yield batch[skip:]


def _interpret(
    path: str, file: BinaryIO, start: int, size: int, expected: int, fetched: set[int] | None, batch_size: int
) -> Iterator[list[bytes]]:
    """The whitelisting stack machine. Yields element batches. Memo entries kept: those in `fetched`, or with
    fetched None every entry but bytes longer than 1 (CPython shares b"" and 1-byte bytes, so np.save fetches those
    back; a fetch of an entry not kept raises _ElementFetched)."""
    stack: list[Any] = []
    marks: list[int] = []  # stack heights at each open MARK
    memo: dict[int, Any] = {}
    memo_size, elements, pending = 0, None, []
    name, pos = "", 0

    def pop(n: int) -> list[Any]:
        if len(stack) - n < (marks[-1] if marks else 0):
            raise _refusal(path, f"{name} on a stack with too few items", pos)
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items

    def pop_mark() -> list[Any]:
        if not marks:
            raise _refusal(path, f"{name} without MARK", pos)
        items = stack[marks[-1] :]
        del stack[marks.pop() :]
        return items

    for name, arg, pos in _ops(path, file, start, size):
        if pos == start and name != "PROTO":
            raise _refusal(path, "pickle protocol 0 or 1", pos)
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name in _PUT:
            if len(stack) <= (marks[-1] if marks else 0):
                raise _refusal(path, f"{name} of nothing", pos)
            if name != "MEMOIZE" and arg != memo_size:  # picklers number memo entries 0, 1, 2, ...
                raise _refusal(path, f"memo index {arg} out of sequence (expected {memo_size})", pos)
            if (memo_size in fetched) if fetched is not None else type(stack[-1]) is not bytes or len(stack[-1]) < 2:
                memo[memo_size] = stack[-1]
            memo_size += 1
        elif name in ("APPENDS", "APPEND"):
            items = pop_mark() if name == "APPENDS" else pop(1)
            if elements is None or len(stack) <= (marks[-1] if marks else 0) or stack[-1] is not elements:
                raise _refusal(path, f"{name} to something other than the element list", pos)
            for item in items:
                if type(item) is not bytes:
                    raise _refusal(
                        path, f"element {elements.count} of type {type(item).__name__} (must be bytes)", pos
                    )
                elements.count += 1
            if elements.count > expected:
                raise _refusal(
                    path, f"element {elements.count - 1} beyond the {expected} the .npy header declares", pos
                )
            pending += items
            while len(pending) >= batch_size:
                yield pending[:batch_size]
                del pending[:batch_size]
        elif name in _GET:
            if arg >= memo_size:
                raise _refusal(path, f"fetch of undefined memo index {arg}", pos)
            if arg not in memo:
                if fetched is None:
                    raise _ElementFetched
                raise _refusal(path, f"fetch of memo index {arg}, which the first pass did not see fetched", pos)
            stack.append(memo[arg])
        elif name == "PROTO":
            if pos != start or not 2 <= arg <= 5:  # np.save writes protocol 3 or 4
                raise _refusal(path, f"pickle protocol {arg}" if pos == start else "a second PROTO", pos)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "MARK":
            marks.append(len(stack))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            stack.append(tuple(pop(int(name[-1]))))
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name == "EMPTY_LIST":
            if elements is not None:
                raise _refusal(path, "a second list", pos)
            elements = _Node("elements")
            stack.append(elements)
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "STACK_GLOBAL":
                module, qualname = pop(2)
                arg = f"{module} {qualname}" if type(module) is str and type(qualname) is str else None
            if arg not in _GLOBALS:
                shown = arg.replace(" ", ".") if arg else f"{_describe(module)}.{_describe(qualname)}"
                raise _refusal(path, f"global {shown}", pos)
            stack.append(_Node(_GLOBALS[arg]))
        elif name == "REDUCE":
            stack.append(_reduce(path, pos, *pop(2)))
        elif name == "BUILD":
            (state,) = pop(1)
            if len(stack) <= (marks[-1] if marks else 0):
                raise _refusal(path, "BUILD of nothing", pos)
            _build(path, pos, stack[-1], state, elements, expected)
    if marks or len(stack) != 1 or not isinstance(stack[0], _Node) or stack[0].kind != "array":
        raise LegacyBlockRecordsError(
            f"{path} does not unpickle to a built numpy array (final stack {_describe(tuple(stack[:4]))}); "
            f"{_REFUSAL_HINT}"
        )
    if pending:
        yield pending


def _reduce(path: str, pos: int, func: Any, args: Any) -> Any:
    """The calls REDUCE may make, done by this code, not by calling what the file names."""
    kind = func.kind if isinstance(func, _Node) else None
    if kind == "_reconstruct" and type(args) is tuple and len(args) == 3 and _same(args[1:], ((0,), b"b")):
        if isinstance(args[0], _Node) and args[0].kind == "ndarray":
            return _Node("array shell")
    elif kind == "dtype" and _same(args, ("O8", False, True)):
        return _Node("dtype shell")
    elif kind == "encode" and type(args) is tuple and len(args) == 2 and type(args[0]) is str and args[1] == "latin1":
        try:
            return args[0].encode("latin-1")
        except UnicodeEncodeError:
            pass
    elif kind == "bytes" and _same(args, ()):
        return b""
    raise _refusal(path, f"call of {_describe(func)} with arguments {_describe(args)}", pos)


def _build(path: str, pos: int, obj: Any, state: Any, elements: _Node | None, expected: int) -> None:
    """BUILD may only set the object dtype's state and the array's (1, (n,), dtype, is_fortran, elements) state."""
    kind = obj.kind if isinstance(obj, _Node) else None
    if kind == "dtype shell" and _same(state, _DTYPE_STATE):
        obj.kind = "dtype"
        return
    if kind == "array shell" and type(state) is tuple and len(state) == 5:
        version, shape, dtype, is_fortran, data = state
        if not (type(shape) is tuple and len(shape) == 1 and type(shape[0]) is int):
            raise _refusal(path, f"array of shape {_describe(shape)} (must be 1-D)", pos)
        is_dtype = isinstance(dtype, _Node) and dtype.kind == "dtype"
        if _same(version, 1) and is_dtype and type(is_fortran) is bool and data is elements is not None:
            if not shape[0] == elements.count == expected:
                found = f"array of shape {shape} with {elements.count} elements (the .npy header declares {expected})"
                raise _refusal(path, found, pos)
            obj.kind = "array"
            return
    raise _refusal(path, f"BUILD of {_describe(obj)} with state {_describe(state)}", pos)


def read_legacy_block_records(path: str | os.PathLike) -> list[bytes]:
    """All elements of a legacy block_records.npy -> list of N bytes (for small files; see the iterator)."""
    return [element for batch in iter_legacy_block_records(path) for element in batch]


def convert_legacy_block_records(
    npy_path: str | os.PathLike, output_path: str | os.PathLike, progress: bool = False
) -> BlockRecords:
    """Convert a legacy block_records.npy into `output_path` (block_records.safetensors, empty titles), atomically.

    One pass over the pickle (iter_legacy_block_records), each batch written where it belongs in the output: the
    number of blocks is known from the .npy header, so the offsets and texts go straight into their places and the
    header, reserved for the largest length the input allows, is filled in last. Memory is constant and the disk
    holds the output once (no scratch copy). `progress` shows a bar over the input's bytes.
    """
    from transformers.utils.logging import tqdm

    npy_path, output_path = os.fspath(npy_path), os.fspath(output_path)
    num_blocks = legacy_block_records_count(npy_path)
    header_size = len(
        _header(num_blocks, {"title_bytes": 0, "text_bytes": os.path.getsize(npy_path)})
    )  # texts cannot outsize the file
    offsets_at = header_size + 8 * (num_blocks + 1)  # text_offsets, after the all-zero title_offsets
    text_at = offsets_at + 8 * (num_blocks + 1)
    with (
        atomic_file(output_path) as out,
        tqdm(
            total=os.path.getsize(npy_path), unit="B", unit_scale=True, disable=not progress, desc="Converting"
        ) as bar,
    ):
        out.write(b"\0" * header_size)
        for start in range(0, 8 * (num_blocks + 2), _CHUNK):  # title_offsets, and text_offsets[0]
            out.write(bytes(min(_CHUNK, 8 * (num_blocks + 2) - start)))
        out.flush()
        fd, count, total = out.fileno(), 0, 0
        shown = 0  # bytes the bar shows (with transformers' bars off, `bar` is a stand-in without a count)

        def advance(done: int, size: int) -> None:
            nonlocal shown
            bar.update(done - shown)
            shown = done

        try:
            for batch in iter_legacy_block_records(npy_path, progress=advance):
                texts = [_utf8(text, "text", count + i, output_path) for i, text in enumerate(batch)]
                ends = total + np.cumsum([len(text) for text in texts], dtype="<i8")
                os.pwrite(fd, ends.tobytes(), offsets_at + 8 * (count + 1))
                os.pwrite(fd, b"".join(texts), text_at + total)
                count, total = count + len(batch), int(ends[-1])
        except LegacyBlockRecordsError:
            raise
        except ValueError as e:  # e.g. a text that is not UTF-8: say which legacy file it came from
            raise ValueError(f"converting {npy_path}: {e}") from e
        os.pwrite(fd, _header(num_blocks, {"title_bytes": 0, "text_bytes": total}, size=header_size), 0)
    return BlockRecords.open(output_path)


__all__ = [
    "MAX_SAFETENSORS_HEADER",
    "BlockRecords",
    "convert_legacy_block_records",
    "index_block_bytes",
    "iter_legacy_block_records",
    "legacy_block_records_count",
    "LegacyBlockRecordsError",
    "read_legacy_block_records",
]
