"""JSONL, the one reader and writer of every JSONL file openrealm reads or writes (articles, QA rows, gold passages,
the synthetic world): a bad line is named by its file and 1-based line, as editors count."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping

from openrealm.file_utils import atomic_file

_JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def json_type(value) -> str:
    """The JSON name of a parsed value's type, for messages: null, a boolean, a number, a string, an array, an
    object."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return _JSON_TYPES.get(type(value), type(value).__name__)


# A JSON escape of half a surrogate pair ("\\ud800" to "\\udfff"); a whole pair decodes to one character.
LONE_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class JsonlError(ValueError):
    """A bad line of a JSONL file: the message is `PATH, line N: PROBLEM` (N 1-based, as editors count)."""

    def __init__(self, path, line: int, problem: str):
        self.path, self.line, self.problem = os.fspath(path), line, problem
        super().__init__(f"{self.path}, line {line}: {problem}")

    def __reduce__(self):  # pickles (e.g. out of a datasets worker) with its three arguments
        return type(self), (self.path, self.line, self.problem)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL file; numbers are 1-based and blank lines are skipped.

    Raises JsonlError naming the file and the line for a line that is not UTF-8, not valid JSON (with the parser's
    message) or not a JSON object; FileNotFoundError / IsADirectoryError when the path is no file."""
    with open(path, "rb") as file:
        for number, line in iter_lines(file, path):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise JsonlError(path, number, f"invalid JSON: {error.msg} (column {error.colno})") from None
            if not isinstance(row, dict):
                raise JsonlError(path, number, f"expected a JSON object, got {json_type(row)}")
            if LONE_SURROGATE_ESCAPE.search(line):  # "\udcff" alone decodes to a str that is not text
                try:
                    json.dumps(row, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError as error:
                    problem = (
                        f"\\u{ord(error.object[error.start]):04x} escapes half of a UTF-16 surrogate pair, not text"
                    )
                    raise JsonlError(path, number, problem) from None
            yield number, row


def iter_lines(lines: Iterable[bytes | str], path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a file (bytes, read as UTF-8; a byte-order mark opening the first line is
    dropped) or of a text stream; numbers are 1-based. A line that is not UTF-8 text (for a text stream: one holding
    undecodable bytes as surrogates) is a JsonlError naming `path` and the line."""
    for number, raw in enumerate(lines, start=1):
        try:
            if isinstance(raw, bytes):
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            else:
                raw.encode("utf-8")
                line = raw
        except UnicodeError as error:
            raise JsonlError(path, number, f"not UTF-8 text ({error.reason} at byte {error.start})") from None
        yield number, line


def jsonl_string(row: Mapping, field: str, path, line: int) -> str:
    """row[field] of a line of `path`, which must be present and a string (JsonlError otherwise)."""
    if field not in row:
        raise JsonlError(path, line, f"missing field {field!r} (fields: {', '.join(sorted(row)) or 'none'})")
    value = row[field]
    if not isinstance(value, str):
        raise JsonlError(path, line, f"field {field!r} must be a string, got {json_type(value)}")
    return value


def jsonl_id(row: Mapping, field: str, required: bool, path, line: int) -> str | None:
    """row[field] as a string (a JSON string or integer); None when absent and not required (JsonlError otherwise)."""
    if field not in row and not required:
        return None
    if field not in row:
        raise JsonlError(path, line, f"missing field {field!r} (fields: {', '.join(sorted(row)) or 'none'})")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise JsonlError(path, line, f"field {field!r} must be a string or an integer, got {json_type(value)}")
    return str(value)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every object of a JSONL file, in order (see iter_jsonl for the errors)."""
    return [row for _, row in iter_jsonl(path)]


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping]) -> None:
    """One JSON object per line (UTF-8, non-ASCII kept), written atomically (file_utils.atomic_file)."""
    with atomic_file(path, "w") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")


__all__ = [
    "JsonlError",
    "iter_jsonl",
    "iter_lines",
    "json_type",
    "jsonl_id",
    "jsonl_string",
    "read_jsonl",
    "write_jsonl",
]
