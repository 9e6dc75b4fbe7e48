"""The knowledge-augmented encoder's copy head (`RealmConfig.copy_head`, modeling_realm's `RealmCopyHead`): a pointer
over the document's wordpieces mixed with the MLM head, a departure from BERT for small readers that must spread their
probability over the names a block holds (benchmarks/research/reader_that_reads.md, "A head that can hedge")."""

import pytest
import torch
from helpers import tiny_realm_config
from transformers import AutoModel

from openrealm import RealmKnowledgeAugEncoder
from openrealm.modeling_realm import document_mask

# [CLS] query [SEP] document [SEP] (token type 1 from the first document wordpiece), then padding
IDS = [
    [2, 11, 12, 4, 3, 21, 22, 23, 21, 3, 0],  # document 21 22 23 21
    [2, 11, 4, 13, 3, 31, 32, 3, 0, 0, 0],  # document 31 32
    [2, 14, 4, 3, 3, 0, 0, 0, 0, 0, 0],  # the null document: segment B is its [SEP] alone
]
TYPES = [[0] * 5 + [1] * 5 + [0], [0] * 5 + [1] * 3 + [0] * 3, [0] * 4 + [1] + [0] * 6]
MASK = [[1] * 10 + [0], [1] * 8 + [0] * 3, [1] * 5 + [0] * 6]
MASKED = [3, 2, 2]  # the [MASK] (id 4) of each row


def batch():
    return torch.tensor(IDS), torch.tensor(TYPES), torch.tensor(MASK)


def encoder(copy_head: bool = True, gate_bias: float | None = None) -> RealmKnowledgeAugEncoder:
    torch.manual_seed(0)
    model = RealmKnowledgeAugEncoder(tiny_realm_config(copy_head=copy_head)).eval()
    if gate_bias is not None:
        with torch.no_grad():
            model.copy_head.gate.weight.zero_()
            model.copy_head.gate.bias.fill_(gate_bias)
    return model


def masked_log_prob(model) -> torch.Tensor:
    ids, types, mask = batch()
    hidden = model.realm(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    rows, positions = torch.arange(3), torch.tensor(MASKED)
    return model.masked_log_prob(hidden, rows, positions, ids, types, mask)


def test_the_document_is_segment_b_without_its_closing_sep():
    ids, types, mask = batch()
    expected = [[False] * 5 + [True] * 4 + [False] * 2, [False] * 5 + [True] * 2 + [False] * 4, [False] * 11]
    assert document_mask(types, mask).tolist() == expected


def test_the_copy_head_is_off_by_default_and_the_mlm_head_alone_predicts():
    model = encoder(copy_head=False)
    assert model.copy_head is None and not model.config.copy_head
    ids, types, mask = batch()
    with torch.no_grad():
        hidden = model.realm(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        expected = model.cls(hidden[torch.arange(3), torch.tensor(MASKED)]).float().log_softmax(-1)
        assert torch.allclose(masked_log_prob(model), expected, atol=1e-6)


def test_the_pointer_attends_by_the_dot_products_of_projected_queries_and_keys():
    model = encoder()
    with torch.no_grad():
        model.copy_head.key.bias.normal_()  # cancels in the softmax over the document: a nonzero one must not matter
        ids, types, mask = batch()
        hidden = model.realm(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        at = hidden[torch.arange(3), torch.tensor(MASKED)]  # [3, D]
        head = model.copy_head
        scores = (head.query(at)[:, None, :] * head.key(hidden)).sum(-1) / hidden.shape[-1] ** 0.5  # [3, L]
        document = document_mask(types, mask)
        attention = scores.masked_fill(~document, float("-inf")).softmax(-1).nan_to_num()  # the null row: all 0
        copy = torch.zeros(3, model.config.vocab_size).scatter_add(1, ids, attention)
        gate = torch.sigmoid(head.gate(at))
        expected = gate * copy + (1 - gate) * model.cls(at).float().softmax(-1)
        log_prob = masked_log_prob(model)
    assert torch.allclose(log_prob[:2].exp(), expected[:2], atol=1e-6)  # row 2 (null): test_the_null_document_...


def test_copy_head_log_probs_sum_to_one():
    with torch.no_grad():
        log_prob = masked_log_prob(encoder())
    assert torch.allclose(log_prob.exp().sum(-1), torch.ones(3), atol=1e-5)


def test_a_copy_head_that_always_points_puts_every_bit_of_mass_on_the_document():
    with torch.no_grad():
        p = masked_log_prob(encoder(gate_bias=40.0)).exp()
    assert p[0, [21, 22, 23]].sum().item() == pytest.approx(1.0, abs=1e-5)
    assert p[1, [31, 32]].sum().item() == pytest.approx(1.0, abs=1e-5)
    assert p[0, 21].item() > p[0, 22].item() * 1.2  # 21 is there twice; the head's attention is near uniform at init


def test_the_null_document_is_left_to_the_mlm_head():
    model = encoder(gate_bias=40.0)
    ids, types, mask = batch()
    with torch.no_grad():
        hidden = model.realm(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        mlm = model.cls(hidden[2, MASKED[2]]).float().log_softmax(-1)
        assert torch.allclose(masked_log_prob(model)[2], mlm, atol=1e-6)  # no pointer mass at all, even at gate ~1


def test_the_forward_gives_the_same_log_probs_as_the_masked_positions_path():
    model = encoder()
    ids, types, mask = batch()
    with torch.no_grad():
        full = model(ids, attention_mask=mask, token_type_ids=types).logits  # [3, L, V], normalised log p
        assert torch.allclose(full[torch.arange(3), torch.tensor(MASKED)], masked_log_prob(model), atol=1e-5)


def test_the_loss_trains_the_copy_head():
    model = encoder().train()
    ids, types, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 2], labels[2, 2] = 22, 31, 14
    output = model(
        ids[:, None], attention_mask=mask[:, None], token_type_ids=types[:, None], labels=labels,
        relevance_score=torch.zeros(3, 1),
    )  # fmt: skip
    output.loss.backward()
    assert torch.isfinite(output.loss)
    for name in ("query", "key", "gate"):
        assert getattr(model.copy_head, name).weight.grad.abs().sum() > 0, name


def test_the_copy_head_needs_the_token_types_to_find_the_document():
    ids, _, mask = batch()
    with pytest.raises(ValueError, match="copy head .* needs input_ids, token_type_ids and attention_mask"):
        encoder()(ids, attention_mask=mask)


def test_a_saved_copy_head_reloads_with_its_weights(tmp_path):
    model = encoder()
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert reloaded.config.copy_head and isinstance(reloaded, RealmKnowledgeAugEncoder)
    assert torch.equal(reloaded.copy_head.key.weight, model.copy_head.key.weight)  # exact: saved and reloaded
