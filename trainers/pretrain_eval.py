"""Moved to `openrealm.trainers.pretraining.evaluation`: this module path stays an alias of it until openrealm 0.2."""

import importlib
import sys
import warnings

warnings.warn(
    "openrealm.trainers.pretrain_eval moved to openrealm.trainers.pretraining.evaluation",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("openrealm.trainers.pretraining.evaluation")
