"""Shared test helpers: the transformers 4.57.6 reference fixtures (see tests/reference/README.md)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "reference" / "fixtures"
MODEL_NAMES = ("embedder", "scorer", "knowledge_aug_encoder", "reader", "openqa")
LAYOUTS = ("safetensors", "hub")


def load_manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def load_cases(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """{case: {field: tensor}} from <name>_cases.safetensors (tensors are named <case>.<field>)."""
    cases: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(FIXTURES / f"{name}_cases.safetensors").items():
        case, field = key.split(".", 1)
        cases.setdefault(case, {})[field] = tensor
    return cases


def fixture_folder(name: str, layout: str) -> Path:
    return FIXTURES / f"{name}_{layout}"


def tiny_config_kwargs() -> dict:
    """The reference fixtures' tiny REALM config."""
    keys = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "retriever_proj_size",
        "span_hidden_size",
        "max_span_width",
        "num_candidates",
        "reader_beam_size",
        "searcher_beam_size",
        "reader_seq_len",
        "num_block_records",
        "max_position_embeddings",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
    )
    config = load_manifest()["config"]
    return {key: config[key] for key in keys}


@pytest.fixture(scope="session")
def manifest() -> dict:
    return load_manifest()


BLOCK_TEXTS = [
    "the nile river flows through egypt and the city of cairo .",
    "paris is the capital city of france .",
    "london is the capital city of england .",
    "alan turing was a pioneer of modern computer science .",
    "the river thames flows through london .",
    "who was born in paris ?",
]


def tiny_realm_config(**overrides):
    from openrealm import RealmConfig

    kwargs = tiny_config_kwargs()
    kwargs.update(num_block_records=len(BLOCK_TEXTS), searcher_beam_size=4)
    kwargs.update(overrides)
    return RealmConfig(**kwargs)


def fixture_tokenizer():
    from openrealm import RealmTokenizer

    return RealmTokenizer.from_pretrained(fixture_folder("embedder", "safetensors"))


def make_openqa_model(seed: int = 0, index_type: str = "exact", **config_overrides):
    """A tiny random RealmForOpenQA whose retriever serves BLOCK_TEXTS (titles "title i") with embeddings computed by
    its own embedder, so retrieval is consistent with the model."""
    from openrealm import BlockRecords, RealmBlockIndex, RealmForOpenQA, RealmRetriever

    torch.manual_seed(seed)
    config = tiny_realm_config(**config_overrides)
    model = RealmForOpenQA(config).eval()
    tokenizer = fixture_tokenizer()
    titles = [f"title {i}" for i in range(len(BLOCK_TEXTS))]
    import tempfile

    records_path = Path(tempfile.mkdtemp()) / "block_records.safetensors"
    records = BlockRecords.write(records_path, zip(titles, BLOCK_TEXTS))
    with torch.no_grad():
        blocks = tokenizer(titles, BLOCK_TEXTS, padding=True, return_tensors="pt")
        block_emb = model.embedder(**blocks).projected_score
    index = RealmBlockIndex.build(block_emb, index_type=index_type)
    model.retriever = RealmRetriever(records, tokenizer, index=index)
    return model
