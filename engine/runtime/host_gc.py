"""Python's garbage collector around the generation loop, where the host must keep ahead of the device.

On a GPU the loop queues one step or cycle ahead of the one the device runs (``Engine.stop_lag``): the host has
about one cycle (~1-1.5 ms for SmolLM2 at batch 1) to read the last one back and launch the next. A collection
that runs in that window delays the next launch, and the device idles for as long. Compiling and capturing leave
a large heap of long-lived objects (traced graphs, compiled kernels, their caches) that every full collection
walks again. Servers settle this the same way: collect once after warm-up and move what survives out of the
collector's reach (``gc.freeze``), so later collections walk only what the run itself allocates.

Policies (``EAGLELAB_GC``, default ``freeze`` on CUDA and ``as-is`` elsewhere):

* ``freeze``: after a run's set-up (a capture or a compile happened), ``gc.collect()`` then ``gc.freeze()``, once
  per set-up, outside any timed part; collection stays on for what the runs allocate;
* ``off``: as ``freeze``, and collection is also off while a run's loop runs (on again after it; what the loop
  left is collected by the next collection as usual);
* ``as-is``: nothing changed.

Measured with ``benchmarks/loop_gaps.py`` on an H100 (SmolLM2, 5/4/24 with a branch of 16, 6 MT-bench prompts):
with the collector frozen and off the device idled ~45 us less a cycle (1,490 -> 1,445 us a cycle end to end).
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Iterator

POLICIES = ("freeze", "off", "as-is")


def policy(device_type: str, asked: str | None = None) -> str:
    """The policy for a device: ``asked``, else ``$EAGLELAB_GC``, else ``freeze`` on CUDA and ``as-is`` on a CPU
    (where the loop reads each step at once: nothing runs ahead to be delayed)."""
    name = asked or os.environ.get("EAGLELAB_GC") or ("freeze" if device_type == "cuda" else "as-is")
    if name not in POLICIES:
        raise ValueError(f"EAGLELAB_GC={name!r}: expected one of {', '.join(POLICIES)}")
    return name


class HostGC:
    """One engine's collector policy: :meth:`settle` after set-up, :meth:`during_loop` around a run's loop."""

    def __init__(self, name: str) -> None:
        assert name in POLICIES, name
        self.name = name
        self.settled = 0  # how many times set-up was collected and frozen

    def settle(self) -> None:
        """After set-up (captures, compiles): collect, and freeze what survives (not under ``as-is``)."""
        if self.name == "as-is":
            return
        gc.collect()
        gc.freeze()
        self.settled += 1

    @contextlib.contextmanager
    def during_loop(self) -> Iterator[None]:
        """Collection off while the loop runs under ``off`` (as it was after); nothing otherwise."""
        if self.name != "off" or not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.enable()
