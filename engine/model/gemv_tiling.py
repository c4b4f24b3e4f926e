"""The GEMV kernel's tiling and the arithmetic the launcher and the tuner share: BLOCK_M from the rows,
K per split. Pure Python (no torch, no Triton), so :mod:`.gemv` (the tuner) and :mod:`.gemv_kernels` (the
Triton launch) both import it without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple


class GemvConfig(NamedTuple):
    """One tiling: weight rows per program, K per loop step, K splits, warps, pipeline stages."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def padded_rows(rows: int, block_n: int) -> int:
    """The kernel's BLOCK_M: the rows padded to a power of two, and to at least 16 for the tensor-core dot (tilings
    of 16 weight rows or more at M > 1; tl.dot takes >= 16 rows)."""
    block_m = 1 << (rows - 1).bit_length()
    return block_m if rows == 1 or block_n < 16 else max(16, block_m)


def splits(k: int, cfg: GemvConfig) -> tuple[int, int]:
    """(K per split, rounded up to whole ``block_k`` steps; programs along K)."""
    per = -(-k // cfg.split_k)
    per = -(-per // cfg.block_k) * cfg.block_k
    return per, -(-k // per)
