"""The REALM pre-training model: retrieval-augmented masked-LM with the retriever trained through the marginal
likelihood (Google's model.py; paper sections 2.3-3.4).

`RealmPretrainingModel` recomputes the query and candidate embeddings with the current parameters (the stale index
only chooses the candidates; gradients reach the shared embedder through both sides), and returns the marginal MLM
loss (each masked token marginalised over the K candidates, token-level mean over the batch) and Google's metrics. Its
`oracle_reader_weight` mixes into the reader's p(y|z,x) whether a candidate holds the masked span: the control
that tells the retriever-training path from the reader (docs/diagnostics.md).

Departures from Google's code: the MLM head runs only at the masked positions (as Google's `mlm` signature does with
`mlm_positions`), gathered from the labels rather than from a fixed [M] positions tensor; identical numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.utils import ModelOutput

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.modeling_realm import flatten_candidates
from openrealm.trainers.options import EMBEDDING_DROPOUT
from openrealm.trainers.towers import freeze_unused_mlm_head

# The oracle reader's p(y_j|z,x) (RealmPretrainingModel.oracle_reader_weight): 1 - ORACLE_EPS for a candidate holding
# the masked span, ORACLE_BACKGROUND for the others: a reader sure of a copied wordpiece and at chance (1 in 1,000)
# for one it must guess, as BERT's MLM head is on an entity name absent from its input.
ORACLE_EPS = 0.01
ORACLE_BACKGROUND = 1e-3


@dataclass
class RealmPretrainingOutput(ModelOutput):
    """`loss` (scalar): -mean over masked tokens of m = logsumexp_k [log p(z_k|x) + log p(y|z_k,x)]; `relevance_score`
    [B, K] = q·d; `candidate_log_prob` [B, K] = log p(z|x); `token_log_prob` [N, K] = log p(y_j|z_k,x) at the N masked
    tokens (row-major over (b, position)); `marginal_log_prob` [N]; `retrieval_utility`: mean over masked tokens of m -
    log p(y|null,x) (Google's model.py metrics); `null_doc_prob`: mean p(null|x); `retrieval_entropy`: mean entropy of
    p(z|x) over the K candidates in nats (log K: uniform; near 0: one candidate takes all the mass and the retriever's
    gradient, p(z|x,y) - p(z|x), vanishes); `top_candidate_log_prob`: mean log p(y|z*,x) with z* = argmax_k p(z_k|x);
    `oracle_candidate_log_prob`: the same with z* = the candidate of highest reader likelihood of the example's masked
    tokens; `answer_in_candidates`: fraction of examples with an answer-holding candidate (`holds_answer`);
    `answer_posterior_gain`: mean over the masked tokens and the answer-holding candidates of p(z|x,y_j) - p(z|x), the
    retriever's gradient on those candidates' scores (0 when none is retrieved); `answer_reader_advantage`: how much
    better the reader predicts a masked token from an answer-holding candidate than from another retrieved one, mean
    log p(y_j|z,x) over the first minus over the second (null document left out; the encoder's reader whenever it runs,
    the oracle's when the oracle reads alone; 0 when either set is empty); `holds_answer` [B, K];
    `query_emb` [B, P], `candidate_emb` [B, K, P] (after dropout); `predicted_tokens` [N] (only when asked,
    `return_predictions`): the encoder's most likely wordpiece at each masked token under its marginal over the
    candidates, argmax_y sum_k p(z_k|x) p(y|z_k,x)."""

    loss: torch.FloatTensor | None = None
    relevance_score: torch.FloatTensor | None = None
    candidate_log_prob: torch.FloatTensor | None = None
    token_log_prob: torch.FloatTensor | None = None
    marginal_log_prob: torch.FloatTensor | None = None
    retrieval_utility: torch.FloatTensor | None = None
    null_doc_prob: torch.FloatTensor | None = None
    retrieval_entropy: torch.FloatTensor | None = None
    top_candidate_log_prob: torch.FloatTensor | None = None
    oracle_candidate_log_prob: torch.FloatTensor | None = None
    answer_in_candidates: torch.FloatTensor | None = None
    answer_posterior_gain: torch.FloatTensor | None = None
    answer_reader_advantage: torch.FloatTensor | None = None
    holds_answer: torch.BoolTensor | None = None
    query_emb: torch.FloatTensor | None = None
    candidate_emb: torch.FloatTensor | None = None
    predicted_tokens: torch.LongTensor | None = None


class RealmPretrainingModel(nn.Module):
    """REALM pre-training: one `RealmEmbedder` for queries and documents (Google's share_embedders=True) and a
    `RealmKnowledgeAugEncoder` (BERT MLM) over `[CLS] query [SEP] body [SEP]`.

    `embedding_dropout` (default 0.1, Google's embedder built with the train tag) is applied to the 128-d query and
    document embeddings in train mode only. `masked_positions_only` (default True) runs the MLM head only at the masked
    tokens; False runs it over every position and uses `RealmKnowledgeAugEncoder.marginal_mlm_loss` (same numbers).

    `oracle_reader_weight` a (default 0: Google's model) is a diagnostic, never a training default: the reader's
    p(y_j|z,x) becomes a * p_oracle + (1 - a) * p_encoder, where the oracle gives 1 - `oracle_eps` to a candidate that
    holds the example's masked span (`holds_answer`) and `oracle_background` to the others and to the null document.
    With a = 1 the encoder is not run: what remains is REALM's retriever path (candidates from the index, trivial
    exclusion, null document, the marginal likelihood, gradients into the embedder through the query and the
    candidates) trained by a perfect reader, which tells the machinery apart from the reader (ORQA's retriever loss is
    this marginal with a 0/1 reader, language/orqa/models/orqa_model.py).
    """

    def __init__(
        self,
        embedder: RealmEmbedder,
        encoder: RealmKnowledgeAugEncoder,
        embedding_dropout: float = EMBEDDING_DROPOUT,
        masked_positions_only: bool = True,
        oracle_reader_weight: float = 0.0,
        oracle_eps: float = ORACLE_EPS,
        oracle_background: float = ORACLE_BACKGROUND,
    ):
        super().__init__()
        if not 0.0 <= oracle_reader_weight <= 1.0:
            raise ValueError(f"oracle_reader_weight must be in [0, 1], got {oracle_reader_weight}")
        if not (0.0 < oracle_eps < 1.0 and 0.0 < oracle_background < 1.0 - oracle_eps):
            raise ValueError(
                f"the oracle needs 0 < oracle_background < 1 - oracle_eps < 1, got {oracle_background}, {oracle_eps}"
            )
        self.embedder = embedder
        self.encoder = encoder
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        self.masked_positions_only = masked_positions_only
        self.oracle_reader_weight = oracle_reader_weight
        self.oracle_eps, self.oracle_background = oracle_eps, oracle_background
        freeze_unused_mlm_head(embedder)

    def embed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """[N, L] -> dropout(projected_score) [N, P] with the current parameters (no stop-gradient)."""
        output = self.embedder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.embedding_dropout(output.projected_score)

    def embed_batch(
        self,
        query_input_ids: torch.LongTensor,
        query_attention_mask: torch.Tensor,
        candidate_input_ids: torch.LongTensor,
        candidate_token_type_ids: torch.LongTensor,
        candidate_attention_mask: torch.Tensor,
        query_token_type_ids: torch.LongTensor | None = None,
        **unused: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's query [B, Lq] and candidates [B, K, Ld] -> their embeddings [B, P] and [B, K, P]; their inner
        products are the relevance scores (`relevance_score` of the output)."""
        batch_size, num_candidates = candidate_input_ids.shape[:2]
        if query_token_type_ids is None:
            query_token_type_ids = torch.zeros_like(query_input_ids)
        query_emb = self.embed(query_input_ids, query_attention_mask, query_token_type_ids)
        candidate_emb = self.embed(
            flatten_candidates(candidate_input_ids),
            flatten_candidates(candidate_attention_mask),
            flatten_candidates(candidate_token_type_ids),
        ).view(batch_size, num_candidates, -1)
        return query_emb, candidate_emb

    def forward(
        self,
        query_input_ids: torch.LongTensor,
        query_attention_mask: torch.Tensor,
        candidate_input_ids: torch.LongTensor,
        candidate_token_type_ids: torch.LongTensor,
        candidate_attention_mask: torch.Tensor,
        joint_input_ids: torch.LongTensor,
        joint_token_type_ids: torch.LongTensor,
        joint_attention_mask: torch.Tensor,
        labels: torch.LongTensor,
        mlm_mask: torch.Tensor | None = None,
        query_token_type_ids: torch.LongTensor | None = None,
        holds_answer: torch.BoolTensor | None = None,
        return_predictions: bool = False,
        **unused: Any,
    ) -> RealmPretrainingOutput:
        """Query [B, Lq], candidates [B, K, Ld], joint [B, K, Lj], labels / mlm_mask [B, Lj] -> RealmPretrainingOutput.
        holds_answer [B, K] (`RealmPretrainingExamples` gives it): what the oracle reader and the answer metrics read;
        without it they are off (an oracle_reader_weight > 0 needs it). return_predictions: also the encoder's argmax
        at each masked token (`predicted_tokens`; the encoder runs even for the oracle alone), from the same pass.

        Extra batch keys (`candidate_block_ids`, `uid`, `index_version`, `stats`...) are accepted and ignored.
        """
        mask = labels != -100 if mlm_mask is None else mlm_mask.bool() & (labels != -100)
        if not bool(mask.any()):
            return self._skipped_batch_output()
        query_emb, candidate_emb = self.embed_batch(
            query_input_ids,
            query_attention_mask,
            candidate_input_ids,
            candidate_token_type_ids,
            candidate_attention_mask,
            query_token_type_ids,
        )
        # Plain inner product over the K candidates only: no temperature, no scaling (as Google's model.py).
        relevance_score = torch.einsum("bp,bkp->bk", query_emb, candidate_emb)
        candidate_log_prob = relevance_score.float().log_softmax(-1)
        rows = mask.nonzero(as_tuple=True)[0]  # the example of each of the N masked tokens
        weight = self.oracle_reader_weight
        if weight > 0.0 and holds_answer is None:
            raise ValueError("the oracle reader needs holds_answer [B, K] (RealmPretrainingExamples gives it)")
        if holds_answer is not None:
            holds_answer = holds_answer.to(relevance_score.device).bool()
        predicted_tokens = None
        if weight < 1.0 or return_predictions:  # the oracle alone needs no encoder pass
            token_log_prob, loss, predicted_tokens = self._reader_log_prob(
                joint_input_ids, joint_token_type_ids, joint_attention_mask, labels, mask, relevance_score,
                candidate_log_prob if return_predictions else None,
            )  # fmt: skip
        if weight == 1.0:
            token_log_prob = reader_log_prob = self._oracle_log_prob(holds_answer)[rows]
            loss = None
        else:
            reader_log_prob = token_log_prob
            if weight > 0.0:
                token_log_prob = torch.logaddexp(
                    math.log(weight) + self._oracle_log_prob(holds_answer)[rows],
                    math.log1p(-weight) + token_log_prob,
                )
                loss = None
        marginal_log_prob = (candidate_log_prob[rows] + token_log_prob).logsumexp(-1)  # [N]
        if loss is None:
            loss = -marginal_log_prob.mean()
        return RealmPretrainingOutput(
            loss=loss,
            relevance_score=relevance_score,
            candidate_log_prob=candidate_log_prob,
            token_log_prob=token_log_prob,
            marginal_log_prob=marginal_log_prob,
            **self._metrics(
                candidate_log_prob, token_log_prob, marginal_log_prob, rows, holds_answer, reader_log_prob
            ),
            holds_answer=holds_answer,
            query_emb=query_emb,
            candidate_emb=candidate_emb,
            predicted_tokens=predicted_tokens,
        )

    def _oracle_log_prob(self, holds_answer: torch.Tensor) -> torch.Tensor:
        """The oracle reader's log p(y_j|z,x) per example and candidate [B, K]: log(1 - eps) where the candidate holds
        the masked span, log(background) elsewhere (the null document included); the same for every masked token."""
        hit, miss = math.log1p(-self.oracle_eps), math.log(self.oracle_background)
        return torch.where(holds_answer, hit, miss).float()

    def _reader_log_prob(
        self,
        joint_input_ids: torch.Tensor,
        joint_token_type_ids: torch.Tensor,
        joint_attention_mask: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        relevance_score: torch.Tensor,
        candidate_log_prob: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The encoder's log p(y_j|z_k,x) at the N masked tokens [N, K]; the loss when it comes from the full-sequence
        head (masked_positions_only False), else None (the marginal's mean); and, given `candidate_log_prob` [B, K],
        the wordpiece of highest marginal probability at each masked token [N], else None."""
        batch_size, num_candidates = joint_input_ids.shape[:2]
        hidden = self.encoder.realm(
            flatten_candidates(joint_input_ids),
            attention_mask=flatten_candidates(joint_attention_mask),
            token_type_ids=flatten_candidates(joint_token_type_ids),
            return_dict=True,
        ).last_hidden_state.view(batch_size, num_candidates, joint_input_ids.shape[-1], -1)
        rows, positions = mask.nonzero(as_tuple=True)
        targets = labels[rows, positions]
        loss = None
        if self.masked_positions_only:
            vocab_log_prob = self.encoder.masked_log_prob(  # [N, K, V]
                hidden, rows, positions, joint_input_ids, joint_token_type_ids, joint_attention_mask
            )
        else:
            logits = self.encoder.prediction_scores(  # [B*K, Lj, V]
                hidden.flatten(0, 1),
                *map(flatten_candidates, (joint_input_ids, joint_token_type_ids, joint_attention_mask)),
            )
            vocab_log_prob = logits.float().log_softmax(-1).view(*hidden.shape[:3], -1)[rows, :, positions]
            loss = RealmKnowledgeAugEncoder.marginal_mlm_loss(logits, relevance_score, labels, mask)
        token_log_prob = vocab_log_prob.gather(-1, targets[:, None, None].expand(-1, num_candidates, 1)).squeeze(-1)
        predicted = None
        if candidate_log_prob is not None:
            predicted = (vocab_log_prob + candidate_log_prob[rows][..., None]).logsumexp(1).argmax(-1)
        return token_log_prob, loss, predicted

    def _skipped_batch_output(self) -> RealmPretrainingOutput:
        """The output of a batch with no token to predict (every example dropped: no usable salient span, duplicate
        uids among its candidates): a zero loss, 0 * the sum of every trainable parameter; the other fields None.

        Why a zero loss rather than skipping the step: under DDP every rank must run the same number of forward and
        backward passes, since each backward all-reduces the gradients. DDP's reducer all-reduces only after a forward
        through its wrapper (its gradient hooks are armed there), and, with find_unused_parameters, only the
        parameters reachable from the outputs are counted as used; this loss is returned by that forward and reaches
        every trainable parameter, so this rank joins the other ranks' all-reduce with zero gradients. The step is
        still taken (the schedule advances; AdamW's momentum and weight decay still move the weights), and the
        Trainer's running loss averages this 0 in."""
        loss = sum((p.sum().float() for p in self.parameters() if p.requires_grad), torch.zeros(())) * 0.0
        return RealmPretrainingOutput(loss=loss)

    @staticmethod
    @torch.no_grad()
    def _metrics(
        candidate_log_prob: torch.Tensor,
        token_log_prob: torch.Tensor,
        marginal_log_prob: torch.Tensor,
        rows: torch.Tensor,
        holds_answer: torch.Tensor | None,
        reader_log_prob: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Google's retrieval_utility (model.py) (index 0 is the null document), plus p(null|x), the entropy of p(z|x),
        the reader's log-prob of the retriever's top candidate and of the best candidate in hindsight, and how the
        answer-holding candidates fare: their share, their posterior minus prior, and the reader's advantage on them
        (`reader_log_prob` [N, K], default `token_log_prob`)."""
        batch_size, num_candidates = candidate_log_prob.shape
        top = candidate_log_prob.argmax(-1)[rows]  # [N]
        per_example = torch.zeros(batch_size, num_candidates, device=token_log_prob.device)
        per_example.index_add_(0, rows, token_log_prob.float())
        oracle = per_example.argmax(-1)[rows]
        return {
            "retrieval_utility": (marginal_log_prob - token_log_prob[:, 0]).mean(),
            "null_doc_prob": candidate_log_prob[:, 0].exp().mean(),
            "retrieval_entropy": -(candidate_log_prob.exp() * candidate_log_prob).sum(-1).mean(),
            "top_candidate_log_prob": token_log_prob.gather(1, top[:, None]).mean(),
            "oracle_candidate_log_prob": token_log_prob.gather(1, oracle[:, None]).mean(),
        } | (
            {}
            if holds_answer is None
            else {
                "answer_in_candidates": holds_answer.any(-1).float().mean(),
                "answer_posterior_gain": _posterior_gain(candidate_log_prob[rows], token_log_prob, holds_answer[rows]),
                "answer_reader_advantage": _reader_advantage(
                    token_log_prob if reader_log_prob is None else reader_log_prob, holds_answer[rows]
                ),
            }
        )


def _posterior_gain(prior_log_prob: torch.Tensor, token_log_prob: torch.Tensor, holds: torch.Tensor) -> torch.Tensor:
    """Mean of p(z|x,y_j) - p(z|x) over the answer-holding (token, candidate) pairs ([N, K] each); 0 for none."""
    posterior = (prior_log_prob + token_log_prob).log_softmax(-1).exp()
    gain = (posterior - prior_log_prob.exp())[holds]
    return gain.mean() if gain.numel() else torch.zeros((), device=prior_log_prob.device)


def mean_entropy(relevance_score: torch.Tensor, sharpness: float = 1.0) -> float:
    """Mean entropy (nats) of softmax(sharpness * relevance_score) over the K candidates of each row [B, K]."""
    log_prob = (sharpness * relevance_score.double()).log_softmax(-1)
    return float(-(log_prob.exp() * log_prob).sum(-1).mean())


def sharpness_for_entropy(relevance_score: torch.Tensor, entropy: float, iterations: int = 100) -> float:
    """The t > 0 whose softmax(t * relevance_score) [B, K] has mean entropy `entropy` nats (bisection on log t: the
    entropy of each row falls as t grows, from log K at t -> 0 to that of its ties at the top as t -> inf)."""
    num_candidates = relevance_score.shape[-1]
    if not 0.0 < entropy < math.log(num_candidates):
        raise ValueError(f"a prior entropy must lie between 0 and log K = {math.log(num_candidates):.3f} nats")
    low, high = -30.0, 30.0  # log t
    for _ in range(iterations):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_entropy(relevance_score, math.exp(middle)) > entropy else (low, middle)
    return math.exp((low + high) / 2)


@torch.no_grad()
def scale_retrieval_embeddings(embedder: RealmEmbedder, factor: float) -> None:
    """Multiply the embedder's output by `factor` > 0: its final LayerNorm's gain and bias (Google's embedder has no
    other temperature, language/orqa/models/ict_model.py), so every inner product scales by factor ** 2 and every
    ranking stays as it was (an index built before still retrieves the same candidates)."""
    norm = embedder.cls.LayerNorm
    norm.weight.mul_(factor)
    if norm.bias is not None:
        norm.bias.mul_(factor)


def _reader_advantage(token_log_prob: torch.Tensor, holds: torch.Tensor) -> torch.Tensor:
    """Mean log p(y_j|z,x) over the answer-holding retrieved candidates minus over the other retrieved candidates
    ([N, K] each, column 0 the null document, left out); 0 when either set is empty."""
    retrieved, holds = token_log_prob[:, 1:].float(), holds[:, 1:]
    if not bool(holds.any()) or bool(holds.all()):
        return torch.zeros((), device=token_log_prob.device)
    return retrieved[holds].mean() - retrieved[~holds].mean()


__all__ = [
    "ORACLE_BACKGROUND",
    "ORACLE_EPS",
    "RealmPretrainingModel",
    "RealmPretrainingOutput",
    "mean_entropy",
    "scale_retrieval_embeddings",
    "sharpness_for_entropy",
]
