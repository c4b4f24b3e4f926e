"""The Triton kernels behind ``torch.ops.eaglelab.draft_qkv`` and ``draft_rows`` (see ``draft_step.py``, which
imports this module only in :func:`draft_step.load`: importing it imports Triton).

A draft step runs the EAGLE-3 drafter's one layer on the frontier's few rows (R = batch x topk, at most 16). Left
to the compiler, the layer's norms, residual adds, rotary, SwiGLU and the head's ranking are kernels of their own
between the matmuls, each a few microseconds of launch and ramp for well under one of work. Here each matmul takes
the work around it; the rows (padded to 16) times a block of weight rows on the tensor cores, the loads pipelined
(as ``gemv_kernel`` does for more than a few rows), the norm folded into the same loop:

``qkv_rope_kernel``: the rows' inputs built on the fly (the embedding of each row's token and the parent's hidden
state, gathered by index, each RMS-normalised), q/k/v projected, q and k rotated, q stored, k and v written into the
drafter's KV cache at the rows' slots. A program computes either PAIRS column pairs (i, i + D/2) of q/k heads, the
two halves rotary mixes, or BLOCK_V columns of v.

``rows_kernel``: y = [norm](x) @ W^T with one of four endings: stored; plus a residual row (o and down); SwiGLU of
the gate and up columns (weight rows n and n + N of the fused gate/up); or, for the head, the block's best K logits
per row with the block's max and sum of exponentials, what ``cycle_kernels.expand_select_kernel`` ranks (the
logits themselves are never stored). x rows may be gathered by index (the parent's state) and read with strides
(the attention's [B, NH, T, D] output as [B*T, NH*D] rows).

Rounding follows the reference (``eagle3.Eagle3Network.forward``) where it rounds in the model's dtype (each matmul's
output, the rotary's products and sum, SwiGLU's silu and product, a residual sum, the head's logits), except inside
RMSNorm: the reference rounds x / rms, then times the weight; here x times the weight is rounded, the matmul's sums
divided by rms after (one pass over x, not two). Sums run in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLOOR = tl.constexpr(-3.4028234663852886e38)  # a NaN or -inf logit's rank key, as cycle_kernels' FLOOR

EPI_STORE, EPI_RESIDUAL, EPI_SWIGLU, EPI_BLOCKS = 0, 1, 2, 3  # rows_kernel's endings


@triton.jit
def _dot_rows(acc, acc2, ss, x_ptr, base, ok, s_xh, XD, nw_ptr, w_ptr, w_rows, w_rows2, w_ok, w_col0, s_w, K,
              NORM: tl.constexpr, TWO: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
              PRECISION: tl.constexpr):
    """acc [BM, BN] += x [BM, K] @ W[w_rows, w_col0:w_col0 + K]^T on the tensor cores (TWO: acc2 likewise for
    ``w_rows2``, from the same x loads), the loads pipelined STAGES steps ahead; x's entry k of row r at
    ``x_ptr + base[r] + (k // XD) * s_xh + k % XD``. NORM: x times the norm's weight (``nw_ptr``) first, rounded to
    x's dtype, and each row's sum of squares added into ``ss`` [BM] (the caller scales by 1 / rms after: the
    reference rounds x / rms before the weight; this rounds x * weight)."""
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        kin = cols < K
        x = tl.load(x_ptr + base[:, None] + ((cols // XD) * s_xh + cols % XD)[None, :],
                    mask=ok[:, None] & kin[None, :], other=0.0)
        if NORM:
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            x = (xf * tl.load(nw_ptr + cols, mask=kin, other=0.0).to(tl.float32)[None, :]).to(x.dtype)
        w = tl.load(w_ptr + w_rows[:, None] * s_w + w_col0 + cols[None, :], mask=w_ok[:, None] & kin[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        if TWO:
            w2 = tl.load(w_ptr + w_rows2[:, None] * s_w + w_col0 + cols[None, :], mask=w_ok[:, None] & kin[None, :],
                         other=0.0, eviction_policy="evict_first")
            acc2 = tl.dot(x, tl.trans(w2), acc2, input_precision=PRECISION)
    return acc, acc2, ss


@triton.jit
def _inv_rms(ss, K, eps):
    """1 / sqrt(mean(x^2) + eps) from the rows' sums of squares."""
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _normed_dots(x_ptr, base, ok, nw_ptr, w_ptr, w_rows, w_rows2, w_ok, w_col0, s_w, K, eps,
                 TWO: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr, PRECISION: tl.constexpr):
    """RMSNorm(x [BM, K] contiguous rows) @ W[w_rows, w_col0:w_col0 + K]^T (TWO: and @ W[w_rows2, ...]^T),
    [BM, BN] float32 each."""
    acc = tl.zeros((BM, BN), tl.float32)
    acc2 = tl.zeros((BM, BN), tl.float32)
    ss = tl.zeros((BM,), tl.float32)
    acc, acc2, ss = _dot_rows(acc, acc2, ss, x_ptr, base, ok, 0, K, nw_ptr, w_ptr, w_rows, w_rows2, w_ok, w_col0,
                              s_w, K, True, TWO, BLOCK_K, STAGES, PRECISION)
    inv = _inv_rms(ss, K, eps)[:, None]
    return acc * inv, acc2 * inv


@triton.jit
def qkv_rope_kernel(tok_ptr, emb_ptr, feat_ptr, par_ptr, in_w_ptr, hid_w_ptr, w_ptr, pos_ptr, freq_ptr, slot_ptr,
                    q_ptr, k_ptr, v_ptr,
                    R, KSEL, F, H, NH, KVH, n_qk_programs, eps, factor,
                    s_emb, s_w, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs,
                    D: tl.constexpr, BM: tl.constexpr, PAIRS: tl.constexpr, BLOCK_V: tl.constexpr,
                    BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    """Rows r = b * KSEL + j: token ``tok[r]`` (a target id), parent ``par[r]`` (its state: ``feat[b, par[r]]`` of
    [B, F, H]), position ``pos[r]``, cache slot ``slot[r]``. q -> ``q`` [R, NH, D]; k, v -> the caches
    ``[B, KVH, S, D]`` (strides given). W: the fused q/k/v weight [(NH + 2 KVH) D, 2H], its first H columns read
    the normalised embedding, the last H the normalised state."""
    pid = tl.program_id(0)
    rows = tl.arange(0, BM)
    ok = rows < R
    b = rows // KSEL
    tok = tl.load(tok_ptr + rows, mask=ok, other=0)
    par = tl.load(par_ptr + rows, mask=ok, other=0)
    e_base = tok * s_emb
    f_base = (b * F + par) * H
    slot = tl.load(slot_ptr + rows, mask=ok, other=0)
    dt = q_ptr.dtype.element_ty
    if pid < n_qk_programs:  # PAIRS rotary pairs (i, i + D/2) of the q and k heads
        HALF: tl.constexpr = D // 2
        p = pid * PAIRS + tl.arange(0, PAIRS)
        p_ok = p < (NH + KVH) * HALF
        head, i = p // HALF, p % HALF
        row_a = head * D + i  # q heads then k heads: the fused weight's first (NH + KVH) D rows
        row_b = row_a + HALF
        xa, xb = _normed_dots(emb_ptr, e_base, ok, in_w_ptr, w_ptr, row_a, row_b, p_ok, 0, s_w, H, eps, True, BM,
                              PAIRS, BLOCK_K, STAGES, PRECISION)
        fa, fb = _normed_dots(feat_ptr, f_base, ok, hid_w_ptr, w_ptr, row_a, row_b, p_ok, H, s_w, H, eps, True, BM,
                              PAIRS, BLOCK_K, STAGES, PRECISION)
        xa += fa
        xb += fb
        xa = xa.to(dt).to(tl.float32)  # [BM, PAIRS], rounded as the projection's output
        xb = xb.to(dt).to(tl.float32)
        pos = tl.load(pos_ptr + rows, mask=ok, other=0).to(tl.float32)
        angle = pos[:, None] * tl.load(freq_ptr + i, mask=p_ok, other=0.0)[None, :]
        cos = (tl.cos(angle) * factor).to(dt).to(tl.float32)
        sin = (tl.sin(angle) * factor).to(dt).to(tl.float32)
        # x * cos + rotate_half(x) * sin, each product and the sum rounded: rotate_half puts -x_b at i, x_a at i + D/2
        ya = ((xa * cos).to(dt).to(tl.float32) + (-xb * sin).to(dt).to(tl.float32)).to(dt)
        yb = ((xb * cos).to(dt).to(tl.float32) + (xa * sin).to(dt).to(tl.float32)).to(dt)
        keep = ok[:, None] & p_ok[None, :]
        is_q = head < NH
        q_at = rows[:, None] * (NH * D) + (head * D + i)[None, :]
        tl.store(q_ptr + q_at, ya, mask=keep & is_q[None, :])
        tl.store(q_ptr + q_at + HALF, yb, mask=keep & is_q[None, :])
        kh = head - NH
        k_at = b[:, None] * s_kb + kh[None, :] * s_kh + slot[:, None] * s_ks + i[None, :]
        tl.store(k_ptr + k_at, ya, mask=keep & (~is_q)[None, :])
        tl.store(k_ptr + k_at + HALF, yb, mask=keep & (~is_q)[None, :])
    else:  # BLOCK_V columns of v
        c = (pid - n_qk_programs) * BLOCK_V + tl.arange(0, BLOCK_V)
        c_ok = c < KVH * D
        w_rows = (NH + KVH) * D + c
        v, _ = _normed_dots(emb_ptr, e_base, ok, in_w_ptr, w_ptr, w_rows, w_rows, c_ok, 0, s_w, H, eps, False, BM,
                            BLOCK_V, BLOCK_K, STAGES, PRECISION)
        vf, _ = _normed_dots(feat_ptr, f_base, ok, hid_w_ptr, w_ptr, w_rows, w_rows, c_ok, H, s_w, H, eps, False, BM,
                             BLOCK_V, BLOCK_K, STAGES, PRECISION)
        v += vf
        v_at = b[:, None] * s_vb + (c // D)[None, :] * s_vh + slot[:, None] * s_vs + (c % D)[None, :]
        tl.store(v_ptr + v_at, v.to(v_ptr.dtype.element_ty), mask=ok[:, None] & c_ok[None, :])


@triton.jit
def rows_kernel(x_ptr, idx_ptr, nw_ptr, w_ptr, res_ptr, res_idx_ptr, y_ptr, val_ptr, ix_ptr, peak_ptr, mass_ptr,
                R, KSEL, N, K, XD, s_xb, s_xt, s_xh, s_w, s_rb, s_rt, s_y, eps,
                NORM: tl.constexpr, GATHER: tl.constexpr, EPI: tl.constexpr, RES_GATHER: tl.constexpr,
                TOPK: tl.constexpr, KP: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    """Program n: columns n * BLOCK_N .. of y = [norm](x) @ W^T for the R rows r = b * KSEL + t; x's row r at
    ``b * s_xb + t' * s_xt`` with t' = ``idx[r]`` (GATHER) or t, entry k at ``(k // XD) * s_xh + k % XD`` past it.
    EPI: 0 y stored [R, N] (row stride s_y); 1 plus the residual row (``res`` at ``b * s_rb + t'' * s_rt``, t'' as
    t' with RES_GATHER); 2 silu(x W_n) * (x W_{n + N}) stored; 3 the block's TOPK best logits of each row (rank keys
    and column ids, [R, C, TOPK]) and its max key and sum of exp(key - max) ([R, C])."""
    pid = tl.program_id(0)
    rows = tl.arange(0, BM)
    ok = rows < R
    b, t = rows // KSEL, rows % KSEL
    if GATHER:
        t = tl.load(idx_ptr + rows, mask=ok, other=0)
    base = b * s_xb + t * s_xt
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    acc = tl.zeros((BM, BLOCK_N), tl.float32)
    up = tl.zeros((BM, BLOCK_N), tl.float32)
    ss = tl.zeros((BM,), tl.float32)
    acc, up, ss = _dot_rows(acc, up, ss, x_ptr, base, ok, s_xh, XD, nw_ptr, w_ptr, n, n + N, n_ok, 0, s_w, K, NORM,
                            EPI == 2, BLOCK_K, STAGES, PRECISION)  # SwiGLU: the up columns from the same loads
    if NORM:
        inv = _inv_rms(ss, K, eps)[:, None]
        acc, up = acc * inv, up * inv
    dt = x_ptr.dtype.element_ty
    acc = acc.to(dt)  # [BM, BN], rounded as the matmul's output
    keep = ok[:, None] & n_ok[None, :]
    if EPI == 0:
        tl.store(y_ptr + rows[:, None] * s_y + n[None, :], acc, mask=keep)
    elif EPI == 1:
        tr = t
        if RES_GATHER:
            tr = tl.load(res_idx_ptr + rows, mask=ok, other=0)
        res = tl.load(res_ptr + (b * s_rb + tr * s_rt)[:, None] + n[None, :], mask=keep, other=0.0)
        tl.store(y_ptr + rows[:, None] * s_y + n[None, :], (res.to(tl.float32) + acc.to(tl.float32)).to(dt),
                 mask=keep)
    elif EPI == 2:
        u = up.to(dt).to(tl.float32)
        g = acc.to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(y_ptr + rows[:, None] * s_y + n[None, :], (silu * u).to(dt), mask=keep)
    else:  # the head: this block's ranking, as cycle_kernels.expand_blocks_kernel ranks a block of logits
        x = acc.to(tl.float32)
        key = tl.where((x != x) | (x == float("-inf")), FLOOR, x)
        key = tl.where(n_ok[None, :], key, float("-inf"))  # past the vocabulary: below every entry
        peak = tl.max(key, axis=1)  # [BM]
        mass = tl.sum(tl.exp(key - peak[:, None]), axis=1)
        C = tl.num_programs(0)
        r = tl.arange(0, KP)
        vals = tl.full((BM, KP), float("-inf"), tl.float32)
        idxs = tl.zeros((BM, KP), tl.int32)
        for j in tl.static_range(TOPK):
            best = tl.max(key, axis=1)  # [BM]
            at = tl.min(tl.where(key == best[:, None], n[None, :], 2147483647), axis=1)
            vals = tl.where(r[None, :] == j, best[:, None], vals)
            idxs = tl.where(r[None, :] == j, at[:, None], idxs)
            key = tl.where(n[None, :] == at[:, None], float("-inf"), key)
        out = (rows[:, None] * C + pid) * TOPK + r[None, :]
        tl.store(val_ptr + out, vals, mask=ok[:, None] & (r[None, :] < TOPK))
        tl.store(ix_ptr + out, idxs, mask=ok[:, None] & (r[None, :] < TOPK))
        tl.store(peak_ptr + rows * C + pid, peak, mask=ok)
        tl.store(mass_ptr + rows * C + pid, mass, mask=ok)
