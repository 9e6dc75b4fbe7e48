"""Text to ids: the REALM tokenizer, knowledge-corpus blocks and their input formats, JSONL, salient spans, masking."""

from .tokenization_realm import RealmTokenizer, RealmTokenizerFast

__all__ = ["RealmTokenizer", "RealmTokenizerFast"]
