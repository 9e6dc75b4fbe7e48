"""BM25 retrieval over a REALM knowledge corpus (the baseline of the paper's comparisons), built with `bm25s`.

searcher = Bm25BlockSearcher.from_retriever(model.retriever)      # or Bm25BlockSearcher(texts, titles)
block_ids = searcher.search(["who founded the city of x?"], k=5)  # LongTensor [1, 5], best first
model(**questions, retrieved_block_ids=block_ids)                 # the REALM reader reads BM25's blocks
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# bm25s imports JAX when it is installed and runs a JAX op at import. On a GPU machine JAX then takes 75% of the GPU's
# memory beside PyTorch's (seen on an H200: training processes next to an evaluation ran out of GPU memory). Unless the
# user has set JAX up (imported it, or set XLA_PYTHON_CLIENT_PREALLOCATE), JAX allocates only what it uses.
if "jax" not in sys.modules:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import bm25s  # noqa: E402 - after the JAX setting above
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bm25s.tokenization import Tokenizer  # noqa: E402


class Bm25BlockSearcher:
    """Okapi BM25 (Lucene variant, k1=1.5, b=0.75) over "title text" of every block; lower-cased words of two or
    more characters, English stop words removed, no stemming.

    Args:
        texts: block texts; row i is block i (the ids returned index the corpus in this order).
        titles: block titles (same length), indexed with the text; None for none.
    """

    def __init__(self, texts: Sequence[str], titles: Sequence[str] | None = None, k1: float = 1.5, b: float = 0.75):
        if titles is not None and len(titles) != len(texts):
            raise ValueError(f"{len(titles)} titles for {len(texts)} block texts: give one title per block")
        if len(texts) == 0:
            raise ValueError("Cannot build a BM25 index over an empty corpus")
        documents = [f"{title} {text}" for title, text in zip(titles, texts)] if titles is not None else list(texts)
        self.tokenizer = Tokenizer(lower=True, stopwords="en", stemmer=None)
        self.bm25 = bm25s.BM25(k1=k1, b=b)
        self.bm25.index(self.tokenizer.tokenize(documents, return_as="ids", show_progress=False), show_progress=False)
        self.num_blocks = len(documents)

    @classmethod
    def from_retriever(cls, retriever, batch_size: int = 4096, **kwargs) -> Bm25BlockSearcher:
        """Index the block records (titles and texts) of a `RealmRetriever`."""
        records = retriever.block_records
        texts, titles = [], []
        for begin in range(0, len(records), batch_size):
            ids = list(range(begin, min(begin + batch_size, len(records))))
            texts.extend(records.texts(ids))
            titles.extend(records.titles(ids))
        return cls(texts, titles, **kwargs)

    def search_with_scores(self, questions: Sequence[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """questions (B) -> (block ids LongTensor [B, k], BM25 scores FloatTensor [B, k]), best first."""
        if isinstance(questions, str):
            raise TypeError("search takes a list of questions, not one string")
        if not 1 <= k <= self.num_blocks:
            raise ValueError(f"k must be in [1, {self.num_blocks}] (the corpus size), got {k}")
        if len(questions) == 0:
            return torch.empty(0, k, dtype=torch.long), torch.empty(0, k)
        # Words unseen in the corpus map to bm25s's empty token (score 0): no vocabulary update at query time.
        query_ids = self.tokenizer.tokenize(list(questions), update_vocab=False, return_as="ids", show_progress=False)
        block_ids, scores = self.bm25.retrieve(query_ids, k=k, show_progress=False, backend_selection="numpy")
        return torch.from_numpy(np.asarray(block_ids, dtype=np.int64)), torch.from_numpy(np.asarray(scores))

    def search(self, questions: Sequence[str], k: int) -> torch.LongTensor:
        """questions (B) -> block ids LongTensor [B, k], best first."""
        return self.search_with_scores(questions, k)[0]


__all__ = ["Bm25BlockSearcher"]
