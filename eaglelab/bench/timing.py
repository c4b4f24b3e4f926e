"""Host-clock timing the bench modules share: a device sync, the median of synchronised calls, and how busy the
machine is besides the run (a bench on a loaded machine says so instead of giving a headline)."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median ms of one synchronised call (host clock: launch overhead and syncs count)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


BUSY_LOAD_PER_CORE = 0.5  # other work's load per core above which a bench's figures are not trusted


@dataclass(frozen=True)
class MachineLoad:
    """The 1-minute load average with this run's own share taken out, per core: other work on the machine."""

    load: float  # os.getloadavg()[0]
    cores: int
    own: float  # what this process puts on the run queue (its compute threads on CPU, 1 on CUDA)

    @property
    def other_per_core(self) -> float:
        return max(self.load - self.own, 0.0) / self.cores

    @property
    def busy(self) -> bool:
        return self.other_per_core > BUSY_LOAD_PER_CORE

    def describe(self) -> str:
        if not self.own:
            return f"load average {self.load:.2f} on {self.cores} cores ({self.other_per_core:.2f} per core) before it began"
        return (f"load average {self.load:.2f} on {self.cores} cores, {self.other_per_core:.2f} per core besides "
                f"its own {self.own:g} busy thread{'s' if self.own != 1 else ''}")


def machine_load(own: float) -> MachineLoad | None:
    """Now's :class:`MachineLoad` (``own``: this run's share of the load), None where the OS has no load average."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # Windows has none
        return None
    return MachineLoad(load, os.cpu_count() or 1, own)


# Notices torch prints that a user of bench or tune can do nothing about: the engine's graph capture checks its
# warm-up with torch.cuda.set_sync_debug_mode("error") (a forward that syncs the host raises there, not mid-capture),
# and torch says once per process that the mode is a prototype.
TORCH_NOTICES = ("Synchronization debug mode is a prototype feature",)


@contextlib.contextmanager
def quiet_torch_notices() -> Iterator[None]:
    """Inside: the :data:`TORCH_NOTICES` are not shown (every other warning is)."""
    with warnings.catch_warnings():
        for text in TORCH_NOTICES:
            warnings.filterwarnings("ignore", message=re.escape(text))
        yield
