"""The device side of programmatic dependent launch (see ``pdl.py``): what each of our kernels runs on entry.
Imports Triton (imported only by the kernels' modules)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def enter(PDL: tl.constexpr):
    """With ``PDL``: wait until the kernel before has completed and its writes are visible, then let the kernel after
    launch (its blocks wait in turn on their own entry). Called before any store and any load of what a phase
    computes (the GEMV's first weight tile may come before: nothing in a phase writes weights). Without: nothing."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
