"""What our Triton kernels (the GEMV, the decode attention) share: why one is unavailable, the dtypes
they take, whether a call is being captured, and a CUDA-graph timer for their tuning and benchmarks.

Triton is never imported at module level here (only by triton_version, when called): each kernel's module imports
it lazily, on first use.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any, Callable

import torch

DTYPES = (torch.bfloat16, torch.float16)  # what the kernels take: half-precision weights and activations


def triton_version() -> str | None:
    """The installed Triton's version (None: not installed)."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def first_line(exc: Exception) -> str:
    """The first non-empty line of an exception's message (at most 120 characters)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:120] if lines else ""


def unavailable(what: str, load: Callable[[], Any]) -> str | None:
    """Why kernel ``what`` cannot run here (None: it can): ``load`` (import Triton, register the op) failed."""
    try:
        load()
    except Exception as exc:  # noqa: BLE001 - any import or registration failure is the reason
        return f"{what} unavailable ({type(exc).__name__}: {first_line(exc)})"
    return None


def dtype_refusal(dtype: torch.dtype, what: str) -> str | None:
    """Why kernel ``what`` takes no call of a model whose weights are ``dtype`` (None: it can)."""
    if dtype in DTYPES:
        return None
    return f"{str(dtype).removeprefix('torch.')} weights ({what} takes bfloat16 or float16)"


def capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream (never for CPU tensors)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def time_in_turn(call: Callable[[int], Any], copies: int, reps: int, replays: int = 3) -> float:
    """Milliseconds per call of ``call(i)`` over ``copies`` inputs in turn (i = 0, 1, ..., copies - 1, 0, ...,
    so that together they outgrow the L2 cache and each call reads from memory, as in a decode): ``reps``
    calls captured in one CUDA graph, the median of ``replays`` replays. In a graph, as in a captured decode,
    launch costs are out: timed eagerly, a call of a few microseconds of GPU work would measure the host's
    dispatch, the same for every variant."""
    turn = itertools.count()
    for _ in range(min(copies, 3)):  # compiles the kernel (Triton JIT), outside the capture
        call(next(turn) % copies)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            call(next(turn) % copies)
    times = []
    for _ in range(replays + 1):  # the first replay warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times[1:])
