"""The fixtures several test modules share, and the check that exact comparisons of floats state a reason. Plain
helpers (constants, small models, corpora, command lines) are in helpers.py."""

import ast
import functools
import linecache
import logging
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

# --- Running side by side (pytest-xdist, setup.cfg's addopts) -----------------------------------------------------
# Each worker gets its share of the cores: more threads than cores slows every step severalfold. The longest modules
# go first (with `--dist loadfile --no-loadscope-reorder` each worker takes whole modules in this order), so that the
# quickstart's run does not start last.
LONGEST_FIRST = ("roads/test_quickstart.py", "learning/test_retriever_learns.py")


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # the processes a test starts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank))

    items.sort(key=place)  # stable: the others keep their order


@pytest.fixture(scope="session")
def manifest() -> dict:
    from helpers import load_manifest

    return load_manifest()


@pytest.fixture(scope="module")
def tokenizer():
    """The reference fixtures' tokenizer (tests/reference/), which the tiny models of helpers.py read; a module that
    needs another vocabulary defines its own `tokenizer`."""
    from helpers import fixture_tokenizer

    return fixture_tokenizer()


@pytest.fixture(scope="module")
def world_corpus(tmp_path_factory) -> Path:
    """A small synthetic world (helpers.TINY_WORLD, seed 0: 58 articles, one block each, dates as salient spans) as a
    corpus with its own 2,000-wordpiece vocabulary. For the pre-training and refresh tests."""
    from datasets import Dataset
    from helpers import TINY_WORLD

    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.salient_spans import make_span_annotator
    from openrealm.tokenization.vocab import train_wordpiece_vocab
    from openrealm.trainers.world.synthetic_world import generate_world

    root = tmp_path_factory.mktemp("world")
    world = generate_world(seed=0, **TINY_WORLD)
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=2000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab, span_annotator=make_span_annotator("regex"))
    return root / "corpus"


@pytest.fixture(scope="module")
def quickstart_corpus(tmp_path_factory) -> Path:
    """The quickstart's small world (117 articles, one block each) as a corpus of blocks of at most 64 wordpieces with
    its own 1,000-wordpiece vocabulary."""
    from datasets import Dataset

    from openrealm.tokenization.corpus import build_corpus
    from openrealm.tokenization.vocab import train_wordpiece_vocab
    from openrealm.trainers.quickstart.stages import WORLD
    from openrealm.trainers.world.synthetic_world import generate_world

    root = tmp_path_factory.mktemp("mlm")
    world = generate_world(seed=0, **WORLD)
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=1000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab, max_block_length=64)
    return root / "corpus"


class WaitingWriters(logging.Handler):
    """Sets `event` when a writer says that it waits for another writer of the same folder (file_utils.writer_lock)."""

    def __init__(self, event: threading.Event):
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "Waiting for another writer" in record.getMessage():
            self.event.set()


@pytest.fixture
def waiting():
    """An event set when a writer starts waiting for another one."""
    event = threading.Event()
    handler = WaitingWriters(event)
    logger = logging.getLogger("openrealm.file_utils")
    logger.addHandler(handler)
    yield event
    logger.removeHandler(handler)


# --- Portable float checks -------------------------------------------------------------------------------------------
# Floats computed with other shapes, batch sizes, thread counts or BLAS kernels differ in the last bits between
# machines (and between thread counts on one machine), so a test compares computed floats with a stated tolerance and
# keeps exact equality for what is copied, reloaded or recomputed by the very same call. Every exact comparison of
# floating-point arrays in a test must say which, in a comment `# exact: REASON` on its statement (or the line above);
# one without it fails here, on any machine, instead of only on the machine whose kernels happen to differ.

EXACT_REASON = "# exact:"
_TESTS_DIR = Path(__file__).resolve().parent


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
    while frame is not None and not Path(frame.f_code.co_filename).resolve().is_relative_to(_TESTS_DIR):
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
