"""Open-QA evaluation as ORQA's language/orqa/utils/eval_utils.py does it: answer normalisation, exact/regex match,
recall@k and reader-oracle on a tiny model, QA datasets (NQ-open, WebQuestions, CuratedTrec from ../shared/data), the
`evaluate` metric and `openrealm evaluate`."""

import json
from pathlib import Path

import evaluate
import pytest
import torch
from helpers import BLOCK_TEXTS, make_openqa_model

from openrealm.trainers.bm25 import Bm25BlockSearcher
from openrealm.trainers.cli import main
from openrealm.trainers.evaluation import (
    METRIC_SCRIPT,
    evaluate_openqa,
    exact_match,
    has_answer,
    load_openqa_metric,
    load_qa_dataset,
    normalize_answer,
    regex_match,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not staged")
MCKINLEY = (  # CuratedTrec test row 0: "How tall is Mount McKinley?"
    r"20\s?,?\s?(32|40)0\s?-?\s?f(ee|oo)t|6,194-meter|20,?237\s*f(oo|ee)?t|20,?073\s*f(oo|ee)?t|6,?168\s*m|6,118\s*m"
    r"|6\,194 m|20\,322 feet"
)
QUESTIONS = [
    {"question": "where does the nile flow ?", "answers": ["Egypt", "cairo"]},
    {"question": "what is the capital of france ?", "answers": ["Paris"]},
    {"question": "who was a pioneer of computer science ?", "answers": ["Alan Turing"]},
    {"question": "which river flows through london ?", "answers": ["the Thames"]},
]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return make_openqa_model(seed=0, reader_beam_size=2)


@pytest.fixture(scope="module")
def results(model):
    return evaluate_openqa(model, QUESTIONS, batch_size=3, num_blocks=2, recall_ks=(1, 3, 20))


def dense_ranking(model, question: str) -> list[int]:
    """All block ids, best first, by the model's own question embedding (computed apart from evaluate_openqa)."""
    tokenizer = model.retriever.tokenizer
    with torch.no_grad():
        query = model.embedder(**tokenizer([question], return_tensors="pt")).projected_score
    return model.retriever.search(query, len(BLOCK_TEXTS))[1][0].tolist()


# ---------------------------------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Nile", "nile"),
        ("U.S.", "us"),
        ("  An apple   a day ", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd"),  # articles only as whole words
        ("December 14, 1972.", "december 14 1972"),
        ("Padmé Amidala", "padme\u0301 amidala"),  # NFD: the accent becomes a combining mark (not ASCII punctuation)
        ("A", ""),
        ("rock-'n'-roll", "rocknroll"),
    ],
)
def test_normalize_answer_follows_orqa(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_takes_the_best_reference_after_normalisation():
    answers = ["14 December 1972 UTC", "December 1972"]  # NQ-open dev row 0
    assert exact_match("december 1972.", answers)
    assert exact_match("The 14 December, 1972 UTC", answers)
    assert not exact_match("1972", answers)
    assert not exact_match("", answers)


def test_regex_match_is_case_insensitive_and_anchored_at_the_start():
    assert regex_match("20,320 feet", [MCKINLEY])
    assert regex_match("20320 FEET tall", [MCKINLEY])  # re.match: a prefix suffices, not a full match
    assert not regex_match("about 20,320 feet", [MCKINLEY])
    assert regex_match("Sept", ["Sept?(ember)?|Feb(ruary)?"])


def test_an_invalid_pattern_never_matches():
    assert not regex_match("anything", ["(unclosed"])
    assert regex_match("paris", ["(unclosed", "paris"])


def test_has_answer_needs_the_answer_words_contiguous():
    text = "The Nile river flows through Egypt and the city of Cairo."
    assert has_answer(text, ["nile River"])
    assert has_answer(text, ["moon", "the city of cairo"])
    assert not has_answer(text, ["river nile"])
    assert not has_answer(text, ["egyp"])  # whole words only


def test_has_answer_with_regex_searches_anywhere():
    assert has_answer("Denali is 20,310 feet tall", [r"20,?3[12]0\s*feet"], match="regex")
    assert not has_answer("Denali is tall", [r"20,?3[12]0\s*feet"], match="regex")
    with pytest.raises(ValueError, match="match"):
        has_answer("text", ["a"], match="fuzzy")


# ---------------------------------------------------------------------------------------------------------------------
# The evaluate metric
# ---------------------------------------------------------------------------------------------------------------------


@needs_data
def test_metric_module_gives_the_exact_match_percentage():
    rows = [json.loads(line) for line in (DATA / "nq_open" / "dev.jsonl").read_text().splitlines()[:4]]
    predictions = ["December 1972", "bob russell", "two seasons", "the 2017"]
    references = [row["answers"] for row in rows]
    expected = 100.0 * sum(map(exact_match, predictions, references)) / 4
    assert expected == 75.0
    assert load_openqa_metric().compute(predictions=predictions, references=references) == {"exact_match": 75.0}
    assert evaluate.load(str(METRIC_SCRIPT)).compute(predictions=predictions, references=references) == {
        "exact_match": expected
    }


@needs_data
def test_metric_module_matches_regex_references():
    rows = load_qa_dataset(str(DATA / "curatedtrec" / "test.jsonl")).select(range(2))
    predictions = ["20,320 feet", "Death of a Salesman"]
    references = [row["answers"] for row in rows]
    assert [regex_match(p, r) for p, r in zip(predictions, references)] == [True, False]
    assert load_openqa_metric().compute(predictions=predictions, references=references, regex=True) == {
        "exact_match": 50.0
    }


# ---------------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------------


@needs_data
def test_curatedtrec_rows_are_regex_matched():
    dataset = load_qa_dataset(str(DATA / "curatedtrec" / "test.jsonl"))
    assert len(dataset) == 694
    assert set(dataset["match"]) == {"regex"}
    assert dataset[0]["question"] == "How tall is Mount McKinley?" and dataset[0]["answers"] == [MCKINLEY]


@needs_data
def test_nq_gold_questions_keep_their_gold_passage_ids():
    dataset = load_qa_dataset(str(DATA / "nq_open" / "dev_gold_questions.jsonl"))
    assert len(dataset) == 2655
    assert dataset[0]["gold_passage_id"] == "nqopen-dev-gold-02579"
    assert dataset[0]["answers"] == ["14 December 1972 UTC", "December 1972"]
    assert set(dataset["match"]) == {"string"}


@needs_data
def test_a_folder_is_read_by_split():
    dataset = load_qa_dataset(str(DATA / "webquestions"), split="test")
    assert len(dataset) == 2032 and dataset[0]["question"] == "what does jamaican people speak?"
    assert dataset[0]["gold_passage_id"] is None


def test_common_answer_layouts_are_mapped(tmp_path):
    rows = [
        {"question": "q1", "answer": ["orqa layout"]},
        {"question": "q2", "answers": {"text": ["squad layout"], "answer_start": [0]}},
        {"question": "q3", "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"]}},
        {"question": "q4", "answers": "one string"},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")  # trailing blank lines are skipped
    assert load_qa_dataset(str(path))["answers"] == [
        ["orqa layout"],
        ["squad layout"],
        ["Paris", "City of Light"],
        ["one string"],
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "answers": ["a"]}\n{"answers": ["b"]}\n', r"line 2: missing or empty 'question'"),
        ('{"question": "q", "text": "no answers"}\n', r"line 1: no answers"),
        ('{"question": "q", "answers": []}\n', r"line 1: the answer list is empty"),
        (
            '{"question": "q", "answers": ["a"]}\n{"question": \n',
            r"line 2: invalid JSON: Expecting value \(column 1\)",
        ),
        ("\n\n", r"holds no questions"),
    ],
)
def test_bad_dataset_files_are_refused_with_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_qa_dataset(str(path))


def test_a_hub_dataset_is_read_from_its_evaluation_split(monkeypatch):
    import datasets

    splits = {  # the Hub's nq_open layout: question, answer (a list)
        "train": datasets.Dataset.from_list([{"question": "train q", "answer": ["a"]}]),
        "validation": datasets.Dataset.from_list([{"question": "when was the moon landing", "answer": ["1969"]}]),
    }
    calls = []

    def load_dataset(name, split=None):
        calls.append((name, split))
        return datasets.DatasetDict(splits) if split is None else splits[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert load_qa_dataset("nq_open")[0]["answers"] == ["1969"]  # validation: no test split
    assert load_qa_dataset("google-research-datasets/nq_open", split="train")["question"] == ["train q"]
    assert calls == [("nq_open", None), ("google-research-datasets/nq_open", "train")]


def test_an_unloadable_hub_name_says_what_was_tried(monkeypatch):
    import datasets

    def offline(name, split=None):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="'nq_open' is neither a local JSONL file/folder nor a loadable Hub"):
        load_qa_dataset("nq_open")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_qa_dataset(str(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------------------------------------------------------------
# evaluate_openqa
# ---------------------------------------------------------------------------------------------------------------------


def test_recall_at_k_counts_questions_with_an_answer_in_the_top_k_blocks(model, results):
    for k in (1, 3):
        expected = sum(
            any(has_answer(BLOCK_TEXTS[i], row["answers"]) for i in dense_ranking(model, row["question"])[:k])
            for row in QUESTIONS
        )
        assert results[f"recall@{k}"] == 100.0 * expected / len(QUESTIONS)
    assert results["recall@20"] == 100.0  # k above the corpus size: every block, and each answer is in some block


def test_reader_oracle_is_recall_over_the_blocks_read(model, results):
    expected = sum(
        any(has_answer(BLOCK_TEXTS[i], row["answers"]) for i in dense_ranking(model, row["question"])[:2])
        for row in QUESTIONS
    )
    assert results["reader_oracle"] == 100.0 * expected / len(QUESTIONS)
    assert results["num_blocks"] == 2 and results["count"] == len(QUESTIONS)
    assert [p["block_ids"] for p in results["predictions"]] == [
        dense_ranking(model, r["question"])[:2] for r in QUESTIONS
    ]


def test_predictions_are_spans_of_the_block_read_and_scored_by_exact_match(results):
    for row, prediction in zip(QUESTIONS, results["predictions"]):
        assert prediction["predicted_block_id"] in prediction["block_ids"]
        assert prediction["prediction"] and prediction["prediction"] in BLOCK_TEXTS[prediction["predicted_block_id"]]
        assert prediction["correct"] == exact_match(prediction["prediction"], row["answers"])
    assert results["exact_match"] == 100.0 * sum(p["correct"] for p in results["predictions"]) / len(QUESTIONS)


def test_predictions_are_the_pipelines_answers(model, results):
    from transformers import pipeline

    qa = pipeline("question-answering", model=model, tokenizer=model.retriever.tokenizer)
    answers = qa([row["question"] for row in QUESTIONS], num_blocks=2)
    assert [p["prediction"] for p in results["predictions"]] == [answer["answer"] for answer in answers]


def test_exact_match_is_full_when_the_references_are_the_predictions(model, results):
    rows = [{"question": p["question"], "answers": [p["prediction"].upper()]} for p in results["predictions"]]
    assert evaluate_openqa(model, rows, batch_size=4, num_blocks=2, recall_ks=(1,))["exact_match"] == 100.0


def test_batch_size_does_not_change_the_results(model, results):
    one_at_a_time = evaluate_openqa(model, QUESTIONS, batch_size=1, num_blocks=2, recall_ks=(1, 3, 20))
    assert one_at_a_time == results


def test_regex_rows_are_scored_by_regex(model, results):
    patterns = [{"question": p["question"], "answers": [".*"], "match": "regex"} for p in results["predictions"]]
    scored = evaluate_openqa(model, patterns, batch_size=4, num_blocks=2, recall_ks=(1,))
    assert scored["exact_match"] == 100.0 and scored["recall@1"] == 100.0 and scored["match"] == "regex"


def test_a_block_searcher_chooses_the_blocks_read(model):
    searcher = Bm25BlockSearcher.from_retriever(model.retriever)
    rows = [{"question": "which river flows through london ?", "answers": ["thames"]}]
    scored = evaluate_openqa(model, rows, num_blocks=2, recall_ks=(1,), block_searcher=searcher)
    assert scored["predictions"][0]["block_ids"] == searcher.search([rows[0]["question"]], 2)[0].tolist()
    assert scored["predictions"][0]["block_ids"][0] == 4  # "the river thames flows through london ."
    assert scored["recall@1"] == 100.0 and scored["reader_oracle"] == 100.0


def test_evaluation_leaves_the_model_in_training_mode_if_it_was(model):
    model.train()
    try:
        evaluate_openqa(model, QUESTIONS[:1], num_blocks=1, recall_ks=(1,))
        assert model.training
    finally:
        model.eval()


# ---------------------------------------------------------------------------------------------------------------------
# openrealm evaluate
# ---------------------------------------------------------------------------------------------------------------------


def test_cli_writes_the_results_json(model, results, tmp_path, capsys):
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "dev.jsonl").write_text("\n".join(json.dumps(row) for row in QUESTIONS + QUESTIONS) + "\n")
    output = tmp_path / "eval" / "dev.json"
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--dataset", str(tmp_path / "qa"), "--split", "dev"]
    argv += ["--output", str(output), "--num-blocks", "2", "--limit", "4", "--recall-k", "1", "3", "20"]
    assert main([*argv, "--no-progress", "--device", "cpu"]) == 0
    written = json.loads(output.read_text())
    assert written["dataset_name"] == "qa" and written["split"] == "dev" and written["retrieval"] == "dense"
    for key in ("exact_match", "recall@1", "recall@3", "recall@20", "reader_oracle", "count", "predictions"):
        assert written[key] == results[key], key
    assert "4 questions: exact_match" in capsys.readouterr().out
    assert [p.name for p in output.parent.iterdir()] == ["dev.json"]  # no temporary left behind

    bm25_output = tmp_path / "eval" / "bm25.json"
    argv[argv.index(str(output))] = str(bm25_output)
    assert main([*argv, "--no-progress", "--retrieval", "bm25"]) == 0
    written = json.loads(bm25_output.read_text())
    searcher = Bm25BlockSearcher.from_retriever(model.retriever)
    assert written["retrieval"] == "bm25"
    assert [p["block_ids"] for p in written["predictions"]] == searcher.search(
        [r["question"] for r in QUESTIONS], 2
    ).tolist()


def test_the_blocks_read_and_the_recall_note_count_only_the_blocks_left_after_a_removal():
    model = make_openqa_model(seed=0)
    model.retriever.remove_blocks([0, 1])  # 4 of the 6 blocks are left to search
    results = evaluate_openqa(model, [{"question": "who ?", "answers": ["x"]}], recall_ks=(1, 5), num_blocks=5)
    assert results["num_blocks"] == 4 and results["corpus_size"] == 6
    assert results["notes"] == [
        "recall@5: the corpus holds only 4 blocks (2 removed), so this is recall over all of them"
    ]
