"""Shared test helpers: the transformers 4.57.6 reference fixtures (see tests/reference/README.md)."""

import ast
import functools
import json
import linecache
import sys
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


# --- Portable float checks ---------------------------------------------------------------------------------------------
# Floats computed with other shapes, batch sizes, thread counts or BLAS kernels differ in the last bits between
# machines (and between thread counts on one machine), so a test compares computed floats with a stated tolerance and
# keeps exact equality for what is copied, reloaded or recomputed by the very same call. Every exact comparison of
# floating-point arrays in a test must say which, in a comment `# exact: REASON` on its statement (or the line above);
# one without it fails here, on any machine, instead of only on the machine whose kernels happen to differ.

EXACT_REASON = "# exact:"
_TESTS_DIR = Path(__file__).resolve().parent


def small_world_corpus(root: Path) -> Path:
    """root/corpus: a small synthetic world (58 articles, one block each, dates as salient spans) with its own
    2,000-wordpiece vocabulary in root/vocab. For the pre-training and refresh tests."""
    from datasets import Dataset

    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.salient_spans import make_span_annotator
    from openrealm.tokenization.vocab import train_wordpiece_vocab
    from openrealm.trainers.world.synthetic_world import generate_world

    world = generate_world(
        seed=0, num_people=20, num_organizations=6, num_cities=6, num_rivers=2, num_mountains=2, num_regions=2
    )
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=2000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab, span_annotator=make_span_annotator("regex"))
    return root / "corpus"


def assert_same_top_k(actual, expected, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Two searches' (scores [Q, k], ids [Q, k]) agree: scores within the tolerance, ids exactly, except that ids
    whose scores lie within the tolerance of each other (a near-tie another kernel may order either way) need only
    agree as a set, and a near-tie cut by k only in its scores."""
    (scores, ids), (expected_scores, expected_ids) = actual, expected
    torch.testing.assert_close(scores, expected_scores, rtol=rtol, atol=atol)
    for row, (got, want, want_scores) in enumerate(zip(ids.tolist(), expected_ids.tolist(), expected_scores.tolist())):
        tolerance = [atol + rtol * abs(score) for score in want_scores]
        start = 0
        for end in range(1, len(want) + 1):  # groups of consecutive scores closer than the tolerance
            if end < len(want) and want_scores[end - 1] - want_scores[end] <= tolerance[end]:
                continue
            cut = end == len(want) and end - start > 1
            assert cut or sorted(got[start:end]) == sorted(want[start:end]), (
                f"row {row}: ids {got} != {want} at ranks {start}..{end - 1}"
            )
            start = end


def _is_float_array(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() or value.is_complex()
    dtype = getattr(value, "dtype", None)
    return getattr(dtype, "kind", "") in ("f", "c")


@functools.cache
def _statement_lines(filename: str) -> list[tuple[int, int]]:
    """(first line - 1, last line) of every statement of a test file: the lines whose comments justify it."""
    tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    return [(node.lineno - 1, node.end_lineno) for node in ast.walk(tree) if isinstance(node, ast.stmt)]


def _justified(filename: str, line: int) -> bool:
    """Whether the innermost statement holding `line` of `filename` (or the line above it) carries `# exact:`."""
    spans = [(first, last) for first, last in _statement_lines(filename) if first < line <= last]
    first, last = min(spans, key=lambda span: span[1] - span[0], default=(line - 1, line))
    return any(EXACT_REASON in linecache.getline(filename, number) for number in range(max(first, 1), last + 1))


def _check_exact_float_comparison(name: str, *values) -> None:
    """Fail an unjustified exact comparison of float arrays made by a test (calls from library code pass)."""
    if not any(_is_float_array(value) for value in values):
        return
    frame = sys._getframe(2)
    while frame is not None and Path(frame.f_code.co_filename).resolve().parent != _TESTS_DIR:
        if "site-packages" not in frame.f_code.co_filename and "/torch/" not in frame.f_code.co_filename:
            return  # called by openrealm itself (or a benchmark), not by a test
        frame = frame.f_back
    if frame is None or Path(frame.f_code.co_filename).name == "conftest.py":
        return
    if not _justified(frame.f_code.co_filename, frame.f_lineno):
        pytest.fail(
            f"{frame.f_code.co_filename}:{frame.f_lineno}: {name} compares floating-point values exactly. Computed "
            "floats differ in the last bits across shapes, thread counts and CPUs: compare them with a stated "
            f"tolerance (torch.testing.assert_close), or, for values copied, reloaded or recomputed by the same call, "
            f"say so in a comment `{EXACT_REASON} REASON` on the statement.",
            pytrace=False,
        )


def _guarded(name: str, function):
    @functools.wraps(function)
    def guarded(*args, **kwargs):
        _check_exact_float_comparison(name, *args[:2])
        return function(*args, **kwargs)

    return guarded


def _guarded_assert_close(function):
    @functools.wraps(function)
    def assert_close(actual, expected, *args, **kwargs):
        if kwargs.get("atol") == 0 and kwargs.get("rtol") == 0:
            _check_exact_float_comparison("assert_close(atol=0, rtol=0)", actual, expected)
        return function(actual, expected, *args, **kwargs)

    return assert_close


@pytest.fixture(autouse=True, scope="session")
def _exact_float_comparisons_need_a_reason():
    """Route the exact comparisons tests use through _check_exact_float_comparison for the whole session."""
    import numpy as np

    patches = [
        (torch, "equal"),
        (torch.Tensor, "equal"),
        (np, "array_equal"),
        (np.testing, "assert_array_equal"),
        (np.testing, "assert_equal"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name in patches]
    for owner, name, function in originals:
        setattr(owner, name, _guarded(f"{getattr(owner, '__name__', 'Tensor')}.{name}", function))
    torch.testing.assert_close, original_assert_close = (
        _guarded_assert_close(torch.testing.assert_close),
        torch.testing.assert_close,
    )
    yield
    for owner, name, function in originals:
        setattr(owner, name, function)
    torch.testing.assert_close = original_assert_close
