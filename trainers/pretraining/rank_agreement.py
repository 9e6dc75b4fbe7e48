"""Cross-rank agreement for the index refresh: under several processes every rank swaps to the same index version at
the same step, so the ranks all-reduce one small CPU vector (MAX) at every step boundary, over gloo even when training
runs on NCCL (the decision never waits for the GPU). With one process every call returns its input."""

from __future__ import annotations

import torch

from openrealm.trainers.stage_utils import rank_and_world


class RankAgreement:
    """The process group the refresh decisions are reduced over, and the two reductions they need."""

    def __init__(self):
        self.group = None  # gloo: CPU tensors, no device sync

    def join(self) -> None:
        """Create the group (collectively: every rank calls this, from the Trainer's on_train_begin)."""
        if rank_and_world()[1] == 1 or self.group is not None:
            return
        backend = torch.distributed.get_backend()
        world = torch.distributed.group.WORLD
        self.group = world if backend == "gloo" else torch.distributed.new_group(backend="gloo")

    def agree_on_version(self, version: int) -> int:
        """The main process's version number on every process (the others pass -1): an exact int64 MAX."""
        if rank_and_world()[1] == 1:
            return version
        value = torch.tensor([version], dtype=torch.int64)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=self._group_or_world())
        return int(value)

    def max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of `values` over the ranks (one float64 all-reduce)."""
        if rank_and_world()[1] == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self._group_or_world())
        return tensor.tolist()

    def _group_or_world(self):
        return self.group if self.group is not None else torch.distributed.group.WORLD


__all__ = ["RankAgreement"]
