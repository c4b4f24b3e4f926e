"""The Triton kernel behind ``torch.ops.eaglelab.gemv`` (see ``gemv.py``, which imports this module only
when it is asked for the kernel: importing it imports Triton).

``gemv_kernel``: program (n, s, m) computes the output columns of one block of ``BLOCK_N`` weight rows over the s-th
share of K for the m-th block of ``BLOCK_M`` rows of x (one block up to 64 rows; more rows, as a batch's verify has,
are cut into blocks of 64, each weight tile then read by each block, from L2 after the first): for one row as a
multiply-and-row-sum, for a few rows with blocks of fewer than 16 weight rows as products summed on the CUDA cores
(as many programs as one row gets), else as a tensor-core dot.
With K split, each program writes its float32 share and takes a ticket for its block of rows and columns; the program
that takes the last ticket adds the shares in order (s = 0, 1, ...), then the bias, casts and stores, and puts the
ticket counter back to 0 for the next call: one launch, no atomics on the sums, so a result does not vary from run
to run. ``SHARES``: each program stores its float32 share and ends; the caller adds them (``gemv.add_shares``, folded
by inductor into the kernel that reads the output inside a compiled phase).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglelab.engine.model import pdl
from eaglelab.engine.model.gemv_tiling import GemvConfig, padded_rows, row_blocks, splits
from eaglelab.engine.model.pdl_kernels import enter
from eaglelab.engine.model.tickets import counters


@triton.jit
def _weights(w_ptr, rows_n, k0, N, K, stride_wn, BLOCK_K: tl.constexpr):
    """The weight tile [BN, BK] at column k0 (streamed: read once, evicted first)."""
    cols = k0 + tl.arange(0, BLOCK_K)  # [BK]
    return tl.load(w_ptr + rows_n[:, None] * stride_wn + cols[None, :],
                   mask=(rows_n[:, None] < N) & (cols[None, :] < K), other=0.0, eviction_policy="evict_first")


@triton.jit
def _rows(x_ptr, rows_m, k0, M, K, stride_xm, BLOCK_K: tl.constexpr):
    """The x tile [BM, BK] at column k0."""
    cols = k0 + tl.arange(0, BLOCK_K)  # [BK]
    return tl.load(x_ptr + rows_m[:, None] * stride_xm + cols[None, :],
                   mask=(rows_m[:, None] < M) & (cols[None, :] < K), other=0.0)


@triton.jit
def _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K: tl.constexpr):
    """The weight tile [BN, BK] and the x tile [BM, BK] at column k0."""
    return (_weights(w_ptr, rows_n, k0, N, K, stride_wn, BLOCK_K),
            _rows(x_ptr, rows_m, k0, M, K, stride_xm, BLOCK_K))


@triton.jit
def _share(part_ptr, s, rows_m, rows_n, M, N):
    """Share s's [BM, BN] block in part[S, M, N]: its addresses and the mask of the rows and columns that exist."""
    out = part_ptr + s * M * N + rows_m[:, None] * N + rows_n[None, :]
    return out, (rows_m[:, None] < M) & (rows_n[None, :] < N)


@triton.jit
def _finish(acc, b_ptr, y_ptr, rows_m, rows_n, M, N, HAS_BIAS: tl.constexpr):
    """y[rows_m, rows_n] = acc (+ bias), cast to y's dtype."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows_n, mask=rows_n < N, other=0.0).to(tl.float32)[None, :]
    out = rows_m[:, None] * N + rows_n[None, :]  # [BM, BN] offsets in a row-major [M, N]
    tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=(rows_m[:, None] < M) & (rows_n[None, :] < N))


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, ticket_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
                HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                PDL: tl.constexpr = False, EARLY: tl.constexpr = 0, SHARES: tl.constexpr = False):
    """y[m-block, n-block] = x[m-block] @ W[n-block]^T over K share s (+ bias); SPLITS > 1: float32 shares in
    part[s, M, N], added by the block's last program to finish (its ticket counter, ticket[m * programs_n + n],
    left at 0). SHARES: each program stores its float32 share in part[s, M, N] and is done (no ticket, no bias,
    y unwritten): the caller adds them. STAGES: the loads of the one-row loop pipelined that many steps ahead (1:
    not at all). PDL: launched dependently (``pdl.py``): waits on entry for the kernel before. EARLY (0, 1 or 2):
    the share's first EARLY weight tiles are loaded before that wait (no kernel of a phase writes weights; a
    second tile past the share's end is masked to zeros), the loop then starts after them; the sums are the same,
    in the same order."""
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] weight rows = output columns
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] x rows (the last block padded)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    # unread stand-ins where EARLY is lower (the compiler drops them): a name a constexpr branch binds must be bound
    w0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=w_ptr.dtype.element_ty)
    w1 = w0
    if EARLY >= 1:  # in flight while the kernel before finishes (a share is one BLOCK_K step or more: splits())
        w0 = _weights(w_ptr, rows_n, k_lo, N, K, stride_wn, BLOCK_K)
    if EARLY >= 2:  # the share's second tile, zeros past its end (k_hi: the next share's columns are not ours)
        w1 = _weights(w_ptr, rows_n, k_lo + BLOCK_K, N, k_hi, stride_wn, BLOCK_K)
    k_first = k_lo + EARLY * BLOCK_K
    enter(PDL)
    if BLOCK_M == 1:  # products summed elementwise over the loop, across lanes once at the end
        part = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        if EARLY >= 1:
            part += w0.to(tl.float32) * _rows(x_ptr, rows_m, k_lo, M, K, stride_xm, BLOCK_K).to(tl.float32)
        if EARLY >= 2:
            part += w1.to(tl.float32) * _rows(x_ptr, rows_m, k_lo + BLOCK_K, M, k_hi, stride_xm, BLOCK_K).to(tl.float32)
        for k0 in tl.range(k_first, k_hi, BLOCK_K, num_stages=STAGES):  # the compiler pipelines dots only
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            part += w.to(tl.float32) * x.to(tl.float32)  # [BN, BK] * [1, BK]
        acc = tl.sum(part, axis=1)[None, :]  # [1, BN]
    elif BLOCK_N < 16:  # a few rows on the CUDA cores, summed as for one row: as many programs as M = 1 gets
        part3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        if EARLY >= 1:
            x0 = _rows(x_ptr, rows_m, k_lo, M, K, stride_xm, BLOCK_K)
            part3 += x0.to(tl.float32)[:, None, :] * w0.to(tl.float32)[None, :, :]
        if EARLY >= 2:
            x1 = _rows(x_ptr, rows_m, k_lo + BLOCK_K, M, k_hi, stride_xm, BLOCK_K)
            part3 += x1.to(tl.float32)[:, None, :] * w1.to(tl.float32)[None, :, :]
        for k0 in tl.range(k_first, k_hi, BLOCK_K, num_stages=STAGES):
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            part3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]  # [BM, 1, BK] * [1, BN, BK]
        acc = tl.sum(part3, axis=2)  # [BM, BN]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if EARLY >= 1:
            acc = tl.dot(_rows(x_ptr, rows_m, k_lo, M, K, stride_xm, BLOCK_K), tl.trans(w0), acc)
        if EARLY >= 2:
            acc = tl.dot(_rows(x_ptr, rows_m, k_lo + BLOCK_K, M, k_hi, stride_xm, BLOCK_K), tl.trans(w1), acc)
        for k0 in range(k_first, k_hi, BLOCK_K):
            w, x = _tiles(x_ptr, w_ptr, rows_m, rows_n, k0, M, N, K, stride_xm, stride_wn, BLOCK_K)
            acc = tl.dot(x, tl.trans(w), acc)  # [BM, BN], tensor cores, float32
    if SHARES:  # the shares are the output: added where they are read (gemv.add_shares, fused by the compiler)
        mine, keep = _share(part_ptr, pid_k, rows_m, rows_n, M, N)
        tl.store(mine, acc, mask=keep)
    elif SPLITS == 1:
        _finish(acc, b_ptr, y_ptr, rows_m, rows_n, M, N, HAS_BIAS)
    else:
        mine, keep = _share(part_ptr, pid_k, rows_m, rows_n, M, N)
        tl.store(mine, acc, mask=keep)
        tl.debug_barrier()  # every thread's share stored before the ticket is taken (its release publishes them)
        block = pid_m * tl.num_programs(0) + pid_n  # this block of rows and columns: its ticket counter
        ticket = tl.atomic_add(ticket_ptr + block, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:  # the last share of this block is in: add them all, in order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLITS):  # read past this SM's L1: other programs wrote them
                theirs, _ = _share(part_ptr, s, rows_m, rows_n, M, N)
                total += tl.load(theirs, mask=keep, other=0.0, cache_modifier=".cg")
            tl.store(ticket_ptr + block, 0)  # ready for the next call (kernels on a stream run in order)
            _finish(total, b_ptr, y_ptr, rows_m, rows_n, M, N, HAS_BIAS)


# Weight tiles each program loads before its PDL wait (the kernel's EARLY: 0, 1 or 2), by the rows of x. Timed on
# an H100 (SmolLM2's shape, 5/4/24, each rule in two bench processes, benchmarks/results/h100_2026-12-06b/): two
# tiles at one row made a decode 0.688 -> 0.645 ms, at more rows a verify 0.807 -> 0.898 ms and the draft phase
# 0.196 -> 0.210 ms (a dot's tiles held in registers across the wait). So two for a decode's GEMV, one elsewhere;
# on another H100 the rule against one tile everywhere: decode 0.694 -> 0.680 ms, the cycle the same
# (benchmarks/results/h100_2026-12-06c/F2).
EARLY_TILES_ONE_ROW = 2
EARLY_TILES = 1


def early_tiles(rows: int) -> int:
    """The weight tiles a dependently launched GEMV of ``rows`` rows of x loads before it waits."""
    return EARLY_TILES_ONE_ROW if rows == 1 else EARLY_TILES


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, block_k: int,
         split_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype; the tiling as int arguments. Launched
    dependently while ``pdl.active()``, each program's first :func:`early_tiles` weight tiles then loaded before it
    waits."""
    return _as_op(x, weight, bias, GemvConfig(block_n, block_k, split_k, num_warps, num_stages), False)


def gemv_shares(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, split_k: int, num_warps: int,
                num_stages: int) -> torch.Tensor:
    """The op ``torch.ops.eaglelab.gemv_shares``: x [M, K] @ weight [N, K]^T as its float32 K shares [S, M, N]
    (:func:`launch` with ``shares``), launched as :func:`gemv` is."""
    return _as_op(x, weight, None, GemvConfig(block_n, block_k, split_k, num_warps, num_stages), True)


def _as_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig,
           shares: bool) -> torch.Tensor:
    """:func:`launch` as the ops launch: dependently while ``pdl.active()``, with that row count's early tiles."""
    on = pdl.active()
    return launch(x, weight, bias, cfg, on, early_tiles(x.shape[0]) if on else 0, shares)


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig, dependent: bool,
           early: int, shares: bool = False) -> torch.Tensor:
    """:func:`gemv` with the launch spelled out: ``dependent`` (PDL: wait on entry, ``launch_pdl``), ``early`` (the
    weight tiles loaded before that wait, 0-2; True is 1; tests run it alone, under Triton's interpreter).
    ``shares``: the output is the float32 K shares [S, M, N] (S = the programs along K of ``cfg``'s split), one launch
    and no ticket; adding them (in order s = 0, 1, ...) and the bias is the caller's (``bias`` must be None)."""
    (M, K), N = x.shape, weight.shape[0]
    block_n, block_k, num_warps, num_stages = cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    per, programs_k = splits(K, cfg)
    programs_n, programs_m = triton.cdiv(N, block_n), row_blocks(M, block_n)
    b = bias if bias is not None else weight  # an unread pointer when there is no bias
    if shares:
        assert bias is None, "the shares' bias is added with them (gemv.add_shares)"
        y = part = ticket = torch.empty(programs_k, M, N, dtype=torch.float32, device=x.device)  # y, ticket unread
    else:
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
        if programs_k > 1:
            part = torch.empty(programs_k, M, N, dtype=torch.float32, device=x.device)
            # one counter per block of rows and columns, all 0 between calls
            ticket = counters("gemv", x.device, programs_n * programs_m)
        else:
            part = ticket = y  # unread pointers
    gemv_kernel[(programs_n, programs_k, programs_m)](
        x, weight, b, y, part, ticket, M, N, K, per, x.stride(0), weight.stride(0),
        HAS_BIAS=bias is not None, SPLITS=programs_k, BLOCK_M=padded_rows(M, block_n), BLOCK_N=block_n,
        BLOCK_K=block_k, STAGES=num_stages, EARLY=int(early), SHARES=shares, num_warps=num_warps,
        num_stages=num_stages, **pdl.launch_options(dependent))
    return part if shares else y


def _shares_shape_only(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, split_k: int,
                       num_warps: int, num_stages: int) -> torch.Tensor:
    """What torch.compile traces the shares with: [S, M, N] float32, no kernel."""
    shares = splits(x.shape[1], GemvConfig(block_n, block_k, split_k, num_warps, num_stages))[1]
    return x.new_empty(shares, x.shape[0], weight.shape[0], dtype=torch.float32)


def _shape_only(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, block_k: int,
                split_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """What torch.compile traces with: the output's shape and dtype, no kernel."""
    return x.new_empty(x.shape[0], weight.shape[0])


def register():
    """``torch.ops.eaglelab.gemv``: an opaque custom op with a shape-only (fake) implementation, so
    torch.compile(fullgraph) keeps it as one call in its graph, and CUDA graphs capture its launches; and
    ``torch.ops.eaglelab.gemv_shares`` alike (a split tiling's float32 K shares [S, M, N], added by the caller).
    (Opaque rather than a ``triton_op``: the compiler then needs no analysis of the kernel's writes, which,
    where it fails, assumes every argument written and copies the weights each call.) Called once per
    process (``gemv.load_op`` caches it)."""
    op = torch.library.custom_op("eaglelab::gemv", gemv, mutates_args=())
    op.register_fake(_shape_only)
    shares = torch.library.custom_op("eaglelab::gemv_shares", gemv_shares, mutates_args=())
    shares.register_fake(_shares_shape_only)
    return op
