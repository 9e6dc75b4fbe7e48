"""Open-QA fine-tuning (ORQA losses, REALM++ options): given blocks, regex and passage supervision, what is trained and
what stays frozen, learning on the synthetic world, and `openrealm train openqa` end to end."""

import errno
import json
import os

import pytest
import torch
from helpers import BLOCK_TEXTS, answers_for, make_openqa_model

from openrealm.hub_cards import model_card
from openrealm.trainers.openqa import (
    OpenQAArguments,
    finetune_openqa,
    openqa_model_from_pretraining,
    openqa_training_arguments,
    save_finetuned,
)
from openrealm.trainers.options import OPENQA_DEV_RESULTS_NAME as DEV_RESULTS_NAME
from openrealm.trainers.options import OPENQA_SUMMARY_NAME as SUMMARY_NAME


@pytest.fixture(scope="module")
def model():
    return make_openqa_model(seed=0)


def test_given_block_ids_are_read_instead_of_the_index_search(model, tokenizer):
    question = tokenizer(
        ["where does the nile flow ?", "what is the capital of france ?"], padding=True, return_tensors="pt"
    )
    given = torch.tensor([[4, 1, 0], [5, 3, 2]])
    output = model(**question, retrieved_block_ids=given)
    assert torch.equal(output.retrieved_block_ids, given)
    assert output.predicted_block_ids[0].item() in (4, 1, 0)
    assert output.predicted_block_ids[1].item() in (5, 3, 2)
    # The reader reads the given blocks in the given order: row 1 of question 0 holds block 1's text.
    question_length = len(tokenizer("where does the nile flow ?", add_special_tokens=False)["input_ids"])
    block_1 = tokenizer(BLOCK_TEXTS[1], add_special_tokens=False)["input_ids"]
    block_start = question_length + 2  # [CLS] question [SEP] block [SEP]
    assert output.reader_input_ids[0, 1, block_start : block_start + len(block_1)].tolist() == block_1


def test_given_block_logits_are_recomputed_from_the_query_tower(model, tokenizer):
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    given = torch.tensor([[5, 2]])
    output = model(**question, retrieved_block_ids=given)
    expected = model.retriever.index.block_emb[given[0]] @ model.embedder(**question).projected_score[0]
    torch.testing.assert_close(output.retrieved_logits[0], expected, rtol=1e-5, atol=1e-5)
    # Fewer blocks given than reader_beam_size (3): all of them are read.
    assert output.reader_input_ids.shape[1] == 2


def test_given_block_ids_match_the_search_when_they_are_its_result(model, tokenizer):
    question = tokenizer(["who was a pioneer of computer science ?"], return_tensors="pt")
    searched = model(**question, answer_ids=answers_for(tokenizer, "alan turing"))
    given = model(
        **question, answer_ids=answers_for(tokenizer, "alan turing"), retrieved_block_ids=searched.retrieved_block_ids
    )
    assert torch.equal(given.predicted_answer_ids, searched.predicted_answer_ids)
    torch.testing.assert_close(given.reader_output.loss, searched.reader_output.loss)


def test_given_block_ids_out_of_the_corpus_are_refused(model, tokenizer):
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        model(**question, retrieved_block_ids=torch.tensor([[0, 6]]))
    with pytest.raises(ValueError, match="num_questions=1"):
        model(**question, retrieved_block_ids=torch.tensor([[0], [1]]))


# ---------------------------------------------------------------------------------------------------------------------
# Regex distant supervision (CuratedTrec)
# ---------------------------------------------------------------------------------------------------------------------


def reader_inputs_for_every_block(model, tokenizer, question, **supervision):
    question_ids = model.retriever.question_token_ids(tokenizer([question], return_tensors="pt")["input_ids"])
    block_ids = torch.arange(len(BLOCK_TEXTS)).view(1, -1)
    return model.retriever.build_reader_inputs(question_ids, block_ids, max_length=64, **supervision)


def answer_texts(tokenizer, inputs):
    """{block id: [decoded gold span, ...]} of the blocks that have an answer."""
    found = {}
    for block, (starts, ends) in enumerate(zip(inputs["start_positions"][0], inputs["end_positions"][0])):
        spans = [(s, e) for s, e in zip(starts.tolist(), ends.tolist()) if s >= 0]
        if spans:
            ids = inputs["input_ids"][0, block]
            found[block] = [tokenizer.decode(ids[s : e + 1]) for s, e in spans]
    return found


def test_regex_patterns_mark_the_matching_spans_case_insensitively(model, tokenizer):
    inputs = reader_inputs_for_every_block(
        model, tokenizer, "what is the capital of france ?", answer_patterns=[["PAR(IS|EE)"]]
    )
    assert answer_texts(tokenizer, inputs) == {1: ["paris"], 5: ["paris"]}
    assert inputs["has_answers"][0].tolist() == [False, True, False, False, False, True]


def test_regex_patterns_span_several_wordpieces_even_out_of_vocabulary_ones(model, tokenizer):
    """ "cairo" and "thames" are [UNK] to the fixture vocabulary: matching the text finds them, wordpiece ids could
    not."""
    inputs = reader_inputs_for_every_block(
        model, tokenizer, "which river ?", answer_patterns=[[r"(the )?river\s+th[a-z]+", r"cair(o|ene)"]]
    )
    assert answer_texts(tokenizer, inputs) == {0: ["[UNK]"], 4: ["the river [UNK]"]}


def test_regex_matches_inside_a_word_do_not_count(model, tokenizer):
    inputs = reader_inputs_for_every_block(model, tokenizer, "where ?", answer_patterns=[["pari", "ondon is"]])
    assert not inputs["has_answers"].any()


def test_invalid_regex_is_refused_naming_the_pattern(model, tokenizer):
    with pytest.raises(ValueError, match=r"'par\(is' of question 0"):
        reader_inputs_for_every_block(model, tokenizer, "where ?", answer_patterns=[["par(is"]])


def test_regex_supervision_gives_the_losses_of_the_same_answer_as_wordpieces(model, tokenizer):
    question = tokenizer(["where does the nile flow ?"], return_tensors="pt")
    as_regex = model(**question, answer_patterns=[["egypt|france"]], reader_beam_size=6).reader_output
    as_ids = model(**question, answer_ids=answers_for(tokenizer, "egypt", "france"), reader_beam_size=6).reader_output
    assert as_regex.retriever_correct.sum() == 2
    assert torch.equal(as_regex.reader_correct, as_ids.reader_correct)
    torch.testing.assert_close(as_regex.loss, as_ids.loss)


def test_a_batch_may_mix_regex_and_string_answers(model, tokenizer):
    questions = tokenizer(["where does the nile flow ?", "who was a pioneer ?"], padding=True, return_tensors="pt")
    output = model(
        **questions,
        answer_ids=[[], answers_for(tokenizer, "alan turing")[0:1]],
        answer_patterns=[["egypt"], None],
        reader_beam_size=6,
    ).reader_output
    correct = {b: output.retriever_correct[b].nonzero().view(-1).tolist() for b in range(2)}
    retrieved = model(**questions, reader_beam_size=6).retrieved_block_ids
    assert [retrieved[0, i].item() for i in correct[0]] == [0]
    assert [retrieved[1, i].item() for i in correct[1]] == [3]


# ---------------------------------------------------------------------------------------------------------------------
# Passage supervision (REALM++)
# ---------------------------------------------------------------------------------------------------------------------


def test_gold_block_adds_its_marginal_log_likelihood_to_the_loss(model, tokenizer):
    question = tokenizer(["what is the capital of france ?"], return_tensors="pt")
    answers = answers_for(tokenizer, "paris")
    plain = model(**question, answer_ids=answers, reader_beam_size=6)
    supervised = model(**question, answer_ids=answers, gold_block_ids=[[1]], reader_beam_size=6)
    logits = supervised.retrieved_logits[0]
    gold = supervised.retrieved_block_ids[0] == 1
    expected = torch.logsumexp(logits, 0) - logits[gold][0]
    output = supervised.reader_output
    assert torch.equal(output.passage_correct, gold)
    torch.testing.assert_close(output.passage_loss, expected)
    torch.testing.assert_close(output.loss, plain.reader_output.loss + expected)
    assert supervised.loss is output.loss


def test_passage_loss_is_zero_when_no_gold_block_is_retrieved(model, tokenizer):
    question = tokenizer(["what is the capital of france ?"], return_tensors="pt")
    answers = answers_for(tokenizer, "paris")
    plain = model(**question, answer_ids=answers).reader_output
    top = model(**question).retrieved_block_ids[0].tolist()
    unretrieved = next(i for i in range(len(BLOCK_TEXTS)) if i not in top)
    for gold in ([[unretrieved]], [[]]):
        output = model(**question, answer_ids=answers, gold_block_ids=gold).reader_output
        assert output.passage_loss.item() == 0.0
        torch.testing.assert_close(output.loss, plain.loss)


def test_gold_passage_text_marks_blocks_with_half_of_its_words(model, tokenizer):
    question = tokenizer(["what is the capital of france ?"], return_tensors="pt")
    output = model(**question, gold_passages=["France has Paris as its capital."], reader_beam_size=6)
    retrieved = output.retrieved_block_ids[0]
    assert torch.equal(output.reader_output.passage_correct, retrieved == 1)  # 3 of 6 words; block 2 has 1 of 6
    assert output.loss > 0
    stricter = model(**question, gold_passages=["France has Paris as its capital."], min_passage_overlap=0.6)
    assert not stricter.reader_output.passage_correct.any()


# ---------------------------------------------------------------------------------------------------------------------
# Fine-tuning
# ---------------------------------------------------------------------------------------------------------------------

FIXTURE_ROWS = [
    {"question": "where does the nile flow ?", "answers": ["egypt"]},
    {"question": "what is the capital of france ?", "answers": ["paris"]},
    {"question": "who was a pioneer of computer science ?", "answers": ["alan turing"]},
    {"question": "what is the capital of england ?", "answers": ["london"]},
]


def test_fine_tuning_trains_query_tower_and_reader_but_not_the_block_embeddings(tmp_path):
    model = make_openqa_model(seed=2)
    block_emb = model.retriever.index.block_emb.clone()
    embedder = {name: p.detach().clone() for name, p in model.embedder.named_parameters()}
    reader = {name: p.detach().clone() for name, p in model.reader.named_parameters()}
    args = openqa_training_arguments(
        tmp_path, 3, warmup_steps=0, per_device_train_batch_size=2, learning_rate=1e-3, disable_tqdm=True
    )
    summary = finetune_openqa(model, FIXTURE_ROWS, None, args, OpenQAArguments(eval_reader_beam_size=6), save=False)
    # exact: the index is left as it was; the towers trained if they changed at all
    assert torch.equal(model.retriever.index.block_emb, block_emb)
    assert not torch.equal(model.embedder.cls.dense.weight, embedder["cls.dense.weight"])  # exact: see above
    assert not torch.equal(  # exact: see above
        model.embedder.realm.embeddings.word_embeddings.weight, embedder["realm.embeddings.word_embeddings.weight"]
    )
    # exact: see above
    assert not torch.equal(model.reader.qa_outputs.dense_output.weight, reader["qa_outputs.dense_output.weight"])
    assert not torch.equal(  # exact: see above
        model.reader.realm.encoder.layer[0].output.dense.weight, reader["realm.encoder.layer.0.output.dense.weight"]
    )
    # The whole corpus (6 blocks) is searched in training (5000 capped); 5 blocks are read in training, 6 afterwards.
    assert summary["searcher_beam_size"] == 6
    assert (summary["reader_beam_size_train"], summary["reader_beam_size_eval"]) == (5, 6)
    assert model.config.reader_beam_size == 6


def test_the_beams_recorded_count_only_the_blocks_left_after_a_removal(tmp_path):
    model = make_openqa_model(seed=2)
    model.retriever.remove_blocks([0, 1, 2])  # 3 of the 6 blocks are left to search
    args = openqa_training_arguments(tmp_path, 1, per_device_train_batch_size=2, disable_tqdm=True)
    summary = finetune_openqa(model, FIXTURE_ROWS, None, args, OpenQAArguments(max_dropped_share=1.0), save=False)
    assert summary["searcher_beam_size"] == 3
    assert (summary["reader_beam_size_train"], summary["reader_beam_size_eval"]) == (3, 3)


def folder_files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_save_failing_part_way_leaves_the_previous_fine_tuned_folder_whole(tmp_path, monkeypatch):
    output = tmp_path / "openqa"
    save_finetuned(make_openqa_model(seed=0), output, {"num_blocks": 6, "max_steps": 1}, None)
    before = folder_files(output)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(output / "README.md"))

    monkeypatch.setattr(model_card, "openqa_model_card", disk_full)  # after the new weights, before the card
    with pytest.raises(OSError, match="No space left"):
        save_finetuned(make_openqa_model(seed=1), output, {"num_blocks": 6, "max_steps": 2}, None)
    assert folder_files(output) == before
    assert sorted(os.listdir(tmp_path)) == ["openqa"]


def test_dev_results_of_an_earlier_save_do_not_stay_beside_a_model_saved_without_them(tmp_path):
    output = tmp_path / "openqa"
    dev = {"exact_match": 50.0, "num_questions": 2, "predictions": []}
    save_finetuned(make_openqa_model(seed=0), output, {"num_blocks": 6, "max_steps": 1}, dev)
    assert (output / DEV_RESULTS_NAME).is_file()
    save_finetuned(make_openqa_model(seed=1), output, {"num_blocks": 6, "max_steps": 2}, None)
    assert not (output / DEV_RESULTS_NAME).exists()
    assert json.loads((output / SUMMARY_NAME).read_text())["max_steps"] == 2


# ---------------------------------------------------------------------------------------------------------------------
# The synthetic world: learning, and the command line end to end
# ---------------------------------------------------------------------------------------------------------------------


def write_questions(path, rows):
    path.write_text("".join(json.dumps({"question": r["question"], "answers": r["answers"]}) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def world_run(tmp_path_factory):
    """A small synthetic world: corpus (64-wordpiece blocks), question splits, and a tiny random pre-training output
    (embedder/ + encoder/) as `openrealm train pretrain` writes it."""
    from datasets import Dataset

    from openrealm import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder
    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.vocab import train_wordpiece_vocab
    from openrealm.trainers.world.synthetic_world import generate_world

    root = tmp_path_factory.mktemp("world")
    world = generate_world(
        seed=0, num_people=20, num_organizations=6, num_cities=6, num_rivers=2, num_mountains=2, num_regions=2
    )
    tokenizer = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=2000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", tokenizer, max_block_length=64)
    torch.manual_seed(0)
    config = RealmConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        retriever_proj_size=32,
        max_position_embeddings=128,
        span_hidden_size=32,
        reader_seq_len=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    RealmEmbedder(config).save_pretrained(root / "pretrained" / "embedder")
    RealmKnowledgeAugEncoder(config).save_pretrained(root / "pretrained" / "encoder")
    return {
        "root": root,
        "corpus": root / "corpus",
        "pretrained": root / "pretrained",
        "train": write_questions(root / "train.jsonl", world.questions_for("train")),
        "dev": write_questions(root / "dev.jsonl", world.questions_for("dev")),
        # Every question on an entity no training question asks about (dev + test): 68 questions.
        "held_out": write_questions(root / "held_out.jsonl", world.questions_for("dev") + world.questions_for("test")),
    }


def test_model_from_pretraining_takes_query_tower_from_embedder_and_reader_bert_from_encoder(world_run):
    from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.tokenization.retriever_inputs import batch_retriever_inputs

    pretrained = world_run["pretrained"]
    model = openqa_model_from_pretraining(pretrained / "embedder", pretrained / "encoder", world_run["corpus"])
    embedder = RealmEmbedder.from_pretrained(pretrained / "embedder").eval()
    encoder = RealmKnowledgeAugEncoder.from_pretrained(pretrained / "encoder")
    for name, weight in embedder.state_dict().items():
        assert torch.equal(model.embedder.state_dict()[name], weight), name  # exact: loaded from the folder
    for name, weight in encoder.realm.state_dict().items():
        assert torch.equal(model.reader.realm.state_dict()[name], weight), name  # exact: loaded from the folder
    blocks = load_corpus(world_run["corpus"])
    assert model.retriever.index.num_blocks == len(blocks) == model.config.num_block_records
    with torch.no_grad():
        inputs = batch_retriever_inputs([blocks[0], blocks[7]], model.retriever.tokenizer, max_length=64)
        expected = embedder(**inputs).projected_score
    torch.testing.assert_close(model.retriever.index.block_emb[[0, 7]], expected, rtol=1e-4, atol=1e-4)


def test_train_openqa_command_writes_a_folder_that_answers_through_the_pipeline(world_run, tmp_path):
    from transformers import pipeline

    from openrealm import RealmForOpenQA
    from openrealm.trainers.cli import main

    output = tmp_path / "finetuned"
    exit_code = main(
        [
            "train", "openqa", "--model", str(world_run["pretrained"]), "--corpus", str(world_run["corpus"]),
            "--train", str(world_run["train"]), "--dev", str(world_run["dev"]), "--output", str(output),
            "--max-steps", "2", "--batch-size", "4", "--gradient-accumulation-steps", "2",
            "--eval-reader-beam-size", "7", "--eval-steps", "1", "--warmup-steps", "0", "--no-progress",
        ]
    )  # fmt: skip
    assert exit_code == 0
    summary = json.loads((output / "openqa_training.json").read_text())
    assert summary["max_steps"] == 2 and summary["gradient_accumulation_steps"] == 2
    assert summary["dev_before"]["count"] == summary["dev_after"]["count"] == 24
    assert [row["step"] for row in summary["dev_history"]] == [1, 2]
    assert json.loads((output / "dev_results.json").read_text())["num_blocks"] == 7
    assert "model-index" in (output / "README.md").read_text()
    reloaded = RealmForOpenQA.from_pretrained(output)
    assert reloaded.config.reader_beam_size == 7
    assert reloaded.retriever.index.num_blocks == summary["num_blocks"]
    qa = pipeline("question-answering", model=str(output))
    result = qa("Where was Bimulam Gonuskni born?")
    assert result["answer"] and result["answer"] in result["text"]
    assert 0 <= result["block_id"] < summary["num_blocks"]


def training_loss(model, rows, tokenizer) -> float:
    """The mean loss over rows, dropout off, with every block scored and read (so that no row's reader loss is
    zeroed because retrieval missed its answer)."""
    from openrealm.trainers.openqa import OpenQACollator

    model.eval()
    with torch.no_grad():
        batch = OpenQACollator(tokenizer)(rows)
        num_blocks = model.retriever.index.num_blocks
        return model(**batch, searcher_beam_size=num_blocks, reader_beam_size=num_blocks).loss.item()


@pytest.mark.slow
def test_fine_tuning_on_the_synthetic_world_lowers_the_loss_and_raises_held_out_exact_match(world_run, tmp_path):
    from openrealm.trainers.evaluation import load_qa_dataset

    pretrained = world_run["pretrained"]
    model = openqa_model_from_pretraining(pretrained / "embedder", pretrained / "encoder", world_run["corpus"])
    train = load_qa_dataset(str(world_run["train"]))
    probe = [dict(row) for row in train.select(range(0, len(train), 20))]
    loss_before = training_loss(model, probe, model.retriever.tokenizer)
    args = openqa_training_arguments(
        tmp_path, 120, warmup_steps=0, learning_rate=6e-3, per_device_eval_batch_size=34, disable_tqdm=True
    )
    openqa_args = OpenQAArguments(reader_beam_size=2, eval_reader_beam_size=5)
    held_out = load_qa_dataset(str(world_run["held_out"]))
    summary = finetune_openqa(model, train, held_out, args, openqa_args, save=False)
    loss_after = training_loss(model, probe, model.retriever.tokenizer)
    assert loss_after < 0.9 * loss_before
    assert summary["dev_after"]["recall@5"] > summary["dev_before"]["recall@5"] + 20
    # From no question answered to several (7.4% of 68 on this seed): the reader learnt to extract answers.
    assert summary["dev_after"]["exact_match"] > summary["dev_before"]["exact_match"] + 4


# ---------------------------------------------------------------------------------------------------------------------
# The collator: string answers, regex patterns, gold passages
# ---------------------------------------------------------------------------------------------------------------------


def test_collator_turns_string_answers_into_wordpieces_and_regex_rows_into_patterns(tokenizer):
    from openrealm.trainers.openqa import OpenQACollator

    rows = [
        {"question": "where does the nile flow ?", "answers": ["egypt", "the nile"], "match": "string"},
        {"question": "what is the capital of france ?", "answers": ["par(is|ee)"], "match": "regex"},
    ]
    batch = OpenQACollator(tokenizer)(rows)
    assert batch["input_ids"].shape[0] == 2
    assert batch["answer_ids"] == [answers_for(tokenizer, "egypt", "the nile"), []]
    assert batch["answer_patterns"] == [None, ["par(is|ee)"]]
    assert "gold_block_ids" not in batch


def test_collator_resolves_gold_passage_ids_to_block_ids_or_passage_texts(tokenizer):
    from openrealm.trainers.openqa import OpenQACollator

    collator = OpenQACollator(
        tokenizer, passage_supervision=True, gold_passages={"nq-7": "paris is in france"}, num_blocks=6
    )
    rows = [
        {"question": "a ?", "answers": ["x"], "gold_passage_id": "4"},
        {"question": "b ?", "answers": ["y"], "gold_passage_id": "nq-7"},
        {"question": "c ?", "answers": ["z"], "gold_passage_id": None},
    ]
    batch = collator(rows)
    assert batch["gold_block_ids"] == [[4], [], []]
    assert batch["gold_passages"] == [None, "paris is in france", None]
    with pytest.raises(ValueError, match="'nq-8' is neither a block id"):
        collator([{"question": "d ?", "answers": ["w"], "gold_passage_id": "nq-8"}])
    with pytest.raises(ValueError, match="'6' is neither a block id"):
        collator([{"question": "d ?", "answers": ["w"], "gold_passage_id": "6"}])


def test_passage_supervision_and_regex_rows_train_together(tokenizer, tmp_path):
    from openrealm.trainers.openqa import OpenQACollator

    model = make_openqa_model(seed=3)
    rows = [
        {"question": "where does the nile flow ?", "answers": ["egy+pt"], "match": "regex", "gold_passage_id": "0"},
        {"question": "what is the capital of france ?", "answers": ["paris"], "gold_passage_id": "1"},
    ]
    batch = OpenQACollator(tokenizer, passage_supervision=True, num_blocks=6)(rows)
    output = model.train()(**batch)
    retrieved, reader_output = output.retrieved_block_ids, output.reader_output
    assert retrieved[0][reader_output.passage_correct[0]].tolist() == [0]
    assert retrieved[1][reader_output.passage_correct[1]].tolist() == [1]
    assert retrieved[0][reader_output.retriever_correct[0]].tolist() == [0]  # the regex found "egypt"
    assert (reader_output.passage_loss > 0).all()
    args = openqa_training_arguments(
        tmp_path, 2, warmup_steps=0, per_device_train_batch_size=2, logging_steps=1, disable_tqdm=True
    )
    summary = finetune_openqa(model, rows, None, args, OpenQAArguments(passage_supervision=True), save=False)
    assert summary["passage_supervision"] is True
    assert [row["step"] for row in summary["train_loss"]] == [1, 2]
    assert all(row["loss"] > 0 for row in summary["train_loss"])


def test_towers_of_different_architectures_are_refused(world_run):
    from openrealm import RealmConfig, RealmKnowledgeAugEncoder

    pretrained = world_run["pretrained"]
    config = RealmConfig.from_pretrained(pretrained / "encoder")
    config.num_hidden_layers = 1
    with pytest.raises(ValueError, match="num_hidden_layers: embedder 2 vs encoder 1"):
        openqa_model_from_pretraining(pretrained / "embedder", RealmKnowledgeAugEncoder(config), world_run["corpus"])


def test_starting_from_towers_without_a_corpus_says_to_pass_one(world_run):
    from openrealm.trainers.openqa import load_openqa_model

    with pytest.raises(ValueError, match="pass --corpus DIR"):
        load_openqa_model(world_run["pretrained"])


def openqa_argv(world_run, train, output, *extra: str) -> list[str]:
    return [
        "train", "openqa", "--model", str(world_run["pretrained"]), "--corpus", str(world_run["corpus"]),
        "--train", str(train), "--output", str(output), "--max-steps", "2", "--batch-size", "4", "--warmup-steps", "0",
        "--no-progress", *extra,
    ]  # fmt: skip


def unanswerable(questions: list[dict]) -> list[dict]:
    """The questions with an answer no block of the world holds."""
    return [{**row, "answers": ["Zorblax Quuxington"]} for row in questions]


def first_training_questions(world_run, count: int) -> list[dict]:
    return [json.loads(line) for line in world_run["train"].read_text().splitlines()[:count]]


def test_fine_tuning_on_questions_whose_answers_no_retrieved_block_holds_ends_with_an_error_and_saves_nothing(
    world_run, tmp_path, capsys
):
    from openrealm.trainers.cli import main

    questions = first_training_questions(world_run, 8)
    train = write_questions(tmp_path / "train.jsonl", unanswerable(questions))
    output = tmp_path / "finetuned"
    assert main(openqa_argv(world_run, train, output)) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: open-QA fine-tuning ended: 8 of 8 training questions read (100%) give no training "
        "example: 8 because none of the "
    )
    assert "blocks retrieved for them holds one of their answers, so ORQA's losses are zero for them" in error
    assert "--searcher-beam-size" in error and error.endswith("No model was saved.")
    assert not output.exists()


def test_fine_tuning_summary_line_warns_when_most_questions_have_no_answer_retrieved(world_run, tmp_path, capsys):
    from openrealm.trainers.cli import main

    questions = first_training_questions(world_run, 8)
    rows = questions[:3] + unanswerable(questions[3:])
    train = write_questions(tmp_path / "train.jsonl", rows)
    output = tmp_path / "finetuned"
    assert main(openqa_argv(world_run, train, output)) == 0  # 2 steps of 4: the 8 questions, each once
    line = capsys.readouterr().out.splitlines()[-1]
    summary = json.loads((output / "openqa_training.json").read_text())
    assert (summary["num_questions_read"], summary["num_questions_unanswered"]) == (8, 5)
    assert line == f"Saved the fine-tuned RealmForOpenQA to {output}; warning: {summary['dropped_warning']}"
    assert summary["dropped_warning"].startswith("5 of 8 training questions read (62%) give no training example")
