"""Where articles and passages come from: the tables users already have, read through `datasets`' own loaders.

    openrealm corpus build --input psgs_w100.tsv ...                     # DPR's passages: id, text, title (a TSV)
    openrealm corpus build --input 'wiki/*.parquet' ...                  # Parquet files (a glob)
    openrealm corpus build --input my_saved_dataset/ ...                 # a folder written by datasets' save_to_disk
    openrealm corpus build --input my_notes/ ...                         # any other folder: its documents
    openrealm corpus build --input wikimedia/wikipedia --input-name 20231101.en --split train ...   # a Hub dataset

Kinds of input (`input_kind`): a file ending in .parquet; .csv or .tsv (optionally .gz, .bz2, .xz); any other
file is JSONL (read by tokenization.corpus.iter_jsonl, as always); a folder written by `save_to_disk`; any other
folder, read as documents (.txt, .md, .html, .pdf: tokenization/documents.py); a glob of
files; anything else shaped like `name` or `owner/name` that is not a local path is a Hub dataset id. Parquet and CSV
are read by `datasets.load_dataset("parquet" | "csv")` into an Arrow file of the build's scratch folder (removed when
the build ends); a save_to_disk folder and a Hub dataset (in the Hugging Face cache) are memory-mapped where they
are, with no copy of their rows. CSV/TSV cells are read as text: no column is guessed to be a number, and "NA",
"null" or "" stay the strings they are (DPR's TSV holds such titles).

Quoting (docs/corpus.md, "TSV quoting"): a TSV is read line by line by default, one row a line, cells split at every
tab; a cell wholly in double quotes, as DPR's psgs_w100.tsv writes its texts (`"... ""Ahärôn"" ..."`), loses them
(`""` inside reads `"`), and any other quote is text (`--tsv-quoting cell`). `--tsv-quoting none` keeps every
cell as written; `--tsv-quoting csv` reads CSV's quoting, where a quoted cell may hold tabs and line breaks. A CSV
is read with CSV's quoting, strictly (a quote closing a cell must end it).

Each table is checked before any block is made: the title and text columns (and the id column when asked for) must
be there (the error names the columns found) and hold strings, with no missing value (the error names the file and
the 1-based row, header not counted). A CSV/TSV row must have as many cells as the header, and be UTF-8: pandas, which
datasets reads CSV with, would fill a short row with empty strings and drop extra cells, so one pass over the file
(its lines split at tabs, or Python's csv module for CSV quoting) checks every row first, names the file, row and
line of a bad one, and counts the rows; the rows pandas then reads must be as many (a TSV read line by line: the
file's lines after the header), so no row is lost without an error. Rows whose quoted cells span lines are said on
stderr.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The columns read by default: those of DPR's psgs_w100.tsv (id, text, title) and of the Hub's wikimedia/wikipedia
# (id, url, title, text). The id column is read, when present, only for a corpus of passages (--passages-as-blocks).
TITLE_COLUMN, TEXT_COLUMN, ID_COLUMN = "title", "text", "id"
PASSAGE_ID = "passage_id"  # the name of the id column in the articles given to the block builder and in blocks/
_COMPRESSIONS = ("", ".gz", ".bz2", ".xz")
# --tsv-quoting (docs/corpus.md, "TSV quoting"): "cell" unquotes a cell wholly in double quotes, "none" keeps every
# cell as written (both: one row a line), "csv" reads CSV's quoting (a quoted cell may hold tabs and line breaks).
TSV_QUOTINGS = ("cell", "none", "csv")
TABLE_SUFFIXES = {
    **{f".parquet{c}": "parquet" for c in ("",)},
    **{f".csv{c}": "csv" for c in _COMPRESSIONS},
    **{f".tsv{c}": "tsv" for c in _COMPRESSIONS},
}


@dataclass(frozen=True)
class InputOptions:
    """How to read an --input (the options of corpus build / add / update, trainers/options.input_options).

    title_column, text_column: the columns (JSONL: fields) of the title and the text. id_column: of the passage ids,
    read for a corpus of passages only (--passages-as-blocks): None reads "id" where a source has it, a name requires
    it in every source. input_name, split: the configuration and split of a Hub dataset (`load_dataset(name,
    input_name, split=split)`) or the split of a saved DatasetDict; without split, "train" or the only one.
    tsv_quoting: how a TSV's quotes are read, one of TSV_QUOTINGS (default "cell")."""

    title_column: str = TITLE_COLUMN
    text_column: str = TEXT_COLUMN
    id_column: str | None = None
    input_name: str | None = None
    split: str | None = None
    tsv_quoting: str = "cell"

    @classmethod
    def from_args(cls, args) -> InputOptions:
        """The options of a command line's parsed arguments (those trainers/options.input_options adds)."""
        return cls(args.title_column, args.text_column, args.id_column, args.input_name, args.split, args.tsv_quoting)

    def columns(self, read_ids: bool, found: Sequence[str] | None = None) -> dict[str, str]:
        """{standard name: column} to read: title, text and, with read_ids, passage_id where there is one (the
        id_column, else "id" when it is among `found`; found None: a source whose columns are not known ahead)."""
        columns = {"title": self.title_column, "text": self.text_column}
        if read_ids and (self.id_column is not None or found is None or ID_COLUMN in found):
            columns[PASSAGE_ID] = self.id_column or ID_COLUMN
        return columns


# Splits tried, in order, when a dataset with several splits is named without one (a corpus: train first).
CORPUS_SPLITS = ("train",)
_GLOB_CHARACTERS = frozenset("*?[")


def table_suffix(path: str) -> str | None:
    """ "parquet", "csv" or "tsv" for a path ending in a table suffix (TABLE_SUFFIXES), else None."""
    name = os.path.basename(path).lower()
    for suffix, kind in TABLE_SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    return None


def is_hub_name(text: str, local_suffixes: Sequence[str] = ()) -> bool:
    """Whether text names a Hub dataset rather than a local path: `name` or `owner/name`, not starting with ".",
    "/" or "~", not ending in one of local_suffixes (nor a table suffix), and not an existing path."""
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        return False
    return path.suffix.lower() not in local_suffixes and table_suffix(text) is None


def input_kind(source: str) -> str:
    """What one --input names: "glob", "folder" (a save_to_disk folder), "documents" (any other folder: its .txt, .md,
    .html and .pdf files, tokenization/documents.py), "parquet", "csv", "tsv", "jsonl" (any other file) or "hub"."""
    from openrealm.tokenization.documents import is_document_folder

    if _GLOB_CHARACTERS & set(source) and not os.path.exists(source):
        return "glob"
    if os.path.isdir(source):
        return "documents" if is_document_folder(source) else "folder"
    kind = table_suffix(source)
    if kind is not None or os.path.isfile(source):
        return kind or "jsonl"
    if is_hub_name(source, (".jsonl", ".json")):
        return "hub"
    raise FileNotFoundError(f"article file not found: {source}")


def expand_inputs(sources: Sequence[str]) -> list[tuple[str, str]]:
    """(kind, path or name) of every input, globs expanded (sorted; a glob matching nothing is an error)."""
    expanded = []
    for source in sources:
        source = os.path.expanduser(os.fspath(source))
        kind = input_kind(source)
        if kind != "glob":
            expanded.append((kind, source))
            continue
        matches = sorted(glob.glob(source, recursive=True))
        matches = [match for match in matches if os.path.isfile(match)]
        if not matches:
            raise FileNotFoundError(f"no file matches --input {source}")
        for match in matches:
            kind = table_suffix(match) or "jsonl"
            expanded.append((kind, match))
    return expanded


def load_hub_dataset(
    name: str,
    split: str | None,
    config_name: str | None = None,
    splits: Sequence[str] = (),
    local: str = "file/folder",
):
    """`datasets.load_dataset(name, config_name, split=split)` as one Dataset: without split, the first of `splits`
    the dataset has (or its only split). Errors say what was tried (offline, unknown name, ...; local: what a local
    input would have been, for the message)."""
    import datasets

    try:
        loaded = datasets.load_dataset(*(name,) if config_name is None else (name, config_name), split=split)
    except Exception as error:  # noqa: BLE001 - offline, unknown name, ...: say what was tried
        raise FileNotFoundError(
            f"{name!r} is neither a local {local} nor a loadable Hub dataset ({type(error).__name__}: {error})"
        ) from error
    return _one_split(loaded, f"Hub dataset {name!r}", split, splits)


def _one_split(loaded, where: str, split: str | None, splits: Sequence[str]):
    """One Dataset of a Dataset or DatasetDict: `split`, else the first of `splits` present, else its only split."""
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    if split is not None:
        if split not in loaded:
            raise ValueError(f"{where} has no split {split!r} (splits: {', '.join(sorted(loaded))})")
        return loaded[split]
    available = [name for name in splits if name in loaded]
    if available:
        return loaded[available[0]]
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    raise ValueError(f"{where} has splits {', '.join(sorted(loaded))}; choose one with --split")


def _load_folder(path: str, split: str | None):
    from datasets import load_from_disk

    try:
        loaded = load_from_disk(path)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{path} is a folder but not one written by datasets' save_to_disk (give the files in it, or a glob): "
            f"{error}"
        ) from None
    except (ValueError, OSError) as error:  # a bare JSON or Arrow error: name the damaged file if one is
        _check_saved_files(path)
        raise error from None
    dataset = _one_split(loaded, path, split, CORPUS_SPLITS)
    for cache_file in dataset.cache_files:
        _check_arrow_end(cache_file["filename"], path)
    return dataset


# The end-of-stream marker closing every Arrow stream file that datasets writes (continuation, then length 0)
_ARROW_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _check_arrow_end(file: str, folder: str) -> None:
    """Refuse an Arrow stream file of a save_to_disk folder that lacks its end-of-stream marker: cut short between
    two record batches, it still reads, without the rows after the cut (pyarrow does not require the marker)."""
    with open(file, "rb") as f:
        f.seek(max(0, os.path.getsize(file) - len(_ARROW_STREAM_END)))
        end = f.read()
    if end != _ARROW_STREAM_END:
        raise ValueError(
            f"{file}: not a whole Arrow file (cut short: no end-of-stream marker, so rows would be lost); {folder} "
            "is a save_to_disk folder that does not read"
        )


def _check_saved_files(path: str) -> None:
    """A ValueError naming the first file of a save_to_disk folder (its JSON files, and its Arrow files, in it and in
    the split folders of a DatasetDict) that does not read: JSON that does not parse, an Arrow file cut short or
    damaged. Nothing when every file reads (the error was something else, e.g. the disk)."""
    import json

    import pyarrow as pa

    files = sorted(Path(path).glob("*.json")) + sorted(Path(path).glob("*/*.json"))
    files += sorted(Path(path).glob("*.arrow")) + sorted(Path(path).glob("*/*.arrow"))
    for file in files:
        try:
            if file.suffix == ".json":
                with open(file, encoding="utf-8") as f:
                    json.load(f)
            else:
                with pa.memory_map(str(file)) as source:
                    pa.ipc.open_stream(source).read_all()
        except (ValueError, OSError) as error:  # JSONDecodeError, UnicodeDecodeError, ArrowInvalid, a short read
            kind = "JSON" if file.suffix == ".json" else "a whole Arrow file (cut short or damaged?)"
            raise ValueError(
                f"{file}: not {kind}: {error}; {path} is a save_to_disk folder that does not read"
            ) from None


def _read_table_file(path: str, kind: str, columns: list[str], cache_dir: str, quoting: str = "cell"):
    """One Parquet or CSV/TSV file as a Dataset of `columns` (all read as strings from CSV), via load_dataset; a TSV
    read as `quoting` says (TSV_QUOTINGS: "cell" and "none" split lines at every tab, quotes are text)."""
    import csv
    import warnings

    from datasets import Features, Value, load_dataset

    if kind == "parquet":
        kwargs = {"columns": columns}
    else:
        kwargs = {
            "sep": "\t" if kind == "tsv" else ",",
            "usecols": columns,
            "features": Features({column: Value("string") for column in columns}),
            "keep_default_na": False,  # a title "NA" or "null" is text, not a missing value
            "na_filter": False,
            "skip_blank_lines": False,  # refused by check_csv_rows; never dropped
        }
        if kind == "tsv" and quoting != "csv":
            kwargs["quoting"] = csv.QUOTE_NONE
            if quoting == "cell":
                kwargs["converters"] = {column: unquote_cell for column in columns}
    try:
        with warnings.catch_warnings():
            # pandas says that the converters replace the dtype (str) the features ask for: they return str
            warnings.filterwarnings("ignore", message="Both a converter and dtype were specified")
            return load_dataset(
                kind if kind == "parquet" else "csv", data_files=[path], split="train", cache_dir=cache_dir, **kwargs
            )
    except Exception as error:  # noqa: BLE001 - datasets wraps pandas' / pyarrow's error: report that one
        cause = error
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError):
            raise cause from None  # e.g. a full disk while datasets writes its cache: not the input's fault
        raise ValueError(f"{path}: cannot read it as {kind.upper()}: {type(cause).__name__}: {cause}") from None


def unquote_cell(cell: str) -> str:
    """A TSV cell wholly in double quotes without them, `""` inside read as `"` (DPR's psgs_w100.tsv quotes its
    texts so, as Python's csv module writes); any other cell, a lone or unpaired quote included, as it is."""
    if len(cell) < 2 or cell[0] != '"' or cell[-1] != '"':
        return cell
    inner = cell[1:-1]
    if '"' not in inner:
        return inner
    return cell if '"' in inner.replace('""', "") else inner.replace('""', '"')  # quotes inside: doubled, or text


def _open_text(path: str):
    """A text stream of a CSV/TSV file, decompressed by its suffix (.gz, .bz2, .xz), strict UTF-8 (a byte order mark
    skipped, as pandas skips it)."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(Path(path).suffix.lower(), open)
    return opener(path, "rt", encoding="utf-8-sig", newline="")


def _table_rows(f, path: str, kind: str, quoting: str):
    """(cells, first line, last line) of every row of an open CSV/TSV file, header first (lines 1-based). A TSV
    read with quoting "cell" or "none" has one row a line, split at every tab; else Python's csv module reads CSV's
    quoting strictly, and a quoted cell may span lines."""
    import csv

    if kind == "tsv" and quoting != "csv":
        for number, line in enumerate(f, start=1):
            line = line.removesuffix("\n").removesuffix("\r")
            yield (line.split("\t") if line else []), number, number
        return
    csv.field_size_limit(2**31 - 1)  # a passage may exceed the module's default 128 KiB per cell
    reader = csv.reader(f, delimiter="\t" if kind == "tsv" else ",", strict=True)
    last = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            began = f" (the row began on line {last + 1})" if reader.line_num > last + 1 else ""
            raise ValueError(
                f"{path}, line {reader.line_num}: {error}{began}; in CSV quoting a cell in double quotes ends at its "
                'next lone quote (a quote inside is written "")'
            ) from None
        yield row, last + 1, reader.line_num
        last = reader.line_num


def _csv_header(path: str, kind: str, quoting: str) -> list[str]:
    """The header's cells of a CSV/TSV file, read as its rows are (_table_rows); a ValueError for an empty file."""
    try:
        with _open_text(path) as f:
            header = next(_table_rows(f, path, kind, quoting), None)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text in line 1 ({error.reason})") from None
    if header is None or not header[0]:
        raise ValueError(f"{path}: no header line (the first line names the columns)")
    return header[0]


def check_csv_rows(path: str, kind: str, quoting: str = "cell", read: Sequence[str] = ()) -> int:
    """Every row of a CSV/TSV file has the header's number of cells and is UTF-8 text; a ValueError naming the file,
    the 1-based row (header not counted) and its line otherwise, or when the header names a column of `read` (those
    to be read) twice. -> the number of rows after the header, which the reader must give (a TSV read line by line:
    the file's lines after the header). One streaming pass, constant memory; the rows whose quoted cells span lines
    are said on stderr, the first named."""
    spanning, first, line, row_number = 0, "", 0, 0
    with _open_text(path) as f:
        rows = _table_rows(f, path, kind, quoting)
        try:
            header, _, line = next(rows, ([], 0, 0))
            twice = [name for name in read if header.count(name) > 1]
            if twice:
                raise ValueError(
                    f"{path}: the header names the column {twice[0]!r} {header.count(twice[0])} times "
                    f"({', '.join(header)}), so which to read is unclear: rename the others"
                )
            for row_number, (row, first_line, line) in enumerate(rows, start=1):
                if len(row) != len(header):
                    hint = ""
                    if kind == "tsv" and quoting != "csv" and '"' in "".join(row):
                        hint = "; if its quoted cells hold tabs or line breaks, read it with --tsv-quoting csv"
                    raise ValueError(
                        f"{path}, row {row_number} (line {first_line}): {len(row)} cell(s), but the header has "
                        f"{len(header)} ({', '.join(header)}){hint}"
                    )
                if line > first_line:
                    spanning += 1
                    first = first or f"row {row_number}, lines {first_line}-{line}"
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text after line {line} ({error.reason})") from None
    if spanning:
        print(
            f"{path}: {row_number} row(s) from {line - 1} line(s) after the header: quoted cells of {spanning} row(s) "
            f"span lines (the first: {first})",
            file=sys.stderr,
        )
    return row_number


def _columns_of(path: str, kind: str, quoting: str = "cell") -> dict[str, str]:
    """{column: Arrow type name} of a Parquet file's schema or a CSV/TSV file's header (every CSV column: string)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as error:  # noqa: BLE001 - pyarrow raises ArrowInvalid and others for a damaged file
            raise ValueError(f"{path} is not a readable Parquet file: {error}") from None
        return {field.name: str(field.type) for field in schema}
    return {column: "string" for column in _csv_header(path, kind, quoting)}


_STRING_TYPES = ("string", "large_string")
_ID_TYPES = (*_STRING_TYPES, "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _check_columns(found: dict[str, str], where: str, wanted: dict[str, str | None], id_required: bool) -> None:
    """Refuse a table lacking a wanted column or holding it with the wrong type; the message lists what is there."""
    listing = ", ".join(found) or "none"
    for role, column in wanted.items():
        if column is None:
            continue
        if column not in found:
            if role == "id" and not id_required:
                continue
            flag = f"--{role}-column"
            raise ValueError(
                f"{where} has no column {column!r} (columns: {listing}); name the {role} column with {flag}"
            )
        allowed = _ID_TYPES if role == "id" else _STRING_TYPES
        if found[column] not in allowed:
            raise ValueError(
                f"{where}: column {column!r} ({role}) holds {found[column]}, not "
                + ("strings or integers" if role == "id" else "strings")
                + f" (columns: {listing})"
            )


def _check_no_missing(table, where: str, columns: dict[str, str]) -> None:
    """The first missing (null) value of the standard columns of `table`, named by file/row (1-based) and column."""
    import pyarrow.compute as pc

    for standard, column in columns.items():
        values = table.column(standard)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise ValueError(f"{where}, row {row + 1}: no value in column {column!r} (a missing {standard})")


def _feature_types(dataset) -> dict[str, str]:
    """{column: type name} of a Dataset: the Arrow type of plain values ("string", "int64"), else the feature's
    kind."""
    from datasets import Value

    return {
        name: feature.dtype if isinstance(feature, Value) else type(feature).__name__
        for name, feature in dataset.features.items()
    }


def standard_columns(dataset, columns: dict[str, str], read_ids: bool):
    """dataset's `columns` ({standard name: column}, InputOptions.columns) alone, under the standard names; with
    read_ids, "passage_id" as strings (integer ids cast; None for a source without ids, so that sources concatenate).
    Selecting and renaming columns of a memory-mapped dataset copies no row."""
    import pyarrow as pa
    from datasets import Value

    dataset = dataset.select_columns(list(dict.fromkeys(columns.values())))
    renamed = {column: standard for standard, column in columns.items() if column != standard}
    if renamed:
        dataset = dataset.rename_columns(renamed)
    if read_ids and PASSAGE_ID not in dataset.column_names:
        dataset = dataset.add_column(PASSAGE_ID, pa.nulls(len(dataset), pa.string()), feature=Value("string"))
    if read_ids and dataset.features[PASSAGE_ID] != Value("string"):
        dataset = dataset.cast_column(PASSAGE_ID, Value("string"))  # integer ids, e.g. a Parquet int64 column
    return dataset


def _document_articles(path: str, read_ids: bool, cache_dir: str):
    """A folder of documents -> Dataset with "title", "text" (and "passage_id": each file's relative path, when
    read_ids), streamed into an Arrow file of cache_dir; prints the folder's summary line (documents read, files left
    out and why)."""
    import sys

    from datasets import Dataset, Features, Value

    from openrealm.tokenization.documents import DocumentFolder

    folder = DocumentFolder(Path(path))
    fields = {"title": "title", "text": "text"} | ({PASSAGE_ID: "path"} if read_ids else {})  # column: its field

    def rows():
        for article in folder:
            yield {column: article[name] for column, name in fields.items()}

    features = Features({column: Value("string") for column in fields})
    dataset = Dataset.from_generator(rows, features=features, cache_dir=cache_dir)
    folder.check_read()
    print(folder.summary(), file=sys.stderr)
    return dataset


def load_table_articles(
    sources: Sequence[str],
    cache_dir: str,
    options: InputOptions,
    read_ids: bool = False,
    jsonl_loader=None,
):
    """The articles of the --input sources as one Dataset with "title", "text" and, with read_ids, "passage_id"
    (strings; None where a source has no ids) -> (dataset, name for messages). options: which columns, which Hub
    configuration and split. jsonl_loader(path) -> Dataset reads a JSONL file among the sources
    (tokenization.corpus's reader, with the same options). Rows keep the order of the sources, each in its own
    order: row i is article i.
    """
    from datasets import concatenate_datasets

    wanted = {"title": options.title_column, "text": options.text_column}
    wanted["id"] = (options.id_column or ID_COLUMN) if read_ids else None
    id_required = read_ids and options.id_column is not None
    parts = []
    for kind, path in expand_inputs(sources):
        if kind == "jsonl":
            parts.append(jsonl_loader(path))
            continue
        if kind == "documents":
            parts.append(_document_articles(path, read_ids, cache_dir))
            continue
        if kind == "folder":
            dataset, where = _load_folder(path, options.split), path
            found = _feature_types(dataset)
        elif kind == "hub":
            dataset = load_hub_dataset(path, options.split, options.input_name, CORPUS_SPLITS)
            where = f"Hub dataset {path!r}"
            found = _feature_types(dataset)
        else:
            found, where = _columns_of(path, kind, options.tsv_quoting), path
        _check_columns(found, where, wanted, id_required)
        columns = options.columns(read_ids, found)
        names = list(dict.fromkeys(columns.values()))
        if kind in ("csv", "tsv"):
            rows = check_csv_rows(path, kind, options.tsv_quoting, names)
        if kind not in ("folder", "hub"):
            dataset = _read_table_file(path, kind, names, cache_dir, options.tsv_quoting)
        if kind in ("csv", "tsv") and len(dataset) != rows:
            raise ValueError(
                f"{path}: the {kind.upper()} reader gave {len(dataset)} row(s), but the file holds {rows} after its "
                "header: rows would be lost"
            )
        dataset = standard_columns(dataset, columns, read_ids)
        _check_no_missing(dataset.data, where, columns)
        parts.append(dataset)
    name = ", ".join(os.fspath(source) for source in sources)
    articles = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    if len(articles) == 0:
        raise ValueError(f"{name} holds no articles (no rows)")
    return articles, name


__all__ = [
    "CORPUS_SPLITS",
    "ID_COLUMN",
    "InputOptions",
    "PASSAGE_ID",
    "TEXT_COLUMN",
    "TITLE_COLUMN",
    "TSV_QUOTINGS",
    "expand_inputs",
    "input_kind",
    "is_hub_name",
    "load_hub_dataset",
    "load_table_articles",
    "standard_columns",
    "table_suffix",
    "unquote_cell",
]
