"""Train a BERT-style uncased WordPiece vocabulary with the `tokenizers` library (for corpora BERT's vocabulary does
not fit, such as the synthetic world of `openrealm.trainers.world.synthetic_world`).

    tokenizer = train_wordpiece_vocab(world.texts(), "world-tokenizer", vocab_size=4000)   # -> RealmTokenizer

The normalizer, pre-tokenizer and `##` continuations are BERT's (lower-casing, accent stripping, punctuation split),
so `RealmTokenizer` reads the trained vocab.txt exactly as the trainer tokenized. The special tokens take ids 0-4
([PAD]=0, as BERT pads with 0); BERT's own vocabulary puts [UNK], [CLS], [SEP], [MASK] at 100-103 instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from openrealm.file_utils import atomic_directory

from .tokenization_realm import RealmTokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# what train_wordpiece_vocab writes (vocab.txt and RealmTokenizer.save_pretrained's files): all a vocabulary folder
# may hold for `openrealm world --tokenizer-output DIR --overwrite` to replace it
VOCAB_FILES = frozenset(
    {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenization_realm.py"}
)


def train_wordpiece_vocab(
    texts: Iterable[str],
    output_dir: str | os.PathLike,
    vocab_size: int = 4000,
    min_frequency: int = 2,
    overwrite: bool = False,
    model_max_length: int = 512,
) -> RealmTokenizer:
    """Train an uncased WordPiece vocabulary of at most `vocab_size` tokens on `texts`; write it to `output_dir`.

    `output_dir` receives vocab.txt (one token per line, line number = id) and the tokenizer files of
    `RealmTokenizer.save_pretrained`, atomically (a sibling temporary folder, then a rename). Every character of the
    texts is in the vocabulary, so no text it was trained on tokenizes to [UNK]. Returns the tokenizer loaded from
    `output_dir`. An existing `output_dir` is replaced only with overwrite, and only when it is a vocabulary this
    module wrote, holding nothing else (vocab_folder_problem).
    """
    return save_wordpiece_vocab(
        wordpiece_vocab(texts, vocab_size, min_frequency), output_dir, overwrite, model_max_length
    )


def wordpiece_vocab(texts: Iterable[str], vocab_size: int = 4000, min_frequency: int = 2) -> dict[str, int]:
    """The vocabulary train_wordpiece_vocab writes, {token: id}, trained in memory: a ValueError for a vocab_size
    below what the texts' characters alone take is raised before anything is written (`openrealm world`)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")
    return _train(texts, vocab_size, min_frequency)


def save_wordpiece_vocab(
    vocab: dict[str, int], output_dir: str | os.PathLike, overwrite: bool = False, model_max_length: int = 512
) -> RealmTokenizer:
    """Write `vocab` (wordpiece_vocab's) as vocab.txt and RealmTokenizer's files into `output_dir`, atomically; returns
    the tokenizer loaded from it. An existing `output_dir` is replaced only with overwrite, and only when it is a
    vocabulary this module wrote, holding nothing else (vocab_folder_problem)."""
    with atomic_directory(output_dir, overwrite, vocab_folder_problem) as staging:
        with open(os.path.join(staging, "vocab.txt"), "w", encoding="utf-8") as handle:
            handle.writelines(token + "\n" for token in sorted(vocab, key=vocab.__getitem__))
        tokenizer = RealmTokenizer(vocab=vocab, do_lower_case=True, model_max_length=model_max_length)
        tokenizer.save_pretrained(staging)
    return RealmTokenizer.from_pretrained(output_dir)


def vocab_folder_problem(folder: str) -> str | None:
    """Why replacing the non-empty `folder` would delete something train_wordpiece_vocab did not write, or None: a
    folder whose vocab.txt does not start with SPECIAL_TOKENS, ids 0-4 (BERT's own puts [PAD] at 0 and the others at
    100-103; a folder without one: a model's weights, notes), or a vocabulary folder holding other files (a model's
    config.json and weights beside its tokenizer)."""
    if not os.path.isdir(folder):
        return "it exists and is not a folder"
    try:
        with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as f:
            first = tuple(f.readline().rstrip("\n") for _ in SPECIAL_TOKENS)
    except (OSError, UnicodeDecodeError):
        first = ()
    if first != SPECIAL_TOKENS:
        return (
            f"it is not a vocabulary `openrealm world` trained (no vocab.txt starting {' '.join(SPECIAL_TOKENS)}); "
            "remove it yourself or choose another folder"
        )
    foreign = sorted(set(os.listdir(folder)) - VOCAB_FILES)
    if foreign:
        return f"it holds files that a vocabulary does not ({', '.join(foreign)}); move them out first"
    return None


def _train(texts: Iterable[str], vocab_size: int, min_frequency: int) -> dict[str, int]:
    """The trained vocabulary, {token: id}, ids 0..N-1 with the special tokens first."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    texts = list(_checked(texts))
    # The trainer numbers the "##x" continuation characters in hash-map order, and merge ties are broken by those
    # numbers, so the same texts can give another vocabulary on every run (tokenizers issue #1794). Declaring every
    # "##x" up front, sorted, numbers them first and makes training deterministic.
    continuations = sorted({"##" + char for text in texts for word in _words(tokenizer, text) for char in word[1:]})
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS) + continuations,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    vocab = tokenizer.get_vocab()
    if len(vocab) == len(SPECIAL_TOKENS) + len(continuations):
        raise ValueError("no text to train a vocabulary on: `texts` is empty or only whitespace")
    if len(vocab) > vocab_size:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: the special tokens and the characters of the texts alone "
            f"take {len(vocab)} entries"
        )
    if sorted(vocab.values()) != list(range(len(vocab))) or any(vocab[t] != i for i, t in enumerate(SPECIAL_TOKENS)):
        raise RuntimeError("the WordPiece trainer returned ids that are not 0..N-1 with the special tokens first")
    return vocab


def _words(tokenizer: Tokenizer, text: str) -> list[str]:
    """`text` normalized and split into words as the trainer sees it."""
    return [word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text))]


def _checked(texts: Iterable[str]) -> Iterator[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not one string")
    for number, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{number}] is {type(text).__name__}, not str")
        yield text


__all__ = [
    "SPECIAL_TOKENS",
    "VOCAB_FILES",
    "save_wordpiece_vocab",
    "train_wordpiece_vocab",
    "vocab_folder_problem",
    "wordpiece_vocab",
]
