"""pipeline("question-answering") for REALM open-QA folders: answers with provenance, batches, top_k, a given
context, and clear errors for bad questions."""

import logging

import pytest
import torch
from helpers import BLOCK_TEXTS, make_openqa_model
from transformers import pipeline

import openrealm
from openrealm import RealmQuestionAnsweringPipeline

QUESTIONS = [
    "where does the nile flow ?",
    "who was a pioneer of computer science ?",
    "what is the capital of france ?",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("openqa")
    make_openqa_model(seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qa(folder):
    return pipeline("question-answering", model=str(folder))


def test_importing_openrealm_registers_the_question_answering_task(qa):
    from transformers.pipelines import PIPELINE_REGISTRY

    assert PIPELINE_REGISTRY.supported_tasks["question-answering"]["impl"] is RealmQuestionAnsweringPipeline
    assert isinstance(qa, RealmQuestionAnsweringPipeline)
    assert isinstance(qa.model, openrealm.RealmForOpenQA) and qa.model.retriever is not None


def test_registration_works_with_a_transformers_5_release_that_lists_no_removed_tasks(monkeypatch):
    """transformers 5.17 (what the GPU machines have) has no pipelines.REMOVED_TASKS; `import openrealm` must not
    depend on it."""
    import transformers.pipelines
    from transformers.pipelines import PIPELINE_REGISTRY

    monkeypatch.delattr(transformers.pipelines, "REMOVED_TASKS", raising=False)
    monkeypatch.setattr(openrealm, "_registered", False)
    openrealm.register_with_transformers()
    assert PIPELINE_REGISTRY.supported_tasks["question-answering"]["impl"] is RealmQuestionAnsweringPipeline


def test_a_question_gets_an_answer_from_a_retrieved_block_with_provenance(qa):
    result = qa(QUESTIONS[0])
    assert set(result) == {"answer", "score", "block_id", "title", "text", "start", "end", "retrieval_score"}
    assert result["text"] == BLOCK_TEXTS[result["block_id"]]
    assert result["title"] == f"title {result['block_id']}"
    assert result["answer"] and result["answer"] in result["text"]
    assert 0.0 < result["score"] <= 1.0


def test_the_answer_is_the_models_prediction(qa, folder):
    model = qa.model
    encoded = qa.tokenizer([QUESTIONS[0]], return_tensors="pt")
    with torch.no_grad():
        output = model(**encoded)
    result = qa(QUESTIONS[0])
    assert result["block_id"] == output.predicted_block_ids.item()
    assert result["answer"].lower().split() == qa.tokenizer.decode(output.predicted_answer_ids).split()
    probabilities = model(**encoded, output_reader_logits=True).reader_output.reader_logits.reshape(-1).softmax(-1)
    assert result["score"] == pytest.approx(probabilities.max().item(), rel=1e-5)


def test_a_list_of_questions_is_answered_in_batches_like_one_at_a_time(qa):
    together = qa(QUESTIONS, batch_size=2)
    assert len(together) == 3
    for question, answer in zip(QUESTIONS, together):
        alone = qa(question)
        assert (answer["answer"], answer["block_id"]) == (alone["answer"], alone["block_id"])
        assert answer["score"] == pytest.approx(alone["score"], rel=1e-4)


def test_top_k_returns_distinct_answers_best_first(qa):
    answers = qa(QUESTIONS[1], top_k=3)
    assert len(answers) == 3
    scores = [answer["score"] for answer in answers]
    assert scores == sorted(scores, reverse=True)
    assert len({(a["block_id"], a["answer"]) for a in answers}) == 3
    assert answers[0]["answer"] == qa(QUESTIONS[1])["answer"]


def test_start_and_end_locate_each_answer_in_the_text_of_its_block(qa):
    for answer in qa(QUESTIONS[2], top_k=4, num_blocks=3):
        assert answer["text"][answer["start"] : answer["end"]] == answer["answer"]


def test_top_k_beyond_the_spans_of_the_blocks_read_returns_only_those_spans(qa):
    answers = qa(QUESTIONS[0], top_k=1000, num_blocks=2)
    assert 0 < len(answers) < 1000  # two blocks of a few words: far fewer spans, and no question, [SEP] or [PAD]
    assert all(answer["text"][answer["start"] : answer["end"]] == answer["answer"] for answer in answers)


def test_top_k_beyond_the_spans_of_a_context_returns_only_its_spans(qa):
    context = "The Nile flows through Egypt."
    answers = qa(QUESTIONS[0], context=context, top_k=1000)
    assert 0 < len(answers) < 1000
    assert all(context[answer["start"] : answer["end"]] == answer["answer"] for answer in answers)


def test_return_blocks_lists_every_retrieved_block_best_first_and_marks_those_read(qa):
    result = qa(QUESTIONS[0], top_k=2, num_blocks=2, num_retrieved=5, return_blocks=True)
    assert set(result) == {"answers", "blocks"} and len(result["answers"]) == 2
    blocks = result["blocks"]
    assert [block["read"] for block in blocks] == [True, True, False, False, False]
    scores = [block["retrieval_score"] for block in blocks]
    assert scores == sorted(scores, reverse=True) and len({block["block_id"] for block in blocks}) == 5
    assert all(block["text"] == BLOCK_TEXTS[block["block_id"]] for block in blocks)
    read = {block["block_id"]: block["retrieval_score"] for block in blocks[:2]}
    for answer in result["answers"]:
        assert answer["retrieval_score"] == pytest.approx(read[answer["block_id"]])
    # retrieving 5 blocks instead of 2 scores them in other shapes: the same answers, scores to float32 rounding
    assert result["answers"] == [pytest.approx(answer) for answer in qa(QUESTIONS[0], top_k=2, num_blocks=2)]


def test_return_blocks_lists_at_least_the_blocks_read(qa):
    result = qa(QUESTIONS[1], num_blocks=3, num_retrieved=1, return_blocks=True)
    assert [block["read"] for block in result["blocks"]] == [True, True, True]


def test_return_blocks_with_a_context_is_refused(qa):
    with pytest.raises(ValueError, match="a question with a context retrieves none"):
        qa(QUESTIONS[0], context="The Nile flows through Egypt.", return_blocks=True)


def test_more_blocks_can_be_read_per_call(qa):
    assert qa(QUESTIONS[0], num_blocks=6, top_k=6)[0]["block_id"] in range(6)


def test_with_a_context_only_the_given_text_is_read(qa):
    context = "The Nile flows through Egypt and Sudan."
    result = qa(QUESTIONS[0], context=context)
    assert set(result) == {"answer", "score", "start", "end"}
    assert context[result["start"] : result["end"]] == result["answer"]
    assert 0.0 < result["score"] <= 1.0


def test_a_long_context_is_read_in_windows(qa):
    context = " ".join(["the river flows through the city ."] * 30) + " Cairo is in Egypt."
    answers = qa(QUESTIONS[0], context=context, top_k=2)
    assert all(context[a["start"] : a["end"]] == a["answer"] for a in answers)


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_an_empty_question_is_refused(qa, question):
    with pytest.raises(ValueError, match="empty or whitespace"):
        qa(question)


def test_an_over_long_question_is_truncated_with_a_warning(qa, caplog):
    question = " ".join(["where does the river flow ?"] * 20)
    with caplog.at_level(logging.WARNING):
        result = qa(question)
    assert "truncated" in caplog.text
    assert result["text"] in BLOCK_TEXTS


def test_the_folder_loads_without_trust_remote_code_when_openrealm_is_installed(folder):
    """The folder carries custom_pipelines for environments without openrealm; openrealm's own pipeline serves it."""
    import json

    assert "custom_pipelines" in json.loads((folder / "config.json").read_text())
    assert isinstance(pipeline("question-answering", model=str(folder)), RealmQuestionAnsweringPipeline)


@pytest.mark.parametrize("num_blocks", [0, -1, 2.5, True])
def test_num_blocks_that_is_not_a_positive_integer_is_refused(qa, num_blocks):
    with pytest.raises(ValueError, match=r"num_blocks .*must be an integer of at least 1"):
        qa(QUESTIONS[0], num_blocks=num_blocks)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5])
def test_batch_size_that_is_not_a_positive_integer_is_refused(qa, batch_size):
    with pytest.raises(ValueError, match=r"batch_size .*must be an integer of at least 1"):
        qa(QUESTIONS, batch_size=batch_size)


def test_batch_size_zero_set_on_the_pipeline_is_refused(folder):
    zero = pipeline("question-answering", model=str(folder), batch_size=0)
    with pytest.raises(ValueError, match=r"batch_size .*must be an integer of at least 1, got 0"):
        zero(QUESTIONS[0])


@pytest.mark.parametrize("top_k", [2.5, 0, -3, "2"])
def test_top_k_that_is_not_a_positive_integer_is_refused(qa, top_k):
    with pytest.raises(ValueError, match=r"top_k .*must be an integer of at least 1"):
        qa(QUESTIONS[0], top_k=top_k)


def test_a_utf8_bytes_question_is_answered_like_its_text(qa):
    from_bytes, from_text = qa(QUESTIONS[0].encode("utf-8")), qa(QUESTIONS[0])
    assert (from_bytes["answer"], from_bytes["block_id"]) == (from_text["answer"], from_text["block_id"])
    assert from_bytes["score"] == pytest.approx(from_text["score"], rel=1e-5)


def test_a_non_utf8_bytes_question_is_refused_by_name(qa):
    with pytest.raises(ValueError, match=r"question 1 is bytes that are not valid UTF-8"):
        qa([QUESTIONS[0], b"where is caf\xe9 ?"])


def test_an_empty_question_in_a_list_is_refused_by_position(qa):
    with pytest.raises(ValueError, match=r"question 2 is empty or whitespace \(''\)"):
        qa([QUESTIONS[0], QUESTIONS[1], ""])


def test_a_question_that_is_not_text_is_refused_by_type(qa):
    with pytest.raises(ValueError, match="question 0 must be a str .*got int"):
        qa([42])


@pytest.mark.parametrize("offset", [1, 0, -1])
def test_max_question_length_beyond_the_reader_input_is_refused(qa, offset):
    reader_seq_len = qa.model.config.reader_seq_len
    with pytest.raises(ValueError, match=rf"max_question_length must be an integer from 3 to {reader_seq_len - 2}"):
        qa(QUESTIONS[0], max_question_length=reader_seq_len + offset)


@pytest.mark.parametrize("max_question_length", [2, 0, -5, 10.5])
def test_max_question_length_too_short_for_a_question_is_refused(qa, max_question_length):
    with pytest.raises(ValueError, match=r"max_question_length must be an integer from 3 to"):
        qa(QUESTIONS[0], max_question_length=max_question_length)


def test_max_question_length_at_its_limit_reads_a_context(qa):
    context = "The Nile flows through Egypt and Sudan."
    question = " ".join(["where does the river flow ?"] * 20)
    result = qa(question, context=context, max_question_length=qa.model.config.reader_seq_len - 2)
    assert context[result["start"] : result["end"]] == result["answer"]
