"""Model cards of REALM checkpoints: `realm_model_card(kind, training_summary)` -> `huggingface_hub.ModelCard`.

kind: "embedder" (RealmEmbedder, the retriever's tower), "encoder" (RealmKnowledgeAugEncoder, the MLM reader of
pre-training), "scorer" (RealmScorer, query x document relevance) or "open-qa" (RealmForOpenQA).
training_summary: the `pretraining.json` dict of `openrealm train pretrain` (corpus, max_steps, batch_size,
learning_rate, refresh_mode, refresh_every, final metrics, ...); missing entries read "unknown".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

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
        "## Intended use",
        "",
        "Research on retrieval-augmented language models: initialising open-domain question answering (REALM "
        "fine-tuning), studying learned retrieval, or continuing pre-training. The retriever only works with an index "
        "built by this embedder over the same corpus.",
        "",
        "## Limitations",
        "",
        "- Runs with few steps, tiny models or synthetic corpora (tests, smoke runs) are for checking the code, not "
        "for use: check the steps and metrics above.",
        "- English only; the vocabulary is uncased.",
        "- It inherits the biases and errors of its corpus (for Wikipedia: its coverage, viewpoint and demographic "
        "biases) and may retrieve and reproduce them.",
        "- No safety tuning or filtering of any kind.",
        "",
        "## Citation",
        "",
        "```bibtex",
        REALM_BIBTEX,
        "```",
        "",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


__all__ = ["KINDS", "REALM_BIBTEX", "final_metrics", "realm_model_card"]
