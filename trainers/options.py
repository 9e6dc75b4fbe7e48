"""The options of the `openrealm` jobs, declared without importing torch, transformers or datasets.

Building a job's parser must not import the job: `openrealm train pretrain --help` then answers at once instead of
after seconds of imports. Each function adds one job's options to its argparse parser; the defaults that the jobs'
own code also uses live here and are imported by the job modules. Three defaults belong to modules that import torch
(masking strategies, MIPS index types, block length): they are spelled out here, and tests keep them equal. The
module is long because every job's options are in it, so that `openrealm JOB --help` imports nothing else.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# train ict (Google's ICT flags)
MASK_RATE = 0.9  # probability of removing the query sentence from its block
ICT_LEARNING_RATE = 1e-4
EMBEDDING_DROPOUT = 0.1  # dropout on the projected retrieval embedding while training (ICT and REALM)
# train pretrain (Google's REALM flags)
PRETRAIN_LEARNING_RATE = 3e-5  # Google's --learning_rate default
NUM_CANDIDATES = 8  # K retrieved blocks per query, the null document included
REFRESH_MODES = ("async", "sync", "off")
PREFLIGHT_STEPS = 300  # steps of `train pretrain --preflight`'s oracle-reader run (trainers/pretraining/preflight.py)
MASKING_STRATEGIES = ("salient", "random_token", "random_span")  # = tokenization.masking.STRATEGIES
# train openqa (ORQA / REALM++)
SEARCHER_BEAM_SIZE = 5000  # ORQA: blocks scored by the retriever loss
READER_BEAM_SIZE = 5  # ORQA: blocks read in training
EVAL_READER_BEAM_SIZE = 100  # REALM++: blocks read at inference
OPENQA_LEARNING_RATE = 1e-5
MIN_PASSAGE_OVERLAP = 0.5  # REALM++: a retrieved block with >= 50% of the gold passage's words is gold
# what `train openqa` writes beside the model, and `push` and the quickstart read back for the model card
OPENQA_SUMMARY_NAME = "openqa_training.json"
OPENQA_DEV_RESULTS_NAME = "dev_results.json"
# quickstart (QUICKSTART_PRESETS = sorted(trainers/quickstart/stages.py: PRESETS))
QUICKSTART_OUTPUT = "realm-quickstart"
QUICKSTART_PRESETS = ("default", "small")
# evaluate
DEFAULT_RECALL_KS = (1, 5, 10, 20)
# corpus build, index build
MAX_BLOCK_LENGTH = 288  # wordpieces per block (Google) = tokenization.corpus.MAX_BLOCK_LENGTH
INDEX_TYPES = ("exact", "flat", "ivf", "hnsw", "ivfpq", "pq")  # = modeling_realm.index_realm.INDEX_TYPES
TSV_QUOTINGS = ("cell", "none", "csv")  # corpus build / add / update --tsv-quoting = tokenization.sources.TSV_QUOTINGS
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # autocast dtypes of index build (torch.<name>)
# train ict, pretrain, openqa: examples dropped (trainers/dropped.py)
WARN_DROPPED_SHARE = 0.5  # the summary line warns when more than half of the examples gave no training signal
MAX_DROPPED_SHARE = 0.9  # --max-dropped-share: more dropped stops the run (under one example in ten trains)
# demo
DEMO_NUM_RETRIEVED = 10  # blocks listed per question = trainers.demo.NUM_RETRIEVED (a file that imports no openrealm)


# The largest seed: transformers' set_seed takes 0..2**32 - 1, and stages seed helpers with seed + 1.
MAX_SEED = 2**31 - 1
# The integers the types below describe by name; any other minimum is "an integer of at least N".
NAMED_MINIMUMS = {0: ("a non-negative integer", "0 or more"), 1: ("a positive integer", "at least 1")}


def _number(text: str, kind: type, expected: str):
    """`text` read as `kind` (int or float), or the argparse error "expected EXPECTED, got 'TEXT'"."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type of an integer of at least `minimum` (a count, a length); "1.5", "nan" and "" are refused, never
    rounded. The message names the minimum: "must be a positive integer (at least 1), got 0"."""
    name, bound = NAMED_MINIMUMS.get(minimum, (f"an integer of at least {minimum}", None))

    def parse(text: str) -> int:
        value = _number(text, int, name)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {name}{f' ({bound})' if bound else ''}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)  # a count that must be at least 1 (a batch size, steps, a beam)
non_negative_int = int_at_least(0)  # a count where 0 means none (checkpoint period, held-out queries)


def seed(text: str) -> int:
    """argparse type of a random seed: an integer from 0 to MAX_SEED (numpy and transformers refuse negative ones)."""
    value = _number(text, int, "an integer seed")
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEED}, got {value}")
    return value


def port(text: str) -> int:
    """argparse type of a TCP port: 1 to 65535."""
    value = _number(text, int, "a port number")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {value}")
    return value


def share(text: str) -> float:
    """argparse type of a share or a probability: a number from 0 to 1 (nan and inf are refused)."""
    value = _number(text, float, "a number from 0 to 1")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {value:g}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type of a learning rate: a finite number of at least 0 (nan and inf would train garbage; 0 keeps the
    weights, a diagnostic)."""
    value = _number(text, float, "a number")
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {value:g}")
    return value


def finite_float(text: str) -> float:
    """argparse type of a number that must be finite (nan and inf are refused); its range is the job's to check."""
    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {value:g}")
    return value


def config_overrides(text: str) -> str:
    """argparse type of --config-overrides "k=v,k=v": the text, once every item is key=value and every key a field of
    RealmConfig (a misspelt key would be stored in config.json and leave the field at its default: a full-size
    model). The values are checked where the config is built (trainers/towers.py), with the model's own fields."""
    from openrealm.trainers.stage_utils import parse_config_overrides  # imports transformers: only when given

    try:
        parse_config_overrides(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def max_dropped_share_option(parser: argparse.ArgumentParser, examples: str) -> None:
    """--max-dropped-share of the training jobs; examples: what the job drops, for the help."""
    parser.add_argument(
        "--max-dropped-share",
        type=share,
        default=MAX_DROPPED_SHARE,
        help=f"stop with an error, saving no model, when more than this share of the {examples} gives no training "
        f"example (default {MAX_DROPPED_SHARE:g}; 1: never); the summary line warns above {WARN_DROPPED_SHARE:g}",
    )


def output_options(parser: argparse.ArgumentParser) -> None:
    """-q/--quiet and -v/--verbose, on every job (`openrealm.trainers.output` applies them)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars or warnings, only errors and the result"
    )
    group.add_argument(
        "-v", "--verbose", action="store_true", help="also the libraries' logs, inner progress bars and load reports"
    )
    group.add_argument("--no-progress", dest="quiet", action="store_true", help=argparse.SUPPRESS)  # former name


def index_param(text: str) -> tuple[str, int]:
    """argparse type of `--index-param NAME=INT`."""
    name, sep, value = text.partition("=")
    if not sep or not value.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=INT (e.g. nlist=4096), got {text!r}")
    return name, int(value)


def quickstart(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm quickstart`."""
    parser.add_argument(
        "--output", default=QUICKSTART_OUTPUT, help=f"folder for everything (default {QUICKSTART_OUTPUT})"
    )
    parser.add_argument("--preset", choices=QUICKSTART_PRESETS, default="default", help="sizes (default: default)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the world, the weights and the data order")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier quickstart's OUTPUT (never a folder holding other files)",
    )
    output_options(parser)


def world(parser: argparse.ArgumentParser) -> None:
    """Arguments of `openrealm world` (generate a synthetic world, optionally with its WordPiece vocabulary)."""
    parser.add_argument("--output", required=True, help="folder to write the world into")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (same seed, same files)")
    defaults = {"people": 120, "organizations": 40, "cities": 40, "rivers": 12, "mountains": 12, "regions": 8}
    for kind, default in defaults.items():
        parser.add_argument(
            f"--num-{kind}", type=positive_int, default=default, help=f"number of {kind} (default {default})"
        )
    parser.add_argument("--questions-per-fact", type=int, default=2, choices=(1, 2), help="question wordings per fact")
    parser.add_argument(
        "--mentions-per-person",
        type=non_negative_int,
        default=0,
        help="meetings per person: names each person in many blocks that do not state what questions ask, and moves "
        "facts' first statements out of their subject's article (default 0: the plain world)",
    )
    parser.add_argument("--tokenizer-output", default=None, help="also train a WordPiece vocabulary into this folder")
    parser.add_argument(
        "--vocab-size", type=positive_int, default=4000, help="WordPiece vocabulary size (default 4000)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a world and a vocabulary written earlier by this command"
    )
    output_options(parser)


def corpus_build(parser: argparse.ArgumentParser) -> None:
    """Arguments of `openrealm corpus build`."""
    input_options(parser)
    parser.add_argument("--output", required=True, help="corpus folder to write (must not exist unless --overwrite)")
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer name or path for AutoTokenizer, e.g. bert-base-uncased or a REALM checkpoint folder",
    )
    parser.add_argument(
        "--max-block-length", type=int_at_least(4), default=MAX_BLOCK_LENGTH, help="wordpieces per block (288)"
    )
    parser.add_argument("--num-proc", type=positive_int, default=1, help="worker processes")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="articles per batch (default 256; 1000 with --passages-as-blocks)",
    )
    parser.add_argument(
        "--spans",
        default="regex",
        help="salient spans: regex (dates, the default), spacy[:MODEL] (NER + dates), a token-classification model "
        "(NER + dates), or none (no spans: `train pretrain` then needs --spans random_token or random_span)",
    )
    parser.add_argument(
        "--no-page-filter", action="store_true", help="keep List of/Index of/Outline of/disambiguation pages"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing corpus at --output")
    parser.add_argument(
        "--passages-as-blocks",
        action="store_true",
        help="each input row is a passage already split (e.g. DPR's psgs_w100.tsv): one block each, cut where it "
        "exceeds --max-block-length, its id (--id-column) kept and shown with answers; corpus add/update follow",
    )
    deduplicate_option(parser, default=True)
    output_options(parser)


def input_options(parser: argparse.ArgumentParser) -> None:
    """--input and how to read it, of corpus build / add / update (tokenization/sources.py; docs/corpus.md)."""
    parser.add_argument(
        "--input",
        required=True,
        nargs="+",
        help="articles: JSONL file(s) ({title, text} per line), Parquet or CSV/TSV file(s) or globs of them, a folder "
        "written by datasets' save_to_disk, or a Hub dataset id",
    )
    parser.add_argument("--title-column", default="title", help="column (JSONL: field) of the titles (default title)")
    parser.add_argument("--text-column", default="text", help="column (JSONL: field) of the texts (default text)")
    parser.add_argument(
        "--id-column",
        default=None,
        help="column of the passage ids kept with --passages-as-blocks (default: id, where the input has it)",
    )
    parser.add_argument("--input-name", default=None, help="configuration of a Hub dataset (e.g. 20231101.en)")
    parser.add_argument(
        "--split", default=None, help="split of a Hub dataset or save_to_disk folder (default: train, or the only one)"
    )
    parser.add_argument(
        "--tsv-quoting",
        choices=TSV_QUOTINGS,
        default="cell",
        help="how a TSV's double quotes are read (docs/corpus.md, TSV quoting): cell (the default) reads one row a "
        'line, split at every tab, and a cell wholly in quotes loses them ("" inside: "), as DPR\'s psgs_w100.tsv is '
        "written; none keeps every cell as written; csv reads CSV's quoting, where a quoted cell may hold tabs and "
        "line breaks",
    )


def deduplicate_option(parser: argparse.ArgumentParser, default: bool | None) -> None:
    """--deduplicate / --no-deduplicate of the corpus commands (docs/corpus.md: duplicate blocks)."""
    parser.add_argument(
        "--deduplicate",
        action=argparse.BooleanOptionalAction,
        default=default,
        help="drop blocks with the same title and text as an earlier block ("
        + ("the default" if default else "default: as the corpus was built, else on")
        + "): REALM pre-training drops every example whose retrieved blocks hold two copies of one; "
        "--no-deduplicate keeps them (counted in corpus_config.json)",
    )


def corpus_add(parser: argparse.ArgumentParser) -> None:
    """Arguments of `openrealm corpus add`."""
    _corpus_edit(parser, "add")


def corpus_update(parser: argparse.ArgumentParser) -> None:
    """Arguments of `openrealm corpus update`."""
    _corpus_edit(parser, "update")


def corpus_remove(parser: argparse.ArgumentParser) -> None:
    """Arguments of `openrealm corpus remove`."""
    _corpus_edit(parser, "remove")


def _corpus_edit(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--corpus", required=True, help="corpus folder (corpus build) or retriever/model folder")
    if command in ("add", "update"):
        input_options(parser)
        parser.add_argument(
            "--embedder",
            default=None,
            help="only for an index without an embedder snapshot: the checkpoint that embedded its blocks",
        )
        parser.add_argument(
            "--spans",
            default="regex",
            help="salient spans of the new blocks, as corpus build's --spans (corpus folders)",
        )
        parser.add_argument("--batch-size", type=positive_int, default=128, help="blocks per forward pass")
        parser.add_argument("--device", default=None, help="where to embed (default cuda if available, else cpu)")
        deduplicate_option(parser, default=None)
    if command == "remove":
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--titles", nargs="+", help="remove every block of these article titles (exact match)")
        which.add_argument("--ids", nargs="+", type=non_negative_int, help="remove these block ids")
    output_options(parser)


def train_ict(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm train ict`."""
    parser.add_argument("--corpus", required=True, help="knowledge-corpus folder (openrealm corpus build)")
    parser.add_argument(
        "--init",
        required=True,
        help="RealmEmbedder folder or Hub id, any BERT checkpoint (e.g. "
        "sentence-transformers/all-MiniLM-L6-v2), or 'random' (sized by --config-overrides)",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="folder for the trained RealmEmbedder + tokenizer (checkpoints go in OUTPUT/checkpoint-*)",
    )
    parser.add_argument(
        "--max-steps", type=positive_int, required=True, help="optimiser steps (Google: 100000 at batch 4096)"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=64,
        help="examples per process; the negatives are the global batch (Google: 4096) (default 64)",
    )
    parser.add_argument(
        "--learning-rate", type=non_negative_float, default=ICT_LEARNING_RATE, help="peak AdamW lr (default 1e-4)"
    )
    parser.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=None,
        help="linear warm-up steps (default Google's min(10000, max(100, max_steps / 10)))",
    )
    parser.add_argument(
        "--query-seq-len",
        type=int_at_least(3),
        default=None,
        help="query wordpieces (default 64, or what the model reads)",
    )
    parser.add_argument(
        "--block-seq-len",
        type=int_at_least(4),
        default=None,
        help="block wordpieces (default 288, or what the model reads)",
    )
    parser.add_argument(
        "--mask-rate",
        type=share,
        default=MASK_RATE,
        help="probability of removing the query sentence from its block (default 0.9)",
    )
    parser.add_argument(
        "--embedding-dropout",
        type=share,
        default=EMBEDDING_DROPOUT,
        help="dropout on the projected embedding while training (default 0.1, as Google)",
    )
    parser.add_argument(
        "--config-overrides",
        type=config_overrides,
        default=None,
        help="RealmConfig fields as k=v,k=v (e.g. hidden_size=64,num_hidden_layers=2,"
        "num_attention_heads=4,intermediate_size=256,retriever_proj_size=32 for --init random)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer of the corpus ids (default: the corpus folder's)")
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of the weights, data order and examples (default 0)"
    )
    parser.add_argument(
        "--logging-steps", type=positive_int, default=50, help="log the loss every N steps (default 50)"
    )
    parser.add_argument(
        "--save-steps", type=non_negative_int, default=1000, help="checkpoint every N steps, 0 = never (default 1000)"
    )
    parser.add_argument(
        "--save-total-limit",
        type=positive_int,
        default=2,
        help="checkpoints kept: the newest N and the one just written (default 2)",
    )
    parser.add_argument("--overwrite", action="store_true", help="train into a non-empty OUTPUT (old checkpoints go)")
    parser.add_argument(
        "--resume-from-checkpoint",
        nargs="?",
        const="last",
        default=None,
        help="resume from OUTPUT's last checkpoint, or from the checkpoint folder given",
    )
    parser.add_argument(
        "--eval-steps",
        type=non_negative_int,
        default=0,
        help="in-batch accuracy on --eval-blocks blocks every N steps, 0 = never (default 0)",
    )
    parser.add_argument("--eval-blocks", type=positive_int, default=1000, help="blocks in the in-batch evaluation set")
    parser.add_argument(
        "--eval-queries",
        type=non_negative_int,
        default=0,
        help="after training, recall@5 of a sentence's own block over the whole corpus with this many "
        "queries (embeds every block; default 0 = skip)",
    )
    parser.add_argument(
        "--num-workers", type=non_negative_int, default=0, help="DataLoader worker processes (default 0)"
    )
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations to save memory")
    parser.add_argument("--report-to", default="none", help="Trainer loggers, e.g. tensorboard, wandb (default none)")
    parser.add_argument(
        "--push-to-hub",
        default=None,
        metavar="REPO_ID",
        help="upload the trained embedder and tokenizer to this Hub repository",
    )
    max_dropped_share_option(parser, "examples of an epoch (expected)")
    output_options(parser)


def train_mlm(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm train mlm`."""
    parser.add_argument("--corpus", required=True, help="knowledge-corpus folder (openrealm corpus build)")
    parser.add_argument(
        "--init",
        required=True,
        help="BERT checkpoint (e.g. sentence-transformers/all-MiniLM-L6-v2, whose MLM head is missing), a REALM "
        "encoder folder, or 'random' (sized by --config-overrides)",
    )
    parser.add_argument("--output", required=True, help="folder for the trained RealmKnowledgeAugEncoder + tokenizer")
    parser.add_argument("--max-steps", type=positive_int, required=True, help="optimiser steps")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="blocks per step and process (default 32)")
    parser.add_argument("--learning-rate", type=non_negative_float, default=5e-5, help="peak AdamW lr (default 5e-5)")
    parser.add_argument(
        "--warmup-steps", type=non_negative_int, default=None, help="default min(10000, max(100, steps / 10))"
    )
    parser.add_argument(
        "--max-seq-len",
        type=int_at_least(4),
        default=None,
        help="wordpieces per block (default 288, or what the model reads)",
    )
    parser.add_argument(
        "--eval-blocks",
        type=non_negative_int,
        default=256,
        help="blocks scored before and after training (default 256; 0 = none)",
    )
    parser.add_argument(
        "--config-overrides",
        type=config_overrides,
        default=None,
        help="RealmConfig fields k=v,... (for --init random)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer of the corpus ids (default: the corpus's)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the weights, data order and masks (default 0)")
    parser.add_argument(
        "--logging-steps", type=positive_int, default=50, help="log the loss every N steps (default 50)"
    )
    parser.add_argument(
        "--save-steps", type=non_negative_int, default=0, help="checkpoint every N steps, 0 = never (default 0)"
    )
    parser.add_argument(
        "--save-total-limit",
        type=positive_int,
        default=2,
        help="checkpoints kept: the newest N and the one just written (default 2)",
    )
    parser.add_argument("--overwrite", action="store_true", help="train into a non-empty OUTPUT (old checkpoints go)")
    parser.add_argument(
        "--resume-from-checkpoint",
        nargs="?",
        const="last",
        default=None,
        help="resume from OUTPUT's last checkpoint, or from the checkpoint folder given",
    )
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--report-to", default="none", help="Trainer loggers, e.g. tensorboard, wandb (default none)")
    max_dropped_share_option(parser, "blocks of an epoch (expected)")
    output_options(parser)


def train_pretrain(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm train pretrain`."""
    parser.add_argument("--corpus", required=True, help="knowledge-corpus folder (openrealm corpus build)")
    parser.add_argument("--embedder", required=True, help="RealmEmbedder (e.g. ICT output) or BERT folder, or random")
    parser.add_argument("--encoder", required=True, help="RealmKnowledgeAugEncoder or BERT folder, or random")
    parser.add_argument("--output", required=True, help="folder for embedder/, encoder/, the tokenizer and index/")
    parser.add_argument(
        "--max-steps", type=positive_int, required=True, help="optimiser steps (paper: 200000 at batch 512)"
    )
    parser.add_argument(
        "--refresh-every", type=non_negative_int, required=True, help="index refresh period in steps (paper ~500)"
    )
    parser.add_argument("--refresh-mode", choices=REFRESH_MODES, default="async", help="async (default), sync or off")
    parser.add_argument(
        "--refresh-lag",
        type=positive_int,
        default=None,
        help="async: swap each new index in exactly this many steps after its snapshot, waiting then if the build has "
        "not ended: a seeded run is reproducible (default: as soon as built, as REALM)",
    )
    parser.add_argument("--index", default=None, help="existing index root built from --embedder (default: build v0)")
    parser.add_argument("--index-root", default=None, help="where index versions go (default OUTPUT/index)")
    parser.add_argument(
        "--shard-index",
        action="store_true",
        help="under accelerate launch, each process holds 1/N of the index and searches are merged across processes",
    )
    parser.add_argument(
        "--index-batch-size", type=positive_int, default=128, help="blocks per forward pass when indexing"
    )
    parser.add_argument(
        "--builder-device",
        default=None,
        help="device of the async index builder (default: a GPU no training process uses, else cuda:0, else cpu)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, help="queries per step (Google local: 4, paper: 512)"
    )
    parser.add_argument(
        "--learning-rate", type=non_negative_float, default=PRETRAIN_LEARNING_RATE, help="peak AdamW lr (default 3e-5)"
    )
    parser.add_argument(
        "--embedder-learning-rate",
        type=non_negative_float,
        default=None,
        help="peak lr of the retriever (default: --learning-rate; lower keeps a small ICT retriever from drifting)",
    )
    parser.add_argument(
        "--freeze-retriever-steps",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="the retriever (embedder) takes no update in the first N steps while the reader trains, as Atlas's "
        "freeze_retriever_steps (default 0: Google's, both from the start)",
    )
    parser.add_argument(
        "--initial-prior-entropy",
        type=finite_float,
        default=None,
        metavar="NATS",
        help="before training, scale the embedder's output LayerNorm so that p(z|x) over the K candidates of sampled "
        "queries has this mean entropy (an initialisation; default: none, the start as loaded)",
    )
    parser.add_argument(
        "--gradient-accumulation-steps", type=positive_int, default=1, help="batches per update (default 1)"
    )
    parser.add_argument(
        "--warmup-steps", type=non_negative_int, default=None, help="default min(10000, max(100, steps / 10))"
    )
    parser.add_argument(
        "--num-candidates", type=int_at_least(2), default=NUM_CANDIDATES, help="K incl. the null doc (8)"
    )
    parser.add_argument(
        "--spans", choices=MASKING_STRATEGIES, default="salient", help="masking strategy (default salient)"
    )
    parser.add_argument("--embedding-dropout", type=share, default=EMBEDDING_DROPOUT, help="(default 0.1)")
    parser.add_argument(
        "--oracle-reader-weight",
        type=share,
        default=0.0,
        metavar="A",
        help="diagnostic, not for training a model: the reader's p(y|z,x) becomes A * an oracle's (sure where the "
        "block holds the masked span, at chance elsewhere) + (1 - A) * the encoder's; 1 trains the retriever alone "
        "(default 0: REALM)",
    )
    parser.add_argument(
        "--hold-out-queries",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="N blocks with a salient span (seeded) give no training query but stay retrievable, for evaluating the "
        "retriever on unseen queries; their ids go to pretraining.json (default 0)",
    )
    parser.add_argument(
        "--config-overrides",
        type=config_overrides,
        default=None,
        help="RealmConfig fields k=v,... (for random models)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer of the corpus ids (default: the corpus's)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the weights, data order and masks (default 0)")
    parser.add_argument("--logging-steps", type=positive_int, default=50, help="log every N steps (default 50)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--report-to", default="none", help="Trainer loggers, e.g. tensorboard, wandb (default none)")
    parser.add_argument(
        "--save-steps", type=non_negative_int, default=None, help="checkpoint every N steps (default: none)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="train into a non-empty OUTPUT (its old checkpoints, index/ and refresh/ go)",
    )
    parser.add_argument(
        "--save-total-limit",
        type=positive_int,
        default=2,
        help="checkpoints kept: the newest N and the one just written (default 2)",
    )
    parser.add_argument(
        "--resume-from-checkpoint",
        nargs="?",
        const="last",
        default=None,
        metavar="PATH|last",
        help="resume from a checkpoint folder, or the newest OUTPUT/checkpoint-N (last; the default value)",
    )
    parser.add_argument("--push-to-hub", default=None, metavar="REPO", help="upload to REPO-{embedder,encoder,scorer}")
    parser.add_argument("--hub-private", action="store_true", help="create the Hub repos private")
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="instead of training: measure whether this run can train its retriever (salient spans stated in other "
        "blocks, answers among the start's K candidates, p(z|x)'s entropy, the reader's utility, a short "
        "oracle-reader "
        "run) and write OUTPUT/preflight.json with a verdict and advice (docs/pretraining.md)",
    )
    parser.add_argument(
        "--preflight-steps",
        type=non_negative_int,
        default=PREFLIGHT_STEPS,
        metavar="N",
        help=f"steps of the pre-flight's oracle-reader run (default {PREFLIGHT_STEPS}; 0: skip it)",
    )
    max_dropped_share_option(parser, "corpus rows read")
    output_options(parser)


def train_openqa(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm train openqa`."""
    parser.add_argument("--model", default=None, help="RealmForOpenQA folder / Hub id, or a pre-training output")
    parser.add_argument("--embedder", default=None, help="RealmEmbedder folder / Hub id (instead of --model)")
    parser.add_argument("--encoder", default=None, help="RealmKnowledgeAugEncoder or BERT folder / Hub id")
    parser.add_argument("--corpus", default=None, help="knowledge-corpus folder (needed when starting from towers)")
    parser.add_argument("--index", default=None, help="index of the embedder's blocks (default: built from --corpus)")
    parser.add_argument("--train", required=True, help="training questions: JSONL file, folder or Hub dataset name")
    parser.add_argument("--dev", default=None, help="dev questions (evaluated before, during and after training)")
    parser.add_argument("--train-split", default="train", help="split of a --train folder or Hub dataset (train)")
    parser.add_argument("--dev-split", default=None, help="split of a --dev folder or Hub dataset (default: auto)")
    parser.add_argument("--output", required=True, help="folder for the fine-tuned RealmForOpenQA")
    parser.add_argument("--overwrite", action="store_true", help="replace the model an earlier run saved in OUTPUT")
    parser.add_argument("--max-steps", type=positive_int, required=True, help="optimiser steps")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="questions per step (ORQA: 1; default 8)")
    parser.add_argument(
        "--gradient-accumulation-steps", type=positive_int, default=1, help="steps per update (default 1)"
    )
    parser.add_argument(
        "--learning-rate", type=non_negative_float, default=OPENQA_LEARNING_RATE, help="peak AdamW lr (default 1e-5)"
    )
    parser.add_argument(
        "--warmup-steps", type=non_negative_int, default=None, help="default min(10000, max(100, steps / 10))"
    )
    parser.add_argument(
        "--searcher-beam-size", type=positive_int, default=SEARCHER_BEAM_SIZE, help="blocks in the retriever loss"
    )
    parser.add_argument(
        "--reader-beam-size", type=positive_int, default=READER_BEAM_SIZE, help="blocks read in training (5)"
    )
    parser.add_argument(
        "--eval-reader-beam-size", type=positive_int, default=EVAL_READER_BEAM_SIZE, help="read at inference"
    )
    parser.add_argument("--eval-steps", type=positive_int, default=None, help="dev evaluation every N steps")
    parser.add_argument(
        "--eval-batch-size", type=positive_int, default=8, help="dev questions per forward pass (default 8)"
    )
    parser.add_argument("--passage-supervision", action="store_true", help="REALM++ gold-passage retriever loss")
    parser.add_argument("--gold-passages", default=None, help="JSONL {id, text} of the gold passages of the rows")
    parser.add_argument("--min-passage-overlap", type=share, default=MIN_PASSAGE_OVERLAP, help="default 0.5")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the span scorer and the data order")
    parser.add_argument("--logging-steps", type=positive_int, default=10, help="log every N steps (default 10)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    parser.add_argument("--report-to", default="none", help="Trainer loggers, e.g. tensorboard (default none)")
    max_dropped_share_option(parser, "training questions read")
    output_options(parser)


def index_build(parser: argparse.ArgumentParser, served: bool = False) -> None:
    """The options of `openrealm index build`. served: those of the refresh's long-lived builder
    (`python -m openrealm.trainers.pretraining.builder serve`), which reads each build's embedder and version from its
    standard input and always writes the versioned layout."""
    if not served:
        parser.add_argument("--embedder", required=True, help="REALM or BERT checkpoint: local folder or Hub repo id")
    parser.add_argument("--corpus", required=True, help="knowledge corpus folder (`openrealm corpus build`)")
    parser.add_argument("--output", required=True, help="index root: writes OUTPUT/vNNNNNN/ (see --layout)")
    parser.add_argument("--index-type", default="exact", choices=INDEX_TYPES, help="MIPS index (default exact)")
    parser.add_argument(
        "--index-param",
        action="append",
        default=[],
        type=index_param,
        metavar="NAME=INT",
        help="index parameter, repeatable (e.g. nlist=4096, nprobe=32, m=32, ef_search=64, pq_m=32)",
    )
    if not served:
        parser.add_argument(
            "--version",
            type=non_negative_int,
            default=None,
            help="index version, >= 0 (default: one past the highest, or 0)",
        )
        parser.add_argument(
            "--layout",
            choices=("versioned", "plain"),
            default="versioned",
            help="versioned: OUTPUT/vNNNNNN/{block_index,build_info.json}; plain: OUTPUT is the index folder itself",
        )
        parser.add_argument(
            "--keep",
            type=positive_int,
            default=None,
            help="keep only the newest KEEP versions and the one written (default all); folders that hold no index "
            "are never removed",
        )
    parser.add_argument(
        "--num-shards",
        type=positive_int,
        default=1,
        help="write an exact index as N files, one per process of a `train pretrain --shard-index` run (default 1)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=128, help="blocks per forward pass, per process")
    parser.add_argument(
        "--max-length",
        type=int_at_least(4),
        default=None,
        help="wordpieces per block (default 288, or what the embedder reads)",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", *DTYPE_NAMES),
        default="auto",
        help="autocast dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    parser.add_argument("--device", default=None, help="default: the process's accelerate device")
    parser.add_argument(
        "--num-workers", type=non_negative_int, default=None, help="input workers (default 2 on CUDA, 0 on CPU)"
    )
    parser.add_argument("--no-sort", action="store_true", help="batch in block order instead of by length")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit, writing nothing, as soon as this process (the one that started the build) is gone (async refresh)",
    )
    output_options(parser)


def evaluate(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm evaluate`."""
    parser.add_argument("--model", required=True, help="RealmForOpenQA folder or Hub repo id (with corpus and index)")
    parser.add_argument("--dataset", required=True, help="QA JSONL file, folder of SPLIT.jsonl, or Hub dataset name")
    parser.add_argument("--output", required=True, help="results JSON to write (metrics and predictions)")
    parser.add_argument("--split", default=None, help="split of a folder or Hub dataset (default: test/validation)")
    parser.add_argument("--dataset-name", default=None, help="name in the results and model card (default: derived)")
    parser.add_argument(
        "--num-blocks", type=positive_int, default=None, help="blocks read per question (default: config)"
    )
    parser.add_argument("--limit", type=positive_int, default=None, help="evaluate only the first N questions")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="questions per forward pass (default 8)")
    parser.add_argument(
        "--recall-k",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_RECALL_KS),
        help="k of recall@k (default 1 5 10 20); a k beyond the corpus size is recall over the whole corpus (noted)",
    )
    parser.add_argument(
        "--retrieval", choices=("dense", "bm25"), default="dense", help="blocks from the model's index or from BM25"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    output_options(parser)


def user_corpus_options(parser: argparse.ArgumentParser) -> None:
    """--corpus and --index of `ask` and `demo`: answer from a corpus of the user's instead of the model's own."""
    parser.add_argument(
        "--corpus",
        default=None,
        help="answer from this corpus folder (openrealm corpus build with the model's tokenizer) instead of the "
        "model's own",
    )
    parser.add_argument(
        "--index",
        default=None,
        help="the corpus's index, built with the model (openrealm index build --embedder MODEL; default "
        "CORPUS/block_index)",
    )


def demo(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm demo`."""
    parser.add_argument(
        "--model",
        required=True,
        help="RealmForOpenQA folder, Hub repo id, or a quickstart output folder (its REALM model and test questions)",
    )
    user_corpus_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: reachable from others)")
    parser.add_argument("--port", type=port, default=7860, help="port to serve on")
    parser.add_argument("--share", action="store_true", help="also open a temporary public gradio.live link")
    parser.add_argument(
        "--num-retrieved",
        type=positive_int,
        default=DEMO_NUM_RETRIEVED,
        help="blocks listed per question (at least those read)",
    )
    parser.add_argument("--example", action="append", default=None, help="an example question (repeatable)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    output_options(parser)


def push(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrealm push`."""
    parser.add_argument("--model", required=True, help="RealmForOpenQA folder (weights, tokenizer, corpus, index)")
    parser.add_argument("--repo-id", required=True, help="Hub repository to create or update (owner/name)")
    parser.add_argument(
        "--eval-results", nargs="*", default=[], help="results JSON(s) of openrealm evaluate, for the model-index"
    )
    parser.add_argument("--training-summary", default=None, help="JSON summary of the fine-tuning run, for the card")
    parser.add_argument(
        "--corpus",
        default=None,
        help="knowledge corpus folder or name, for the card; a corpus folder other than the model's own is uploaded "
        "with the model in place of its own corpus (its index: --index, default CORPUS/block_index)",
    )
    parser.add_argument("--index", default=None, help="the index of --corpus, built with the model")
    parser.add_argument("--datasets", nargs="*", default=None, help="Hub dataset ids to list in the card metadata")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument(
        "--with-demo",
        action="store_true",
        help="also add a Space-ready Gradio app (app.py, openrealm_demo.py, requirements.txt) to the folder",
    )
    parser.add_argument(
        "--readme",
        choices=("keep", "replace"),
        default=None,
        help="a README.md in the folder that openrealm did not write (or that was edited since) is refused, since "
        "the Hub shows it as the model card: keep uploads it as it is (no card, so no results in its metadata), "
        "replace writes openrealm's card over it",
    )
    output_options(parser)


__all__ = [
    "MASK_RATE",
    "ICT_LEARNING_RATE",
    "EMBEDDING_DROPOUT",
    "PRETRAIN_LEARNING_RATE",
    "NUM_CANDIDATES",
    "REFRESH_MODES",
    "PREFLIGHT_STEPS",
    "MASKING_STRATEGIES",
    "SEARCHER_BEAM_SIZE",
    "READER_BEAM_SIZE",
    "EVAL_READER_BEAM_SIZE",
    "OPENQA_LEARNING_RATE",
    "MIN_PASSAGE_OVERLAP",
    "OPENQA_SUMMARY_NAME",
    "OPENQA_DEV_RESULTS_NAME",
    "QUICKSTART_OUTPUT",
    "QUICKSTART_PRESETS",
    "DEFAULT_RECALL_KS",
    "MAX_BLOCK_LENGTH",
    "INDEX_TYPES",
    "DTYPE_NAMES",
    "WARN_DROPPED_SHARE",
    "MAX_DROPPED_SHARE",
    "DEMO_NUM_RETRIEVED",
    "MAX_SEED",
    "int_at_least",
    "positive_int",
    "non_negative_int",
    "seed",
    "port",
    "share",
    "non_negative_float",
    "finite_float",
    "config_overrides",
    "max_dropped_share_option",
    "output_options",
    "index_param",
    "quickstart",
    "world",
    "corpus_build",
    "input_options",
    "deduplicate_option",
    "corpus_add",
    "corpus_update",
    "corpus_remove",
    "train_ict",
    "train_mlm",
    "train_pretrain",
    "train_openqa",
    "index_build",
    "evaluate",
    "demo",
    "push",
    "user_corpus_options",
]
