"""Moved to `openrealm.trainers.world.synthetic_world`: this module path stays an alias of it until openrealm 0.2."""

import importlib
import sys
import warnings

warnings.warn(
    "openrealm.trainers.synthetic_world moved to openrealm.trainers.world.synthetic_world",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("openrealm.trainers.world.synthetic_world")
