"""Ticket counters for kernels whose last program to finish a piece of work completes it in the same launch (the
split GEMV's shares added, a split attention's partials merged, a draft step's expansion selected): each program
takes a ticket (an atomic add on its piece's counter); the one that takes the last does the rest and puts the
counter back to 0, so the counters are 0 between calls. Kernels of one stream run one after another (a dependent
launch waits for the kernel ahead of it before it takes a ticket), so each kind of kernel needs one set per device.
"""

from __future__ import annotations

import torch

SIZE = 1 << 16  # counters per set
_made: dict[tuple[str, torch.device], torch.Tensor] = {}


def counters(kind: str, device: torch.device, pieces: int) -> torch.Tensor:
    """The int32 counters of ``kind`` (e.g. "gemv") on ``device``, at least ``pieces`` of them, all 0 between calls.
    Made on first use; made under a CUDA-graph capture they live in that graph's memory pool, kept while the tensor
    is."""
    assert pieces <= SIZE, f"{pieces} pieces of work > {SIZE} {kind} ticket counters"
    key = (kind, device)
    if key not in _made:
        _made[key] = torch.zeros(SIZE, dtype=torch.int32, device=device)
    return _made[key]


def made(kind: str, device: torch.device) -> torch.Tensor | None:
    """The counters of ``kind`` on ``device`` if a kernel has taken them (None: none has), for a test to check they
    were used and left at 0."""
    return _made.get((kind, device))
