"""Open-domain QA exact match as ORQA and REALM score it, as an `evaluate` metric.

Load it with `openrealm.trainers.evaluation.load_openqa_metric()` (or `evaluate.load(<path of this file>)`).
"""

import datasets
import evaluate

from openrealm.trainers.evaluation import exact_match, regex_match

_DESCRIPTION = """
Exact match of open-domain question answering (ORQA / REALM): the prediction is correct when, after normalisation
(Unicode NFD, lowercase, punctuation and the articles a/an/the removed, whitespace collapsed), it equals one of the
reference answers. With `regex=True` (CuratedTrec) each reference is a regular expression, matched case-insensitively
and anchored at the start of the prediction (`re.match`, as ORQA); an invalid pattern never matches.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted answers (str).
    references: list of lists of reference answers (or regex patterns with regex=True), one list per prediction.
    regex: bool, references are regular expressions (default False).
Returns:
    exact_match: percentage (0-100) of predictions matching one of their references.
Examples:
    >>> metric = load_openqa_metric()
    >>> metric.compute(predictions=["The Nile"], references=[["nile", "amazon"]])
    {'exact_match': 100.0}
"""

_CITATION = """@inproceedings{lee2019latent,
  title     = {Latent Retrieval for Weakly Supervised Open Domain Question Answering},
  author    = {Lee, Kenton and Chang, Ming-Wei and Toutanova, Kristina},
  booktitle = {Proceedings of the 57th Annual Meeting of the Association for Computational Linguistics},
  year      = {2019}
}"""


class RealmOpenQa(evaluate.Metric):
    """Exact match (percent) with ORQA's answer normalisation, or regex match for CuratedTrec."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, regex: bool = False) -> dict:
        match = regex_match if regex else exact_match
        correct = [match(prediction, answers) for prediction, answers in zip(predictions, references)]
        return {"exact_match": 100.0 * sum(correct) / max(len(correct), 1)}


__all__ = ["RealmOpenQa"]
