"""Phase timing for the observer: CUDA events on GPU, ``perf_counter`` on CPU, profiler ranges.

A disabled clock costs one attribute check per phase: no event, no range, no host sync.
An enabled clock records events around each phase (never inside a captured graph: the engine
times around graph replays) and reads them once per cycle in :meth:`PhaseClock.collect`, after
the engine's own end-of-cycle synchronisation.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch


class PhaseClock:
    """Times named phases within one cycle."""

    def __init__(self, device: torch.device, enabled: bool, profile_ranges: bool = True) -> None:
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self.profile_ranges = enabled and profile_ranges
        self._open: list[tuple[str, object, object]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with torch.profiler.record_function(name) if self.profile_ranges else contextlib.nullcontext():
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                yield
                end.record()
                self._open.append((name, start, end))
            else:
                t0 = time.perf_counter()
                yield
                self._open.append((name, t0, time.perf_counter()))

    def collect(self) -> dict[str, float]:
        """Milliseconds per phase since the last collect (phases repeated in a cycle are summed)."""
        out: dict[str, float] = {}
        if self.cuda and self._open:
            self._open[-1][2].synchronize()  # type: ignore[union-attr]
        for name, a, b in self._open:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3  # type: ignore[union-attr,operator]
            out[name] = out.get(name, 0.0) + ms
        self._open.clear()
        return out
