"""The `openrealm` command line (also `python -m openrealm` and `accelerate launch -m openrealm`).

Every command is listed by `openrealm --help`: `convert` and `ask` are declared here, the jobs in JOBS below (their
options in trainers/options.py, so that no job module is imported before its arguments parse). README.md and docs/
show each with an example.

Exit status: 0 done; 1 failed (a checkpoint missing trained weights, a model neither found locally nor loadable from
the Hub, another I/O failure); 2 bad arguments or input (a malformed file, a missing path, an output that would
replace something). Failures and bad input print one line `openrealm: error: MESSAGE` on stderr; set
OPENREALM_DEBUG=1 to get the traceback instead. Any other error keeps its traceback.
"""

import argparse
import builtins
import functools
import importlib
import os
import pickle
import re
import sys

EXIT_STATUS = "exit status: 0 done; 1 failed (e.g. weights missing, a model not found); 2 bad arguments or input"

# (group, command) -> (module whose run(args) does the job, help, the function of openrealm.trainers.options that adds
# the job's options).
JOBS = {
    ("quickstart", None): (
        "openrealm.trainers.jobs.quickstart",
        "the whole REALM lifecycle on a generated world of fictional entities (about 9 min on 2 CPU cores)",
        "quickstart",
    ),
    ("world", None): (
        "openrealm.trainers.jobs.world",
        "generate the synthetic world of fictional entities",
        "world",
    ),
    ("corpus", "build"): (
        "openrealm.trainers.jobs.corpus_build",
        "build a knowledge corpus of blocks from articles or passages (JSONL, Parquet, CSV/TSV, datasets, the Hub)",
        "corpus_build",
    ),
    ("corpus", "add"): (
        "openrealm.trainers.jobs.corpus_edit",
        "add articles to a corpus and its index (a new version)",
        "corpus_add",
    ),
    ("corpus", "remove"): (
        "openrealm.trainers.jobs.corpus_edit",
        "remove blocks by title or id (never retrieved again)",
        "corpus_remove",
    ),
    ("corpus", "update"): (
        "openrealm.trainers.jobs.corpus_edit",
        "replace the blocks of articles with new versions of them",
        "corpus_update",
    ),
    ("train", "ict"): (
        "openrealm.trainers.jobs.train_ict",
        "ICT warm start of the retriever (Inverse Cloze Task)",
        "train_ict",
    ),
    ("train", "mlm"): (
        "openrealm.trainers.jobs.train_mlm",
        "masked-LM training of the encoder on the corpus (BERT's objective; a checkpoint without an MLM head needs "
        "it)",
        "train_mlm",
    ),
    ("train", "pretrain"): (
        "openrealm.trainers.jobs.train_pretrain",
        "REALM pre-training with an index refreshed while it trains (1 CPU or N GPUs)",
        "train_pretrain",
    ),
    ("train", "openqa"): (
        "openrealm.trainers.jobs.train_openqa",
        "open-QA fine-tuning of RealmForOpenQA (ORQA losses, REALM++ options)",
        "train_openqa",
    ),
    ("index", "build"): (
        "openrealm.trainers.jobs.index_build",
        "embed every block of a corpus and write a MIPS index",
        "index_build",
    ),
    ("evaluate", None): (
        "openrealm.trainers.jobs.evaluate",
        "evaluate an open-QA model: exact match, recall@k, reader-oracle (results JSON)",
        "evaluate",
    ),
    ("demo", None): (
        "openrealm.trainers.jobs.demo",
        "a local web page that answers questions and shows the block each answer came from (Gradio)",
        "demo",
    ),
    ("push", None): (
        "openrealm.trainers.jobs.push",
        "upload an open-QA model folder to the Hub with a model card holding its evaluation results",
        "push",
    ),
}


def selected_job(argv: list[str]) -> tuple[str, str | None] | None:
    """The (group, command) of JOBS that argv names (`corpus build ...` -> ("corpus", "build")), else None."""
    words = [word for word in argv if not word.startswith("-")]
    if not words:
        return None
    for group, command in JOBS:
        if words[0] == group and (command is None or words[1:2] == [command]):
            return group, command
    return None


def run_job(module_name: str, args: argparse.Namespace, **kwargs) -> int:
    """Import the job's module (torch, transformers, datasets: seconds) only now that the arguments parsed; kwargs go
    to its run(args, ...)."""
    return importlib.import_module(module_name).run(args, **kwargs)


def run_in_process(words: list[str], argv: list[str], **kwargs) -> int:
    """Run the job `openrealm WORDS ARGV` (e.g. words ["train", "ict"]) in this process, its options parsed as the
    command line parses them, without the command line's error handling (an error raises); kwargs go to its
    run(args, ...) (the pre-training job takes extra callbacks). How one stage runs another: the quickstart, the
    pre-flight check's oracle run."""
    module_name, _, options_name = JOBS[(words[0], words[1] if len(words) > 1 else None)]
    parser = argparse.ArgumentParser(prog=" ".join(["openrealm", *words]))
    getattr(importlib.import_module("openrealm.trainers.options"), options_name)(parser)
    return run_job(module_name, parser.parse_args(argv), **kwargs)


def add_jobs(commands, selected: tuple[str, str | None] | None) -> None:
    """One sub-command per job; grouped jobs (`corpus build`, `train ict`, ...) share their group's parser. Only the
    selected job gets its options, from `openrealm.trainers.options` (no torch, transformers or datasets): neither
    `openrealm --help` nor `openrealm JOB --help` imports a job module."""
    groups = {}
    for (group, command), (module_name, help_text, options) in JOBS.items():
        if command is None:
            parser = commands.add_parser(group, help=help_text, description=help_text)
        else:
            if group not in groups:
                groups[group] = commands.add_parser(group, help=f"{group} jobs").add_subparsers(
                    dest=f"{group}_command", required=True
                )
            parser = groups[group].add_parser(command, help=help_text, description=help_text)
        if (group, command) != selected:
            continue
        getattr(importlib.import_module("openrealm.trainers.options"), options)(parser)
        parser.set_defaults(handler=functools.partial(run_job, module_name))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `openrealm` parser for argv (default sys.argv[1:]): every command is listed, and the options of the job
    argv names are added (so `--help` of a job lists them)."""
    parser = argparse.ArgumentParser(
        prog="openrealm",
        description="REALM for transformers 5.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="convert a transformers 4.x REALM folder to the OpenREALM layout")
    convert.add_argument("source", help="4.x folder or Hub repo id (e.g. google/realm-orqa-nq-openqa)")
    convert.add_argument("destination", help="new folder to write (must not exist unless --overwrite)")
    convert.add_argument("--index-type", default="exact", help="MIPS index over the block embeddings (default exact)")
    convert.add_argument(
        "--overwrite",
        action="store_true",
        help="update DESTINATION, a folder convert wrote (or an empty one): its model files are replaced, other "
        "entries (README.md, .git, checkpoints) kept",
    )
    options = importlib.import_module("openrealm.trainers.options")
    options.output_options(convert)
    convert.set_defaults(handler=run_convert)

    ask = commands.add_parser("ask", help="answer questions with a REALM open-QA model")
    ask.add_argument("--model", required=True, help="folder or Hub repo id of a RealmForOpenQA checkpoint")
    ask.add_argument("question", nargs="*", help="question(s); read from stdin, one per line, when none is given")
    ask.add_argument("--top-k", type=options.positive_int, default=1, help="answers per question")
    ask.add_argument(
        "--num-blocks", type=options.positive_int, default=None, help="blocks read per question (default: config)"
    )
    ask.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    options.user_corpus_options(ask)
    options.output_options(ask)
    ask.set_defaults(handler=functools.partial(run_job, "openrealm.trainers.jobs.ask"))

    add_jobs(commands, selected_job(sys.argv[1:] if argv is None else argv))
    return parser


def run_convert(args: argparse.Namespace) -> int:
    import openrealm

    destination = openrealm.convert_legacy_folder(
        args.source, args.destination, index_type=args.index_type, overwrite=args.overwrite
    )
    print(f"Converted {args.source} -> {destination}")
    return 0


# Errors that mean bad arguments or input (json.JSONDecodeError and openrealm's JsonlError are ValueErrors): exit 2.
BAD_INPUT_ERRORS = (
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
    PermissionError,
)
# Arguments naming a model folder or Hub repo id: a local path that does not exist is reported as such.
MODEL_ARGUMENTS = (
    ("model", "--model"),
    ("source", "SOURCE"),
    ("embedder", "--embedder"),
    ("encoder", "--encoder"),
    ("init", "--init"),
    ("tokenizer", "--tokenizer"),
)
# The most characters of a message printed; OPENREALM_DEBUG=1 shows the whole of it.
MESSAGE_LIMIT = 600
# Characters a terminal may act on (ESC sequences, carriage return, C1 controls); tab and newline print as they are.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The last line of a Python traceback: the exception's class and message ("ValueError: ...").
TRACEBACK_ERROR = re.compile(r"^([A-Za-z_][\w.]*): (.+)$")


def classify_error(error: BaseException) -> tuple[int, str] | None:
    """(exit status, message) of an error the command line reports in one line, or None for an error that keeps its
    traceback (a bug). Errors of the libraries that mean a bad file get openrealm's words: a field of a config
    (huggingface_hub's strict dataclasses), a pickle that torch refuses to unpickle, a damaged safetensors file."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    from openrealm.modeling_realm import MissingWeightsError
    from openrealm.retrieval_realm import refused_pickle_error

    if isinstance(error, MissingWeightsError):  # a checkpoint that would train or answer with random weights
        return 1, str(error)
    if isinstance(error, pickle.UnpicklingError):  # never torch's advice to load it with weights_only=False
        return 2, str(refused_pickle_error("a weights file", error))
    if isinstance(error, StrictDataclassError):
        return 2, f"RealmConfig: {error.__cause__ or error}"
    if isinstance(error, SafetensorError):  # a full disk (os error 28) while writing, else a damaged file
        return (1 if "os error" in str(error) else 2), f"safetensors: {error}"
    if isinstance(error, BAD_INPUT_ERRORS):
        return wrapped_error(str(error)) or (2, str(error))
    if isinstance(error, OSError):  # e.g. neither a local folder nor a loadable Hub repo, no network, disk full
        return 1, str(error)
    if out_of_memory(error):  # a model or batch larger than this machine (sizes no machine holds are refused first)
        return 1, f"out of memory: {error}"
    return None


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: Python's MemoryError, torch's CPU allocator ("can't allocate
    memory") or CUDA's OutOfMemoryError."""
    if isinstance(error, MemoryError):
        return True
    torch = sys.modules.get("torch")  # a torch error needs torch loaded; the command line does not import it
    cuda_oom = torch is not None and isinstance(error, torch.OutOfMemoryError)
    return cuda_oom or (isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def wrapped_error(text: str) -> tuple[int, str] | None:
    """(exit status, message) of the error inside a message that carries a traceback, as transformers' pipeline()
    reports a failed model load ("Could not load model ... See the original errors: ... Traceback ..."): the
    exception line of the first traceback's last exception. None for a message without a traceback."""
    if "Traceback (most recent call last):" not in text:
        return None
    first = text.split("while loading with ")[1] if "while loading with " in text else text
    found = [match for match in map(TRACEBACK_ERROR.match, first.splitlines()) if match]
    if not found:
        return None
    name, message = found[-1].groups()
    builtin = getattr(builtins, name.rsplit(".", 1)[-1], None)
    failed = name.endswith("MissingWeightsError") or (
        isinstance(builtin, type) and issubclass(builtin, OSError) and not issubclass(builtin, BAD_INPUT_ERRORS)
    )
    return (1 if failed else 2), message


def printable(text: str) -> str:
    """text with its control characters other than tab and newline (a terminal's escape sequences, from a corpus or
    a file) shown as \\xNN escapes instead of being sent to the terminal."""
    return CONTROL_CHARACTERS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def one_line(message: str) -> str:
    """The message's lines joined into one, printable, cut to MESSAGE_LIMIT characters."""
    message = printable(" ".join(line.strip() for line in message.splitlines() if line.strip()))
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 1].rstrip() + "… (OPENREALM_DEBUG=1 prints it whole)"
    return message


def report_error(error: BaseException, status: int, message: str | None = None) -> int:
    """Print `openrealm: error: MESSAGE` (one line; default the error's text) on stderr and return status; re-raise
    when OPENREALM_DEBUG=1."""
    if os.environ.get("OPENREALM_DEBUG") == "1":
        raise error
    message = one_line(str(error) if message is None else message) or type(error).__name__
    print(f"openrealm: error: {message}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run one command; see the module docstring for the exit status."""
    args = build_parser(argv).parse_args(argv)
    import openrealm
    from openrealm.trainers import output

    openrealm.register_with_transformers()  # deferred by the package root for this command line (fast --help)
    from openrealm.trainers.towers import check_model_folder

    try:
        for name, flag in MODEL_ARGUMENTS:
            if isinstance(getattr(args, name, None), str):
                check_model_folder(getattr(args, name), flag)
        with output.configured(args):  # --quiet / --verbose: the libraries' logs and progress bars
            return args.handler(args)
    except Exception as error:
        classified = classify_error(error)
        if classified is None:
            raise
        return report_error(error, *classified)


__all__ = [
    "JOBS",
    "build_parser",
    "main",
    "run_in_process",
]


if __name__ == "__main__":
    sys.exit(main())
