"""The job options are declared apart from the jobs (fast --help); the defaults spelled out there equal the
library's."""

from openrealm import index_realm
from openrealm.tokenization import blocks, masking, sources
from openrealm.trainers import demo_page, embedding, options, pretraining
from openrealm.trainers.pretraining import refresh


def test_the_spelled_out_defaults_equal_the_constants_of_the_modules_that_use_them():
    assert options.MASKING_STRATEGIES == masking.STRATEGIES
    assert options.INDEX_TYPES == index_realm.INDEX_TYPES
    assert options.MAX_BLOCK_LENGTH == blocks.MAX_BLOCK_LENGTH
    assert options.TSV_QUOTINGS == sources.TSV_QUOTINGS
    assert tuple(embedding.DTYPES) == options.DTYPE_NAMES
    assert options.DEMO_NUM_RETRIEVED == demo_page.NUM_RETRIEVED


def test_the_jobs_use_the_option_defaults():
    assert pretraining.NUM_CANDIDATES == options.NUM_CANDIDATES == 8
    assert refresh.MODES == options.REFRESH_MODES


def test_the_quickstart_presets_declared_for_help_are_the_jobs_own():
    from openrealm.trainers.quickstart import stages

    assert options.QUICKSTART_PRESETS == tuple(sorted(stages.PRESETS))
