"""Host-clock timing the bench modules share: a device sync, and the median of synchronised calls."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

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
