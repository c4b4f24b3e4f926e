"""The GEMV kernel's tiling and the arithmetic the launcher and the tuner share: BLOCK_M from the rows,
K per split, whether a CUDA-core tiling's sums fit the registers, a tiling's text form. Pure Python (no torch, no
Triton), so :mod:`.gemv` (the tuner) and :mod:`.gemv_kernels` (the Triton launch) both import it without importing
each other.
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


BLOCK_M_MAX = 64  # rows of x a program holds at most: more rows are cut into blocks of this many, a program each
# The rows (M) the kernel can take: up to 64 one program holds them all; 65-256, a verify at batch 8 (8 x 20 rows) or
# 32 (32 x 3), are cut into blocks of 64 (:func:`row_blocks`), where a split tiling's K shares added by the reader
# beat cuBLAS's GEMM as they do at 8-64 rows. More rows (a prompt) are a GEMM's job. Tuning buckets (powers of two)
# go up to it, in a device profile's or the cache's tilings too.
KERNEL_ROWS = 256


def padded_rows(rows: int, block_n: int) -> int:
    """The kernel's BLOCK_M: the rows padded to a power of two, and to at least 16 for the tensor-core dot (tilings
    of 16 weight rows or more at M > 1; tl.dot takes >= 16 rows); at most :data:`BLOCK_M_MAX` (:func:`row_blocks`)."""
    block_m = 1 << (rows - 1).bit_length()
    return min(block_m if rows == 1 or block_n < 16 else max(16, block_m), BLOCK_M_MAX)


def row_blocks(rows: int, block_n: int) -> int:
    """The blocks of :func:`padded_rows` rows the kernel cuts ``rows`` rows of x into (1 up to 64 rows)."""
    return -(-rows // padded_rows(rows, block_n))


def splits(k: int, cfg: GemvConfig) -> tuple[int, int]:
    """(K per split, rounded up to whole ``block_k`` steps; programs along K)."""
    per = -(-k // cfg.split_k)
    per = -(-per // cfg.block_k) * cfg.block_k
    return per, -(-k // per)


SUM_REGISTERS = 128  # float32 sums a thread may hold on the CUDA-core path ([rows, block_n, block_k] per program)


def fits_registers(cfg: GemvConfig, rows: int) -> bool:
    """Whether ``cfg`` at ``rows`` rows of x keeps its sums in registers: always on the tensor-core dot (16 weight
    rows or more, or one row of x); on the CUDA cores (fewer than 16 weight rows at M > 1) its [padded rows, block_n,
    block_k] float32 sums take at most :data:`SUM_REGISTERS` a thread. E.g. (4, 512, 1, 4, 2): 8 rows 128 a thread,
    16 rows 256."""
    if rows == 1 or cfg.block_n >= 16:
        return True
    return padded_rows(rows, cfg.block_n) * cfg.block_n * cfg.block_k <= SUM_REGISTERS * 32 * cfg.num_warps


def parse_tilings(text: str) -> tuple[GemvConfig, ...]:
    """``'bn,bk,split,warps,stages;...'`` -> the tilings (empty text: none). ValueError saying what is wrong where a
    tiling is not five positive ints or its block_n or block_k is not a power of two (the kernel's tiles need one)."""
    out = []
    for part in (t.strip() for t in text.split(";")):
        if not part:
            continue
        try:
            cfg = GemvConfig(*(int(v) for v in part.split(",")))
        except (TypeError, ValueError):
            raise ValueError(f"{part!r} is not five comma-separated ints (block_n, block_k, split_k, warps, "
                             "stages); ';' between tilings") from None
        if min(cfg) < 1 or cfg.block_n & (cfg.block_n - 1) or cfg.block_k & (cfg.block_k - 1):
            raise ValueError(f"{part!r}: every value must be >= 1, block_n and block_k powers of two")
        out.append(cfg)
    return tuple(out)
