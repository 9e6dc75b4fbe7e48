"""The articles a corpus is built from, as one `datasets.Dataset` with "title", "text" (and "passage_id"): a Dataset
given in Python, JSONL files (errors name the file and line), and every other input of tokenization/sources.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from openrealm.tokenization.jsonl import JsonlError, iter_jsonl, jsonl_id, jsonl_string
from openrealm.tokenization.sources import (
    PASSAGE_ID,
    InputOptions,
    input_kind,
    load_table_articles,
    standard_columns,
)


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
    paths = source_paths(source)
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


def source_paths(source) -> list[str]:
    return [os.fspath(p) for p in source] if isinstance(source, (list, tuple)) else [os.fspath(source)]


__all__ = [
    "load_articles",
    "resolve_tokenizer",
    "source_paths",
]
