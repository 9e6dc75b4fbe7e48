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
