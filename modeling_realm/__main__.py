"""`python -m openrealm ...` (and `accelerate launch -m openrealm ...`).

Like the package root, this entry point is not shipped as Hub custom code; the command line itself lives in
openrealm.trainers.
"""

import sys

from .trainers.cli import main

sys.exit(main())
