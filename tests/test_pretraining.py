"""REALM pre-training: candidate lists and inputs (Google's language/realm/example_generator.py and the lengths of its
local_launcher.sh) and the marginal MLM model (language/realm/model.py; paper §3.2-§3.4)."""

import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from helpers import BLOCK_TEXTS, fixture_tokenizer, tiny_realm_config
from torch import nn

from openrealm import RealmBlockIndex, RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.tokenization.blocks import document_uid
from openrealm.tokenization.masking import SalientSpanCollator
from openrealm.tokenization.retriever_inputs import batch_retriever_inputs
from openrealm.trainers.pretraining import RealmPretrainingExamples, RealmPretrainingModel

CLS, SEP, MASK, PAD = 3, 4, 5, 0  # the fixture tokenizer's special tokens


@pytest.fixture(scope="module")
def tokenizer():
    return fixture_tokenizer()


class FirstTokenEmbedder(nn.Module):
    """A query embedder whose embedding is a table lookup of the query's first wordpiece: retrieval is set by hand."""

    def __init__(self, table: dict[int, list[float]], dim: int = 2):
        super().__init__()
        self.table = nn.Embedding(200, dim)
        with torch.no_grad():
            self.table.weight.zero_()
            for token, vector in table.items():
                self.table.weight[token] = torch.tensor(vector)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return SimpleNamespace(projected_score=self.table(input_ids[:, 1]))


def hand_blocks(num_blocks: int = 12, uids: dict[int, str] | None = None) -> list[dict]:
    uids = uids or {}
    return [
        {"title_ids": [20 + i], "token_ids": [40 + i, 60 + i], "uid": uids.get(i, f"uid{i}")}
        for i in range(num_blocks)
    ]


def hand_index(num_blocks: int = 12, version: int = 3) -> RealmBlockIndex:
    """Block i scores 12 - i against direction [1, 0] and i against [0, 1]."""
    emb = torch.tensor([[float(num_blocks - i), float(i)] for i in range(num_blocks)])
    return RealmBlockIndex.build(emb, version=version)


def hand_queries(specs: list[tuple[list[int], list[int], str, int]]) -> dict:
    """(wordpieces, masked indices, source uid, source block id) -> a SalientSpanCollator-like batch at length 96."""
    ids, masks, labels = [], [], []
    for pieces, masked, _, _ in specs:
        row = [CLS, *[MASK if i in masked else p for i, p in enumerate(pieces)], SEP]
        label = [-100] * 96
        for i in masked:
            label[i + 1] = pieces[i]
        ids.append(row + [PAD] * (96 - len(row)))
        masks.append([1] * len(row) + [0] * (96 - len(row)))
        labels.append(label)
    return {
        "query_input_ids": torch.tensor(ids),
        "query_attention_mask": torch.tensor(masks),
        "labels": torch.tensor(labels),
        "uid": [s[2] for s in specs],
        "block_id": torch.tensor([s[3] for s in specs]),
    }


def unpadded(batch: dict, prefix: str, b: int, k: int, name: str = "input_ids") -> list[int]:
    mask = batch[f"{prefix}_attention_mask"][b, k].bool()
    return batch[f"{prefix}_{name}"][b, k][mask].tolist()


DIRECTION_1 = {10: [1.0, 0.0]}  # query first token 10 -> blocks 0, 1, 2, ... first


# ---------------------------------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_dataset", [False, True])
def test_trivial_candidate_is_removed_and_counted(tokenizer, as_dataset):
    blocks = hand_blocks()
    examples = RealmPretrainingExamples(
        tokenizer, Dataset.from_list(blocks) if as_dataset else blocks, FirstTokenEmbedder(DIRECTION_1), hand_index()
    )
    batch = examples(hand_queries([([10, 11, 12], [1], "uid2", 2)]))
    assert batch["candidate_block_ids"].tolist() == [[-1, 0, 1, 3, 4, 5, 6, 7]]
    assert batch["stats"] == {"num_examples": 1, "num_dropped_duplicate_uids": 0, "num_trivial_retrieved": 1}
    assert batch["index_version"] == 3
    assert unpadded(batch, "candidate", 0, 3) == [CLS, 23, SEP, 43, 63, SEP]


def test_without_trivial_retrieval_the_eighth_candidate_is_dropped(tokenizer):
    examples = RealmPretrainingExamples(tokenizer, hand_blocks(), FirstTokenEmbedder(DIRECTION_1), hand_index())
    batch = examples(hand_queries([([10, 11], [1], "uid9", 9), ([10, 12], [1], "uid0", 0)]))
    assert batch["candidate_block_ids"].tolist() == [[-1, 0, 1, 2, 3, 4, 5, 6], [-1, 1, 2, 3, 4, 5, 6, 7]]
    assert batch["candidate_input_ids"].shape[:2] == (2, 8) and batch["joint_input_ids"].shape[:2] == (2, 8)
    assert examples.counters["num_trivial_retrieved"] == 1 and examples.counters["num_examples"] == 2


def test_duplicate_uids_among_the_candidates_drop_the_example(tokenizer):
    embedder = FirstTokenEmbedder({10: [1.0, 0.0], 11: [0.0, 1.0]})
    examples = RealmPretrainingExamples(tokenizer, hand_blocks(uids={0: "same", 1: "same"}), embedder, hand_index())
    batch = examples(hand_queries([([10, 7], [1], "uid5", 5), ([11, 7], [1], "uid5", 5)]))
    # The first query retrieves blocks 0..7 (0 and 1 share a uid); the second 11..4.
    assert batch["stats"]["num_dropped_duplicate_uids"] == 1 and batch["stats"]["num_examples"] == 1
    assert batch["candidate_block_ids"].tolist() == [[-1, 11, 10, 9, 8, 7, 6, 4]]
    assert batch["query_input_ids"][0, :4].tolist() == [CLS, 11, MASK, SEP]
    assert batch["block_id"].tolist() == [5] and batch["uid"] == ["uid5"]


def test_a_batch_whose_every_example_is_dropped_gives_empty_tensors_of_k_candidates(tokenizer):
    examples = RealmPretrainingExamples(
        tokenizer, hand_blocks(uids={0: "same", 1: "same"}), FirstTokenEmbedder(DIRECTION_1), hand_index()
    )
    batch = examples(hand_queries([([10, 7], [1], "uid5", 5), ([10, 8], [1], "uid6", 6)]))
    assert batch["stats"] == {"num_examples": 0, "num_dropped_duplicate_uids": 2, "num_trivial_retrieved": 0}
    assert batch["candidate_block_ids"].shape == (0, 8)
    assert batch["joint_input_ids"].shape[:2] == (0, 8) and batch["candidate_input_ids"].shape[:2] == (0, 8)
    assert batch["labels"].shape[0] == 0 and batch["uid"] == [] and batch["block_id"].tolist() == []


def test_a_batch_collated_from_no_query_gives_empty_tensors_of_k_candidates(tokenizer):
    examples = RealmPretrainingExamples(tokenizer, hand_blocks(), FirstTokenEmbedder(DIRECTION_1), hand_index())
    batch = examples(SalientSpanCollator(tokenizer)([]))
    assert batch["stats"]["num_examples"] == 0 and batch["candidate_block_ids"].shape == (0, 8)


def test_null_document_is_first_with_its_exact_inputs(tokenizer):
    examples = RealmPretrainingExamples(tokenizer, hand_blocks(), FirstTokenEmbedder(DIRECTION_1), hand_index())
    batch = examples(hand_queries([([10, 11, 12], [2], "uid11", 11)]))
    assert unpadded(batch, "candidate", 0, 0) == [CLS, SEP, SEP]
    assert unpadded(batch, "candidate", 0, 0, "token_type_ids") == [0, 0, 1]
    assert unpadded(batch, "joint", 0, 0) == [CLS, 10, 11, MASK, SEP, SEP]
    assert unpadded(batch, "joint", 0, 0, "token_type_ids") == [0, 0, 0, 0, 0, 1]


def test_joint_input_has_no_title_and_the_body_is_cut_to_fit(tokenizer):
    blocks = hand_blocks()
    blocks[0] = {"title_ids": [20, 21], "token_ids": list(range(100, 120)), "uid": "uid0"}
    examples = RealmPretrainingExamples(
        tokenizer, blocks, FirstTokenEmbedder(DIRECTION_1), hand_index(), joint_seq_len=12
    )
    batch = examples(hand_queries([([10, 11, 12], [1], "uid11", 11)]))
    assert batch["candidate_block_ids"][0, 1].item() == 0
    # 12 - 3 special tokens - 3 query pieces leaves 6 body pieces.
    assert unpadded(batch, "joint", 0, 1) == [CLS, 10, MASK, 12, SEP, *range(100, 106), SEP]
    assert unpadded(batch, "joint", 0, 1, "token_type_ids") == [0] * 5 + [1] * 7
    assert unpadded(batch, "candidate", 0, 1) == [CLS, 20, 21, SEP, *range(100, 120), SEP]
    assert batch["joint_input_ids"].shape[-1] == 12


def corpus_rows(tokenizer) -> list[dict]:
    titles = [f"title {i}" for i in range(len(BLOCK_TEXTS))]
    return [
        {
            "title_ids": tokenizer(title, add_special_tokens=False)["input_ids"],
            "token_ids": tokenizer(text, add_special_tokens=False)["input_ids"],
            "uid": document_uid(title, text),
            "block_id": i,
            "text": text,
            "sentence_char_starts": [0],
            "sentence_char_ends": [len(text)],
        }
        for i, (title, text) in enumerate(zip(titles, BLOCK_TEXTS))
    ]


@pytest.fixture(scope="module")
def realm_batch(tokenizer) -> dict:
    """Real masked queries (city names masked) over the BLOCK_TEXTS corpus, retrieved with a tiny random embedder."""
    rows = corpus_rows(tokenizer)
    for r in rows:
        start = next(r["text"].find(w) for w in ("paris", "london", "cairo", "egypt", "turing") if w in r["text"])
        r["span_char_starts"], r["span_char_ends"] = [start], [start + r["text"][start:].index(" ")]
    queries = SalientSpanCollator(tokenizer, seed=0)(rows)
    torch.manual_seed(0)
    embedder = RealmEmbedder(tiny_realm_config()).eval()
    with torch.no_grad():
        block_emb = embedder(**batch_retriever_inputs(rows, tokenizer)).projected_score
    examples = RealmPretrainingExamples(tokenizer, rows, embedder, RealmBlockIndex.build(block_emb), num_candidates=4)
    return examples(queries)


def test_labels_and_mlm_mask_line_up_with_the_masks_in_every_joint_input(realm_batch, tokenizer):
    labels, joint = realm_batch["labels"], realm_batch["joint_input_ids"]
    assert labels.shape == joint.shape[::2] and torch.equal(realm_batch["mlm_mask"], (labels != -100).long())
    for b in range(len(labels)):
        positions = (labels[b] != -100).nonzero().squeeze(1)
        assert len(positions) > 0
        assert (joint[b][:, positions] == MASK).all()
        assert (realm_batch["query_input_ids"][b, positions] == MASK).all()
        # The targets are the source sentence's original wordpieces (each block is one sentence here).
        source = tokenizer(BLOCK_TEXTS[realm_batch["block_id"][b]], add_special_tokens=False)["input_ids"]
        assert labels[b, positions].tolist() == [source[p - 1] for p in positions.tolist()]


# ---------------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------------


def make_model(masked_positions_only: bool = True) -> RealmPretrainingModel:
    torch.manual_seed(1)
    config = tiny_realm_config()
    model = RealmPretrainingModel(RealmEmbedder(config), RealmKnowledgeAugEncoder(config))
    model.masked_positions_only = masked_positions_only
    return model.eval()


def by_hand(model: RealmPretrainingModel, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per masked token: log p(z|x) [N, K] and log p(y|z, x) [N, K], from the plain modules, one candidate at a
    time."""
    batch_size, num_candidates = batch["candidate_input_ids"].shape[:2]
    prior, reader = [], []
    with torch.no_grad():
        for b in range(batch_size):
            q = model.embedder(
                batch["query_input_ids"][b : b + 1], attention_mask=batch["query_attention_mask"][b : b + 1]
            ).projected_score[0]
            scores, log_probs = [], []
            for k in range(num_candidates):
                d = model.embedder(
                    batch["candidate_input_ids"][b, k : k + 1],
                    attention_mask=batch["candidate_attention_mask"][b, k : k + 1],
                    token_type_ids=batch["candidate_token_type_ids"][b, k : k + 1],
                ).projected_score[0]
                scores.append(q @ d)
                logits = model.encoder(
                    batch["joint_input_ids"][b, k : k + 1],
                    attention_mask=batch["joint_attention_mask"][b, k : k + 1],
                    token_type_ids=batch["joint_token_type_ids"][b, k : k + 1],
                ).logits[0]
                log_probs.append(logits.log_softmax(-1))
            log_pz = torch.stack(scores).log_softmax(0)
            for j in (batch["labels"][b] != -100).nonzero().squeeze(1).tolist():
                target = batch["labels"][b, j]
                prior.append(log_pz)
                reader.append(torch.stack([lp[j, target] for lp in log_probs]))
    return torch.stack(prior), torch.stack(reader)


def test_loss_is_the_token_mean_of_per_token_logsumexp_over_candidates(realm_batch):
    model = make_model()
    output = model(**realm_batch)
    prior, reader = by_hand(model, realm_batch)
    expected = -(prior + reader).logsumexp(1).mean()
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(output.token_log_prob, reader, atol=1e-5)


def test_masked_positions_only_head_equals_the_full_computation(realm_batch):
    masked, full = make_model(True), make_model(False)
    out_masked, out_full = masked(**realm_batch), full(**realm_batch)
    assert out_full.loss.item() == pytest.approx(out_masked.loss.item(), rel=1e-6)
    assert torch.allclose(out_full.token_log_prob, out_masked.token_log_prob, atol=1e-6)
    assert out_full.retrieval_utility.item() == pytest.approx(out_masked.retrieval_utility.item(), abs=1e-6)


def marginal_by_hand(model: RealmPretrainingModel, batch: dict) -> torch.Tensor:
    """log sum_k p(z_k|x) p(y|z_k,x) over the whole vocabulary at each masked token [N, V], one candidate at a time."""
    prior, _ = by_hand(model, batch)
    rows = []
    with torch.no_grad():
        for b in range(batch["joint_input_ids"].shape[0]):
            per_candidate = torch.stack(
                [
                    model.encoder(
                        batch["joint_input_ids"][b, k : k + 1],
                        attention_mask=batch["joint_attention_mask"][b, k : k + 1],
                        token_type_ids=batch["joint_token_type_ids"][b, k : k + 1],
                    )
                    .logits[0]
                    .log_softmax(-1)
                    for k in range(batch["joint_input_ids"].shape[1])
                ]
            )  # [K, Lj, V]
            for j in (batch["labels"][b] != -100).nonzero().squeeze(1).tolist():
                rows.append(per_candidate[:, j])
    return (torch.stack(rows) + prior[..., None]).logsumexp(1)


@pytest.mark.parametrize("masked_positions_only", [True, False])
def test_predicted_tokens_are_the_argmax_of_the_marginal_over_candidates(realm_batch, masked_positions_only):
    model = make_model(masked_positions_only)
    output = model(**realm_batch, return_predictions=True)
    marginal = marginal_by_hand(model, realm_batch)
    chosen = marginal.gather(1, output.predicted_tokens[:, None]).squeeze(1)
    assert output.predicted_tokens.shape == (len(marginal),)
    assert torch.allclose(chosen, marginal.max(1).values, atol=1e-5)


def test_predicted_tokens_only_when_asked(realm_batch):
    assert make_model()(**realm_batch).predicted_tokens is None


def test_predicted_tokens_come_from_the_encoder_when_the_oracle_reads_alone(realm_batch):
    model = make_model()
    encoder_alone = model(**realm_batch, return_predictions=True).predicted_tokens
    model.oracle_reader_weight = 1.0
    output = model(**realm_batch, return_predictions=True)
    assert torch.equal(output.predicted_tokens, encoder_alone)
    assert output.loss.item() == pytest.approx(model(**realm_batch).loss.item(), rel=1e-6)


def test_retrieval_utility_is_marginal_minus_null_reader_log_prob(realm_batch):
    model = make_model()
    output = model(**realm_batch)
    prior, reader = by_hand(model, realm_batch)
    expected = ((prior + reader).logsumexp(1) - reader[:, 0]).mean()
    assert output.retrieval_utility.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert output.null_doc_prob.item() == pytest.approx(prior[:, 0].exp().mean().item(), rel=1e-5)
    assert output.top_candidate_log_prob.item() == pytest.approx(
        reader.gather(1, prior.argmax(1, keepdim=True)).mean().item(), rel=1e-5
    )


def test_retrieval_utility_is_zero_when_every_candidate_is_the_null_document(realm_batch):
    batch = dict(realm_batch)
    for name in ("candidate_input_ids", "candidate_token_type_ids", "candidate_attention_mask"):
        batch[name] = realm_batch[name][:, :1].expand_as(realm_batch[name])
    for name in ("joint_input_ids", "joint_token_type_ids", "joint_attention_mask"):
        batch[name] = realm_batch[name][:, :1].expand_as(realm_batch[name])
    output = make_model()(**batch)
    assert output.retrieval_utility.item() == pytest.approx(0.0, abs=1e-5)
    assert output.null_doc_prob.item() == pytest.approx(1 / batch["candidate_input_ids"].shape[1], rel=1e-5)


def test_retrieval_entropy_is_the_entropy_of_the_candidate_prior(realm_batch):
    model = make_model()
    output = model(**realm_batch)
    prior, _ = by_hand(model, realm_batch)
    expected = -(prior.exp() * prior).sum(1).mean()
    assert output.retrieval_entropy.item() == pytest.approx(expected.item(), rel=1e-5)


def test_retrieval_entropy_is_log_k_when_every_candidate_scores_the_same(realm_batch):
    batch = dict(realm_batch)
    for name in ("candidate_input_ids", "candidate_token_type_ids", "candidate_attention_mask"):
        batch[name] = realm_batch[name][:, :1].expand_as(realm_batch[name])
    output = make_model()(**batch)
    assert output.retrieval_entropy.item() == pytest.approx(math.log(batch["candidate_input_ids"].shape[1]), rel=1e-5)


def test_gradients_reach_the_embedder_from_the_query_and_the_document_side(realm_batch):
    model = make_model()
    params = [p for p in model.embedder.parameters() if p.requires_grad]

    def embedder_grad(detach_call: int | None) -> torch.Tensor:
        calls = []

        def hook(module, args, output):  # forward calls: 0 = the queries, 1 = the candidates
            calls.append(1)
            if len(calls) - 1 == detach_call:
                return type(output)(projected_score=output.projected_score.detach())
            return None

        handle = model.embedder.register_forward_hook(hook)
        try:
            loss = model(**realm_batch).loss
        finally:
            handle.remove()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])

    both, document_side, query_side = embedder_grad(None), embedder_grad(0), embedder_grad(1)
    assert query_side.norm() > 0 and document_side.norm() > 0
    assert torch.allclose(both, query_side + document_side, atol=1e-6)


def test_embedding_dropout_acts_in_train_mode_only(realm_batch):
    model = make_model()
    eval_scores = [model(**realm_batch).relevance_score for _ in range(2)]
    assert torch.equal(eval_scores[0], eval_scores[1])  # exact: the same call twice, no dropout
    model.train()
    train_scores = [model(**realm_batch).relevance_score for _ in range(2)]
    assert not torch.allclose(train_scores[0], train_scores[1])


def test_retrieval_utility_is_positive_when_the_reader_uses_a_retrieved_document(realm_batch):
    model = make_model()
    rows, positions = (realm_batch["labels"] != -100).nonzero(as_tuple=True)
    answer = model.encoder.get_output_embeddings().weight[realm_batch["labels"][rows, positions]]  # [N, H]

    def reader_knows_the_answer_from_candidate_1(module, args, output):  # output [N, K, H] at the masked tokens
        boosted = output.clone()
        boosted[:, 1] = boosted[:, 1] + 500 * answer / answer.norm(dim=-1, keepdim=True)
        return boosted

    baseline = model(**realm_batch).retrieval_utility.item()
    handle = model.encoder.cls.predictions.transform.register_forward_hook(reader_knows_the_answer_from_candidate_1)
    try:
        output = model(**realm_batch)
    finally:
        handle.remove()
    assert output.token_log_prob[:, 1].mean() > -0.1  # the reader is now sure of the answer given candidate 1
    assert output.retrieval_utility.item() > 1.0 > abs(baseline)
    assert output.oracle_candidate_log_prob.item() == pytest.approx(output.token_log_prob[:, 1].mean().item())


def test_a_batch_without_examples_gives_a_zero_loss_reaching_every_trainable_parameter(tokenizer):
    """An all-dropped batch still goes through forward (under DDP every rank must all-reduce each step): its loss is
    0 and its backward gives every trainable parameter a zero gradient."""
    examples = RealmPretrainingExamples(
        tokenizer, hand_blocks(uids={0: "same", 1: "same"}), FirstTokenEmbedder(DIRECTION_1), hand_index()
    )
    model = make_model().train()
    output = model(**examples(hand_queries([([10, 7], [1], "uid5", 5)])))
    output.loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert output.loss.item() == 0.0 and output.retrieval_utility is None
    assert all(p.grad is not None and not p.grad.any() for p in trainable) and len(trainable) > 10


# ---------------------------------------------------------------------------------------------------------------------
# The oracle reader (a diagnostic: REALM's retriever path trained by a perfect reader)
# ---------------------------------------------------------------------------------------------------------------------


def by_text(realm_batch, tokenizer) -> torch.Tensor:
    """[B, K]: whether candidate k's block text holds example b's masked words (the null document never does)."""
    holds = []
    for b, ids in enumerate(realm_batch["candidate_block_ids"].tolist()):
        labels = realm_batch["labels"][b]
        span = tokenizer.decode(labels[labels != -100])
        holds.append([i != -1 and span in BLOCK_TEXTS[i] for i in ids])
    return torch.tensor(holds)


def test_holds_masked_span_marks_the_candidates_whose_body_holds_the_masked_words(realm_batch, tokenizer):
    from openrealm.trainers.pretraining import holds_masked_span

    holds = realm_batch["holds_answer"]
    assert torch.equal(holds, by_text(realm_batch, tokenizer))
    assert holds.any() and not holds[:, 0].any()  # some candidate holds a span; the null document never
    # "cairo" is [UNK] in this 158-wordpiece vocabulary, as "england" and "thames" are: an unknown word is no fact
    args = (realm_batch["joint_input_ids"], realm_batch["joint_token_type_ids"], realm_batch["labels"])
    assert not torch.equal(holds_masked_span(*args, realm_batch["labels"] != -100), holds)


def test_holds_masked_span_needs_every_masked_run_as_consecutive_wordpieces():
    from openrealm.trainers.pretraining import holds_masked_span

    # query [CLS] 7 [M] [M] 9 [M] [SEP] with masks 11 12 and 14; bodies (segment 1) of three candidates
    joint = torch.tensor([[[CLS, 7, MASK, MASK, 9, MASK, SEP, 11, 12, 30, 14, SEP],
                           [CLS, 7, MASK, MASK, 9, MASK, SEP, 12, 11, 14, 30, SEP],
                           [CLS, 7, MASK, MASK, 9, MASK, SEP, 11, 30, 12, 14, SEP]]])  # fmt: skip
    types = torch.tensor([[0] * 7 + [1] * 5] * 3).unsqueeze(0)
    labels = torch.full((1, 12), -100)
    labels[0, [2, 3, 5]] = torch.tensor([11, 12, 14])
    assert holds_masked_span(joint, types, labels, labels != -100).tolist() == [[True, False, False]]
    continuation = torch.zeros(40, dtype=torch.bool)
    continuation[30] = True  # 30 continues the word 14 in candidate 1: "14 ##30" is another word
    joint[0, 0, 9:11] = torch.tensor([14, 30])
    assert holds_masked_span(joint, types, labels, labels != -100, continuation).tolist() == [[False, False, False]]


def test_the_oracle_reader_gives_one_minus_eps_to_answer_holding_candidates_and_the_background_elsewhere(
    realm_batch, tokenizer
):
    model = make_model()
    model.oracle_reader_weight = 1.0
    output = model(**realm_batch)
    rows = (realm_batch["labels"] != -100).nonzero(as_tuple=True)[0]
    expected = torch.where(by_text(realm_batch, tokenizer)[rows], math.log(0.99), math.log(1e-3))
    torch.testing.assert_close(output.token_log_prob, expected)
    expected_loss = -(output.candidate_log_prob[rows] + expected).logsumexp(-1).mean()
    torch.testing.assert_close(output.loss, expected_loss)


def test_the_oracle_alone_trains_only_the_retriever(realm_batch):
    model = make_model()
    model.oracle_reader_weight = 1.0
    model(**realm_batch).loss.backward()
    assert model.embedder.cls.dense.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.encoder.parameters())


def test_a_mixed_reader_is_the_weighted_sum_of_the_oracle_and_encoder_probabilities(realm_batch, tokenizer):
    encoder_only, mixed = make_model(), make_model()
    mixed.oracle_reader_weight = 0.25
    learned, out = encoder_only(**realm_batch).token_log_prob, mixed(**realm_batch)
    rows = (realm_batch["labels"] != -100).nonzero(as_tuple=True)[0]
    oracle = torch.where(by_text(realm_batch, tokenizer)[rows], 0.99, 1e-3)
    torch.testing.assert_close(out.token_log_prob.exp(), 0.25 * oracle + 0.75 * learned.exp())


def test_answer_posterior_gain_is_positive_when_the_oracle_prefers_a_retrieved_answer_block(realm_batch):
    model = make_model()
    model.oracle_reader_weight = 1.0
    output = model(**realm_batch)
    assert 0 < output.answer_in_candidates <= 1
    assert output.answer_posterior_gain > 0  # the posterior moves mass onto the answer-holding candidates


def test_the_reader_advantage_is_the_mean_log_prob_on_answer_holding_candidates_minus_on_the_others(
    realm_batch, tokenizer
):
    model = make_model()  # the encoder reads alone: its advantage, measured on the same candidates
    output = model(**realm_batch)
    rows = (realm_batch["labels"] != -100).nonzero(as_tuple=True)[0]
    holds = by_text(realm_batch, tokenizer)[rows][:, 1:]
    retrieved = output.token_log_prob[:, 1:]
    torch.testing.assert_close(output.answer_reader_advantage, retrieved[holds].mean() - retrieved[~holds].mean())


def test_the_oracle_reader_advantage_is_log_one_minus_eps_over_the_background(realm_batch):
    model = make_model()
    model.oracle_reader_weight = 1.0
    advantage = model(**realm_batch).answer_reader_advantage
    torch.testing.assert_close(advantage, torch.tensor(math.log(0.99) - math.log(1e-3)))


def test_a_mixed_reader_reports_the_encoder_s_own_advantage(realm_batch):
    mixed = make_model()
    mixed.oracle_reader_weight = 0.5
    torch.testing.assert_close(
        mixed(**realm_batch).answer_reader_advantage, make_model()(**realm_batch).answer_reader_advantage
    )


def test_an_oracle_weight_outside_zero_to_one_is_refused():
    config = tiny_realm_config()
    with pytest.raises(ValueError, match="oracle_reader_weight must be in"):
        RealmPretrainingModel(RealmEmbedder(config), RealmKnowledgeAugEncoder(config), oracle_reader_weight=1.5)


def test_sharpness_for_entropy_gives_the_prior_the_asked_mean_entropy():
    from openrealm.trainers.pretraining import mean_entropy, sharpness_for_entropy

    scores = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    sharpness = sharpness_for_entropy(scores, 1.2)
    assert mean_entropy(scores, sharpness) == pytest.approx(1.2, abs=1e-6)
    with pytest.raises(ValueError, match="between 0 and log K"):
        sharpness_for_entropy(scores, math.log(8))


def test_scaling_the_retrieval_embeddings_scales_every_score_by_its_square_and_keeps_the_ranking():
    from openrealm.trainers.pretraining import scale_retrieval_embeddings

    embedder = RealmEmbedder(tiny_realm_config()).eval()
    ids = torch.randint(5, 50, (6, 10), generator=torch.Generator().manual_seed(0))
    before = embedder(ids).projected_score
    scale_retrieval_embeddings(embedder, 3.0)
    after = embedder(ids).projected_score
    torch.testing.assert_close(after, 3.0 * before)
    torch.testing.assert_close(after @ after.T, 9.0 * (before @ before.T))
