"""Write transformers 4.57.6 REALM reference fixtures for OpenREALM's tests.

Run this in a separate environment that has transformers==4.57.6 (see tests/reference/README.md):

    TRUST_REMOTE_CODE=True python tests/reference/make_reference_fixtures.py

It writes ``tests/reference/fixtures/``: a tiny WordPiece vocabulary, two checkpoint folders per REALM class
(the 4.57 safetensors layout and the Hub ``pytorch_model.bin`` layout), the inputs and 4.57.6 outputs of a set
of cases per class, tokenizer cases, and ``manifest.json`` describing all of it. It then reloads every folder
with 4.57.6 ``from_pretrained`` and asserts that the saved outputs are reproduced.
"""

import ast
import json
import math
import os
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers.models.deprecated.realm import (
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmRetriever,
    RealmScorer,
    RealmTokenizer,
    RealmTokenizerFast,
)

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
MAX_SIZE_BYTES = 5 * 1024 * 1024

PARAM_SEEDS = {"embedder": 1001, "scorer": 1002, "knowledge_aug_encoder": 1003, "reader": 1004, "openqa": 1005}
INPUT_SEEDS = {"knowledge_aug_encoder": 2003, "reader": 2004}
BLOCK_EMB_SEED = 3005

CLASSES = {
    "embedder": RealmEmbedder,
    "scorer": RealmScorer,
    "knowledge_aug_encoder": RealmKnowledgeAugEncoder,
    "reader": RealmReader,
    "openqa": RealmForOpenQA,
}

# Aliases that 4.57 does not declare in `_tied_weights_keys`, declared here (as regular expressions, the way
# 4.57 reads them) through `_dynamic_tied_weights_keys` so that 4.57's own `save_pretrained` drops them.
EXTRA_TIED_ALIASES = {
    "scorer": [r"^query_embedder\."],
    "reader": [r"^cls\.predictions\.decoder\.bias$"],
    "openqa": [r"^reader\.cls\.predictions\.decoder\.bias$"],
}

WORD_LINES = (
    "who what where when which why how is are was were the a an of in on at to by for from with and or as it its",
    "that this he she they his her born river city capital computer science pioneer modern alan turing paris france",
    "london egypt nile flows flow through long longest world largest country europe africa english mathematician",
    "british famous known first built tower eiffel water sea north south old new great people language french",
    "named called many most has had be been one two three year machine theory logic code war during after before",
    "also about work university cambridge studied wrote paper question answer book museum hello test well cafe",
    "capitals",
)
WORDS = [word for line in WORD_LINES for word in line.split()]


def build_vocab():
    """Return the tiny deterministic WordPiece vocabulary as a list of tokens (index = id)."""
    special = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    punctuation = [".", ",", "?", "!", "'", "-", "(", ")", ":"]
    digits = [str(d) for d in range(10)] + [f"##{d}" for d in range(10)]
    pieces = ["##s", "##ing", "##ed", "##er", "##ly"]
    cjk = ["中", "文"]
    vocab = special + punctuation + digits + WORDS + pieces + cjk
    assert len(vocab) == len(set(vocab)), "duplicate vocabulary entries"
    return vocab


def write_vocab(path):
    """Write vocab.txt and return the vocabulary list."""
    vocab = build_vocab()
    path.write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
    return vocab


def make_config(vocab_size):
    """Return the tiny RealmConfig shared by every class."""
    return RealmConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        retriever_proj_size=16,
        span_hidden_size=24,
        max_span_width=5,
        num_candidates=3,
        reader_beam_size=3,
        searcher_beam_size=6,
        reader_seq_len=40,
        num_block_records=12,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
    )


def randomize_parameters(model, seed):
    """Overwrite every (de-duplicated) parameter with seeded random values.

    LayerNorm weights get 1 + N(0, 0.2); embedding tables N(0, 0.5); other biases and LayerNorm biases N(0, 0.1);
    Linear weights N(0, 1) * gain / sqrt(in_features), with gain 2 for the attention query, key, value and output
    projections and 1 elsewhere. The gains make the [CLS] vector depend on the whole input, so different inputs
    get clearly different embeddings and block rankings, while no softmax or tanh saturates.
    """
    generator = torch.Generator().manual_seed(seed)
    attention = (".query.", ".key.", ".value.", ".attention.output.dense.")
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith(("LayerNorm.weight", "layer_normalization.weight")):
                value = 1.0 + 0.2 * noise
            elif name.endswith("_embeddings.weight"):
                value = 0.5 * noise
            elif param.dim() == 2:
                gain = 2.0 if any(part in name for part in attention) else 1.0
                value = gain * noise / math.sqrt(param.shape[1])
            else:
                value = 0.1 * noise
            param.copy_(value)


def build_model(name, config, retriever=None):
    """Build the model of one class with randomized parameters, in eval mode."""
    torch.manual_seed(0)
    if name == "openqa":
        model = RealmForOpenQA(config, retriever=retriever)
        generator = torch.Generator().manual_seed(BLOCK_EMB_SEED)
        with torch.no_grad():
            model.block_emb.copy_(torch.randn(model.block_emb.shape, generator=generator))
    else:
        model = CLASSES[name](config)
    randomize_parameters(model, PARAM_SEEDS[name])
    return model.eval()


def state_dict_alias_groups(state_dict):
    """Group state-dict keys that share storage; return the groups with more than one key."""
    groups = {}
    for key, tensor in state_dict.items():
        ptr = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        groups.setdefault(ptr, []).append(key)
    return [sorted(keys) for keys in groups.values() if len(keys) > 1]


def write_tokenizer_files(tokenizer, folder):
    """Save the slow tokenizer files into folder and check that they name RealmTokenizer."""
    tokenizer.save_pretrained(str(folder))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "RealmTokenizer", config["tokenizer_class"]
    assert not (folder / "tokenizer.json").exists()


def safetensors_keys(path):
    """Return the sorted tensor names stored in a safetensors file."""
    with safe_open(str(path), framework="pt") as handle:
        return sorted(handle.keys())


def describe_save_error(err):
    """Return a deterministic description of 4.57's shared-tensor save error (message and sorted groups)."""
    message = str(err)
    start, end = message.index("["), message.index("] that are")
    groups = sorted(sorted(group) for group in ast.literal_eval(message[start : end + 1]))
    return {"message": f"{type(err).__name__}: {message[:start]}[...]{message[end + 1 :]}", "shared_groups": groups}


def save_safetensors_layout(name, model, tokenizer, retriever=None):
    """Write <name>_safetensors/ with 4.57.6 save_pretrained and describe it for the manifest."""
    folder = FIXTURES / f"{name}_safetensors"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    default_error = None
    try:
        model.save_pretrained(str(folder))
        method = "transformers 4.57.6 model.save_pretrained(dir) with default arguments (safe_serialization=True)"
    except RuntimeError as err:
        default_error = describe_save_error(err)
        shutil.rmtree(folder)
        folder.mkdir(parents=True)
        model._dynamic_tied_weights_keys = EXTRA_TIED_ALIASES[name]
        try:
            model.save_pretrained(str(folder))
        finally:
            del model._dynamic_tied_weights_keys
        method = (
            "transformers 4.57.6 model.save_pretrained(dir) after declaring the undeclared aliases on the "
            f"instance as _dynamic_tied_weights_keys={EXTRA_TIED_ALIASES[name]} (the default save raises)"
        )
    write_tokenizer_files(tokenizer, folder)
    if retriever is not None:
        retriever.save_pretrained(str(folder))
    state_dict = model.state_dict()
    keys = safetensors_keys(folder / "model.safetensors")
    stored = load_file(str(folder / "model.safetensors"))
    for key in keys:
        assert torch.equal(stored[key], state_dict[key]), key
    return {
        "path": folder.name,
        "files": sorted(p.name for p in folder.iterdir()),
        "weights_file": "model.safetensors",
        "method": method,
        "default_save_pretrained_error": default_error,
        "num_keys": len(keys),
        "keys": keys,
        "dropped_alias_keys": sorted(set(state_dict) - set(keys)),
    }


def hub_state_dict(model):
    """Return model.state_dict() (every key, aliases kept) plus 4.16-style persistent embeddings.position_ids."""
    positions = torch.arange(model.config.max_position_embeddings, dtype=torch.int64).unsqueeze(0)
    result = OrderedDict()
    for key, tensor in model.state_dict().items():
        if key.endswith("embeddings.word_embeddings.weight"):
            prefix = key[: -len("word_embeddings.weight")]
            result[prefix + "position_ids"] = positions.clone()
        result[key] = tensor
    return result


def hub_config_dict(model, class_name, openqa):
    """Return a config dict shaped like the transformers 4.16.0.dev0 config.json files of google/realm-*."""
    full = model.config.to_dict()
    realm_keys = set(RealmConfig().to_dict()) - set(transformers.PretrainedConfig().to_dict())
    kept = {key: full[key] for key in realm_keys | {"bos_token_id", "eos_token_id", "pad_token_id", "model_type"}}
    kept.update(
        {
            "architectures": [class_name],
            "torch_dtype": "float32",
            "transformers_version": "4.16.0.dev0",
            "use_cache": True,
            "searcher_seq_len": 64,
        }
    )
    if openqa:
        kept["use_scann"] = False
    return dict(sorted(kept.items()))


def save_hub_layout(name, model, tokenizer, retriever=None):
    """Write <name>_hub/ like a published google/realm-* repo and describe it for the manifest."""
    folder = FIXTURES / f"{name}_hub"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    state_dict = hub_state_dict(model)
    torch.save(state_dict, str(folder / "pytorch_model.bin"))
    config = hub_config_dict(model, type(model).__name__, openqa=retriever is not None)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer_files(tokenizer, folder)
    if retriever is not None:
        retriever.save_pretrained(str(folder))
    position_keys = [key for key in state_dict if key.endswith("embeddings.position_ids")]
    return {
        "path": folder.name,
        "files": sorted(p.name for p in folder.iterdir()),
        "weights_file": "pytorch_model.bin",
        "method": (
            "torch.save(OrderedDict) of model.state_dict() (every key, tied aliases kept, storage shared as in "
            "memory) plus int64 [1, max_position_embeddings] arange tensors inserted before each "
            "embeddings.word_embeddings.weight; config.json in the 4.16.0.dev0 Hub shape"
        ),
        "num_keys": len(state_dict),
        "keys": list(state_dict),
        "position_ids_keys": position_keys,
        "alias_groups": state_dict_alias_groups(state_dict),
        "config_json": config,
    }


def new_book():
    """Return an empty case book: case tensors (named <case>.<field>) and their manifest entries."""
    return {"tensors": {}, "cases": {}}


def start_case(book, case, description, mode="eval", call=None, json_values=None):
    """Start a case entry in the book."""
    book["cases"][case] = {
        "description": description,
        "mode": mode,
        "call": call,
        "fields": {},
        "json": json_values or {},
        "none_outputs": [],
    }


def add_field(book, case, field, tensor, meaning, role="output"):
    """Store one tensor of a case (None is recorded under none_outputs)."""
    if tensor is None:
        book["cases"][case]["none_outputs"].append(field)
        return
    tensor = tensor.detach().cpu().clone().contiguous()
    book["tensors"][f"{case}.{field}"] = tensor
    book["cases"][case]["fields"][field] = {
        "role": role,
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "shape": list(tensor.shape),
        "meaning": meaning,
    }


def embedder_cases(model, tokenizer):
    """Run the RealmEmbedder cases."""
    book = new_book()
    pairs = [
        ("who is the pioneer in modern computer science?", "alan turing was a british mathematician."),
        ("where is the nile?", "the nile flows through egypt and many countries in africa to the sea."),
        ("what is the capital of france?", "paris."),
    ]
    enc = tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any() and (enc["token_type_ids"] == 1).any()
    with torch.no_grad():
        out = model(**enc)
        out_hidden = model(**enc, output_hidden_states=True)
    inputs = {
        "input_ids": "token ids [B=3, L], padded with [PAD]=0 (question, passage pairs)",
        "attention_mask": "1 for real tokens, 0 for padding",
        "token_type_ids": "0 for the first segment, 1 for the second",
    }
    start_case(book, "padded_batch", "three (text, text_pair) pairs padded to the longest", call="model(**inputs)")
    start_case(
        book,
        "hidden_states",
        "same inputs as padded_batch with output_hidden_states=True",
        call="model(**inputs, output_hidden_states=True)",
    )
    for case in ("padded_batch", "hidden_states"):
        for field, meaning in inputs.items():
            add_field(book, case, field, enc[field], meaning, role="input")
    add_field(
        book, "padded_batch", "projected_score", out.projected_score, "RealmEmbedderOutput.projected_score [B, P]"
    )
    add_field(book, "hidden_states", "projected_score", out_hidden.projected_score, "same as padded_batch")
    add_field(
        book,
        "hidden_states",
        "hidden_states",
        torch.stack(out_hidden.hidden_states),
        "RealmEmbedderOutput.hidden_states stacked on a new dim 0: [num_hidden_layers + 1, B, L, H]",
    )
    ids_only = tokenizer(["the nile flows through egypt.", "alan turing"], padding=True, return_tensors="pt")
    with torch.no_grad():
        out_ids = model(input_ids=ids_only["input_ids"])
    start_case(
        book,
        "input_ids_only",
        "input_ids only (padded ids included, no attention_mask, no token_type_ids: ones / zeros are used)",
        call="model(input_ids=input_ids)",
    )
    add_field(book, "input_ids_only", "input_ids", ids_only["input_ids"], "token ids [B=2, L]", role="input")
    add_field(
        book, "input_ids_only", "projected_score", out_ids.projected_score, "RealmEmbedderOutput.projected_score"
    )
    return book


def scorer_cases(model, tokenizer):
    """Run the RealmScorer case."""
    book = new_book()
    queries = ["who is the pioneer in modern computer science?", "where is the nile?"]
    candidates = [
        ["alan turing was a pioneer.", "paris is in france.", "the nile is long."],
        ["the nile flows through egypt.", "london is old.", "computer science"],
    ]
    query = tokenizer(queries, padding=True, return_tensors="pt")
    cand = tokenizer.batch_encode_candidates(candidates, max_length=12, return_tensors="pt")
    with torch.no_grad():
        out = model(
            **query,
            candidate_input_ids=cand["input_ids"],
            candidate_attention_mask=cand["attention_mask"],
            candidate_token_type_ids=cand["token_type_ids"],
        )
    start_case(
        book,
        "query_and_candidates",
        "query batch of 2 (padded) against 2 x 3 candidates encoded by batch_encode_candidates(max_length=12)",
        call=(
            "model(input_ids, attention_mask, token_type_ids, candidate_input_ids=..., "
            "candidate_attention_mask=..., candidate_token_type_ids=...)"
        ),
        json_values={"queries": queries, "candidates": candidates, "candidate_max_length": 12},
    )
    add_field(book, "query_and_candidates", "input_ids", query["input_ids"], "query ids [B=2, L]", role="input")
    add_field(
        book, "query_and_candidates", "attention_mask", query["attention_mask"], "query mask [B, L]", role="input"
    )
    add_field(
        book, "query_and_candidates", "token_type_ids", query["token_type_ids"], "query types [B, L]", role="input"
    )
    for field in ("input_ids", "attention_mask", "token_type_ids"):
        add_field(
            book,
            "query_and_candidates",
            f"candidate_{field}",
            cand[field],
            f"candidate {field} [B=2, C=3, 12]",
            role="input",
        )
    add_field(
        book,
        "query_and_candidates",
        "relevance_score",
        out.relevance_score,
        "RealmScorerOutput.relevance_score [B, C]",
    )
    add_field(book, "query_and_candidates", "query_score", out.query_score, "RealmScorerOutput.query_score [B, P]")
    add_field(
        book,
        "query_and_candidates",
        "candidate_score",
        out.candidate_score,
        "RealmScorerOutput.candidate_score [B,C,P]",
    )
    return book


def knowledge_aug_encoder_cases(model, tokenizer):
    """Run the RealmKnowledgeAugEncoder cases."""
    book = new_book()
    queries = ["the [MASK] flows through [MASK].", "[MASK] turing was a [MASK] of computer [MASK]."]
    answers = [["nile", "egypt"], ["alan", "pioneer", "science"]]
    docs = [
        ["the nile is the longest river in africa.", "egypt has water.", "paris is in france."],
        ["alan turing studied at cambridge.", "the first computer", "london is a great city in europe."],
    ]
    max_length = 24
    text = [[q] * 3 for q in queries]
    enc = tokenizer.batch_encode_candidates(text, text_pair=docs, max_length=max_length, return_tensors="pt")
    labels = torch.full((2, max_length), -100, dtype=torch.long)
    mlm_mask = torch.zeros((2, max_length), dtype=torch.long)
    mask_id = tokenizer.mask_token_id
    for row in range(2):
        positions = (enc["input_ids"][row, 0] == mask_id).nonzero().flatten()
        for cand in range(3):
            assert torch.equal((enc["input_ids"][row, cand] == mask_id).nonzero().flatten(), positions)
        assert len(positions) == len(answers[row])
        labels[row, positions] = torch.tensor(tokenizer.convert_tokens_to_ids(answers[row]))
        mlm_mask[row, positions] = 1
    generator = torch.Generator().manual_seed(INPUT_SEEDS["knowledge_aug_encoder"])
    relevance = torch.randn((2, 3), generator=generator)
    base = {key: enc[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        with_mask = model(**base, relevance_score=relevance, labels=labels, mlm_mask=mlm_mask)
        without_mask = model(**base, relevance_score=relevance, labels=labels)
        no_labels = model(**base)
    meanings = {
        "input_ids": "batch_encode_candidates(text=[[query]*3]*2, text_pair=docs, max_length=24): [B=2, C=3, L=24]",
        "attention_mask": "[B, C, L]",
        "token_type_ids": "[B, C, L]",
    }
    json_values = {"queries": queries, "docs": docs, "masked_answers": answers, "max_length": max_length}
    start_case(
        book,
        "with_mlm_mask",
        "labels at the [MASK] positions, relevance_score and mlm_mask (1 exactly at the masked positions)",
        call="model(input_ids, attention_mask, token_type_ids, relevance_score=..., labels=..., mlm_mask=...)",
        json_values=json_values,
    )
    start_case(
        book,
        "without_mlm_mask",
        "same as with_mlm_mask but mlm_mask omitted: 4.57 uses all ones, so the loss is diluted",
        call="model(input_ids, attention_mask, token_type_ids, relevance_score=..., labels=...)",
        json_values=json_values,
    )
    start_case(
        book,
        "no_labels",
        "same inputs, no labels: logits only",
        call="model(input_ids, attention_mask, token_type_ids)",
    )
    for case in ("with_mlm_mask", "without_mlm_mask", "no_labels"):
        for field, meaning in meanings.items():
            add_field(book, case, field, base[field], meaning, role="input")
    for case in ("with_mlm_mask", "without_mlm_mask"):
        add_field(book, case, "relevance_score", relevance, "random N(0,1) candidate scores [B, C]", role="input")
        add_field(
            book, case, "labels", labels, "[B, L]: -100 except the gold ids at the [MASK] positions", role="input"
        )
    add_field(
        book, "with_mlm_mask", "mlm_mask", mlm_mask, "[B, L] int64: 1 at the [MASK] positions, else 0", role="input"
    )
    add_field(book, "with_mlm_mask", "loss", with_mask.loss, "MaskedLMOutput.loss (0-d)")
    add_field(book, "with_mlm_mask", "logits", with_mask.logits, "MaskedLMOutput.logits [B*C, L, V] (not reshaped)")
    add_field(book, "without_mlm_mask", "loss", without_mask.loss, "MaskedLMOutput.loss (0-d), diluted")
    add_field(book, "without_mlm_mask", "logits", without_mask.logits, "MaskedLMOutput.logits [B*C, L, V]")
    add_field(book, "no_labels", "loss", no_labels.loss, "None")
    add_field(book, "no_labels", "logits", no_labels.logits, "MaskedLMOutput.logits [B*C, L, V]")
    return book


READER_QUESTION = "who is the pioneer in modern computer science?"
READER_BLOCKS = [
    "alan turing was a pioneer of computer science.",
    "the eiffel tower was built in the city.",
    "turing studied at cambridge and wrote a famous paper about logic, alan turing.",
    "the nile flows through egypt.",
    "alan turing was born in london.",
    "egypt has the longest river, the nile.",
]
READER_ANSWERS = {
    "answer_in_reader_beam": ["alan turing", "turing"],
    "answer_nowhere": ["paris"],
    "answer_outside_reader_beam": ["nile"],
}


def reader_encoding(tokenizer):
    """Encode the 6 (question, block) pairs as 4.57's retriever does (without truncation needed)."""
    enc = tokenizer(
        [READER_QUESTION] * len(READER_BLOCKS),
        READER_BLOCKS,
        padding=True,
        return_special_tokens_mask=True,
        return_tensors="pt",
    )
    block_mask = enc["special_tokens_mask"].logical_not() & enc["token_type_ids"].bool()
    return enc, block_mask


def reader_labels(tokenizer, enc, answers):
    """Return has_answers and padded start/end positions from 4.57's RealmRetriever.block_has_answer."""
    retriever = RealmRetriever(np.array([], dtype=object), tokenizer)
    answer_ids = tokenizer(answers, add_special_tokens=False).input_ids
    has_answers, starts, ends = retriever.block_has_answer(enc, answer_ids)
    return (
        answer_ids,
        torch.tensor(has_answers, dtype=torch.bool),
        torch.tensor(starts, dtype=torch.long),
        torch.tensor(ends, dtype=torch.long),
    )


def reader_cases(model, tokenizer):
    """Run the RealmReader cases."""
    book = new_book()
    enc, block_mask = reader_encoding(tokenizer)
    generator = torch.Generator().manual_seed(INPUT_SEEDS["reader"])
    relevance = torch.randn((len(READER_BLOCKS),), generator=generator)
    beam = model.config.reader_beam_size
    base = {key: enc[key][:beam] for key in ("input_ids", "attention_mask", "token_type_ids")}
    inputs = dict(
        base,
        all_input_ids=enc["input_ids"],
        special_tokens_mask=enc["special_tokens_mask"],
        block_mask=block_mask,
        relevance_score=relevance,
    )
    input_meanings = {
        "input_ids": "[R=3, L]: the first R rows of tokenizer([question]*6, blocks, padding=True) (4.57 needs R rows)",
        "attention_mask": "[R, L]",
        "token_type_ids": "[R, L]",
        "all_input_ids": "[S=6, L] every row of the pair encoding (not a model input)",
        "special_tokens_mask": "[S, L] from return_special_tokens_mask=True (not a model input)",
        "block_mask": "[S, L] bool: ~special_tokens_mask & token_type_ids",
        "relevance_score": "[S] random N(0,1)",
    }
    expected_rows = {
        "answer_in_reader_beam": lambda h: bool(h[:3].any()),
        "answer_nowhere": lambda h: not bool(h.any()),
        "answer_outside_reader_beam": lambda h: not bool(h[:3].any()) and bool(h[3:].any()),
    }
    output_meanings = {
        "loss": "RealmReaderOutput.loss (0-d)",
        "retriever_loss": "RealmReaderOutput.retriever_loss (0-d)",
        "reader_loss": "RealmReaderOutput.reader_loss (0-d)",
        "retriever_correct": "RealmReaderOutput.retriever_correct [S] bool (= has_answers)",
        "reader_correct": "RealmReaderOutput.reader_correct [R=3, num_spans] bool",
        "block_idx": "RealmReaderOutput.block_idx (0-d int64, index inside the reader beam)",
        "candidate": "RealmReaderOutput.candidate (0-d int64, span index)",
        "start_pos": "RealmReaderOutput.start_pos [1]",
        "end_pos": "RealmReaderOutput.end_pos [1] (inclusive)",
    }
    descriptions = {
        "answer_in_reader_beam": "answers 'alan turing'/'turing' occur in rows 0 and 2 (reader beam) and row 4",
        "answer_nowhere": "answer 'paris' occurs in no block: has_answers all False, positions of shape [6, 0]",
        "answer_outside_reader_beam": "answer 'nile' occurs only in rows 3 and 5 (outside the reader beam of 3)",
    }
    for case, answers in READER_ANSWERS.items():
        answer_ids, has_answers, starts, ends = reader_labels(tokenizer, enc, answers)
        assert expected_rows[case](has_answers), (case, has_answers)
        with torch.no_grad():
            out = model(
                **base,
                relevance_score=relevance,
                block_mask=block_mask,
                start_positions=starts,
                end_positions=ends,
                has_answers=has_answers,
            )
        start_case(
            book,
            case,
            descriptions[case],
            call=(
                "model(input_ids, attention_mask, token_type_ids, relevance_score=..., block_mask=..., "
                "start_positions=..., end_positions=..., has_answers=...)"
            ),
            json_values={
                "question": READER_QUESTION,
                "blocks": READER_BLOCKS,
                "answers": answers,
                "answer_ids": answer_ids,
            },
        )
        for field, value in inputs.items():
            role = "intermediate" if field in ("all_input_ids", "special_tokens_mask") else "input"
            add_field(book, case, field, value, input_meanings[field], role=role)
        add_field(
            book, case, "start_positions", starts, "[S, A] gold starts padded with -1 (block_has_answer)", role="input"
        )
        add_field(book, case, "end_positions", ends, "[S, A] gold ends (inclusive) padded with -1", role="input")
        add_field(book, case, "has_answers", has_answers, "[S] bool", role="input")
        for field, meaning in output_meanings.items():
            add_field(book, case, field, getattr(out, field), meaning)
    with torch.no_grad():
        out = model(**base, relevance_score=relevance, block_mask=block_mask)
    start_case(
        book,
        "no_labels",
        "same inputs, no positions / has_answers: prediction only",
        call="model(input_ids, attention_mask, token_type_ids, relevance_score=..., block_mask=...)",
        json_values={"question": READER_QUESTION, "blocks": READER_BLOCKS},
    )
    for field in ("input_ids", "attention_mask", "token_type_ids"):
        add_field(book, "no_labels", field, base[field], input_meanings[field], role="input")
    add_field(book, "no_labels", "block_mask", block_mask, input_meanings["block_mask"], role="input")
    add_field(book, "no_labels", "relevance_score", relevance, input_meanings["relevance_score"], role="input")
    for field, meaning in output_meanings.items():
        add_field(book, "no_labels", field, getattr(out, field), meaning)
    return book


OPENQA_QUESTIONS = {
    "answer_in_reader_beam": ("who is the pioneer in modern computer science?", ["alan turing", "turing"]),
    "train_answer_outside_reader_beam": ("which river flows through egypt?", ["nile"]),
    "answer_nowhere": ("what is the capital of france?", ["paris"]),
    "no_answer_ids": ("where was alan turing born?", None),
}
OPENQA_FILLERS = [
    "the eiffel tower was built in one year.",
    "cambridge is an old university.",
    "the longest river in europe.",
    "london is a great city.",
    "many people in africa.",
    "the sea is north of the country.",
    "a book about logic and code.",
    "the museum has a famous tower.",
    "french is a language of europe.",
    "the war was long.",
    "computer science is about machine theory.",
    "egypt is a country in africa.",
]
OPENQA_ANSWER_SENTENCES = {
    "answer_in_reader_beam": "alan turing was a pioneer.",
    "train_answer_outside_reader_beam": "the nile flows through it.",
}


def question_ranking(model, tokenizer, question, k):
    """Return (question_projection, top-k scores, top-k ids) as 4.57's RealmForOpenQA computes them."""
    enc = tokenizer([question], return_tensors="pt")
    with torch.no_grad():
        projection = model.embedder(**enc, return_dict=True).projected_score
        batch_scores = torch.einsum("BD,QD->QB", model.block_emb, projection)
        scores, ids = torch.topk(batch_scores, k=k, dim=-1)
    return projection, scores.squeeze(0), ids.squeeze(0)


def design_block_records(model, tokenizer):
    """Choose block texts after ranking so each OpenQA case gets its answer where it needs it."""
    k = model.config.searcher_beam_size
    rankings = {
        case: question_ranking(model, tokenizer, q, k)[2].tolist() for case, (q, _) in OPENQA_QUESTIONS.items()
    }
    texts = list(OPENQA_FILLERS)
    for filler in texts:
        assert not {"alan", "turing", "nile", "paris"} & set(tokenizer.tokenize(filler)), filler
    in_beam = rankings["answer_in_reader_beam"]
    outside = rankings["train_answer_outside_reader_beam"]
    targets = {
        "answer_in_reader_beam": [in_beam[1]],
        "train_answer_outside_reader_beam": [outside[3], outside[4]],
    }
    for case, block_ids in targets.items():
        for block_id in block_ids:
            texts[block_id] = f"{texts[block_id]} {OPENQA_ANSWER_SENTENCES[case]}"
    assert not set(targets["train_answer_outside_reader_beam"]) & set(outside[:3])
    records = np.array([text.encode("utf-8") for text in texts], dtype=object)
    return records, rankings, targets


def openqa_cases(model, tokenizer, retriever):
    """Run the RealmForOpenQA cases (the retriever must hold the designed block records)."""
    book = new_book()
    config = model.config
    for case, (question, answers) in OPENQA_QUESTIONS.items():
        train = case.startswith("train")
        model.train(train)
        enc = tokenizer([question], return_tensors="pt")
        answer_ids = None
        if answers is not None:
            answer_ids = tokenizer(
                answers, add_special_tokens=False, return_token_type_ids=False, return_attention_mask=False
            ).input_ids
        with torch.no_grad():
            out = model(**enc, answer_ids=answer_ids, return_dict=True)
            projection, scores, ids = question_ranking(model, tokenizer, question, model.searcher_beam_size)
            retrieved_logits = torch.einsum("D,BD->B", projection.squeeze(), model.block_emb[ids])
        has_answers, starts, ends, concat = retriever(
            ids, enc["input_ids"], answer_ids, max_length=config.reader_seq_len
        )
        block_mask = concat["special_tokens_mask"].logical_not() & concat["token_type_ids"].bool()
        model.eval()
        question_ids = enc["input_ids"][0].tolist()
        row = concat["input_ids"][0].tolist()
        assert row[: len(question_ids)] == question_ids, "the retriever's decode/re-encode changed the question"
        reader = out.reader_output
        if has_answers is not None:
            assert reader.retriever_correct.tolist() == has_answers
        predicted = concat["input_ids"][reader.block_idx][reader.start_pos : reader.end_pos + 1]
        assert torch.equal(predicted, out.predicted_answer_ids)
        start_case(
            book,
            case,
            OPENQA_DESCRIPTIONS[case],
            mode="train" if train else "eval",
            call="model(input_ids, attention_mask, token_type_ids, answer_ids=answer_ids, return_dict=True)",
            json_values={
                "question": question,
                "answers": answers,
                "answer_ids": answer_ids,
                "searcher_beam_size": int(ids.numel()),
                "predicted_answer_slow_decode": tokenizer.decode(out.predicted_answer_ids),
                "retrieved_block_texts": [retriever.block_records[i].decode("utf-8") for i in ids.tolist()],
            },
        )
        for field in ("input_ids", "attention_mask", "token_type_ids"):
            add_field(
                book, case, field, enc[field], f"question {field} [1, Lq] from tokenizer([question])", role="input"
            )
        add_field(
            book, case, "question_projection", projection, "embedder(question).projected_score [1, P]", "intermediate"
        )
        add_field(
            book, case, "retrieved_block_ids", ids, "[S] topk ids of einsum('BD,QD->QB', block_emb, q)", "intermediate"
        )
        add_field(
            book, case, "retrieved_scores", scores, "[S] the topk values (block scores, descending)", "intermediate"
        )
        add_field(
            book,
            case,
            "retrieved_logits",
            retrieved_logits,
            "[S] einsum('D,BD->B', q, block_emb[ids]): the relevance_score given to the reader",
            "intermediate",
        )
        for field in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
            add_field(
                book,
                case,
                f"concat_{field}",
                concat[field],
                f"retriever's (question, block) encoding {field} [S, Lc] (padding=True, max_length=reader_seq_len)",
                "intermediate",
            )
        add_field(
            book, case, "block_mask", block_mask, "[S, Lc] bool ~special_tokens_mask & token_type_ids", "intermediate"
        )
        if has_answers is not None:
            add_field(
                book, case, "has_answers", torch.tensor(has_answers), "[S] bool from the retriever", "intermediate"
            )
            add_field(
                book,
                case,
                "start_positions",
                torch.tensor(starts, dtype=torch.long),
                "[S, A] (-1 pad)",
                "intermediate",
            )
            add_field(
                book, case, "end_positions", torch.tensor(ends, dtype=torch.long), "[S, A] (-1 pad)", "intermediate"
            )
        for field in ("loss", "retriever_loss", "reader_loss", "retriever_correct", "reader_correct"):
            add_field(book, case, field, getattr(reader, field), f"reader_output.{field}")
        for field in ("block_idx", "candidate", "start_pos", "end_pos"):
            add_field(book, case, field, getattr(reader, field), f"reader_output.{field}")
        add_field(
            book, case, "predicted_answer_ids", out.predicted_answer_ids, "RealmForOpenQAOutput.predicted_answer_ids"
        )
    return book


OPENQA_DESCRIPTIONS = {
    "answer_in_reader_beam": "eval mode: answers 'alan turing'/'turing' in the block ranked 2nd (inside the top 3)",
    "train_answer_outside_reader_beam": (
        "model.train() (searcher beam 6, dropout 0): answer 'nile' only in the blocks ranked 4th and 5th"
    ),
    "answer_nowhere": "eval mode: answer 'paris' is in no block (has_answers all False, positions [3, 0])",
    "no_answer_ids": "eval mode, answer_ids=None: no losses",
}


TOKENIZER_TEXTS = [
    "who is the pioneer in modern computer science?",
    "Hello, world! It's (well) a test: one-two.",
    "WHERE IS THE NILE RIVER?",
    "Café Ñandú",
    "中文 computer 中",
    "born in 1912, not 2024",
    "the zebra flows",
    "   the   river\tflows \n through  egypt   ",
    "computers were working and flowed",
    "alan turing's paris",
]
TOKENIZER_PAIRS = [
    ("who is the pioneer in modern computer science?", "alan turing was a pioneer."),
    ("What flows through EGYPT?", "The Nile."),
    ("中文?", "Café in London"),
]


def encode_both(slow, fast, text, text_pair=None):
    """Encode text (and pair) with the slow and fast tokenizer."""
    result = {}
    for label, tok in (("slow", slow), ("fast", fast)):
        enc = tok(text, text_pair)
        result[label] = {key: enc[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
        result[label]["tokens"] = tok.convert_ids_to_tokens(enc["input_ids"])
    result["slow_equals_fast"] = result["slow"] == result["fast"]
    return result


def tokenizer_cases(slow, fast):
    """Return the tokenizer fixture dict (written to tokenizer_cases.json)."""
    singles = [{"text": text, **encode_both(slow, fast, text)} for text in TOKENIZER_TEXTS]
    pairs = [{"text": a, "text_pair": b, **encode_both(slow, fast, a, b)} for a, b in TOKENIZER_PAIRS]
    candidates = [["alan turing was a pioneer.", "the nile"], ["Paris, France!", "中文 zebra 1912"]]
    batch = {}
    for label, tok in (("slow", slow), ("fast", fast)):
        enc = tok.batch_encode_candidates(candidates, max_length=12, return_tensors="pt")
        batch[label] = {key: enc[key].tolist() for key in ("input_ids", "attention_mask", "token_type_ids")}
    decode_ids = [
        singles[0]["slow"]["input_ids"],
        singles[1]["slow"]["input_ids"],
        pairs[1]["slow"]["input_ids"],
        singles[4]["slow"]["input_ids"],
        [3, 2, 5, 0, 0, 4],
    ]
    decodes = []
    for ids in decode_ids:
        entry = {"ids": ids}
        for skip in (False, True):
            for label, tok in (("slow", slow), ("fast", fast)):
                entry[f"{label}_skip_special_tokens_{str(skip).lower()}"] = tok.decode(ids, skip_special_tokens=skip)
        decodes.append(entry)
    return {
        "description": "RealmTokenizer (slow) and RealmTokenizerFast outputs of transformers 4.57.6 on vocab.txt",
        "tokenizer_kwargs": {"model_max_length": 64},
        "texts": singles,
        "pairs": pairs,
        "batch_encode_candidates": {"text": candidates, "max_length": 12, **batch},
        "decode": decodes,
    }


def case_runner(name, tokenizer, retriever=None):
    """Return a function model -> case book for the class `name`."""
    if name == "openqa":
        return lambda model: openqa_cases(model, tokenizer, retriever)
    return lambda model: CASE_FUNCTIONS[name](model, tokenizer)


CASE_FUNCTIONS = {
    "embedder": embedder_cases,
    "scorer": scorer_cases,
    "knowledge_aug_encoder": knowledge_aug_encoder_cases,
    "reader": reader_cases,
}


def reload_and_check(name, folder_entry, original, expected, tokenizer):
    """Reload a folder with 4.57.6 from_pretrained and assert the saved outputs are reproduced exactly."""
    folder = FIXTURES / folder_entry["path"]
    kwargs = {"output_loading_info": True}
    retriever = None
    if name == "openqa":
        retriever = RealmRetriever.from_pretrained(str(folder))
        kwargs["retriever"] = retriever
    model, info = CLASSES[name].from_pretrained(str(folder), **kwargs)
    model.eval()
    reloaded = model.state_dict()
    original_state = original.state_dict()
    assert set(reloaded) == set(original_state)
    differing = sorted(key for key in original_state if not torch.equal(reloaded[key], original_state[key]))
    book = case_runner(name, tokenizer, retriever)(model)
    assert set(book["tensors"]) == set(expected), (name, folder.name)
    for key, tensor in expected.items():
        assert tensor.dtype == book["tensors"][key].dtype and torch.equal(tensor, book["tensors"][key]), (
            folder.name,
            key,
        )
    return {
        "outputs_reproduced": True,
        "retriever_tokenizer_class": type(retriever.tokenizer).__name__ if retriever is not None else None,
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": [list(map(str, item)) for item in info["mismatched_keys"]],
        "state_dict_keys_differing_from_original": differing,
    }


# --- transformers 4.x API behaviours (fixtures/transformers4_api/) ------------------------------------------------
#
# What 4.x user code calls beyond the models' numbers: the retriever's call with return_tensors "np" and "pt" (types,
# values, special_tokens_mask), numpy indexing of retriever.block_records, a folder written by
# RealmRetriever.save_pretrained (no weights), and what RealmConfig does with fields transformers 5's BERT lacks.

API_FIXTURES = FIXTURES / "transformers4_api"
API_BLOCKS = [
    "alan turing was a pioneer of computer science.",
    "café 中文 in london.",
    "the nile flows through egypt, the nile is long.",
    "paris is the capital of france.",
    "the eiffel tower was built in one year.",
]
# Questions use only in-vocabulary words: 4.x decodes and re-encodes the question, which drops [UNK] pieces.
API_RETRIEVER_CALLS = {
    "answers_in_two_blocks": {
        "block_ids": [0, 2, 1],
        "question": "who is the pioneer in modern computer science?",
        "answers": ["turing", "nile"],
        "max_length": 40,
    },
    "answer_twice_in_one_block_block_cut_by_max_length": {
        "block_ids": [2, 3],
        "question": "which river flows through egypt?",
        "answers": ["nile"],
        "max_length": 16,
    },
    "answer_nowhere": {
        "block_ids": [3, 4],
        "question": "what is the capital of france?",
        "answers": ["turing"],
        "max_length": 40,
    },
    "no_answer_ids": {"block_ids": [4, 1], "question": "where is paris?", "answers": None, "max_length": 40},
}
API_BLOCK_RECORD_KEYS = {
    "int 1": 1,
    "int -1": -1,
    "numpy int64 3": np.int64(3),
    "numpy array [2, 0, 2]": np.array([2, 0, 2]),
    "list [1, 2]": [1, 2],
    "slice 1:3": slice(1, 3),
    "slice ::-2": slice(None, None, -2),
    "numpy array [[0, 1], [3, 4]]": np.array([[0, 1], [3, 4]]),
    "numpy bool mask [T, F, T, F, F]": np.array([True, False, True, False, False]),
}


def describe_value(value):
    """A JSON description of what 4.x returned: type, numpy dtype/shape, and bytes as UTF-8 text."""
    if isinstance(value, bytes):
        return {"type": "bytes", "utf8": value.decode("utf-8")}
    if isinstance(value, np.ndarray):
        elements = {type(item).__name__ for item in value.reshape(-1)}
        return {
            "type": "numpy.ndarray",
            "dtype": str(value.dtype),
            "shape": list(value.shape),
            "element_types": sorted(elements),
            "utf8": np.vectorize(lambda item: item.decode("utf-8"), otypes=[object])(value).tolist(),
        }
    raise TypeError(f"unexpected block_records value {type(value)}")


def describe_concat_inputs(concat):
    """The retriever's concat_inputs: class, and per key its array type, dtype, shape and values."""
    return {
        "class": type(concat).__name__,
        "keys": sorted(concat.keys()),
        "fields": {
            key: {
                "type": f"{type(value).__module__.split('.')[0]}.{type(value).__name__}",
                "dtype": str(value.dtype).replace("torch.", ""),
                "shape": list(value.shape),
                "values": value.tolist(),
            }
            for key, value in sorted(concat.items())
        },
    }


def retriever_call_cases(retriever):
    """Call 4.x's RealmRetriever like RealmForOpenQA does, with return_tensors "np" and "pt"; record everything."""
    tokenizer = retriever.tokenizer
    cases = {}
    for case, spec in API_RETRIEVER_CALLS.items():
        question_ids = tokenizer([spec["question"]], return_tensors="np")["input_ids"]
        answer_ids = None
        if spec["answers"] is not None:
            answer_ids = tokenizer(spec["answers"], add_special_tokens=False).input_ids
        entry = {**spec, "question_input_ids": question_ids.tolist(), "answer_ids": answer_ids, "returns": {}}
        for return_tensors in ("np", "pt"):
            block_ids = np.array(spec["block_ids"]) if return_tensors == "np" else torch.tensor(spec["block_ids"])
            has_answers, start_pos, end_pos, concat = retriever(
                block_ids, question_ids, answer_ids, max_length=spec["max_length"], return_tensors=return_tensors
            )
            entry["returns"][return_tensors] = {
                "block_ids_given_as": type(block_ids).__module__.split(".")[0] + "." + type(block_ids).__name__,
                "has_answers": has_answers,
                "start_pos": start_pos,
                "end_pos": end_pos,
                "label_types": [type(value).__name__ for value in (has_answers, start_pos, end_pos)],
                "concat_inputs": describe_concat_inputs(concat),
            }
        np_fields, pt_fields = (entry["returns"][rt]["concat_inputs"]["fields"] for rt in ("np", "pt"))
        assert all(np_fields[k]["values"] == pt_fields[k]["values"] for k in np_fields), case
        cases[case] = entry
    return cases


def relative_position_config_cases(config):
    """What 4.x does with RealmConfig fields that transformers 5's BertModel does not implement."""
    results = {}
    absolute = RealmEmbedder(config).eval()
    randomize_parameters(absolute, PARAM_SEEDS["embedder"])
    enc = RealmTokenizer(str(FIXTURES / "vocab.txt"))(["alan turing was a pioneer."], return_tensors="pt")
    for value in ("relative_key", "relative_key_query"):
        relative_config = RealmConfig(**{**config.to_dict(), "position_embedding_type": value})
        torch.manual_seed(0)
        relative = RealmEmbedder(relative_config).eval()
        relative.load_state_dict(absolute.state_dict(), strict=False)
        with torch.no_grad():
            difference = (relative(**enc).projected_score - absolute(**enc).projected_score).abs().max().item()
        results[f"position_embedding_type={value}"] = {
            "config_accepted": True,
            "config_value": relative_config.position_embedding_type,
            "saved_in_config_json": relative_config.to_diff_dict().get("position_embedding_type"),
            "extra_state_dict_keys": sorted(set(relative.state_dict()) - set(absolute.state_dict())),
            "max_abs_projected_score_change_with_the_absolute_model_weights": difference,
        }
    pruned_config = RealmConfig(**{**config.to_dict(), "pruned_heads": {0: [1]}})
    pruned = RealmEmbedder(pruned_config)
    results["pruned_heads={0: [1]}"] = {
        "config_accepted": True,
        "layer_0_query_weight_shape": list(pruned.realm.encoder.layer[0].attention.self.query.weight.shape),
        "layer_1_query_weight_shape": list(pruned.realm.encoder.layer[1].attention.self.query.weight.shape),
    }
    return results


def write_transformers4_api_fixtures(config):
    """Write fixtures/transformers4_api/: a folder by 4.x's RealmRetriever.save_pretrained and cases.json."""
    shutil.rmtree(API_FIXTURES, ignore_errors=True)
    folder = API_FIXTURES / "retriever_save_pretrained"
    folder.mkdir(parents=True)
    records = np.array([text.encode("utf-8") for text in API_BLOCKS], dtype=object)
    fast = RealmTokenizerFast(vocab_file=str(FIXTURES / "vocab.txt"), model_max_length=64)
    RealmRetriever(records, fast).save_pretrained(str(folder))
    retriever = RealmRetriever.from_pretrained(str(folder))  # what 4.x user code gets back from that folder
    assert [bytes(r) for r in retriever.block_records] == list(records)
    block_records = {
        key: describe_value(retriever.block_records[index]) for key, index in API_BLOCK_RECORD_KEYS.items()
    }
    cases = {
        "generator": {
            "script": "tests/reference/make_reference_fixtures.py",
            "transformers": transformers.__version__,
        },
        "retriever_folder": {
            "path": folder.name,
            "written_by": "RealmRetriever(np.array(blocks as utf-8 bytes, dtype=object), RealmTokenizerFast)"
            ".save_pretrained(dir)",
            "files": sorted(p.name for p in folder.iterdir()),
            "blocks": API_BLOCKS,
            "loaded_by_4_57_6": {
                "tokenizer_class": type(retriever.tokenizer).__name__,
                "block_records_type": (
                    f"numpy.ndarray {retriever.block_records.dtype} {list(retriever.block_records.shape)}"
                ),
                "num_blocks": len(retriever.block_records),
            },
        },
        "block_records_indexing": block_records,
        "retriever_calls": retriever_call_cases(retriever),
        "config_fields_transformers5_bert_lacks": relative_position_config_cases(config),
    }
    (API_FIXTURES / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return cases


def folder_size(path):
    """Return the total size in bytes of the files under path."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main():
    """Generate every fixture, reload every folder, write the manifest and print a summary.

    With `--only transformers4_api`, (re)write only fixtures/transformers4_api/ and leave every other fixture as is.
    """
    os.environ.setdefault("TRUST_REMOTE_CODE", "True")  # the block_records.npy files read back are our own
    assert transformers.__version__ == "4.57.6", transformers.__version__
    torch.manual_seed(0)
    if sys.argv[1:] == ["--only", "transformers4_api"]:
        cases = write_transformers4_api_fixtures(make_config(len(build_vocab())))
        print(
            f"wrote {API_FIXTURES} ({folder_size(API_FIXTURES) / 1024:.0f} KiB, {len(cases['retriever_calls'])} calls)"
        )
        return
    if sys.argv[1:]:
        raise SystemExit(f"usage: {sys.argv[0]} [--only transformers4_api]")
    shutil.rmtree(FIXTURES, ignore_errors=True)
    FIXTURES.mkdir(parents=True)
    vocab = write_vocab(FIXTURES / "vocab.txt")
    tokenizer = RealmTokenizer(str(FIXTURES / "vocab.txt"), model_max_length=64)
    fast = RealmTokenizerFast(vocab_file=str(FIXTURES / "vocab.txt"), model_max_length=64)
    config = make_config(len(vocab))
    manifest = {
        "generator": {
            "script": "tests/reference/make_reference_fixtures.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
        },
        "vocab_file": "vocab.txt",
        "vocab_size": len(vocab),
        "config": config.to_diff_dict(),
        "attn_implementation": "eager",
        "tokenizer": {
            "class_in_tokenizer_config": "RealmTokenizer",
            "cases_file": "tokenizer_cases.json",
            "tokenizer_used_for_model_cases": "RealmTokenizer (slow), model_max_length=64",
        },
        "conventions": {
            "case_tensor_names": "<case>.<field> in <name>_cases.safetensors",
            "dtypes": (
                "float tensors are float32; ids, positions, block_idx, candidate, start_pos, end_pos are int64; "
                "masks from the tokenizer (attention_mask, special_tokens_mask, mlm_mask) are int64; "
                "block_mask, has_answers, retriever_correct and reader_correct are stored as safetensors BOOL "
                "(torch.bool), not uint8; losses, block_idx and candidate are 0-d tensors"
            ),
            "roles": "input: passed to the model; intermediate: computed by the script; output: the model's output",
            "none_outputs": "fields the 4.57.6 output holds as None (not stored)",
            "json": "non-tensor values of the case (texts, answer_ids as lists of lists of ints, decoded strings)",
            "mode": "eval unless the case says train (dropout is 0.0, so train mode is deterministic too)",
            "exactness": "outputs were reproduced bit-exactly by reloading every folder with 4.57.6 on CPU",
        },
        "parameter_randomization": {
            "seeds": PARAM_SEEDS,
            "rule": (
                "every parameter of named_parameters() (tied ones once, in that order, one torch.Generator): "
                "LayerNorm weights 1 + N(0, 0.2); embedding tables N(0, 0.5); other biases and LayerNorm biases "
                "N(0, 0.1); Linear weights gain * N(0, 1) / sqrt(in_features), gain 2 for attention "
                "query/key/value/output.dense, 1 elsewhere; "
                f"RealmForOpenQA.block_emb N(0, 1) with seed {BLOCK_EMB_SEED}"
            ),
        },
        "models": {},
    }

    openqa_plan = None
    for name, cls in CLASSES.items():
        retriever = None
        if name == "openqa":
            model = build_model(name, config)
            records, rankings, targets = design_block_records(model, tokenizer)
            retriever = RealmRetriever(records, tokenizer)
            model.retriever = retriever
            openqa_plan = {
                "block_records_file": "block_records.npy",
                "block_records": [r.decode("utf-8") for r in records],
                "rankings_top6": rankings,
                "blocks_given_the_answer": targets,
                "retriever_tokenizer_at_generation": "RealmTokenizer (slow)",
            }
        else:
            model = build_model(name, config)
        book = case_runner(name, tokenizer, retriever)(model)
        save_file(book["tensors"], str(FIXTURES / f"{name}_cases.safetensors"), metadata={"format": "pt"})
        folders = {
            "safetensors": save_safetensors_layout(name, model, tokenizer, retriever),
            "hub": save_hub_layout(name, model, tokenizer, retriever),
        }
        expected = load_file(str(FIXTURES / f"{name}_cases.safetensors"))
        for entry in folders.values():
            entry["reload_with_4_57_6"] = reload_and_check(name, entry, model, expected, tokenizer)
        manifest["models"][name] = {
            "class": cls.__name__,
            "parameter_seed": PARAM_SEEDS[name],
            "state_dict_num_keys": len(model.state_dict()),
            "state_dict_alias_groups": state_dict_alias_groups(model.state_dict()),
            "folders": folders,
            "cases_file": f"{name}_cases.safetensors",
            "cases": book["cases"],
        }
        if openqa_plan is not None:
            manifest["models"][name]["retrieval"] = openqa_plan

    (FIXTURES / "tokenizer_cases.json").write_text(
        json.dumps(tokenizer_cases(tokenizer, fast), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (FIXTURES / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    write_transformers4_api_fixtures(config)
    size = folder_size(FIXTURES)
    assert size < MAX_SIZE_BYTES, f"fixtures too large: {size} bytes"
    print(f"wrote {FIXTURES} ({size / 1024:.0f} KiB, vocab {len(vocab)} tokens)")
    for entry in manifest["models"].values():
        print(f"  {entry['class']}: {len(entry['cases'])} cases")
        for layout, folder in entry["folders"].items():
            info = folder["reload_with_4_57_6"]
            print(
                f"    {layout:11s} {folder['num_keys']:3d} keys, reload ok, missing {len(info['missing_keys'])}, "
                f"unexpected {len(info['unexpected_keys'])}, params changed on reload "
                f"{info['state_dict_keys_differing_from_original']}"
            )


if __name__ == "__main__":
    main()
