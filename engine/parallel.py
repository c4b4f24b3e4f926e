"""Tensor-parallel building blocks: the process group handle, sharded linears, one all-reduce.

With ``tp=None`` (a single process) every layer here is a plain linear and no collective runs.
Column-parallel linears split their output features over ranks, row-parallel ones their input
features; the model calls :meth:`TPGroup.all_reduce` visibly in its forward after each
row-parallel projection (attention output, MLP output), which is the one place the all-reduce
probe times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

# Called after each timed all-reduce: (layer, site, nbytes, ms, phase, in_graph) -> None.
AllReduceHook = Callable[[int, str, int, float, str, bool], None]


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group."""

    rank: int
    world_size: int
    group: Any = None  # torch.distributed ProcessGroup (None: the default group)
    hook: AllReduceHook | None = field(default=None, repr=False)
    phase: str = "decode"  # set by the engine around each forward, read by the hook

    def all_reduce(self, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """Sum ``x`` over ranks in place and return it; timed when a hook is set."""
        if self.hook is None or torch.cuda.is_current_stream_capturing():
            dist.all_reduce(x, group=self.group)
            return x
        return _timed_all_reduce(self, x, layer, site)

    def shard(self, size: int, what: str) -> int:
        """This rank's share of ``size``; ``size`` must divide evenly."""
        assert size % self.world_size == 0, f"{what}={size} does not split over {self.world_size} ranks"
        return size // self.world_size


def _timed_all_reduce(tp: TPGroup, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
    import time

    if x.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(x, group=tp.group)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
    else:
        t0 = time.perf_counter()
        dist.all_reduce(x, group=tp.group)
        ms = (time.perf_counter() - t0) * 1e3
    assert tp.hook is not None
    tp.hook(layer, site, x.numel() * x.element_size(), ms, tp.phase, False)
    return x


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's rows (output features) split over ranks: [out / world, in]."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup | None, what: str = "") -> None:
        super().__init__()
        self.tp = tp
        self.full_out = out_features
        local_out = tp.shard(out_features, what or "out_features") if tp else out_features
        self.weight = nn.Parameter(torch.empty(local_out, in_features))
        self.bias = nn.Parameter(torch.empty(local_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full checkpoint tensor (weight [out, in] or bias [out])."""
        if self.tp is None:
            return full
        return full.chunk(self.tp.world_size, dim=0)[self.tp.rank]


class RowParallelLinear(nn.Module):
    """y_partial = x_local W_local^T with W's columns (input features) split: [out, in / world].

    The caller all-reduces the result (visibly, in the model's forward). A bias is added once,
    after the reduction, by the caller; row-parallel projections in our models have none.
    """

    def __init__(self, in_features: int, out_features: int, tp: TPGroup | None, what: str = "") -> None:
        super().__init__()
        self.tp = tp
        local_in = tp.shard(in_features, what or "in_features") if tp else in_features
        self.weight = nn.Parameter(torch.empty(out_features, local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return full
        return full.chunk(self.tp.world_size, dim=1)[self.tp.rank]
