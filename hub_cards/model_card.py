"""Model cards of REALM checkpoints: `realm_model_card(kind, training_summary)` -> `huggingface_hub.ModelCard` for
the pre-training towers, and `openqa_model_card(evaluations, ...)` for a fine-tuned RealmForOpenQA folder, whose YAML
metadata carries the evaluation results as `model-index` (written by `openrealm evaluate`, pushed by `openrealm push`).

kind: "embedder" (RealmEmbedder, the retriever's tower), "encoder" (RealmKnowledgeAugEncoder, the MLM reader of
pre-training), "scorer" (RealmScorer, query x document relevance) or "open-qa" (RealmForOpenQA).
training_summary: the `pretraining.json` dict of `openrealm train pretrain` (corpus, max_steps, batch_size,
learning_rate, refresh_mode, refresh_every, final metrics, ...); missing entries read "unknown".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from openrealm.file_utils import write_text_atomic

KINDS = {
    "embedder": (
        "RealmEmbedder",
        "the knowledge retriever's embedder: BERT -> [CLS] -> tanh pooler -> dense -> LayerNorm, one vector per query "
        "or document block; the same tower embeds queries and the documents of the MIPS index",
    ),
    "encoder": (
        "RealmKnowledgeAugEncoder",
        "the knowledge-augmented encoder: a BERT masked language model reading `[CLS] query [SEP] document [SEP]` "
        "and marginalising its predictions over the retrieved documents",
    ),
    "scorer": (
        "RealmScorer",
        "the retriever's relevance scorer: the embedder wrapped to score candidate documents by the inner product of "
        "query and document embeddings",
    ),
    "open-qa": (
        "RealmForOpenQA",
        "the open-domain question-answering model: retriever plus span-extraction reader over the retrieved blocks",
    ),
}

# Written from the paper (Guu, Lee, Tung, Pasupat, Chang; ICML 2020).
REALM_BIBTEX = """@inproceedings{guu2020realm,
  title     = {{REALM}: Retrieval-Augmented Language Model Pre-Training},
  author    = {Guu, Kelvin and Lee, Kenton and Tung, Zora and Pasupat, Panupong and Chang, Ming-Wei},
  booktitle = {Proceedings of the 37th International Conference on Machine Learning (ICML)},
  year      = {2020}
}"""

FINAL_METRICS = ("loss", "retrieval_utility", "null_doc_prob", "index_version")
LIMITATIONS = [
    "- Runs with few steps, tiny models or synthetic corpora (tests, smoke runs) are for checking the code, not "
    "for use: check the steps and metrics above.",
    "- English only; the vocabulary is uncased.",
    "- It inherits the biases and errors of its corpus (for Wikipedia: its coverage, viewpoint and demographic "
    "biases) and may retrieve and reproduce them.",
    "- No safety tuning or filtering of any kind.",
]


def _value(value) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _corpus_facts(corpus: str | None) -> dict:
    """num_blocks / num_articles / source of a local knowledge-corpus folder (corpus_config.json), when readable."""
    if not corpus:
        return {}
    path = Path(corpus) / "corpus_config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def final_metrics(summary: dict) -> dict:
    """The final MLM loss, retrieval utility, null-document probability and index version of a run summary."""
    final = dict(summary.get("final") or {})
    history = [entry for entry in summary.get("log_history") or [] if "loss" in entry]
    last = history[-1] if history else {}
    metrics = {name: final.get(name, last.get(name)) for name in FINAL_METRICS}
    if metrics["loss"] is None:
        metrics["loss"] = summary.get("train_loss")
    return metrics


def closing_sections(intended_use: str) -> list[str]:
    """The lines every card ends with: intended use, limitations, citation."""
    return [
        "## Intended use",
        "",
        intended_use,
        "",
        "## Limitations",
        "",
        *LIMITATIONS,
        "",
        "## Citation",
        "",
        "```bibtex",
        REALM_BIBTEX,
        "```",
        "",
    ]


def realm_model_card(
    kind: str,
    training_summary: dict,
    *,
    repo_id: str | None = None,
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
) -> ModelCard:
    """A model card (YAML metadata + description, corpus, training, intended use, limitations, citation)."""
    if kind not in KINDS:
        raise ValueError(f"model card kind must be one of {sorted(KINDS)}, got {kind!r}")
    class_name, description = KINDS[kind]
    summary = training_summary
    corpus = summary.get("corpus")
    facts = _corpus_facts(corpus)
    metrics = final_metrics(summary)
    data = ModelCardData(
        library_name="transformers",
        license=license,
        language=["en"],
        tags=["realm", "retrieval-augmented", "pre-training", "openrealm", kind],
        datasets=datasets or None,
    )
    corpus_name = os.path.basename(str(corpus).rstrip("/")) if corpus else "unknown"
    fingerprint = summary.get("corpus_fingerprint") or facts.get("fingerprint")
    lines = [
        f"# REALM {kind}{f' ({repo_id})' if repo_id else ''}",
        "",
        "## Model description",
        "",
        "REALM (Retrieval-Augmented Language Model pre-training, Guu et al. 2020) augments a masked language model "
        "with a learned knowledge retriever: for each masked query it retrieves documents from a large text corpus "
        "by maximum inner product search and predicts the masked tokens from the query and the retrieved documents, "
        "training retriever and encoder together through the marginal likelihood.",
        "",
        f"This repository holds `{class_name}`: {description}. Load it with "
        f"`openrealm.{class_name}.from_pretrained(...)`.",
        "",
        "## Training corpus",
        "",
        f"- corpus: `{corpus_name}` ({_value(corpus)})",
        f"- blocks: {_value(summary.get('num_blocks', facts.get('num_blocks')))}",
        f"- articles: {_value(facts.get('num_articles'))}",
        f"- source: {_value(facts.get('source'))}",
        f"- corpus fingerprint: {_value(fingerprint)}",
        "",
        "## Training",
        "",
        f"- steps: {_value(summary.get('max_steps'))}",
        f"- batch size: {_value(summary.get('batch_size'))}",
        f"- learning rate: {_value(summary.get('learning_rate'))}",
        f"- index refresh: {_value(summary.get('refresh_mode'))} every {_value(summary.get('refresh_every'))} steps",
        f"- candidates per query: {_value(summary.get('num_candidates'))}",
        f"- masking: {_value(summary.get('spans'))}",
        f"- initial embedder / encoder: {_value(summary.get('embedder'))} / {_value(summary.get('encoder'))}",
        "",
        "Final metrics:",
        "",
        f"- MLM loss: {_value(metrics['loss'])}",
        f"- retrieval utility: {_value(metrics['retrieval_utility'])}",
        f"- null-document probability: {_value(metrics['null_doc_prob'])}",
        f"- index version: {_value(metrics['index_version'])}",
        "",
        *closing_sections(
            "Research on retrieval-augmented language models: initialising open-domain question answering (REALM "
            "fine-tuning), studying learned retrieval, or continuing pre-training. The retriever only works with an "
            "index built by this embedder over the same corpus."
        ),
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


# Shared sections of the cards.
INTENDED_USE_QA = (
    "Open-domain question answering over the knowledge corpus shipped with the model (block records and MIPS index "
    "in this repository), and research on retrieval-augmented models. Answers come with their provenance (the block "
    "read), so they can be checked. The retriever only works with an index built by this embedder over this corpus."
)
METRIC_NAMES = {"exact_match": "Exact match", "reader_oracle": "Reader oracle"}


def evaluation_results(evaluation: dict, model_name: str) -> list[EvalResult]:
    """`model-index` entries of one `openrealm evaluate` JSON: exact_match, recall@k and reader_oracle (percent) on
    its dataset and split, task question-answering."""
    if "exact_match" not in evaluation:
        raise ValueError(
            f"evaluation results of {model_name} hold no 'exact_match': write them with openrealm evaluate"
        )
    dataset = str(evaluation.get("dataset_name") or evaluation.get("dataset") or "unknown")
    metrics = [
        "exact_match",
        *sorted((k for k in evaluation if k.startswith("recall@")), key=_recall_k),
        "reader_oracle",
    ]
    return [
        EvalResult(
            task_type="question-answering",
            task_name="Open-domain question answering",
            dataset_type=dataset,
            dataset_name=dataset,
            dataset_split=evaluation.get("split"),
            metric_type=metric,
            metric_name=METRIC_NAMES.get(metric, metric.replace("recall@", "Recall@")),
            metric_value=round(float(evaluation[metric]), 2),
            metric_config=evaluation.get("match"),
        )
        for metric in metrics
        if evaluation.get(metric) is not None
    ]


def _recall_k(metric: str) -> int:
    return int(metric.split("@", 1)[1])


def _results_table(evaluations: list[dict]) -> list[str]:
    """One markdown row per evaluation: dataset, split, questions, blocks read, retrieval, EM, recall@k, oracle."""
    ks = sorted({_recall_k(k) for evaluation in evaluations for k in evaluation if k.startswith("recall@")})
    header = ["dataset", "split", "questions", "blocks read", "retrieval", "EM", *[f"R@{k}" for k in ks], "oracle"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for evaluation in evaluations:
        cells = [
            evaluation.get("dataset_name") or evaluation.get("dataset"),
            evaluation.get("split"),
            evaluation.get("count"),
            evaluation.get("num_blocks"),
            evaluation.get("retrieval", "dense"),
            evaluation.get("exact_match"),
            *[evaluation.get(f"recall@{k}") for k in ks],
            evaluation.get("reader_oracle"),
        ]
        lines.append("| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else _value(c) for c in cells) + " |")
    return lines


def openqa_model_card(
    evaluations: list[dict],
    *,
    model_name: str,
    training_summary: dict | None = None,
    num_blocks: int | None = None,
    corpus: str | None = None,
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
    with_demo: bool = False,
) -> ModelCard:
    """The card of a fine-tuned RealmForOpenQA: `model-index` from `openrealm evaluate` JSONs (exact match, recall@k,
    reader-oracle per dataset), the training corpus (name, blocks) and run, intended use, limitations, citation.

    evaluations: dicts read from evaluation JSONs; training_summary: the fine-tuning summary (corpus, max_steps,
    learning_rate, ...) when known; num_blocks / corpus: the knowledge corpus (block count, folder or dataset name);
    with_demo: the repository also holds the Gradio app of hub_cards/space_app.py, which the card then explains.
    """
    summary = training_summary or {}
    corpus = corpus or summary.get("corpus")
    facts = _corpus_facts(corpus)
    results = [result for evaluation in evaluations for result in evaluation_results(evaluation, model_name)]
    data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        pipeline_tag="question-answering",
        license=license,
        language=["en"],
        tags=["realm", "retrieval-augmented", "open-domain-qa", "openrealm", "open-qa"],
        datasets=datasets or None,
        eval_results=results or None,
    )
    corpus_name = os.path.basename(str(corpus).rstrip("/")) if corpus else "unknown"
    lines = [
        f"# {model_name}",
        "",
        "## Model description",
        "",
        "REALM (Retrieval-Augmented Language Model pre-training, Guu et al. 2020) fine-tuned for open-domain question "
        "answering as in ORQA (Lee et al. 2019): the question is embedded, the top blocks of the knowledge corpus are "
        "retrieved by maximum inner product search, and a span-extraction reader picks the answer from the blocks "
        "read, scoring each (block, span) pair with the block's retrieval score added.",
        "",
        f"This repository holds `{KINDS['open-qa'][0]}`: {KINDS['open-qa'][1]}, with its tokenizer, knowledge corpus "
        "(block records) and MIPS index, so it answers questions on its own:",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'qa = pipeline("question-answering", model="{model_name}", trust_remote_code=True)',
        'qa("who founded the city?", top_k=1)  # answer, score, block id, title and text of the block read',
        "```",
        "",
        *(_demo_section(model_name) if with_demo else []),
        "## Training corpus",
        "",
        f"- knowledge corpus: `{corpus_name}` ({_value(corpus)})",
        f"- blocks: {_value(num_blocks or summary.get('num_blocks') or facts.get('num_blocks'))}",
        f"- articles: {_value(facts.get('num_articles'))}",
        f"- source: {_value(facts.get('source'))}",
        "",
        "## Training",
        "",
        f"- training data: {_value(summary.get('train'))}",
        f"- steps: {_value(summary.get('max_steps'))}",
        f"- batch size: {_value(summary.get('batch_size'))}",
        f"- learning rate: {_value(summary.get('learning_rate'))}",
        f"- initial model: {_value(summary.get('model') or summary.get('init'))}",
        "",
        "## Evaluation",
        "",
        "Exact match after ORQA's answer normalisation (regex match for CuratedTrec), retrieval recall@k (some top-k "
        "block contains an answer) and reader-oracle (some block read contains an answer), in percent:",
        "",
        *(_results_table(evaluations) if evaluations else ["No evaluation results were given."]),
        "",
        *closing_sections(INTENDED_USE_QA),
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def _demo_section(model_name: str) -> list[str]:
    """How to run the repository's Gradio app (written by hub_cards/space_app.py) locally or as a Space."""
    return [
        "## Demo",
        "",
        "`app.py` is a web page that answers questions and shows the block each answer came from, with the answer "
        "highlighted, and the other retrieved blocks. Run it locally with",
        "",
        "```bash",
        f"hf download {model_name} app.py openrealm_demo.py requirements.txt --local-dir demo",
        "cd demo && pip install -r requirements.txt && python app.py",
        "```",
        "",
        "or create a Gradio Space and upload those three files to it.",
        "",
    ]


# The last line of every card openrealm writes: the SHA-256 of the text above it, so that `openrealm push` tells a card
# it may replace (written by openrealm, unedited) from a hand-written or edited one (docs/publishing.md)
CARD_MARK = "<!-- written by openrealm (sha256 {digest} of the text above); push replaces it while unedited -->"
_CARD_MARK = re.compile(r"\n<!-- written by openrealm \(sha256 ([0-9a-f]{64}) of the text above\)[^\n]*-->\n?\Z")


def card_text(card) -> str:
    """The text of `card` (a ModelCard or str) as openrealm writes it: ending in CARD_MARK with its digest."""
    text = str(card).rstrip("\n") + "\n"
    return f"{text}\n{CARD_MARK.format(digest=hashlib.sha256(text.encode()).hexdigest())}\n"


def written_by_openrealm(text: str) -> bool:
    """Whether a README.md's text is a card openrealm wrote (card_text) and nobody edited since: its last line is
    CARD_MARK with the digest of the text above it."""
    match = _CARD_MARK.search(text)
    return match is not None and hashlib.sha256(text[: match.start()].encode()).hexdigest() == match.group(1)


def write_model_card(folder: str | os.PathLike, card) -> Path:
    """Write FOLDER/README.md atomically (temporary file beside it, then rename), marked as openrealm's
    (card_text)."""
    return Path(write_text_atomic(Path(folder) / "README.md", card_text(card)))


__all__ = [
    "CARD_MARK",
    "card_text",
    "evaluation_results",
    "final_metrics",
    "KINDS",
    "openqa_model_card",
    "REALM_BIBTEX",
    "realm_model_card",
    "write_model_card",
    "written_by_openrealm",
]
