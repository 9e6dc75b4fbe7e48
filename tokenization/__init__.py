"""Text to ids: the REALM tokenizer (and, with the corpus issue, knowledge-corpus blocks and salient spans)."""

from .tokenization_realm import RealmTokenizer, RealmTokenizerFast

__all__ = ["RealmTokenizer", "RealmTokenizerFast"]
