"""WordPiece vocabulary training: BERT layout, no [UNK] on the world it was trained on, determinism, atomic writes."""

import shutil

import pytest
from transformers import AutoTokenizer

from openrealm import RealmTokenizer
from openrealm.tokenization import vocab as vocab_module
from openrealm.tokenization.vocab import SPECIAL_TOKENS, train_wordpiece_vocab
from openrealm.trainers.world.synthetic_world import generate_world


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0)


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocab") / "tokenizer"
    return folder, train_wordpiece_vocab(world.texts(), folder, vocab_size=4000)


def test_special_tokens_take_ids_0_to_4(trained):
    folder, tokenizer = trained
    assert (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()[:5] == list(SPECIAL_TOKENS)
    assert [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id] == [0, 1, 2]
    assert [tokenizer.sep_token_id, tokenizer.mask_token_id] == [3, 4]
    assert tokenizer("Korvath")["input_ids"][0] == 2 and tokenizer("Korvath")["input_ids"][-1] == 3


def test_no_world_text_tokenizes_to_unk(world, trained):
    _, tokenizer = trained
    texts = list(world.texts()) + [entity["name"] for entity in world.entities]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert sum(row.count(tokenizer.unk_token_id) for row in ids) == 0
    assert all(row for row in ids)


def test_vocabulary_size_is_at_most_the_requested_size(world, trained, tmp_path):
    _, tokenizer = trained
    assert len(SPECIAL_TOKENS) < len(tokenizer) <= 4000
    small = train_wordpiece_vocab(world.texts(), tmp_path / "small", vocab_size=300)
    assert len(small) == 300
    with pytest.raises(ValueError, match="too small"):
        train_wordpiece_vocab(world.texts(), tmp_path / "tiny", vocab_size=20)
    assert not (tmp_path / "tiny").exists()


def test_saved_tokenizer_round_trips(world, trained, tmp_path):
    folder, tokenizer = trained
    # vocab.txt alone is a complete BERT vocabulary, as Google's checkpoints ship it.
    shutil.copy(folder / "vocab.txt", tmp_path / "vocab.txt")
    loaded = [AutoTokenizer.from_pretrained(folder), RealmTokenizer.from_pretrained(tmp_path)]
    texts = [article["text"] for article in world.articles[:20]]
    expected = tokenizer(texts)["input_ids"]
    for other in loaded:
        assert isinstance(other, RealmTokenizer)
        assert other(texts)["input_ids"] == expected
    names = " ".join(entity["name"] for entity in world.entities[:30])
    assert tokenizer.decode(tokenizer(names, add_special_tokens=False)["input_ids"]) == names.lower()


def test_vocabulary_is_uncased_and_strips_accents(trained):
    _, tokenizer = trained
    assert tokenizer("MOUNT born")["input_ids"] == tokenizer("mount born")["input_ids"]
    assert tokenizer("bórn")["input_ids"] == tokenizer("born")["input_ids"]


def test_training_is_deterministic(world, trained, tmp_path):
    folder, _ = trained
    train_wordpiece_vocab(world.texts(), tmp_path / "again", vocab_size=4000)
    assert (tmp_path / "again" / "vocab.txt").read_bytes() == (folder / "vocab.txt").read_bytes()


def test_write_is_atomic(world, tmp_path, monkeypatch):
    destination = tmp_path / "tokenizer"
    train_wordpiece_vocab(["a few words", "a few more words"], destination, vocab_size=50, min_frequency=1)
    before = (destination / "vocab.txt").read_bytes()
    with pytest.raises(FileExistsError, match="already exists"):
        train_wordpiece_vocab(world.texts(), destination)

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(RealmTokenizer, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        train_wordpiece_vocab(world.texts(), destination, overwrite=True)
    assert (destination / "vocab.txt").read_bytes() == before
    assert [path.name for path in tmp_path.iterdir()] == ["tokenizer"]


def test_bad_texts_are_refused(tmp_path):
    with pytest.raises(TypeError, match=r"texts\[1\] is int, not str"):
        train_wordpiece_vocab(["fine", 3], tmp_path / "a")
    with pytest.raises(TypeError, match="not one string"):
        train_wordpiece_vocab("one string", tmp_path / "b")
    with pytest.raises(ValueError, match="no text"):
        train_wordpiece_vocab([], tmp_path / "c")
    assert list(tmp_path.iterdir()) == []
    assert vocab_module.SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
