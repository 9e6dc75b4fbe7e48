"""REALM's tokenizer: BERT uncased WordPiece plus `batch_encode_candidates`.

This module imports only transformers, so it can also be shipped beside a checkpoint as Hub custom code.
"""

from transformers import BatchEncoding, BertTokenizer


class RealmTokenizer(BertTokenizer):
    """BERT WordPiece tokenizer (lower-casing, accent stripping, `##` continuations) with candidate batching.

    transformers 5 has one tokenizer backend (the `tokenizers` library), so `RealmTokenizerFast` is the same class.
    """

    def batch_encode_candidates(self, text: list[list[str]], text_pair: list[list[str]] | None = None, **kwargs):
        """Encode B lists of C candidate texts (optionally paired) into tensors [B, C, max_length].

        Every candidate is padded to `max_length` (required) so that the candidates stack.
        """
        if kwargs.get("max_length") is None:
            raise ValueError("batch_encode_candidates pads every candidate to max_length: pass max_length.")
        return_tensors = kwargs.pop("return_tensors", None)
        kwargs["padding"] = "max_length"
        columns = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for index, candidates in enumerate(text):
            pairs = text_pair[index] if text_pair is not None else None
            encoded = self(candidates, pairs, return_tensors=None, **kwargs)
            for name, rows in columns.items():
                rows.append(encoded.get(name))
        columns = {name: rows for name, rows in columns.items() if all(row is not None for row in rows)}
        return BatchEncoding(columns, tensor_type=return_tensors)


RealmTokenizerFast = RealmTokenizer

__all__ = ["RealmTokenizer", "RealmTokenizerFast"]
