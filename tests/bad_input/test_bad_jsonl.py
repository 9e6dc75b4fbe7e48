"""The JSONL readers every command shares (`tokenization/jsonl.py`: articles, QA rows, gold passages): a bad line
is reported as FILE, line N (1-based) with what is wrong, the parser's own message kept."""

import pytest
from helpers import write_lines

from openrealm.tokenization.jsonl import JsonlError, iter_jsonl
from openrealm.trainers.evaluation import load_qa_dataset
from openrealm.trainers.openqa import read_gold_passages


def test_iter_jsonl_numbers_lines_from_one_counting_the_skipped_blank_ones(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', "", "   ", '{"n": 2}')
    assert list(iter_jsonl(path)) == [(1, {"n": 1}), (4, {"n": 2})]


def test_iter_jsonl_reports_invalid_json_with_file_line_and_the_parsers_message(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', "", '{"n": 2,}')
    with pytest.raises(JsonlError) as caught:
        list(iter_jsonl(path))
    assert (
        str(caught.value)
        == f"{path}, line 3: invalid JSON: Expecting property name enclosed in double quotes (column 9)"
    )
    assert (caught.value.path, caught.value.line) == (path, 3)


def test_iter_jsonl_refuses_a_line_that_is_not_an_object(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", '{"n": 1}', '["a", "b"]')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: expected a JSON object, got an array$"):
        list(iter_jsonl(path))


def test_iter_jsonl_names_a_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": "\xff"}\n')
    with pytest.raises(JsonlError, match=r"a\.jsonl, line 2: not UTF-8 text"):
        list(iter_jsonl(path))


def test_iter_jsonl_reads_a_utf8_byte_order_mark(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"n": 1}\n')
    assert list(iter_jsonl(path)) == [(1, {"n": 1})]


def test_qa_error_line_counts_blank_lines(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]}', "", '{"answers": ["b"]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 3: missing or empty 'question'"):
        load_qa_dataset(path)


def test_qa_invalid_json_gives_the_parsers_message(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]', "")
    with pytest.raises(JsonlError, match=r"qa\.jsonl, line 1: invalid JSON: Expecting ',' delimiter"):
        load_qa_dataset(path)


def test_qa_line_that_is_not_an_object_is_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '"where is paris ?"')
    with pytest.raises(JsonlError, match=r"qa\.jsonl, line 1: expected a JSON object, got a string"):
        load_qa_dataset(path)


def test_answers_null_is_an_error_naming_file_and_line(tmp_path):
    path = write_lines(
        tmp_path / "qa.jsonl", '{"question": "q", "answers": ["a"]}', '{"question": "q", "answers": [null]}'
    )
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 2: answers\[0\] must be a string, got null"):
        load_qa_dataset(path)


def test_null_among_answers_is_an_error_not_the_answer_none(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": ["Paris", null]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 1: answers\[1\] must be a string, got null"):
        load_qa_dataset(path)


def test_answers_of_the_wrong_type_are_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "q", "answers": {"text": true}}')
    with pytest.raises(
        ValueError, match=r"qa\.jsonl, line 1: 'answers\.text' must be a list of strings, got a boolean"
    ):
        load_qa_dataset(path)


def test_a_question_that_is_not_a_string_is_named(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": ["q"], "answers": ["a"]}')
    with pytest.raises(ValueError, match=r"qa\.jsonl, line 1: 'question' must be a string, got an array"):
        load_qa_dataset(path)


def test_numeric_answers_are_read_as_their_text(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", '{"question": "when ?", "answers": [1969, "July 1969"]}')
    assert load_qa_dataset(path)["answers"] == [["1969", "July 1969"]]


def test_gold_passages_are_read_by_id(tmp_path):
    path = write_lines(tmp_path / "gold.jsonl", '{"id": 7, "text": "Paris."}', "", '{"id": "x", "text": "Nile."}')
    assert read_gold_passages(path) == {"7": "Paris.", "x": "Nile."}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": 1, "text": "a"', r"invalid JSON: Expecting ',' delimiter"),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('{"id": 1}', r"missing field 'text' \(fields: id\)"),
        ('{"id": null, "text": "a"}', "field 'id' must be a string or an integer, got null"),
        ('{"id": 1, "text": null}', "field 'text' must be a string, got null"),
    ],
    ids=["invalid-json", "not-an-object", "missing-text", "null-id", "null-text"],
)
def test_bad_gold_passage_lines_are_named(tmp_path, line, problem):
    path = write_lines(tmp_path / "gold.jsonl", '{"id": 0, "text": "ok"}', "", line)
    with pytest.raises(JsonlError, match=rf"gold\.jsonl, line 3: {problem}"):
        read_gold_passages(path)
