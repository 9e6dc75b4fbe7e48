"""trainers/towers.py's size check: the parameter count it estimates from a config alone (never above the model's
own), and the bound above which a tower is refused before it is allocated."""

import pytest

from openrealm import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder
from openrealm.trainers.towers import MAX_TOWER_PARAMETERS, check_tower_size, tower_parameters

SIZES = [
    dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=400),
    dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=1000),
]


@pytest.mark.parametrize("tower", [RealmEmbedder, RealmKnowledgeAugEncoder])
@pytest.mark.parametrize("sizes", SIZES, ids=["hidden 32", "hidden 128"])
def test_the_estimated_parameter_count_is_at_most_the_towers_and_above_70_percent_of_it(tower, sizes):
    config = RealmConfig(retriever_proj_size=16, **sizes)
    actual = sum(parameter.numel() for parameter in tower(config).parameters())
    assert 0.7 * actual <= tower_parameters(config) <= actual


def test_bert_large_passes_and_a_tower_above_the_bound_is_refused_naming_it():
    check_tower_size(RealmConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096), "--init random")  # fmt: skip
    config = RealmConfig(hidden_size=24576, num_hidden_layers=12, num_attention_heads=12)
    assert tower_parameters(config) > MAX_TOWER_PARAMETERS
    refusal = (
        r"^--init random: a tower of hidden_size 24576, 12 layers, intermediate_size 3072 and 30522 wordpieces has "
        r"about 3\.3e\+10 parameters, more than the 10 billion"
    )
    with pytest.raises(ValueError, match=refusal):
        check_tower_size(config, "--init random")
