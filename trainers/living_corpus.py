"""Change a knowledge corpus without re-embedding it: the machinery of `openrealm corpus add | remove | update`
(trainers/jobs/corpus_edit.py).

New blocks are split as the corpus was and embedded with the embedder snapshot stored in the index; removed blocks
keep their rows (every other id, and the provenance of past answers, stays valid) and are never retrieved again. Each
command writes one new version of the folder all at once under its writer lock, so a killed command leaves the
previous version whole. Usage and guarantees: docs/corpus.md ("Adding, updating and removing documents") and
docs/guarantees.md.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from openrealm import RealmRetriever
from openrealm.file_utils import atomic_directory, link_or_copy, write_text_atomic, writer_lock
from openrealm.retrieval_realm import BLOCK_INDEX_DIR, BLOCK_RECORDS_NAME
from openrealm.tokenization.articles import load_articles
from openrealm.tokenization.blocks import (
    LEFT_OUT_COUNTS,
    MAX_BLOCK_LENGTH,
    BlockBuilder,
    annotator_names,
    articles_left_out,
    pack_articles,
)
from openrealm.tokenization.corpus_folder import (
    BLOCKS_DIR,
    CONFIG_NAME,
    REMOVED_IDS_NAME,
    block_columns,
    keeps_ids,
    load_corpus,
    read_corpus_config,
    read_removed_block_ids,
    write_removed_block_ids,
)
from openrealm.tokenization.duplicates import count_duplicate_blocks, drop_duplicate_blocks
from openrealm.tokenization.sources import PASSAGE_ID, InputOptions
from openrealm.trainers.embedding import embed_corpus
from openrealm.trainers.towers import load_embedder

# Entries of DIR that a new version writes; everything else (model weights, cards, tokenizer extras) is carried over.
_REWRITTEN = frozenset({BLOCKS_DIR, CONFIG_NAME, REMOVED_IDS_NAME, BLOCK_RECORDS_NAME, BLOCK_INDEX_DIR})


def _holding_writer_lock(edit: Callable[..., dict]) -> Callable[..., dict]:
    """edit(folder, ...) run while holding folder's writer lock (file_utils.writer_lock), from its read to its
    write. A folder that does not exist is refused first, so that no lock file is made for it."""

    @functools.wraps(edit)
    def locked(folder: str | os.PathLike, *args, **kwargs) -> dict:
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"{os.fspath(folder)}: no such folder; corpus add, remove and update edit a local corpus folder "
                "(openrealm corpus build) or a retriever or model folder with block records and an index"
            )
        with writer_lock(folder):
            return edit(folder, *args, **kwargs)

    return locked


@_holding_writer_lock
def edit_corpus(
    folder: str | os.PathLike,
    *,
    add=None,
    replace: bool = False,
    remove_titles: list[str] | tuple = (),
    remove_ids: list[int] | tuple = (),
    embedder: torch.nn.Module | str | None = None,
    span_annotator=None,
    batch_size: int = 128,
    device: str | torch.device | None = None,
    num_proc: int = 1,
    progress: bool = True,
    deduplicate: bool | None = None,
    input_options: InputOptions | None = None,
) -> dict:
    """Write the next version of `folder` with the articles of `add` (what corpus build reads: JSONL, Parquet, CSV/TSV
    files or globs, a save_to_disk folder, a Hub dataset id, or a datasets.Dataset with "title", "text"; how to read
    it: input_options, tokenization.sources.InputOptions) added as new blocks, and the blocks of `remove_titles` /
    `remove_ids` removed; with `replace`, the live blocks of the added articles' titles are removed first (an
    update). Returns a summary: version, added_block_ids [first, stop), removed_block_ids, num_blocks, num_live (a
    corpus folder's blocks not removed), num_searchable, needs_rebuild.

    embedder: for an index without an embedder snapshot (a RealmEmbedder or a checkpoint for towers.load_embedder);
    span_annotator: salient spans of the new blocks in a corpus folder (as corpus build's).
    deduplicate: drop the new blocks that duplicate an earlier one (the same title and text; corpus.duplicate_rows);
    None: as the corpus was built (corpus_config.json), on for other folders. The summary's num_duplicates counts
    those found, and a corpus folder's config the duplicates its live blocks hold afterwards.

    The whole edit holds the folder's writer lock: an edit started meanwhile waits, then changes this one's version.
    """
    folder = os.path.abspath(os.fspath(folder))
    is_corpus = os.path.isfile(os.path.join(folder, CONFIG_NAME))
    config = read_corpus_config(folder) if is_corpus else None
    if is_corpus:
        load_corpus(folder)  # refuses blocks/, records and corpus_config.json that disagree
    retriever = RealmRetriever.from_pretrained(folder)  # refuses records and an index that disagree
    if not is_corpus and not retriever.has_index:
        raise ValueError(f"{folder} has block records but no {BLOCK_INDEX_DIR}/: nothing to add blocks to")
    removed_before = read_removed_block_ids(folder) if is_corpus else retriever.index.removed_ids.numpy()
    num_before = len(retriever.block_records)
    to_remove = _ids_to_remove(retriever, folder, remove_titles, remove_ids, removed_before)

    summary = {"folder": folder, "num_blocks_before": num_before}
    with atomic_directory(folder, keep=lambda name: name not in _REWRITTEN) as staging:
        new_blocks = None
        if add is not None:
            scratch = os.path.join(staging, ".scratch")
            # A corpus of passages (corpus build --passages-as-blocks) takes passages, one block each, with their ids.
            # A corpus of documents keeps each block's document path as its id.
            if is_corpus:
                passages, keep_ids = config.get("passages_as_blocks", False), keeps_ids(config)
            else:  # a model folder: as the corpus its records were copied from
                passages = keep_ids = retriever.block_records.has_passage_ids
            if input_options is not None and input_options.id_column is not None and not passages:
                raise ValueError(
                    f"--id-column names passage ids, but {folder} is not a corpus of passages (corpus build "
                    "--passages-as-blocks)"
                )
            articles, source_name = load_articles(add, scratch, input_options, keep_ids)
            titles = sorted(set(articles["title"]))
            existing = retriever.block_ids_of_titles(titles, exclude=removed_before)
            if existing and not replace:
                taken = sorted({retriever.block_records.title(i) for i in existing})
                raise ValueError(
                    f"{source_name}: {len(taken)} article title(s) are already in {folder} (e.g. {taken[0]!r}); use "
                    "`openrealm corpus update` to replace them"
                )
            to_remove = np.union1d(to_remove, existing).astype(np.int64)
            builder = BlockBuilder(
                retriever.tokenizer,
                (config or {}).get("max_block_length", MAX_BLOCK_LENGTH),
                span_annotator if is_corpus else None,
                page_filter=(config or {}).get("page_filter", True),
                html_unescape=(config or {}).get("html_unescape", True),
                language=(config or {}).get("language", "en"),
                source_name=source_name,
                passages=passages,
                keep_ids=keep_ids,
            )
            first_article = (config or {}).get("num_input_articles", 0)
            new_blocks, num_cut = pack_articles(articles, builder, scratch, num_proc=num_proc, first_id=first_article)
            left_out = articles_left_out(articles, new_blocks, builder.page_filter)
            summary.update(num_passages_cut=num_cut, max_block_length=builder.max_block_length, **left_out)
            # A live block of an added title is refused (add) or removed first (update), so only the added articles
            # can repeat a block (a duplicate has the title of the block it copies).
            if deduplicate is None:
                deduplicate = (config or {}).get("deduplicate", True)
            new_blocks, num_duplicates = drop_duplicate_blocks(new_blocks, scratch, deduplicate)
            summary.update(num_duplicates=num_duplicates, duplicates_dropped=bool(deduplicate and num_duplicates))
            new_ids = np.arange(num_before, num_before + len(new_blocks), dtype=np.int64)
            from datasets import Value

            new_blocks = new_blocks.add_column("block_id", new_ids, feature=Value("int64"))
            new_blocks = new_blocks.select_columns(block_columns(keep_ids))
            block_emb = None
            if retriever.has_index:
                index = retriever.index
                block_embedder = _block_embedder(index, embedder, folder)
                block_emb = embed_corpus(
                    block_embedder,
                    new_blocks,
                    retriever.tokenizer,
                    batch_size=batch_size,
                    device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
                    dtype=index.metadata.get("dtype", "auto"),
                    max_length=index.metadata.get("max_length", MAX_BLOCK_LENGTH),
                    progress=progress,
                )
            retriever.add_blocks(
                new_blocks["title"],
                new_blocks["text"],
                block_emb=block_emb,
                passage_ids=new_blocks[PASSAGE_ID] if keep_ids else None,
            )
            summary.update(added_block_ids=[int(num_before), int(num_before + len(new_blocks))], source=source_name)
        if len(to_remove) and retriever.has_index:
            retriever.remove_blocks(to_remove)
        if is_corpus and retriever.has_index:  # the corpus's own index follows it: it records the new version
            retriever.index.metadata["corpus_version"] = config.get("version", 0) + 1
        retriever.write_files(staging)
        if is_corpus:
            removed = np.union1d(removed_before, to_remove).astype(np.int64)
            num_input = len(articles) if add is not None else 0
            num_dropped = summary["num_duplicates"] if summary.get("duplicates_dropped") else 0
            written = _write_corpus_files(
                folder,
                staging,
                config,
                new_blocks,
                num_input,
                removed,
                span_annotator,
                num_dropped,
                summary.get("num_passages_cut", 0),
                {name: summary[name] for name in LEFT_OUT_COUNTS if name in summary},
            )
            summary["num_duplicate_blocks"] = written["num_duplicate_blocks"]
            summary["num_live"] = written["num_blocks"] - len(removed)  # what an index of the corpus would search
        if new_blocks is not None:
            del new_blocks
            shutil.rmtree(os.path.join(staging, ".scratch"), ignore_errors=True)
    index = retriever.index if retriever.has_index else None
    summary.update(
        corpus_version=config.get("version", 0) + 1 if is_corpus else None,
        removed_block_ids=[int(i) for i in to_remove],
        num_blocks=len(retriever.block_records),
        num_searchable=index.num_searchable if index is not None else None,
        index_version=index.version if index is not None else None,
        needs_rebuild=bool(index is not None and index.needs_rebuild),
        drift=round(index.drift, 4) if index is not None else None,
    )
    return summary


def _ids_to_remove(retriever, folder: str, titles, ids, removed_before: np.ndarray) -> np.ndarray:
    """Block ids named by `ids` or by their `titles`, checked: each must exist and not be removed already."""
    num_blocks = len(retriever.block_records)
    ids = np.asarray([int(i) for i in ids], dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= num_blocks)]
    if bad.size:
        raise ValueError(f"block id {int(bad[0])} is not in {folder} (ids 0 to {num_blocks - 1})")
    gone = ids[np.isin(ids, removed_before)]
    if gone.size:
        raise ValueError(f"block {int(gone[0])} of {folder} was removed already")
    if titles:
        found = retriever.block_ids_of_titles(titles, exclude=removed_before)
        missing = sorted(set(titles) - {retriever.block_records.title(i) for i in found})
        if missing:
            if retriever.block_ids_of_titles(missing[:1], exclude=()):  # its blocks are all among the removed ones
                raise ValueError(f"the blocks of {missing[0]!r} in {folder} were removed already")
            raise ValueError(f"no block of {folder} has the title {missing[0]!r} (titles are matched exactly)")
        ids = np.union1d(ids, found)
    return np.unique(ids).astype(np.int64)


def _block_embedder(index, embedder, folder: str) -> torch.nn.Module:
    """The embedder of new blocks: the one given, else the snapshot stored with the index."""
    if embedder is not None:
        return load_embedder(embedder) if isinstance(embedder, (str, os.PathLike)) else embedder
    stored = index.load_embedder()
    if stored is None:
        raise ValueError(
            f"the index in {folder}/{BLOCK_INDEX_DIR} stores no embedder snapshot (it was not written by `openrealm "
            "index build`, e.g. converted from a 4.x checkpoint): pass --embedder, the checkpoint whose embedder made "
            "its block embeddings, or rebuild the index with `openrealm index build`"
        )
    return stored


def _write_corpus_files(
    folder, staging, config, new_blocks, num_input, removed, span_annotator, num_dropped, num_cut=0, left_out=None
) -> dict:
    """blocks/ (the old Arrow files hard-linked, the new blocks in one more file), removed ids, corpus_config.json.
    num_input: the articles read for new_blocks, page-filtered ones included; num_dropped: duplicate blocks of theirs
    left out; num_cut: passages of theirs cut to fit a block; left_out: those that made no block, by cause
    (blocks.articles_left_out), added to the config's counts. Returns the config written."""
    old_dir, new_dir = Path(folder) / BLOCKS_DIR, Path(staging) / BLOCKS_DIR
    state = json.loads((old_dir / "state.json").read_text())
    new_dir.mkdir()
    for entry in state["_data_files"]:
        link_or_copy(old_dir / entry["filename"], new_dir / entry["filename"])
    link_or_copy(old_dir / "dataset_info.json", new_dir / "dataset_info.json")
    version = config.get("version", 0) + 1
    num_blocks = config["num_blocks"]
    if new_blocks is not None:
        part = Path(staging) / ".scratch" / "saved"
        new_blocks.save_to_disk(str(part))
        for number, entry in enumerate(json.loads((part / "state.json").read_text())["_data_files"]):
            name = f"data-v{version:06d}-{number:05d}.arrow"
            os.replace(part / entry["filename"], new_dir / name)
            state["_data_files"].append({"filename": name})
        num_blocks += len(new_blocks)
    state["_fingerprint"] = f"openrealm-corpus-v{version}-{num_blocks}"
    (new_dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    if len(removed):
        write_removed_block_ids(Path(staging) / REMOVED_IDS_NAME, removed)
    config = dict(config, version=version, num_blocks=num_blocks, num_removed=len(removed))
    uids = load_corpus(folder).with_format("arrow")["uid"]
    if new_blocks is not None:
        uids = pa.chunked_array([*uids.chunks, *new_blocks.with_format("arrow")["uid"].chunks])
    config["num_duplicate_blocks"] = count_duplicate_blocks(uids, removed)  # the live blocks, after this edit
    if num_dropped:
        config["num_duplicates_dropped"] = config.get("num_duplicates_dropped", 0) + num_dropped
    if num_cut:
        config["num_passages_cut"] = config.get("num_passages_cut", 0) + num_cut
    for name, count in (left_out or {}).items():
        config[name] = config.get(name, 0) + count
    if new_blocks is not None:
        # every input row took an article id, also those the page filter dropped: the next add starts after them
        config["num_input_articles"] = config.get("num_input_articles", 0) + num_input
        config["num_articles"] = config.get("num_articles", 0) + len(set(new_blocks["article_id"]))
        names = annotator_names(span_annotator)
        config["span_annotators"] = sorted(set(config.get("span_annotators", [])) | set(names))
    entries = set(os.listdir(staging)) - {".scratch"}
    config["files"] = sorted(set(config.get("files", [])) | entries | {CONFIG_NAME})
    write_text_atomic(Path(staging) / CONFIG_NAME, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return config


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


__all__ = [
    "edit_corpus",
]
