"""The Triton kernels behind ``torch.ops.eaglelab.gemv`` (see ``gemv.py``, which imports this module only
when it is asked for the kernel: importing it imports Triton).

``gemv_kernel``: program (n, s) computes the output columns of one block of ``BLOCK_N`` weight rows over
the s-th share of K: for one row as a multiply-and-row-sum, for a few rows with blocks of fewer than 16 weight
rows as products summed on the CUDA cores (as many programs as one row gets), else as a tensor-core dot.
``split_sum_kernel``: with K split, adds the float32 shares in order (s = 0, 1, ...), then the bias, and casts: no
atomics, so a result does not vary from run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglelab.engine.model.gemv import GemvConfig, padded_rows, splits


@triton.jit
def _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K: tl.constexpr):
    """The weight tile [BN, BK] (streamed: read once, evicted first) and the x tile [BM, BK] at column k0."""
    cols = k0 + tl.arange(0, BLOCK_K)  # [BK]
    w = tl.load(w_ptr + rows_n[:, None] * stride_wn + cols[None, :],
                mask=(rows_n[:, None] < N) & (cols[None, :] < K), other=0.0, eviction_policy="evict_first")
    x = tl.load(x_ptr + rows_m[:, None] * stride_xm + cols[None, :],
                mask=(rows_m[:, None] < M) & (cols[None, :] < K), other=0.0)
    return w, x


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
                HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """y[:, n-block] = x @ W[n-block]^T over K share s (+ bias). PARTIAL: float32 sums to y[s, M, N] instead.
    STAGES: the loads of the one-row loop pipelined that many steps ahead (1: not at all)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] weight rows = output columns
    rows_m = tl.arange(0, BLOCK_M)  # [BM] x rows (padded)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if BLOCK_M == 1:  # products summed elementwise over the loop, across lanes once at the end
        part = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):  # the compiler pipelines dots only
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            part += w.to(tl.float32) * x.to(tl.float32)  # [BN, BK] * [1, BK]
        acc = tl.sum(part, axis=1)[None, :]  # [1, BN]
    elif BLOCK_N < 16:  # a few rows on the CUDA cores, summed as for one row: as many programs as M = 1 gets
        part3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            part3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]  # [BM, 1, BK] * [1, BN, BK]
        acc = tl.sum(part3, axis=2)  # [BM, BN]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            acc = tl.dot(x, tl.trans(w), acc)  # [BM, BN], tensor cores, float32
    out = rows_m[:, None] * N + rows_n[None, :]  # [BM, BN] offsets in a row-major [M, N]
    keep = (rows_m[:, None] < M) & (rows_n[None, :] < N)
    if PARTIAL:
        tl.store(y_ptr + pid_k * M * N + out, acc, mask=keep)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_n, mask=rows_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def split_sum_kernel(part_ptr, b_ptr, y_ptr, MN, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BLOCK: tl.constexpr):
    """y[M, N] = sum over s of part[s, M, N] (in order s = 0, 1, ...) + b, cast to y's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(part_ptr + s * MN + offs, mask=keep, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=keep)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, block_k: int,
         split_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype; the tiling as int arguments."""
    (M, K), N = x.shape, weight.shape[0]
    per, programs_k = splits(K, GemvConfig(block_n, block_k, split_k, num_warps, num_stages))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    b = bias if bias is not None else weight  # an unread pointer when there is no bias
    block_m = padded_rows(M, block_n)
    partial = programs_k > 1
    out = torch.empty(programs_k, M, N, dtype=torch.float32, device=x.device) if partial else y
    gemv_kernel[(triton.cdiv(N, block_n), programs_k)](
        x, weight, b, out, M, N, K, per, x.stride(0), weight.stride(0),
        HAS_BIAS=bias is not None, PARTIAL=partial, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
    if partial:
        split_sum_kernel[(triton.cdiv(M * N, 1024),)](
            out, b, y, M * N, N, SPLITS=programs_k, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4)
    return y


def _shape_only(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, block_k: int,
                split_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """What torch.compile traces with: the output's shape and dtype, no kernel."""
    return x.new_empty(x.shape[0], weight.shape[0])


def register():
    """``torch.ops.eaglelab.gemv``: an opaque custom op with a shape-only (fake) implementation, so
    torch.compile(fullgraph) keeps it as one call in its graph, and CUDA graphs capture its launches.
    (Opaque rather than a ``triton_op``: the compiler then needs no analysis of the kernel's writes, which,
    where it fails, assumes every argument written and copies the weights each call.) Called once per
    process (``gemv.load_op`` caches it)."""
    op = torch.library.custom_op("eaglelab::gemv", gemv, mutates_args=())
    op.register_fake(_shape_only)
    return op
