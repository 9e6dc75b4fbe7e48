"""Articles -> blocks of at most 288 wordpieces (Google's ORQA preprocessing, wiki_preprocessor.py): sentences packed
greedily into `[CLS] title [SEP] body [SEP]`, the `datasets.map` function that does it (BlockBuilder) and its
driver (pack_articles). The departures from Google's code: tokenization/corpus.py."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import html
import inspect
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from openrealm.tokenization.sources import (
    PASSAGE_ID,
)

# A salient span: (start, end, label) in characters of its sentence; an annotator finds them in a sentence.
Span = tuple[int, int, str]
SpanAnnotator = Callable[[str], list[Span]]
MAX_BLOCK_LENGTH = 288


# Articles, or passages (passages_as_blocks), per map batch when the caller names none. A map batch's blocks are one
# Arrow record batch of the packed blocks (of 1,000 rows at most), and an open memory-mapped table holds Arrow's
# objects for each of its record batches: passages, one block each, go 1,000 at a time so that the packed blocks have
# as few record batches as blocks/
# (benchmarks/performance.md#a-corpus-of-dprs-layout-at-scale-corpus-build---input-psgstsv---passages-as-blocks-cpu).
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
_REMOVED_TITLE_PATTERN = r"(List of .+)|(Index of .+)|(Outline of .+)|(.*\(disambiguation\).*)"
_REMOVED_TITLE = re.compile(_REMOVED_TITLE_PATTERN)


def document_uid(title: str, text: str) -> str:
    """Google's document uid (`featurization.get_document_uid`) as hex: SHA-1 of f"{title} <sep> {text}"."""
    return hashlib.sha1(f"{title} <sep> {text}".encode()).hexdigest()


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


# corpus_config.json's counts of the input articles that made no block, by cause (articles_left_out)
LEFT_OUT_COUNTS = ("num_pages_filtered", "num_articles_without_text")


def articles_left_out(articles, blocks, page_filter: bool) -> dict[str, int]:
    """How many of `articles` (a Dataset with "title") made no block of `blocks` (pack_articles' blocks, duplicates
    not yet dropped), by cause: {"num_pages_filtered": titles the page filter drops (is_removed_page),
    "num_articles_without_text": the others (no text, or none the tokenizer keeps)}. Counted in Arrow."""
    import pyarrow.compute as pc

    from openrealm.tokenization.duplicates import count_distinct_in_order

    filtered = 0
    if page_filter:
        titles = articles.with_format("arrow")["title"]
        filtered = int(pc.sum(pc.match_substring_regex(titles, f"^(?:{_REMOVED_TITLE_PATTERN})")).as_py() or 0)
    made = count_distinct_in_order(blocks.data.column("article_id"))
    return dict(zip(LEFT_OUT_COUNTS, (filtered, len(articles) - filtered - made)))


def articles_left_out_note(num_pages_filtered: int, num_articles_without_text: int, unit: str = "article") -> str:
    """The end of a corpus command's summary line when input articles (unit: or "passage") made no block ("" when
    all did): the page filter's and those without text."""
    parts = []
    if num_pages_filtered:
        parts.append(f"{num_pages_filtered} {unit}(s) dropped by the page filter, which --no-page-filter turns off")
    if num_articles_without_text:
        parts.append(f"{num_articles_without_text} {unit}(s) without text")
    return f" ({'; '.join(parts)})" if parts else ""


def passages_cut_note(num_cut: int, max_block_length: int) -> str:
    """The end of a corpus command's summary line when passages were cut to fit a block ("" when none)."""
    if not num_cut:
        return ""
    return f" ({num_cut} passage(s) longer than {max_block_length} wordpieces with their title: cut to fit one block)"


__all__ = [
    "document_uid",
    "Span",
    "SpanAnnotator",
    "ARTICLES_PER_BATCH",
    "LEFT_OUT_COUNTS",
    "BlockBuilder",
    "COLUMNS",
    "MAX_BLOCK_LENGTH",
    "PASSAGES_PER_BATCH",
    "annotator_names",
    "articles_left_out",
    "articles_left_out_note",
    "block_features",
    "datasets_progress_bars",
    "is_removed_page",
    "pack_articles",
    "passages_cut_note",
]
