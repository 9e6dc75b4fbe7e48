"""Plain helpers the test modules share: constants, small models, corpora and command lines (the fixtures several
modules share are in conftest.py). A test module imports what it shares from here, never from another test module."""

import errno
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from huggingface_hub.utils import filter_repo_objects
from safetensors.torch import load_file
from transformers import AutoTokenizer

from openrealm import RealmConfig, RealmEmbedder
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.retriever_inputs import block_retriever_inputs
from openrealm.tokenization.salient_spans import make_span_annotator
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import cli
from openrealm.trainers.embedding import exact_index
from openrealm.trainers.indexing import build_index
from openrealm.trainers.pretraining import RealmPretrainingExamples
from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, held_out_query_blocks, recall_at_k
from openrealm.trainers.pretraining.refresh import IndexRefreshCallback
from openrealm.trainers.stage_utils import parse_config_overrides
from openrealm.trainers.towers import load_embedder, save_tower
from openrealm.trainers.world.synthetic_world import generate_world

# --- The transformers 4.57.6 reference fixtures (tests/reference/README.md) ------------------------------------------

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


BLOCK_TEXTS = [
    "the nile river flows through egypt and the city of cairo .",
    "paris is the capital city of france .",
    "london is the capital city of england .",
    "alan turing was a pioneer of modern computer science .",
    "the river thames flows through london .",
    "who was born in paris ?",
]


def tiny_realm_config(**overrides) -> RealmConfig:
    """The reference fixtures' config (the fixture tokenizer's 158 wordpieces), retrieving from BLOCK_TEXTS."""
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
    records_path = Path(tempfile.mkdtemp()) / "block_records.safetensors"
    records = BlockRecords.write(records_path, zip(titles, BLOCK_TEXTS))
    with torch.no_grad():
        blocks = tokenizer(titles, BLOCK_TEXTS, padding=True, return_tensors="pt")
        block_emb = model.embedder(**blocks).projected_score
    index = RealmBlockIndex.build(block_emb, index_type=index_type)
    model.retriever = RealmRetriever(records, tokenizer, index=index)
    return model


# --- The tiny towers of the training jobs ----------------------------------------------------------------------------
# Towers over a corpus's own vocabulary, small enough for a CPU test; a test that needs other sizes states only what it
# changes.

TINY_MODEL = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "retriever_proj_size": 16,
}


def tiny_fields(**changes) -> dict:
    """TINY_MODEL with `changes` applied (a change to None drops the field), as config keyword arguments."""
    return {key: value for key, value in {**TINY_MODEL, **changes}.items() if value is not None}


def tiny_overrides(**changes) -> str:
    """tiny_fields(**changes) as a `--config-overrides` value: "hidden_size=32,num_hidden_layers=1,..."."""
    return ",".join(f"{key}={value}" for key, value in tiny_fields(**changes).items())


TINY = tiny_overrides()
# Pre-training's joint input is a 96-wordpiece query and a 288-wordpiece block: 384 positions.
TINY_PRETRAIN = tiny_overrides(max_position_embeddings=384)
# The towers of TinyWorld's runs (test_retriever_learns.py, test_preflight.py): no dropout, 128 positions.
TINY_NO_DROPOUT = tiny_overrides(hidden_dropout_prob=0, attention_probs_dropout_prob=0, max_position_embeddings=128)


def job_argv(job: str, corpus: Path, output: Path, max_steps: int, kept: int = 5) -> list[str]:
    """`openrealm train JOB` (ict or mlm) at a tiny size, saving a checkpoint every step and keeping `kept`."""
    argv = ["train", job, "--corpus", str(corpus), "--init", "random", "--output", str(output), "--batch-size", "4"]
    argv += ["--config-overrides", TINY, "--max-steps", str(max_steps), "--warmup-steps", "1", "--save-steps", "1"]
    argv += ["--save-total-limit", str(kept)]
    if job == "ict":
        return argv + ["--no-progress", "--query-seq-len", "16", "--block-seq-len", "64"]
    return argv + ["--quiet", "--max-seq-len", "64", "--eval-blocks", "0"]


# --- A corpus in the fixture tokenizer's wordpieces, and its embedder ------------------------------------------------

# Titles of different lengths and one long body, so batches mix lengths and padding.
TITLES = ["the nile", "paris", "london city", "alan turing", "the river thames", "paris", "science"]
TEXTS = [*BLOCK_TEXTS, " ".join(BLOCK_TEXTS)]


def write_corpus(directory: Path, titles=TITLES, texts=TEXTS) -> Path:
    """A knowledge corpus folder (openrealm corpus build) with one block per article."""
    build_corpus(Dataset.from_dict({"title": titles, "text": texts}), directory, fixture_tokenizer())
    return directory


def tiny_embedder(seed: int = 0, **overrides) -> RealmEmbedder:
    """A random embedder of the reference fixtures' config that reads 288-wordpiece blocks."""
    torch.manual_seed(seed)
    return RealmEmbedder(tiny_realm_config(max_position_embeddings=288, **overrides)).eval()


def direct_embedding(embedder: RealmEmbedder, title: str, text: str) -> torch.Tensor:
    """One block, unpadded, straight through the embedder -> [P]."""
    tokenizer = fixture_tokenizer()
    title_ids, token_ids = (tokenizer(s, add_special_tokens=False)["input_ids"] for s in (title, text))
    inputs = block_retriever_inputs(title_ids, token_ids, tokenizer, max_length=288)
    with torch.no_grad():
        return embedder(
            input_ids=torch.tensor([inputs["input_ids"]]), token_type_ids=torch.tensor([inputs["token_type_ids"]])
        ).projected_score[0]


def duplicated_integer_blocks(num_blocks: int = 40, dim: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of small integers in which block 5 appears 6 times (ids 5, 11, 12, 23, 30, 38), and a query equal to it:
    inner products of small integers are exact in float32 on every kernel, so the copies tie exactly."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(-3, 4, (num_blocks, dim), generator=g).float()
    blocks[[11, 12, 23, 30, 38]] = blocks[5].clone()
    return blocks, blocks[5:6].clone()


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


# --- Synthetic worlds ------------------------------------------------------------------------------------------------

# A world of 20 people, 6 organizations and 6 cities: about 60 articles.
TINY_WORLD = dict(num_people=20, num_organizations=6, num_cities=6, num_rivers=2, num_mountains=2, num_regions=2)
HELD_OUT_BLOCKS, QUERIES_PER_BLOCK, RECALL_K = 15, 4, 5


class TinyWorld:
    """A 20-person world (about 65 blocks of 64 wordpieces; `synthetic_world`, its facts), its corpus, a random-start
    embedder and held-out queries."""

    def __init__(self, root: Path, seed: int = 0):
        world = generate_world(seed=seed, **TINY_WORLD)
        tokenizer = train_wordpiece_vocab(world.texts(), root / "tokenizer", vocab_size=600)
        articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
        self.corpus = root / "corpus"
        build_corpus(
            articles,
            self.corpus,
            tokenizer,
            max_block_length=64,
            span_annotator=world.span_annotator(),
            progress=False,
        )
        self.tokenizer, self.blocks = AutoTokenizer.from_pretrained(self.corpus), load_corpus(self.corpus)
        self.start = root / "start"
        embedder = load_embedder("random", self.tokenizer, parse_config_overrides(TINY_NO_DROPOUT), seed)
        save_tower(embedder, self.start, self.tokenizer)
        held = held_out_query_blocks(self.blocks, HELD_OUT_BLOCKS, seed)
        self.queries = fixed_masked_queries(
            self.tokenizer,
            self.blocks,
            num_queries=HELD_OUT_BLOCKS,
            seed=seed + 1,
            block_ids=held,
            queries_per_block=QUERIES_PER_BLOCK,
        )
        self.root, self.seed, self.synthetic_world = root, seed, world

    def recall(self, embedder_dir: Path) -> float:
        """Held-out recall@5 of the embedder in `embedder_dir` over a fresh exact index of every block."""
        return self.recall_of(RealmEmbedder.from_pretrained(embedder_dir).eval())

    def recall_of(self, embedder: RealmEmbedder) -> float:
        """Held-out recall@5 of `embedder` (in eval mode) over a fresh exact index of every block."""
        return recall_at_k(embedder, exact_index(embedder, self.blocks, self.tokenizer), self.queries, RECALL_K)


# --- REALM pre-training over a world's corpus ------------------------------------------------------------------------


def tiny_embedder_for(tokenizer) -> RealmEmbedder:
    """A random TINY_PRETRAIN embedder (seed 0) over `tokenizer`'s vocabulary."""
    torch.manual_seed(0)
    return RealmEmbedder(RealmConfig(vocab_size=len(tokenizer), **parse_config_overrides(TINY_PRETRAIN)))


def setup_refresh(corpus: Path, root: Path, mode: str, refresh_every: int = 2, **kwargs):
    """(training embedder, examples over index v0, callback) with index v0 built from the embedder into root."""
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    embedder = tiny_embedder_for(tokenizer)
    index = build_index(embedder, corpus, root, version=0, keep=3, progress=False)
    examples = RealmPretrainingExamples(tokenizer, load_corpus(corpus), embedder, index)
    callback = IndexRefreshCallback(examples, corpus, root, refresh_every, mode, **kwargs)
    return embedder, examples, callback


def weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Bit for bit: the snapshots and reloads compared are copies, and any training step changes some weight."""
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # exact: above


def small_corpus(corpus: Path, output: Path, texts: list[str], spans: str = "regex") -> Path:
    """A corpus of one block per text (titles "Article i"), tokenized with the world's vocabulary."""
    articles = Dataset.from_list([{"title": f"Article {i}", "text": text} for i, text in enumerate(texts)])
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    build_corpus(articles, output, tokenizer, span_annotator=make_span_annotator(spans))
    return output


UNDATED = [f"The river number {i} flows past the city and into the sea." for i in range(8)]
DATED = [f"In March {1900 + i} the river number {i} was named by the city." for i in range(10)]


def repeated_corpus(corpus: Path, output: Path, texts: list[str], copies: int) -> Path:
    """`copies` copies of the articles "Article i" (one block each), duplicates kept (--no-deduplicate)."""
    rows = [{"title": f"Article {i}", "text": text} for i, text in enumerate(texts)] * copies
    tokenizer = AutoTokenizer.from_pretrained(corpus)
    annotator = make_span_annotator("regex")
    build_corpus(Dataset.from_list(rows), output, tokenizer, span_annotator=annotator, deduplicate=False)
    return output


def pretrain_argv(
    corpus: Path, output: Path, *extra: str, refresh_every: int = 100, refresh_mode: str = "off"
) -> list[str]:
    """`train pretrain`'s options with random TINY_PRETRAIN towers, then `extra`."""
    argv = ["--corpus", str(corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--refresh-every", str(refresh_every), "--refresh-mode", refresh_mode]
    argv += ["--config-overrides", TINY_PRETRAIN, "--no-progress"]
    return argv + ["--index-batch-size", "32", *extra]


def cli_pretrain(corpus: Path, output: Path, *extra: str) -> int:
    """`openrealm train pretrain` in-process with pretrain_argv's options; its exit status."""
    return cli.main(["train", "pretrain", *pretrain_argv(corpus, output, *extra)])


# --- Processes a test starts ----------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it), for a server or a process group a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The environment of an accelerate_launch: no GPU, one thread per process (the processes share the cores).
ACCELERATE_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def accelerate_launch(num_processes: int = 2) -> list[str]:
    """`accelerate launch` of num_processes CPU processes, as argv up to the script: with no visible GPU `--multi_gpu`
    runs torchrun + gloo on CPU (`--cpu` would start one process). Each launch gets its own free port, so launches of
    tests running side by side (pytest-xdist) do not meet on torchrun's default 29500."""
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
        "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
        "--dynamo_backend", "no",
    ]  # fmt: skip


# --- Writers of one folder -------------------------------------------------------------------------------------------


WAIT_SECONDS = 120  # a safety net against a hang: every wait on an event ends long before
# Holds the writer lock of the folder argv[1] until a line arrives on its stdin; prints "held" once it has it.
LOCK_HOLDER = """
import sys
from openrealm.file_utils import writer_lock
with writer_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""
FACT = {"title": "zorblax", "text": "zorblax is a fictional moon of saturn , found in 2031 by the kepler team ."}


def files_under(folder: Path) -> dict[str, bytes]:
    """{relative path: content} of every file under folder (what a refused command must leave as it was)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def write_jsonl(path, rows) -> str:
    """rows (dicts) as a JSONL file at path (UTF-8); returns its path as a str."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def answers_for(tokenizer, *texts) -> list[list[int]]:
    """The wordpiece ids of each answer text, without special tokens (what answer_ids takes per question)."""
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


class RecordingHfApi:
    """Stands in for huggingface_hub.HfApi: records the repos created and the files each upload would send."""

    def __init__(self):
        self.repos, self.uploads = [], {}

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.repos.append((repo_id, private))

    def upload_folder(self, repo_id, folder_path, commit_message=None, ignore_patterns=None):
        folder = Path(folder_path)
        paths = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
        kept = filter_repo_objects(paths, ignore_patterns=ignore_patterns)  # as upload_folder filters
        self.uploads[repo_id] = {path: (folder / path).read_bytes() for path in kept}
        return f"https://huggingface.co/{repo_id}/commit/0"


# --- Bad input: a one-sentence world and what the CLI says --------------------------------------------------------


NILE_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "nile", "paris", "london", "is", "a", "city"]


NILE_ARTICLE = {"title": "nile", "text": "The nile is a city."}


def write_lines(path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def one_error_line(capsys) -> str:
    """The error line of the CLI's stderr, checked to be its only `openrealm: error:` line (the last one; progress
    bars may come before it) with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], err
    assert lines[-1].startswith("openrealm: error: "), err
    return lines[-1]


def refused_argument(argv: list[str], capsys) -> str:
    """The error line of `openrealm ARGV` refused by its parser: exit 2, no traceback, one line with "error:" (the
    last; argparse prints the usage above it), e.g. "openrealm train ict: error: argument --seed: ..."."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert [line for line in lines if "error:" in line] == lines[-1:], err
    return lines[-1]


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def evaluate_argv(tmp_path, *extra: str) -> list[str]:
    dataset = write_lines(tmp_path / "qa.jsonl", '{"question": "where does the nile flow ?", "answers": ["egypt"]}')
    return ["evaluate", "--model", str(tmp_path / "model"), "--dataset", dataset, "--no-progress", *extra]


def write_config(folder, **fields) -> str:
    """A model folder holding only config.json: the tiny REALM config with `fields` replaced."""
    folder.mkdir()
    config = {**tiny_config_kwargs(), "model_type": "realm", "architectures": ["RealmForOpenQA"], **fields}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


def model_copy(saved_model, tmp_path) -> str:
    return str(shutil.copytree(saved_model, tmp_path / "model"))
