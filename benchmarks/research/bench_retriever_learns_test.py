"""How tests/learning/test_retriever_learns.py's margins were set, and that the test fails on a broken path.

Runs the test's tiny world (its `TinyWorld` and `measure`) for several seeds and prints, per seed, the held-out
recall@5 of the start and after refresh sync and off, and the second-half share of training queries with an answer
among the K candidates. `--break` patches a defect into the package for the run:

- `detach`: the query and candidate embeddings cut from the graph (`RealmPretrainingModel.embed` returns
  e.detach() + 0 * e: same values, no gradient reaches the embedder);
- `swaps`: every index swap recorded but not installed (`RealmPretrainingExamples.update_index` installs the start's
  index only), so training keeps the start's index and query snapshot.

    python benchmarks/research/bench_retriever_learns_test.py --seeds 0 1 2 3 4 5 6 7 --output /tmp/learns.json
    python benchmarks/research/bench_retriever_learns_test.py --seeds 0 1 2 --break detach
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "learning")]  # helpers.py and test_retriever_learns.py

from test_retriever_learns import MIN_CANDIDATE_GAIN, MIN_RECALL_GAIN, TinyWorld, measure  # noqa: E402

from openrealm.trainers.pretraining import RealmPretrainingExamples, RealmPretrainingModel  # noqa: E402


def detach_embeddings() -> None:
    embed = RealmPretrainingModel.embed

    def detached(self, *args, **kwargs):
        emb = embed(self, *args, **kwargs)
        return emb.detach() + 0.0 * emb

    RealmPretrainingModel.embed = detached


def skip_swaps() -> None:
    update = RealmPretrainingExamples.update_index

    def first_only(self, query_embedder, index):
        if not hasattr(self, "index"):  # the start's index (set in __init__) is installed; no later one
            update(self, query_embedder, index)

    RealmPretrainingExamples.update_index = first_only


BREAKS = {"detach": detach_embeddings, "swaps": skip_swaps}


def verdicts(result: dict) -> dict[str, bool]:
    """What each test of tests/learning/test_retriever_learns.py would say of this seed's run."""
    return {
        "recall_gain": result["sync"] >= result["start"] + MIN_RECALL_GAIN,
        "candidates_gain": result["sync_candidates"] >= result["off_candidates"] + MIN_CANDIDATE_GAIN,
        "sync_above_off": result["sync"] > result["off"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--break", dest="defect", choices=sorted(BREAKS))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.defect:
        BREAKS[args.defect]()
    rows = []
    for seed in args.seeds:
        started = time.time()
        with tempfile.TemporaryDirectory() as root:
            result = measure(TinyWorld(Path(root), seed=seed))
        result = {"seed": seed, **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}}
        result["verdicts"], result["seconds"] = verdicts(result), round(time.time() - started, 1)
        print(json.dumps(result), flush=True)
        rows.append(result)
    if args.output:
        args.output.write_text(json.dumps({"break": args.defect, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
