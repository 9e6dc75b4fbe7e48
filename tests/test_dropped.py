"""trainers/dropped.py: what a training job says about the examples it dropped."""

import pytest

from openrealm.trainers.dropped import check_dropped

CAUSES = {"no_span": ("their block has no salient span", "build the corpus with named entities")}


@pytest.mark.parametrize("max_share", [0.9, 1.0])
def test_a_run_that_read_nothing_is_refused_in_words_whatever_the_share(max_share):
    refusal, warning = check_dropped(0, {"no_span": 0}, CAUSES, max_share, "corpus rows read")
    assert refusal == "0 corpus rows read: no batch held an example, so nothing trained" and warning is None
