"""Programmatic dependent launch (PDL): each kernel of a captured phase starts while the one before it finishes.

A CUDA graph removes the host from a phase, not the gap between two of its kernels: the next kernel is launched
only once the last block of the one before has exited, and its blocks are then scheduled, load their arguments and
work out their indices before touching memory. On a small model every kernel is a few microseconds, and those gaps
add up (a SmolLM2 decode: ~140 us of its ~870 between 371 kernels on an H100). Hopper (compute capability 9.0)
lets a kernel launched with the *programmatic stream serialization* attribute start as soon as every block of the
kernel before it has signalled (``griddepcontrol.launch_dependents``) or exited; it then waits
(``griddepcontrol.wait``) for that kernel to have completed, its memory visible, before it reads or writes anything
the chain shares. CUDA-graph capture keeps these launches as programmatic edges.

Every kernel of the chain has to take part:

* inductor's own kernels, compiled with ``triton.enable_pdl`` (the phase compiler's option,
  ``engine/runtime/compile.phase_options``);
* ours (the GEMV, the decode attention, the cycle's kernels): each takes a ``PDL`` constexpr, and with it waits on
  entry, before any load or store of what the phase computes, then lets its dependents launch
  (``pdl_kernels.enter``); its launcher passes :func:`launch_options` while
  :func:`dependent_launches` is on, i.e. while a runner that asked for PDL warms up and captures. The GEMV loads its
  first tile of weights before that wait (no kernel of a phase writes weights): the memory's latency then runs
  while the kernel before finishes;
* anything else (cuBLAS, copies) launches as always: the kernel after it starts once it has exited, as without PDL.

Waiting on entry keeps the order of the phase's memory effects exactly that of plain launches: only the launch, the
block scheduling, the kernel's prologue and the weights' first loads overlap the kernel before, never a load of
what it writes nor a store. The numbers a phase computes are therefore the same bits with and without PDL.

Pure Python: Triton is not imported here (``pdl_kernels`` holds the device side).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_active = False  # whether our launchers add launch_pdl now (inside dependent_launches(True))


def refusal(device: torch.device | str) -> str | None:
    """Why phases on ``device`` cannot launch dependently (None: they can): a CUDA device of compute capability 9.0
    or later, inductor able to generate PDL code, Triton able to launch it."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"PDL is a CUDA feature ({device.type} device)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"PDL needs compute capability 9.0 or later (Hopper); this GPU is {major}.{minor}"
    return software_refusal()


def software_refusal() -> str | None:
    """Why this torch and Triton cannot generate and launch PDL kernels (None: they can)."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "enable_pdl"):
        return f"torch {torch.__version__}'s inductor has no triton.enable_pdl (PDL code for compiled kernels)"
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no grid dependency control (gdc_wait): {exc}"
    return None


@contextlib.contextmanager
def dependent_launches(on: bool) -> Iterator[None]:
    """While inside (``on``), our kernels launch with PDL; restored after (nests)."""
    global _active
    before, _active = _active, bool(on)
    try:
        yield
    finally:
        _active = before


def active() -> bool:
    """Whether our launchers launch dependently now (the kernels' ``PDL`` constexpr)."""
    return _active


def launch_options(on: bool | None = None) -> dict[str, bool]:
    """What a launcher passes to one of our kernels: its ``PDL`` constexpr, and ``launch_pdl`` with it when on (never
    ``launch_pdl=False``, so that a launch off PDL, Triton's interpreter included, is exactly as before). ``on``:
    whether to launch dependently (None: :func:`active`)."""
    on = _active if on is None else on
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}
