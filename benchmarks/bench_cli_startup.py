"""How long `openrealm --help` and every job's `--help` take to start (the target: under 1 s on 2 cores).

    .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 7]

Each command runs --repeats times in a fresh process; reported: median and range of wall time. In the same run:
`python -c pass` (the interpreter's floor), `import torch` and `import openrealm` (the package root: it registers REALM
with transformers, which imports torch). The parser before the change (d7cf237, 4.00 s for `openrealm --help`) can no
longer run against the package: its job modules no longer declare their options.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time


def wall_times(command: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    python = sys.executable
    from openrealm.trainers.cli import JOBS

    commands = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import torch'": [python, "-c", "import torch"],
        "python -c 'import openrealm'": [python, "-c", "import openrealm"],
        "openrealm --help": [python, "-m", "openrealm", "--help"],
        **{
            f"openrealm {' '.join(job)} --help": [python, "-m", "openrealm", *job, "--help"]
            for job in ([group] if command is None else [group, command] for group, command in JOBS)
        },
    }
    import torch

    print(
        f"- {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch "
        f"{torch.__version__}"
    )
    print(f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.repeats} runs each, fresh processes\n")
    print("| command | median s | range s |\n|---|---|---|")
    for name, command in commands.items():
        times = wall_times(command, args.repeats)
        print(f"| `{name}` | {statistics.median(times):.2f} | {min(times):.2f}-{max(times):.2f} |")


if __name__ == "__main__":
    main()
