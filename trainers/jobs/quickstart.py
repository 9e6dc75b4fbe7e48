"""`openrealm quickstart`: the whole REALM lifecycle on a generated world (trainers/quickstart/stages.py runs it).

openrealm quickstart [--output realm-quickstart] [--seed 0] [--preset default|small] [--overwrite]
"""

from __future__ import annotations

import argparse

from openrealm.trainers.quickstart.stages import quickstart


def run(args: argparse.Namespace) -> int:
    quickstart(args.output, args.preset, args.seed, args.overwrite, progress=not args.quiet)
    return 0


__all__ = ["run"]
