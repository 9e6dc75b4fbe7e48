"""Moved to `openrealm.trainers.world.reading_warmup`: this module path stays an alias of it until openrealm 0.2."""

import importlib
import sys
import warnings

warnings.warn(
    "openrealm.trainers.reading_warmup moved to openrealm.trainers.world.reading_warmup",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("openrealm.trainers.world.reading_warmup")
