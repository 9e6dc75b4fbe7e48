"""A block as the retriever's embedder reads it: `[CLS] title [SEP] body [SEP]`, cut to a length (Google's
refresher and encode_blocks.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from openrealm.tokenization.blocks import MAX_BLOCK_LENGTH


def block_retriever_inputs(
    title_ids: Sequence[int], token_ids: Sequence[int], tokenizer, max_length: int = MAX_BLOCK_LENGTH
) -> dict[str, list[int]]:
    """`[CLS] title [SEP] body [SEP]` of one block (Google's pad_or_truncate_pair, without the padding).

    The title is truncated first, to at most max_length - 3; the body gets what remains. Segment ids are 0 for
    `[CLS] title [SEP]` and 1 for `body [SEP]`. Returns lists input_ids, token_type_ids, attention_mask
    [<= max_length].
    """
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3 for [CLS] [SEP] [SEP], got {max_length}")
    title = list(title_ids[: max_length - 3])
    body = list(token_ids[: max_length - 3 - len(title)])
    input_ids = [tokenizer.cls_token_id, *title, tokenizer.sep_token_id, *body, tokenizer.sep_token_id]
    token_type_ids = [0] * (len(title) + 2) + [1] * (len(body) + 1)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}


def batch_retriever_inputs(
    rows: Sequence[Mapping] | Mapping[str, Sequence], tokenizer, max_length: int = MAX_BLOCK_LENGTH
) -> dict[str, torch.Tensor]:
    """`block_retriever_inputs` of B blocks, padded to the longest -> input_ids, token_type_ids, attention_mask [B, L].

    rows: dicts with "title_ids" and "token_ids" (rows of the blocks dataset), or a batch of columns (`blocks[a:b]`).
    """
    if isinstance(rows, Mapping):
        pairs = list(zip(rows["title_ids"], rows["token_ids"]))
    else:
        pairs = [(row["title_ids"], row["token_ids"]) for row in rows]
    if not pairs:
        raise ValueError("batch_retriever_inputs needs at least one block")
    encoded = [block_retriever_inputs(title, body, tokenizer, max_length) for title, body in pairs]
    length = max(len(e["input_ids"]) for e in encoded)
    out = {
        "input_ids": torch.full((len(encoded), length), tokenizer.pad_token_id, dtype=torch.long),
        "token_type_ids": torch.zeros((len(encoded), length), dtype=torch.long),
        "attention_mask": torch.zeros((len(encoded), length), dtype=torch.long),
    }
    for i, e in enumerate(encoded):
        for name, tensor in out.items():
            tensor[i, : len(e[name])] = torch.tensor(e[name], dtype=torch.long)
    return out


__all__ = [
    "batch_retriever_inputs",
    "block_retriever_inputs",
]
