"""The knowledge corpus: articles -> blocks of at most 288 wordpieces (Google's ORQA preprocessing,
wiki_preprocessor.py).

    build_corpus("wiki.jsonl", "corpus/", "bert-base-uncased", num_proc=8)     # or: openrealm corpus build ...
    blocks = load_corpus("corpus/")              # corpus_folder.py: a datasets.Dataset, memory-mapped
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

The parts live apart, as Google keeps featurization apart from corpus generation: the articles (articles.py, input
formats in sources.py, JSONL in jsonl.py), packing them into blocks (blocks.py), duplicate blocks (duplicates.py), the
folder's format, written and read in one place (corpus_folder.py), and a block as the embedder reads it
(retriever_inputs.py). This module is the build that joins them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable

from openrealm.file_utils import atomic_directory, check_replaceable, full_disk_error, path_within
from openrealm.tokenization.articles import load_articles, resolve_tokenizer, source_paths
from openrealm.tokenization.blocks import (
    MAX_BLOCK_LENGTH,
    BlockBuilder,
    SpanAnnotator,
    annotator_names,
    articles_left_out,
    pack_articles,
)
from openrealm.tokenization.corpus_folder import (
    BLOCK_RECORDS_NAME,
    BLOCKS_DIR,
    CONFIG_NAME,
    CORPUS_FORMAT,
    CORPUS_FORMAT_VERSION,
    block_columns,
    corpus_folder_problem,
    load_corpus,
    save_blocks,
    write_block_records,
)
from openrealm.tokenization.duplicates import count_distinct_in_order, duplicate_rows
from openrealm.tokenization.sources import (
    InputOptions,
    input_kind,
)


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
    paths = [] if isinstance(source, Dataset) else source_paths(source)
    inputs = list(paths)
    if isinstance(tokenizer, (str, os.PathLike)):
        inputs.append(("the tokenizer", os.fspath(tokenizer)))  # a folder replacing would delete (not a Hub name)
    check_replaceable(output_dir, overwrite, corpus_folder_problem, inputs)  # before any (long) work
    tokenizer, tokenizer_name = resolve_tokenizer(tokenizer)
    # A folder of documents: every block keeps its document's path (what `openrealm ask` and the pipeline report).
    document_ids = any(input_kind(path) == "documents" for path in paths)
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
        with atomic_directory(output_dir, overwrite, corpus_folder_problem, inputs=inputs) as staging:
            # datasets' cache files: inside the staging folder, removed below
            scratch = os.path.join(staging, ".scratch")
            articles, builder.source_name = load_articles(source, scratch, input_options, keep_ids)
            blocks, num_cut = pack_articles(
                articles, builder, scratch, num_proc=num_proc, batch_size=batch_size, progress=progress
            )
            left_out = articles_left_out(articles, blocks, page_filter)
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
            write_block_records(os.path.join(staging, BLOCK_RECORDS_NAME), saved, keep_ids, document_ids)
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
                **left_out,  # input articles that made no block: page-filtered, without text
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


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


__all__ = ["build_corpus"]
