"""A small world to learn on: a seeded generator of a fictional knowledge corpus and questions about it.

People, organizations, cities, rivers, mountains and regions get names made of random syllables (no pretrained model
can know them) and facts drawn at random (a name never predicts a value), so a fact can only be recovered by
retrieval. Every fact is stated twice, in two different articles and two different wordings: once in its subject's
article and once in the linked entity's article or in a decade chronicle. A sentence whose entity or date is masked
(REALM's salient-span masking) can then be completed from another block. Every sentence names its subject (no
pronouns) because REALM's query is one sentence alone, and every entity or date in a sentence belongs to a fact that
sentence states, so every salient span is recoverable. With `mentions_per_person`, people also meet (each named in
many blocks that state nothing asked about them) and facts' first statements move to "Notes" articles: a world where
knowing a question's topic is not enough (docs/quickstart.md, "A world where the topic is not enough").

    world = generate_world(seed=0)
    world.write("world/")                       # articles.jsonl, questions_{train,dev,test}.jsonl, facts.jsonl, ...
    annotate = world.span_annotator()           # sentence -> [(start, end, label)], picklable

Generation uses only the standard library (random, string, re), so worlds are identical across platforms and hash
seeds; writing uses openrealm's atomic-folder helper. The module is long because it holds the world's whole grammar
(relations, sentence and question wordings, name syllables) beside the generator that reads it: one place to read
what the world can say.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from openrealm.file_utils import atomic_directory
from openrealm.tokenization.jsonl import read_jsonl, write_jsonl

FORMAT = "openrealm.synthetic_world"
FORMAT_VERSION = 1
SPLITS = ("train", "dev", "test")
WORLD_CONFIG_NAME = "world_config.json"
# what World.write writes: all a world folder may hold for `openrealm world --overwrite` to replace it
WORLD_FILES = frozenset(
    {"articles.jsonl", "facts.jsonl", "entities.jsonl", WORLD_CONFIG_NAME, *(f"questions_{s}.jsonl" for s in SPLITS)}
)
KINDS = ("person", "organization", "city", "river", "mountain", "region")
# CoNLL-style labels (what an NER annotator would call them), plus DATE for the date regex.
LABELS = {"person": "PER", "organization": "ORG", "city": "LOC", "river": "LOC", "mountain": "LOC", "region": "LOC"}
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
DATE_PATTERN = r"\b(?:(?:" + "|".join(MONTHS) + r") )?[12]\d{3}\b"

# Three syllables, 6 to 10 letters, no doubled letter and no English-looking ending: such words are almost never
# English (one word in 30,000 is a whole word of BERT's uncased vocabulary, mostly a rare proper noun).
_ONSETS = tuple("bdfgklmnprstvz") * 3 + ("th", "sh", "dr", "tr", "br", "kr", "gr")
_VOWELS = tuple("aeiou") * 4 + ("ae", "ai", "ei", "ou")
_CODAS = ("",) * 12 + ("n", "r", "l", "s", "m", "v", "k", "th", "rn", "nd", "sk", "lv")
_ENGLISH_LOOKING = re.compile(r"(?:[bcdfgklmnprstvz]e|er|ed|es|ing|nd|on|al|ly|en|an|ow|ic|in|ur|rn)$|(.)\1")
# Belt and braces: English words the syllables could still spell.
_ENGLISH = frozenset("angelo ankara dakota dinamo enamel latino telugu".split() + [month.lower() for month in MONTHS])
_ORGANIZATION_SUFFIXES = ("Works", "Company", "Guild", "Foundry", "Press", "Society", "Trading House", "Bank")

# relation -> (subject kind, value kind, where the second statement goes: the value's article or a chronicle)
RELATIONS = {
    "birthplace": ("person", "city", "value"),
    "birth_date": ("person", "date", "chronicle"),
    "employer": ("person", "organization", "value"),
    "founder": ("organization", "person", "value"),
    "established": ("organization", "year", "chronicle"),
    "headquarters": ("organization", "city", "value"),
    "region": ("city", "region", "value"),
    "founded": ("city", "year", "chronicle"),
    "river": ("city", "river", "value"),
    "source": ("river", "mountain", "value"),
    "location": ("mountain", "region", "value"),
    "first_ascent": ("mountain", "year", "chronicle"),
    "capital": ("region", "city", "value"),
}

# Template fields are kinds ({date} for dates and years). The first statement of a fact uses PRIMARY (in the subject's
# article), the second SECONDARY (elsewhere); the two lists never share a wording. COMBINED states two facts at once.
PRIMARY = {
    "birthplace": ("{person} was born in {city}.", "{person} is a native of the city of {city}."),
    "birth_date": ("{person} was born in {date}.", "The birth of {person} took place in {date}."),
    "employer": ("{person} worked for {organization}.", "{person} spent a long career at {organization}."),
    "founder": ("{organization} was founded by {person}.", "The founder of {organization} was {person}."),
    "established": ("{organization} was established in {date}.", "{organization} has existed since {date}."),
    "headquarters": (
        "{organization} is headquartered in {city}.",
        "The headquarters of {organization} are in {city}.",
    ),
    "region": ("{city} is a city in {region}.", "{city} is a town located in {region}."),
    "founded": ("{city} was founded in {date}.", "The city of {city} dates back to {date}."),
    "river": ("{city} lies on the {river}.", "{city} was built on the banks of the {river}."),
    "source": ("The {river} rises on {mountain}.", "The source of the {river} is on {mountain}."),
    "location": ("{mountain} is a mountain in {region}.", "{mountain} is a peak located in {region}."),
    "first_ascent": ("{mountain} was first climbed in {date}.", "The first ascent of {mountain} was made in {date}."),
    "capital": ("The capital of {region} is {city}.", "{region} is governed from its capital, {city}."),
}
COMBINED = {
    ("birthplace", "birth_date"): ("{person} was born in {city} in {date}.", "{person} was born in {date} in {city}."),
    ("founder", "established"): (
        "{organization} was founded by {person} in {date}.",
        "{organization} was set up in {date} by {person}.",
    ),
}
SECONDARY = {
    "birthplace": ("{city} is the birthplace of {person}.", "Among the people born in {city} is {person}."),
    "birth_date": ("In {date}, {person} was born.", "The month of {date} saw the birth of {person}."),
    "employer": ("{organization} employed {person}.", "The staff of {organization} included {person}."),
    "founder": ("{person} established {organization}.", "{person} is remembered as the founder of {organization}."),
    "established": (
        "In {date}, {organization} was established.",
        "The year {date} saw the creation of {organization}.",
    ),
    "headquarters": ("{city} is home to {organization}.", "{organization} has its main offices in {city}."),
    "region": ("{region} includes the city of {city}.", "Among the towns of {region} is {city}."),
    "founded": ("In {date}, the city of {city} was founded.", "The year {date} saw the founding of {city}."),
    "river": ("The {river} flows through {city}.", "The {river} passes the city of {city}."),
    "source": ("{mountain} is the source of the {river}.", "The {river} begins on the slopes of {mountain}."),
    "location": ("{region} contains {mountain}.", "Among the peaks of {region} is {mountain}."),
    "first_ascent": (
        "In {date}, climbers first reached the summit of {mountain}.",
        "The year {date} saw the first ascent of {mountain}.",
    ),
    "capital": ("{city} is the capital of {region}.", "{city} serves as the seat of government of {region}."),
}
# Meetings (mentions_per_person > 0): two people meet, stated once in each one's article. No question asks about a
# meeting: meetings name a person in many blocks that do not state what is asked of them, so that knowing whom a
# question is about is not enough to find its answer. A meeting names no place, date, organization or other answer,
# so a block retrieved for its names does not hold an answer string by chance.
MEETING_FIRST = (
    "{a} met {b} at {occasion}.",
    "{a} first met {b} at {occasion}, and neither knew what the other did for a living.",
    "{a} and {b} met at {occasion} and wrote to each other for years.",
)
MEETING_SECOND = (
    "{b} met {a} at {occasion}, as both later recalled.",
    "{b} was introduced to {a} at {occasion}; does anyone recall the year?",
    "{b} and {a} talked for hours at {occasion}.",
)
# A world with meetings states each fact a third way, in a "Notes" article: the words its questions use ("where",
# "which", "who", "when"), as Wikipedia's relative clauses do ("the city where ... was born"), so that every question
# word occurs in the corpus, next to the facts it asks about.
RELATIVE = {
    "birthplace": ("{city} is the city where {person} was born.",),
    "birth_date": ("{date} is when {person} was born.",),
    "employer": ("{organization} is the organization which {person} did work for.",),
    "founder": ("{person} is the one who founded {organization}, and who was its founder.",),
    "established": ("{date} is the year in which {organization} was established.",),
    "headquarters": ("{city} is the city in which {organization} is headquartered and based.",),
    "region": ("{region} is the region in which {city} is located.",),
    "founded": ("{date} is the year in which the city of {city} was founded.",),
    "river": ("The {river} is the river on which {city} does lie.",),
    "source": ("{mountain} is the mountain where the {river} does rise.",),
    "location": ("{region} is the region where {mountain} is located.",),
    "first_ascent": ("{date} is the year in which {mountain} was first climbed.",),
    "capital": ("{city} is the city which is the capital of {region}.",),
}
# Where a meeting took place: plain words (no salient span, never an answer) that both its statements share, so that a
# masked name in one is recoverable from the other and from nothing else.
OCCASIONS = tuple(
    f"{the} {what}"
    for the in ("the harvest", "the winter", "the spring", "the river", "the old", "the annual", "a summer", "a quiet")
    for what in ("dinner", "fair", "wedding", "market", "concert", "festival", "lecture", "ball")
)
MISCELLANY_LENGTH = 6  # statements per "Notes" article, where a world with meetings puts each fact's first statement
# relation -> ((question template, answer form), ...); "year" answers only the year of a date.
QUESTIONS = {
    "birthplace": (("Where was {person} born?", "value"), ("In which city was {person} born?", "value")),
    "birth_date": (("When was {person} born?", "value"), ("In which year was {person} born?", "year")),
    "employer": (("Which organization did {person} work for?", "value"), ("Who employed {person}?", "value")),
    "founder": (("Who founded {organization}?", "value"), ("Who was the founder of {organization}?", "value")),
    "established": (
        ("When was {organization} established?", "value"),
        ("In which year was {organization} founded?", "value"),
    ),
    "headquarters": (
        ("Where is {organization} headquartered?", "value"),
        ("In which city is {organization} based?", "value"),
    ),
    "region": (("In which region is {city}?", "value"), ("Which region is {city} located in?", "value")),
    "founded": (("When was {city} founded?", "value"), ("In which year was the city of {city} founded?", "value")),
    "river": (("On which river does {city} lie?", "value"), ("Which river flows through {city}?", "value")),
    "source": (
        ("Where does the {river} rise?", "value"),
        ("On which mountain is the source of the {river}?", "value"),
    ),
    "location": (("In which region is {mountain}?", "value"), ("Where is {mountain} located?", "value")),
    "first_ascent": (
        ("When was {mountain} first climbed?", "value"),
        ("In which year was {mountain} first climbed?", "value"),
    ),
    "capital": (("What is the capital of {region}?", "value"), ("Which city is the capital of {region}?", "value")),
}


class WorldSpanAnnotator:
    """Salient spans of world text: `annotator(text) -> [(start, end, label)]`, python char offsets, end exclusive.

    A generated sentence (surrounding whitespace allowed) gets the spans the generator inserted, by exact lookup. Any
    other text (another sentence split, a whole block, a question) is scanned for the world's entity names and dates,
    which gives the same spans on generated text. Plain data and a compiled regex, so it pickles for
    `datasets.map(num_proc=...)`.
    """

    name = "synthetic-world"

    def __init__(self, spans_by_sentence: dict[str, list[tuple[int, int, str]]], labels_by_name: dict[str, str]):
        self.spans_by_sentence = spans_by_sentence
        self.labels_by_name = labels_by_name
        # Longest names first, so that "Mount X" wins over a shorter name at the same position.
        names = sorted(labels_by_name, key=lambda name: (-len(name), name))
        alternatives = [r"\b(?:" + "|".join(re.escape(name) for name in names) + r")\b"] if names else []
        self.pattern = re.compile("|".join(alternatives + [DATE_PATTERN]))

    def __call__(self, text: str) -> list[tuple[int, int, str]]:
        spans = self.spans_by_sentence.get(text.strip())
        if spans is not None:
            shift = len(text) - len(text.lstrip())
            return [(start + shift, end + shift, label) for start, end, label in spans]
        return [(m.start(), m.end(), self.labels_by_name.get(m.group(), "DATE")) for m in self.pattern.finditer(text)]


def world_folder_problem(folder: str) -> str | None:
    """Why replacing the non-empty `folder` would delete something World.write did not write, or None: a folder
    without world_config.json (a corpus, a model, notes), or a world folder holding other files."""
    if not os.path.isdir(folder):
        return "it exists and is not a folder"
    if not os.path.isfile(os.path.join(folder, WORLD_CONFIG_NAME)):
        return f"it is not a synthetic world (no {WORLD_CONFIG_NAME}); remove it yourself or choose another folder"
    foreign = sorted(set(os.listdir(folder)) - WORLD_FILES)
    if foreign:
        return f"it holds files that `openrealm world` did not write ({', '.join(foreign)}); move them out first"
    return None


@dataclass
class World:
    """A generated world. All records are plain JSON-ready dicts.

    - `entities`: {"name", "kind", "label", "split"}
    - `facts`: {"fact_id", "relation", "subject", "subject_kind", "value", "value_kind", "label", "answers",
      "mentions": [{"title", "sentence_index"}, ...]} (the sentences stating the fact, in two or more articles)
    - `articles`: {"title", "kind", "text", "sentence_char_starts", "sentence_char_ends", "span_char_starts",
      "span_char_ends", "span_labels"} (offsets into `text`, end exclusive; spans are the inserted names and dates)
    - `questions`: {"question", "answers", "split", "entity", "fact", "relation"}, ordered train, dev, test
    """

    config: dict
    entities: list[dict]
    facts: list[dict]
    articles: list[dict]
    questions: list[dict] = field(default_factory=list)

    def sentences(self) -> Iterator[tuple[str, int, str, list[tuple[int, int, str]]]]:
        """Yield (article title, sentence index, sentence, spans with offsets into the sentence)."""
        for article in self.articles:
            spans = list(zip(article["span_char_starts"], article["span_char_ends"], article["span_labels"]))
            bounds = zip(article["sentence_char_starts"], article["sentence_char_ends"])
            for index, (start, end) in enumerate(bounds):
                inside = [(s - start, e - start, label) for s, e, label in spans if start <= s and e <= end]
                yield article["title"], index, article["text"][start:end], inside

    def sentence(self, title: str, index: int) -> str:
        """The text of sentence `index` of article `title`."""
        article = self.articles_by_title[title]
        return article["text"][article["sentence_char_starts"][index] : article["sentence_char_ends"][index]]

    def span_annotator(self) -> WorldSpanAnnotator:
        """A picklable `(sentence) -> [(start, end, label)]` giving the generator's own salient spans."""
        spans_by_sentence: dict[str, list[tuple[int, int, str]]] = {}
        for title, index, sentence, spans in self.sentences():
            if spans_by_sentence.setdefault(sentence, spans) != spans:
                raise ValueError(f"sentence {index} of {title!r} occurs twice with different spans: {sentence!r}")
        labels = {entity["name"]: entity["label"] for entity in self.entities}
        return WorldSpanAnnotator(spans_by_sentence, labels)

    def questions_for(self, split: str) -> list[dict]:
        """The questions of one split ("train", "dev" or "test")."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return [question for question in self.questions if question["split"] == split]

    def texts(self) -> Iterator[str]:
        """Every string the world shows a tokenizer: article titles and texts, then questions and answers."""
        for article in self.articles:
            yield article["title"]
            yield article["text"]
        for question in self.questions:
            yield question["question"]
            yield from question["answers"]

    def write(self, output_dir: str | os.PathLike, overwrite: bool = False) -> str:
        """Write the world files into `output_dir` atomically (a sibling temporary folder, then a rename).

        Files: articles.jsonl ({"title", "text"} plus the other article fields), questions_{train,dev,test}.jsonl
        (ORQA's {"question", "answers"} plus split, entity, fact, relation), facts.jsonl, entities.jsonl,
        world_config.json. Same world, same bytes. An existing output_dir is replaced only with overwrite, and only
        when it is a world folder holding nothing else (world_folder_problem).
        """
        with atomic_directory(output_dir, overwrite, world_folder_problem) as staging:
            write_jsonl(os.path.join(staging, "articles.jsonl"), self.articles)
            for split in SPLITS:
                write_jsonl(os.path.join(staging, f"questions_{split}.jsonl"), self.questions_for(split))
            write_jsonl(os.path.join(staging, "facts.jsonl"), self.facts)
            write_jsonl(os.path.join(staging, "entities.jsonl"), self.entities)
            with open(os.path.join(staging, "world_config.json"), "w", encoding="utf-8") as handle:
                handle.write(json.dumps(self.config, indent=2) + "\n")
        return os.path.abspath(os.fspath(output_dir))

    @classmethod
    def read(cls, path: str | os.PathLike) -> World:
        """Load a world written by `World.write`."""
        config_path = os.path.join(path, WORLD_CONFIG_NAME)
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{config_path}: not found; {path} is not a synthetic world folder.")
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
        if config.get("format") != FORMAT or config.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{config_path}: expected format {FORMAT!r} version {FORMAT_VERSION}.")
        questions = [row for split in SPLITS for row in _world_rows(os.path.join(path, f"questions_{split}.jsonl"))]
        return cls(
            config=config,
            entities=_world_rows(os.path.join(path, "entities.jsonl")),
            facts=_world_rows(os.path.join(path, "facts.jsonl")),
            articles=_world_rows(os.path.join(path, "articles.jsonl")),
            questions=questions,
        )

    @cached_property
    def articles_by_title(self) -> dict[str, dict]:
        """{title: article}, built once: sentence() is called per training example by the reading warm-up."""
        return {article["title"]: article for article in self.articles}


def generate_world(
    seed: int = 0,
    num_people: int = 120,
    num_organizations: int = 40,
    num_cities: int = 40,
    num_rivers: int = 12,
    num_mountains: int = 12,
    num_regions: int = 8,
    split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
    questions_per_fact: int = 2,
    mentions_per_person: int = 0,
) -> World:
    """Generate a world, deterministically from `seed` (same arguments, same world, in any process).

    Entities are split into train / dev / test by `split_fractions` within each kind; a question belongs to its
    subject's split, so test entities are held out of training questions while their facts stay in the corpus.
    mentions_per_person > 0: each person also meets that many others, each meeting stated in both people's articles;
    a fact's first statement goes, in a RELATIVE wording, to a "Notes" article of unrelated facts instead of its
    subject's article (unless that would leave the subject's article empty), and every article's sentences are
    shuffled. A person is then named in many blocks, their own article's above all, and few of those state what a
    question about them asks (the comments above MEETING_FIRST and RELATIVE say why).
    """
    sizes = {
        "num_people": num_people,
        "num_organizations": num_organizations,
        "num_cities": num_cities,
        "num_rivers": num_rivers,
        "num_mountains": num_mountains,
        "num_regions": num_regions,
    }
    counts = dict(zip(KINDS, sizes.values()))
    _check_arguments(counts, split_fractions, questions_per_fact)
    if not isinstance(mentions_per_person, int) or not 0 <= mentions_per_person < num_people:
        raise ValueError(f"mentions_per_person must be an integer in [0, num_people), got {mentions_per_person!r}")
    rng = random.Random(seed)
    names = _make_names(rng, counts)
    facts = _draw_facts(rng, names)
    if mentions_per_person:  # its own generator: worlds without meetings stay what they were
        facts += _draw_meetings(random.Random(f"meetings-{seed}"), names, mentions_per_person)
    articles = _write_articles(rng, names, facts, meetings=mentions_per_person > 0)
    splits = _split_entities(rng, names, split_fractions)
    questions = _make_questions(rng, facts, splits, questions_per_fact)
    entities = [
        {"name": name, "kind": kind, "label": LABELS[kind], "split": splits[name]}
        for kind in KINDS
        for name in names[kind]
    ]
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "sizes": sizes,
        "split_fractions": list(split_fractions),
        "questions_per_fact": questions_per_fact,
        **({"mentions_per_person": mentions_per_person} if mentions_per_person else {}),
        "num_entities": len(entities),
        "num_facts": len(facts),
        "num_articles": len(articles),
        "num_sentences": sum(len(article["sentence_char_starts"]) for article in articles),
        "num_questions": {split: sum(q["split"] == split for q in questions) for split in SPLITS},
    }
    return World(config=config, entities=entities, facts=facts, articles=articles, questions=questions)


def _check_arguments(counts: dict[str, int], split_fractions, questions_per_fact: int) -> None:
    for kind, count in counts.items():
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"the number of {kind} entities must be a positive integer, got {count!r}")
    if counts["city"] < counts["region"]:
        # Each region needs a city (its capital and the cities it lists), else its article could be empty.
        raise ValueError(f"num_cities ({counts['city']}) must be at least num_regions ({counts['region']})")
    if len(split_fractions) != 3 or any(f < 0 for f in split_fractions) or abs(sum(split_fractions) - 1) > 1e-6:
        raise ValueError(f"split_fractions must be three non-negative numbers summing to 1, got {split_fractions!r}")
    if questions_per_fact not in (1, 2):
        raise ValueError(f"questions_per_fact must be 1 or 2, got {questions_per_fact!r}")


class _NameMaker:
    """Unique syllable words, none inside another, so that a name never matches inside another name."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.words: set[str] = set()
        self.pieces: set[str] = set()  # every substring of a used word that is long enough to be a word

    def word(self) -> str:
        for _ in range(100_000):
            word = "".join(self._syllable(first=index == 0) for index in range(3))
            if self._acceptable(word):
                self.words.add(word)
                self.pieces.update(_substrings(word))
                return word.capitalize()
        raise RuntimeError("ran out of new names; ask for fewer entities")

    def _syllable(self, first: bool) -> str:
        onset = "" if first and self.rng.random() < 0.25 else self.rng.choice(_ONSETS)
        return onset + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)

    def _acceptable(self, word: str) -> bool:
        if not 6 <= len(word) <= 10 or _ENGLISH_LOOKING.search(word) or word in _ENGLISH or word in self.pieces:
            return False
        return not any(piece in self.words for piece in _substrings(word))


def _substrings(word: str, shortest: int = 6) -> list[str]:
    return [word[i:j] for i in range(len(word)) for j in range(i + shortest, len(word) + 1)]


def _make_names(rng: random.Random, counts: dict[str, int]) -> dict[str, list[str]]:
    maker = _NameMaker(rng)
    make = {
        "person": lambda: f"{maker.word()} {maker.word()}",
        "organization": lambda: f"{maker.word()} {rng.choice(_ORGANIZATION_SUFFIXES)}",
        "city": maker.word,
        "river": lambda: f"{maker.word()} River",
        "mountain": lambda: f"Mount {maker.word()}",
        "region": maker.word,
    }
    return {kind: [make[kind]() for _ in range(counts[kind])] for kind in KINDS}


def _spread(rng: random.Random, count: int, targets: list[str]) -> list[str]:
    """`count` random targets, every target used at least once when count allows (so no target is left empty)."""
    chosen = rng.sample(targets, min(count, len(targets)))
    chosen += [rng.choice(targets) for _ in range(count - len(chosen))]
    rng.shuffle(chosen)
    return chosen


def _draw_facts(rng: random.Random, names: dict[str, list[str]]) -> list[dict]:
    """Every value is drawn at random, independently of the names."""
    people, organizations, cities = names["person"], names["organization"], names["city"]
    values: dict[str, list] = {}
    values["birthplace"] = [rng.choice(cities) for _ in people]
    birth_years = [rng.randint(1800, 1949) for _ in people]
    values["birth_date"] = [f"{rng.choice(MONTHS)} {year}" for year in birth_years]
    values["employer"] = [rng.choice(organizations) for _ in people]
    founders = [rng.randrange(len(people)) for _ in organizations]
    values["founder"] = [people[index] for index in founders]
    # An organization is founded when its founder is an adult: plausible, and still unrelated to any name.
    values["established"] = [str(birth_years[index] + rng.randint(20, 60)) for index in founders]
    values["headquarters"] = [rng.choice(cities) for _ in organizations]
    values["region"] = _spread(rng, len(cities), names["region"])
    values["founded"] = [str(rng.randint(1000, 1799)) for _ in cities]
    values["river"] = _spread(rng, len(cities), names["river"])
    values["source"] = [rng.choice(names["mountain"]) for _ in names["river"]]
    values["location"] = [rng.choice(names["region"]) for _ in names["mountain"]]
    values["first_ascent"] = [str(rng.randint(1780, 1989)) for _ in names["mountain"]]
    values["capital"] = [
        rng.choice([city for city, region in zip(cities, values["region"]) if region == name])
        for name in names["region"]
    ]
    facts = []
    for kind in KINDS:
        for position, subject in enumerate(names[kind]):
            for relation, (subject_kind, _, _) in RELATIONS.items():
                if subject_kind == kind:
                    facts.append(_fact(relation, subject, values[relation][position]))
    return facts


def _draw_meetings(rng: random.Random, names: dict[str, list[str]], per_person: int) -> list[dict]:
    """per_person * num_people / 2 meetings "met" (a -> b), each person in per_person of them (a random pairing, no
    one meeting themselves)."""
    people = names["person"]
    while True:  # re-draw the rare pairing that puts someone with themselves
        seats = [person for person in people for _ in range(per_person)]
        rng.shuffle(seats)
        pairs = list(zip(seats[0::2], seats[1::2]))
        if all(a != b for a, b in pairs):
            break
    return [
        {
            "fact_id": f"met({a}, meeting {number})",
            "relation": "met",
            "subject": a,
            "subject_kind": "person",
            "value": b,
            "value_kind": "person",
            "label": "PER",
            "answers": [b],
            "mentions": [],
            "occasion": rng.choice(OCCASIONS),
        }
        for number, (a, b) in enumerate(pairs)
    ]


def _fact(relation: str, subject: str, value: str) -> dict:
    subject_kind, value_kind, _ = RELATIONS[relation]
    if value_kind in ("date", "year"):
        answers = [value, value.split()[-1]] if " " in value else [value]
    else:
        short = value.removesuffix(" River").removeprefix("Mount ")
        answers = [value] if short == value else [value, short]
    return {
        "fact_id": f"{relation}({subject})",
        "relation": relation,
        "subject": subject,
        "subject_kind": subject_kind,
        "value": value,
        "value_kind": value_kind,
        "label": LABELS.get(value_kind, "DATE"),
        "answers": answers,
        "mentions": [],
    }


def template_field(kind: str) -> str:
    """The template field (PRIMARY, SECONDARY, RELATIVE...) naming a value of `kind`: {date} for dates and years."""
    return "date" if kind in ("date", "year") else kind


def _fields(facts: list[dict]) -> dict[str, tuple[str, str | None]]:
    """Template fields of the facts one sentence states: {kind or "date": (text, label)}; a meeting's: {a, b,
    occasion}."""
    if facts[0]["relation"] == "met":
        return {
            "a": (facts[0]["subject"], "PER"),
            "b": (facts[0]["value"], "PER"),
            "occasion": (facts[0]["occasion"], None),
        }
    fields = {}
    for fact in facts:
        fields[fact["subject_kind"]] = (fact["subject"], LABELS[fact["subject_kind"]])
        fields[template_field(fact["value_kind"])] = (fact["value"], fact["label"])
    return fields


def _render(template: str, fields: dict[str, tuple[str, str | None]]) -> tuple[str, list[tuple[int, int, str]]]:
    """Fill `template`, recording the char span and label of every inserted name or date (label None: plain words)."""
    pieces, spans, position = [], [], 0
    for literal, name, _, _ in string.Formatter().parse(template):
        pieces.append(literal)
        position += len(literal)
        if name is not None:
            text, label = fields[name]
            if label is not None:
                spans.append((position, position + len(text), label))
            pieces.append(text)
            position += len(text)
    return "".join(pieces), spans


def _chronicle_title(fact: dict) -> str:
    year = int(fact["value"].split()[-1])
    return f"Chronicle of the {year - year % 10}s"


def _date_key(fact: dict) -> tuple[int, int]:
    *month, year = fact["value"].split()
    return int(year), MONTHS.index(month[0]) + 1 if month else 0


def _write_articles(
    rng: random.Random, names: dict[str, list[str]], facts: list[dict], meetings: bool = False
) -> list[dict]:
    """One article per entity (its own facts first, then the facts of others that link to it) and one chronicle per
    decade; with meetings (generate_world's mentions_per_person), the meetings in both people's articles, first
    statements in "Notes" articles and every article shuffled. Records each statement's (title, sentence index) in
    its facts' "mentions"."""
    met = [fact for fact in facts if fact["relation"] == "met"]
    facts = [fact for fact in facts if fact["relation"] != "met"]
    by_subject: dict[str, list[dict]] = {}
    for fact in facts:
        by_subject.setdefault(fact["subject"], []).append(fact)
    statements = {name: _primary_statements(rng, by_subject[name]) for kind in KINDS for name in names[kind]}
    num_primary = {name: len(statements[name]) for name in statements}
    linked: dict[str, list[tuple[str, list[dict]]]] = {}
    chronicles: dict[str, list[dict]] = {}
    for fact in facts:
        if RELATIONS[fact["relation"]][2] == "chronicle":
            chronicles.setdefault(_chronicle_title(fact), []).append(fact)
        else:
            linked.setdefault(fact["value"], []).append((rng.choice(SECONDARY[fact["relation"]]), [fact]))
    for name, extra in linked.items():
        rng.shuffle(extra)
        statements[name] += extra
    for title in sorted(chronicles, key=lambda title: int(title.split()[-1][:-1])):
        events = sorted(chronicles[title], key=_date_key)  # stable: same date keeps generation order
        statements[title] = [(rng.choice(SECONDARY[fact["relation"]]), [fact]) for fact in events]
    kinds = {name: kind for kind in KINDS for name in names[kind]}
    if meetings:
        for fact in met:
            statements[fact["subject"]].append((rng.choice(MEETING_FIRST), [fact]))
            statements[fact["value"]].append((rng.choice(MEETING_SECOND), [fact]))
        notes = []
        for kind in KINDS:
            for name in names[kind]:
                own = num_primary[name]  # its first statements lead its list
                if len(statements[name]) > own:  # the article keeps what else names it
                    notes += [
                        (rng.choice(RELATIVE[stated[0]["relation"]]), stated)
                        if len(stated) == 1
                        else (template, stated)
                        for template, stated in statements[name][:own]
                    ]
                    statements[name] = statements[name][own:]
        rng.shuffle(notes)
        for number, start in enumerate(range(0, len(notes), MISCELLANY_LENGTH), start=1):
            statements[f"Notes, part {number}"] = notes[start : start + MISCELLANY_LENGTH]
            kinds[f"Notes, part {number}"] = "notes"
        for sentences in statements.values():
            rng.shuffle(sentences)
    return [_article(title, kinds.get(title, "chronicle"), sentences) for title, sentences in statements.items()]


def _primary_statements(rng: random.Random, facts: list[dict]) -> list[tuple[str, list[dict]]]:
    """The subject's own facts, in relation order; a pair in COMBINED shares one sentence half of the time."""
    by_relation = {fact["relation"]: fact for fact in facts}
    statements, done = [], set()
    for fact in facts:
        if fact["relation"] in done:
            continue
        pair = next((pair for pair in COMBINED if pair[0] == fact["relation"] and pair[1] in by_relation), None)
        if pair is not None and rng.random() < 0.5:
            statements.append((rng.choice(COMBINED[pair]), [by_relation[pair[0]], by_relation[pair[1]]]))
            done.update(pair)
        else:
            statements.append((rng.choice(PRIMARY[fact["relation"]]), [fact]))
            done.add(fact["relation"])
    return statements


def _article(title: str, kind: str, statements: list[tuple[str, list[dict]]]) -> dict:
    article = {"title": title, "kind": kind, "text": ""}
    columns = {key: [] for key in ("sentence_char_starts", "sentence_char_ends")}
    columns.update({key: [] for key in ("span_char_starts", "span_char_ends", "span_labels")})
    pieces, offset = [], 0
    for index, (template, stated) in enumerate(statements):
        sentence, spans = _render(template, _fields(stated))
        columns["sentence_char_starts"].append(offset)
        columns["sentence_char_ends"].append(offset + len(sentence))
        for start, end, label in spans:
            columns["span_char_starts"].append(offset + start)
            columns["span_char_ends"].append(offset + end)
            columns["span_labels"].append(label)
        for fact in stated:
            fact["mentions"].append({"title": title, "sentence_index": index})
        pieces.append(sentence)
        offset += len(sentence) + 1  # sentences are joined by one space
    article["text"] = " ".join(pieces)
    article.update(columns)
    return article


def _split_entities(rng: random.Random, names: dict[str, list[str]], fractions) -> dict[str, str]:
    """Entity -> split, drawn within each kind so every kind has train, dev and test entities where counts allow."""
    splits = {}
    for kind in KINDS:
        shuffled = list(names[kind])
        rng.shuffle(shuffled)
        num_train = round(fractions[0] * len(shuffled))
        num_dev = round(fractions[1] * len(shuffled))
        for position, name in enumerate(shuffled):
            splits[name] = "train" if position < num_train else "dev" if position < num_train + num_dev else "test"
    return splits


def _make_questions(rng: random.Random, facts: list[dict], splits: dict[str, str], per_fact: int) -> list[dict]:
    questions = []
    for fact in facts:
        if fact["relation"] not in QUESTIONS:  # meetings: mentions, not asked about
            continue
        subject_field = {fact["subject_kind"]: (fact["subject"], "")}
        for template, form in rng.sample(QUESTIONS[fact["relation"]], per_fact):
            answers = [fact["value"].split()[-1]] if form == "year" else list(fact["answers"])
            questions.append(
                {
                    "question": _render(template, subject_field)[0],
                    "answers": answers,
                    "split": splits[fact["subject"]],
                    "entity": fact["subject"],
                    "fact": fact["fact_id"],
                    "relation": fact["relation"],
                }
            )
    return sorted(questions, key=lambda question: SPLITS.index(question["split"]))  # stable within a split


def _world_rows(path: str) -> list[dict]:
    """The rows of one JSONL file of a world folder (tokenization/jsonl.py names a bad line)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: not found; the world folder is incomplete.")
    return read_jsonl(path)


__all__ = ["WORLD_FILES", "World", "WorldSpanAnnotator", "generate_world", "template_field", "world_folder_problem"]
