"""Open-domain QA evaluation as in ORQA / REALM (language/orqa/utils/eval_utils.py): exact match after answer
normalisation (regex match for CuratedTrec), retrieval recall@k, reader-oracle; QA datasets from JSONL or the Hub.
The `openrealm evaluate` job is trainers/jobs/evaluate.py.

Scores are percentages (0-100), as the papers report them.
"""

from __future__ import annotations

import json
import os
import re
import string
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from openrealm.file_utils import write_text_atomic
from openrealm.tokenization.jsonl import iter_jsonl, json_type
from openrealm.tokenization.sources import is_hub_name, load_hub_dataset
from openrealm.trainers.options import DEFAULT_RECALL_KS
from openrealm.trainers.stage_utils import eval_mode

METRIC_SCRIPT = Path(__file__).parent / "metrics" / "realm_open_qa" / "realm_open_qa.py"
# Splits tried, in order, when a Hub dataset is named without one: evaluation splits first.
EVALUATION_SPLITS = ("test", "validation", "dev", "train")
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


# ---------------------------------------------------------------------------------------------------------------------
# Answer matching
# ---------------------------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """ORQA's `eval_utils.normalize_answer`: Unicode NFD, lowercase, ASCII punctuation removed, articles a/an/the
    removed, whitespace collapsed."""
    text = unicodedata.normalize("NFD", text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, references: Sequence[str]) -> bool:
    """True when the normalised prediction equals one of the normalised references."""
    prediction = normalize_answer(prediction)
    return any(prediction == normalize_answer(reference) for reference in references)


def _compile(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error:
        return None  # ORQA counts an invalid pattern as wrong


def regex_match(prediction: str, patterns: Sequence[str]) -> bool:
    """CuratedTrec scoring (ORQA): one of the patterns matches at the start of the prediction (`re.match`,
    case-insensitive; not a full match). An invalid pattern never matches."""
    compiled = (_compile(pattern) for pattern in patterns)
    return any(pattern is not None and pattern.match(prediction) is not None for pattern in compiled)


def has_answer(text: str, answers: Sequence[str], match: str = "string") -> bool:
    """Does a block contain an answer? string: the normalised answer's words appear contiguously in the normalised
    text; regex: `re.search` of a pattern anywhere in the text (case-insensitive)."""
    if match == "regex":
        compiled = (_compile(pattern) for pattern in answers)
        return any(pattern is not None and pattern.search(text) is not None for pattern in compiled)
    if match != "string":
        raise ValueError(f"match must be 'string' or 'regex', got {match!r}")
    words = normalize_answer(text).split()
    for answer in answers:
        answer_words = normalize_answer(answer).split()
        width = len(answer_words)
        if width and any(words[i : i + width] == answer_words for i in range(len(words) - width + 1)):
            return True
    return False


def load_openqa_metric(**kwargs):
    """The `evaluate` metric shipped with openrealm: `compute(predictions=[str], references=[[str]], regex=False)`
    -> {"exact_match": percent}."""
    import evaluate

    return evaluate.load(str(METRIC_SCRIPT), **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------------


def _answer_strings(value, key: str, where: str) -> list[str]:
    """The non-blank answers of a field's value: a string, a number, or a list of them. null (or anything else)
    among them is an error naming the field, never the answer "None"."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: {key!r} must be a list of strings, got {json_type(value)}")
    answers = []
    for position, answer in enumerate(value):
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{where}: {key}[{position}] must be a string, got {json_type(answer)}")
        if str(answer).strip():
            answers.append(str(answer))
    if not answers:
        raise ValueError(f"{where}: the answer list is empty")
    return answers


def _answers_of(row: dict, where: str) -> tuple[list[str], str]:
    """(answers, match) of one row in any of the common layouts: answers / answer (ORQA) as a list or a string,
    SQuAD's {"text": [...]}, TriviaQA's {"value", "aliases"}; answer_patterns (CuratedTrec) -> regex."""
    if row.get("answer_patterns"):
        return _answer_strings(row["answer_patterns"], "answer_patterns", where), "regex"
    for key in ("answers", "answer"):
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, dict):
            value = value.get("text") or value.get("aliases") or value.get("value")
            key = f"{key}.text"
        return _answer_strings(value, key, where), "string"
    raise ValueError(
        f"{where}: no answers: expected an 'answers', 'answer' or 'answer_patterns' field, got {sorted(row)}"
    )


def qa_example(row: dict, where: str) -> dict:
    """One row -> {question, answers, match, gold_passage_id}."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question = row.get("question")
    if question is not None and not isinstance(question, str):
        raise ValueError(f"{where}: 'question' must be a string, got {json_type(question)}")
    if not question or not question.strip():
        raise ValueError(f"{where}: missing or empty 'question' (fields: {sorted(row)})")
    answers, match = _answers_of(row, where)
    gold = row.get("gold_passage_id")
    return {
        "question": question,
        "answers": answers,
        "match": match,
        "gold_passage_id": None if gold is None else str(gold),
    }


def read_qa_jsonl(path: str | os.PathLike) -> list[dict]:
    """QA rows of a JSONL file (blank lines skipped); errors name the file and the 1-based line."""
    examples = [qa_example(row, f"{path}, line {number}") for number, row in iter_jsonl(path)]
    if not examples:
        raise ValueError(f"{path} holds no questions (empty file)")
    return examples


def local_dataset_file(path_or_name: str, split: str | None) -> Path | None:
    """The JSONL file meant: a file, or DIR/SPLIT.jsonl; None when nothing local is named."""
    path = Path(path_or_name).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        candidates = [split] if split else EVALUATION_SPLITS
        for name in candidates:
            if (path / f"{name}.jsonl").is_file():
                return path / f"{name}.jsonl"
        raise FileNotFoundError(f"{path} holds no {' or '.join(f'{name}.jsonl' for name in candidates)}")
    if not is_hub_name(path_or_name, (".jsonl", ".json")):  # a Hub name is `name` or `owner/name`; a path must exist
        raise FileNotFoundError(f"No such dataset file or folder: {path}")
    return None


def dataset_identity(path_or_name: str, split: str | None = None) -> tuple[str, str | None]:
    """(name, split) for reports and model cards: a JSONL file DIR/SPLIT.jsonl -> (DIR's name, SPLIT); a folder ->
    (its name, the SPLIT.jsonl read); a Hub dataset -> (its name, split)."""
    local = local_dataset_file(str(path_or_name), split)
    if local is None:
        return str(path_or_name), split
    return local.absolute().parent.name, local.stem


def load_qa_dataset(path_or_name: str, split: str | None = None):
    """A QA dataset as a `datasets.Dataset` with columns question (str), answers (list[str]), match ("string" or
    "regex": regex when the rows have answer_patterns, e.g. CuratedTrec) and gold_passage_id (str or None).

    path_or_name: a JSONL file, a folder holding SPLIT.jsonl, or a Hub dataset name (needs the network; without
    split the first of test / validation / dev / train is used)."""
    import datasets

    local = local_dataset_file(str(path_or_name), split)
    if local is not None:
        examples = read_qa_jsonl(local)
    else:
        hub = load_hub_dataset(str(path_or_name), split, splits=EVALUATION_SPLITS, local="JSONL file/folder")
        examples = [qa_example(dict(row), f"{path_or_name}, row index {number}") for number, row in enumerate(hub)]
        if not examples:
            raise ValueError(f"Hub dataset {path_or_name!r} holds no questions")
    features = datasets.Features(
        {
            "question": datasets.Value("string"),
            "answers": datasets.Sequence(datasets.Value("string")),
            "match": datasets.Value("string"),
            "gold_passage_id": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_list(examples, features=features)


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------------


def span_text(tokenizer, block_text: str, reader_row: list[int], start: int, end: int) -> str:
    """The answer cut from the block's original text: reader positions [start, end] of `[CLS] q [SEP] block [SEP]`
    mapped to character offsets of the block (falls back to decoding the wordpieces)."""
    block_start = reader_row.index(tokenizer.sep_token_id) + 1
    offsets = tokenizer(block_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    first, last = start - block_start, end - block_start
    if 0 <= first <= last < len(offsets):
        return block_text[offsets[first][0] : offsets[last][1]]
    return tokenizer.decode(reader_row[start : end + 1])


def _batches(items: list, size: int) -> Iterable[list]:
    for begin in range(0, len(items), size):
        yield items[begin : begin + size]


def _rows(dataset) -> list[dict]:
    rows = [dict(row) for row in dataset]
    for number, row in enumerate(rows):
        row.setdefault("match", "string")
        if not row.get("answers"):
            raise ValueError(f"question {number} ({row.get('question')!r}) has no answers")
    return rows


def _predict_batch(model, rows: list[dict], num_read: int, num_retrieved: int, block_searcher) -> list[dict]:
    """Answer and retrieval of a batch of questions: {prediction, block_ids (all retrieved), read_ids}."""
    retriever = model.retriever
    tokenizer = retriever.tokenizer
    questions = [row["question"] for row in rows]
    encoded = tokenizer(
        questions, padding=True, truncation=True, max_length=model.config.reader_seq_len // 2, return_tensors="pt"
    ).to(model.device)
    kwargs = {"reader_beam_size": num_read, "searcher_beam_size": num_retrieved}
    if block_searcher is not None:
        kwargs["retrieved_block_ids"] = block_searcher.search(questions, num_retrieved)
    output = model(**encoded, return_dict=True, **kwargs)
    reader = output.reader_output
    block_idx, starts, ends = (reader[name].reshape(-1).tolist() for name in ("block_idx", "start_pos", "end_pos"))
    retrieved = output.retrieved_block_ids.cpu().tolist()
    predictions = []
    for b, block_ids in enumerate(retrieved):
        block_id = block_ids[block_idx[b]]
        reader_row = output.reader_input_ids[b, block_idx[b]].tolist()
        text = retriever.block_records.texts([block_id])[0]
        answer = span_text(tokenizer, text, reader_row, starts[b], ends[b])
        predictions.append({"prediction": answer, "block_ids": block_ids, "predicted_block_id": block_id})
    return predictions


def passage_ids_of(records, block_ids: list[int], predicted_block_id: int) -> dict:
    """{"passage_ids": [of block_ids], "predicted_passage_id"} when the corpus stores passage ids (`corpus build
    --passages-as-blocks`, e.g. DPR's), else {}: what a per-question prediction adds to name the passages read."""
    if not getattr(records, "has_passage_ids", False):
        return {}
    passage_ids = records.passage_ids([*block_ids, predicted_block_id])
    return {"passage_ids": passage_ids[:-1], "predicted_passage_id": passage_ids[-1]}


def evaluate_openqa(
    model,
    dataset,
    *,
    batch_size: int = 8,
    num_blocks: int | None = None,
    recall_ks: Sequence[int] = DEFAULT_RECALL_KS,
    block_searcher=None,
    progress: bool = False,
) -> dict:
    """Evaluate a `RealmForOpenQA` on QA rows ({question, answers, match}; a `load_qa_dataset` result or a list).

    The model reads the top `num_blocks` (default config.reader_beam_size) of the top max(recall_ks) blocks
    retrieved by its index, or by `block_searcher.search(questions, k) -> LongTensor [B, k]` (e.g. BM25).
    Returns percentages: exact_match (regex match for regex rows), recall@k (some top-k block holds an answer; k is
    capped at the corpus size, and "notes" then says so for each such k), reader_oracle (some read block holds an
    answer); count, num_blocks, corpus_size, and predictions (question, prediction, answers, correct, block_ids read;
    with a corpus of passages, their passage_ids and predicted_passage_id).
    """
    rows = _rows(dataset)
    if not rows:
        raise ValueError("The dataset holds no questions.")
    if not recall_ks or min(recall_ks) < 1:
        raise ValueError(f"recall_ks must be positive block counts, got {recall_ks}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if num_blocks is not None and num_blocks < 1:
        raise ValueError(f"num_blocks must be positive, got {num_blocks}")
    corpus_size = len(model.retriever.block_records)
    retriever = model.retriever
    searchable = retriever.index.num_searchable if retriever.has_index else corpus_size  # removed: never retrieved
    num_read = min(num_blocks or model.config.reader_beam_size, searchable)
    num_retrieved = min(max(max(recall_ks), num_read), searchable)
    ks = sorted(set(recall_ks))
    # recall@k for k beyond the corpus is recall over the whole corpus: kept under its name, with a note saying so.
    held = f"{searchable} blocks" + (f" ({corpus_size - searchable} removed)" if searchable < corpus_size else "")
    notes = [
        f"recall@{k}: the corpus holds only {held}, so this is recall over all of them" for k in ks if k > searchable
    ]
    records = model.retriever.block_records
    hits = {k: 0 for k in ks}
    oracle = correct_count = 0
    predictions = []
    batches = list(_batches(rows, batch_size))
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="evaluating", unit="batch")
    with eval_mode(model):
        with torch.inference_mode():
            for batch in batches:
                for row, result in zip(batch, _predict_batch(model, batch, num_read, num_retrieved, block_searcher)):
                    match, answers = row["match"], list(row["answers"])
                    scorer = regex_match if match == "regex" else exact_match
                    correct = scorer(result["prediction"], answers)
                    texts = model.retriever.block_records.texts(result["block_ids"])
                    contains = [has_answer(text, answers, match) for text in texts]
                    first_hit = contains.index(True) if True in contains else None
                    for k in ks:
                        hits[k] += first_hit is not None and first_hit < k
                    oracle += first_hit is not None and first_hit < num_read
                    correct_count += correct
                    predictions.append(
                        {
                            "question": row["question"],
                            "prediction": result["prediction"],
                            "answers": answers,
                            "correct": bool(correct),
                            "block_ids": result["block_ids"][:num_read],
                            "predicted_block_id": result["predicted_block_id"],
                            **passage_ids_of(records, result["block_ids"][:num_read], result["predicted_block_id"]),
                        }
                    )
    count = len(predictions)
    matches = sorted({row["match"] for row in rows})
    results = {"exact_match": 100.0 * correct_count / count}
    results.update({f"recall@{k}": 100.0 * hits[k] / count for k in ks})
    results.update(
        {
            "reader_oracle": 100.0 * oracle / count,
            "count": count,
            "num_blocks": num_read,
            "match": matches[0] if len(matches) == 1 else "mixed",
            "corpus_size": corpus_size,
            **({"notes": notes} if notes else {}),
            "predictions": predictions,
        }
    )
    return results


def write_results(results: dict, path: str | os.PathLike) -> Path:
    """Write results as JSON atomically (temporary file in the same folder, then rename)."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return path


def read_results(path: str | os.PathLike) -> dict:
    """An evaluation JSON written by `openrealm evaluate` (checked to hold exact_match)."""
    from openrealm.configuration_realm import read_json_object

    try:
        results = read_json_object(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"No evaluation results file {path}") from None
    if "exact_match" not in results:
        raise ValueError(f"{path} holds no evaluation results (no 'exact_match'); write it with openrealm evaluate")
    return results


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------


__all__ = [
    "METRIC_SCRIPT",
    "evaluate_openqa",
    "exact_match",
    "has_answer",
    "load_openqa_metric",
    "load_qa_dataset",
    "normalize_answer",
    "read_results",
    "regex_match",
    "write_results",
]
