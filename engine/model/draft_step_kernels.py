"""The Triton kernels behind ``torch.ops.eaglelab.draft_qkv`` and ``draft_rows`` (see ``draft_step.py``, which
imports this module only in :func:`draft_step.load`: importing it imports Triton).

A draft step runs the EAGLE-3 drafter's one layer on the frontier's few rows (R = batch x topk, at most 16). Left
to the compiler, the layer's norms, residual adds, rotary, SwiGLU and the head's ranking are kernels of their own
between the matmuls, each a few microseconds of launch and ramp for well under one of work. Here each matmul takes
the work around it, as products summed on the CUDA cores over the few rows (as ``gemv_kernel`` does for a few rows
with narrow column blocks):

``qkv_rope_kernel``: the rows' inputs built on the fly (the embedding of each row's token and the parent's hidden
state, gathered by index, each RMS-normalised), q/k/v projected, q and k rotated, q stored, k and v written into the
drafter's KV cache at the rows' slots. A program computes either PAIRS column pairs (i, i + D/2) of q/k heads, the
two halves rotary mixes, or BLOCK_V columns of v.

``rows_kernel``: y = [norm](x) @ W^T with one of four endings: stored; plus a residual row (o and down); SwiGLU of
the gate and up columns (weight rows n and n + N of the fused gate/up); or, for the head, the block's best K logits
per row with the block's max and sum of exponentials, what ``cycle_kernels.expand_select_kernel`` ranks (the
logits themselves are never stored). x rows may be gathered by index (the parent's state) and read with strides
(the attention's [B, NH, T, D] output as [B*T, NH*D] rows).

Each value is rounded where the reference (``eagle3.Eagle3Network.forward``) rounds in the model's dtype: the
normalised input before its weight, each matmul's output, the rotary's products and sum, SwiGLU's silu and product,
a residual sum, the head's logits; sums run in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLOOR = tl.constexpr(-3.4028234663852886e38)  # a NaN or -inf logit's rank key, as cycle_kernels' FLOOR

EPI_STORE, EPI_RESIDUAL, EPI_SWIGLU, EPI_BLOCKS = 0, 1, 2, 3  # rows_kernel's endings


@triton.jit
def _inv_rms(ptr, base, ok, K, eps, RP: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of each row [RP] (row r at ``ptr + base[r]``, K contiguous entries)."""
    ss = tl.zeros((RP,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(ptr + base[:, None] + cols[None, :], mask=ok[:, None] & (cols[None, :] < K), other=0.0)
        x = x.to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _products(part, x_ptr, base, ok, s_xh, XD, inv, nw_ptr, w_ptr, w_rows, w_ok, w_col0, s_w, K,
              NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """part [RP, BN, BK] += x [RP, BK] * W[w_rows, w_col0 + k] [BN, BK] over K, x's entry k of row r at
    ``x_ptr + base[r] + (k // XD) * s_xh + k % XD``; NORM: x normalised (``inv`` [RP], weight ``nw_ptr``) first,
    rounded as the reference's RMSNorm rounds (to x's dtype, then times the weight in that dtype)."""
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        kin = cols < K
        x = tl.load(x_ptr + base[:, None] + ((cols // XD) * s_xh + cols % XD)[None, :],
                    mask=ok[:, None] & kin[None, :], other=0.0)
        if NORM:
            xn = (x.to(tl.float32) * inv[:, None]).to(x.dtype)
            nw = tl.load(nw_ptr + cols, mask=kin, other=0.0)
            x = (xn.to(tl.float32) * nw.to(tl.float32)[None, :]).to(x.dtype)
        w = tl.load(w_ptr + w_rows[:, None] * s_w + w_col0 + cols[None, :], mask=w_ok[:, None] & kin[None, :],
                    other=0.0, eviction_policy="evict_first")
        part += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return part


@triton.jit
def qkv_rope_kernel(tok_ptr, emb_ptr, feat_ptr, par_ptr, in_w_ptr, hid_w_ptr, w_ptr, pos_ptr, freq_ptr, slot_ptr,
                    q_ptr, k_ptr, v_ptr,
                    R, KSEL, F, H, NH, KVH, n_qk_programs, eps, factor,
                    s_emb, s_w, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs,
                    D: tl.constexpr, RP: tl.constexpr, PAIRS: tl.constexpr, BLOCK_V: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """Rows r = b * KSEL + j: token ``tok[r]`` (a target id), parent ``par[r]`` (its state: ``feat[b, par[r]]`` of
    [B, F, H]), position ``pos[r]``, cache slot ``slot[r]``. q -> ``q`` [R, NH, D]; k, v -> the caches
    ``[B, KVH, S, D]`` (strides given). W: the fused q/k/v weight [(NH + 2 KVH) D, 2H]."""
    pid = tl.program_id(0)
    rows = tl.arange(0, RP)
    ok = rows < R
    b = rows // KSEL
    tok = tl.load(tok_ptr + rows, mask=ok, other=0)
    par = tl.load(par_ptr + rows, mask=ok, other=0)
    e_base = tok * s_emb
    f_base = (b * F + par) * H
    inv_e = _inv_rms(emb_ptr, e_base, ok, H, eps, RP, BLOCK_K)
    inv_f = _inv_rms(feat_ptr, f_base, ok, H, eps, RP, BLOCK_K)
    slot = tl.load(slot_ptr + rows, mask=ok, other=0)
    if pid < n_qk_programs:  # PAIRS rotary pairs (i, i + D/2) of the q and k heads
        HALF: tl.constexpr = D // 2
        p = pid * PAIRS + tl.arange(0, PAIRS)
        p_ok = p < (NH + KVH) * HALF
        head, i = p // HALF, p % HALF
        row_a = head * D + i  # q heads then k heads: the fused weight's first (NH + KVH) D rows
        row_b = row_a + HALF
        part_a = tl.zeros((RP, PAIRS, BLOCK_K), tl.float32)
        part_a = _products(part_a, emb_ptr, e_base, ok, 0, H, inv_e, in_w_ptr, w_ptr, row_a, p_ok, 0, s_w, H,
                           True, BLOCK_K)
        part_a = _products(part_a, feat_ptr, f_base, ok, 0, H, inv_f, hid_w_ptr, w_ptr, row_a, p_ok, H, s_w, H,
                           True, BLOCK_K)
        part_b = tl.zeros((RP, PAIRS, BLOCK_K), tl.float32)
        part_b = _products(part_b, emb_ptr, e_base, ok, 0, H, inv_e, in_w_ptr, w_ptr, row_b, p_ok, 0, s_w, H,
                           True, BLOCK_K)
        part_b = _products(part_b, feat_ptr, f_base, ok, 0, H, inv_f, hid_w_ptr, w_ptr, row_b, p_ok, H, s_w, H,
                           True, BLOCK_K)
        dt = q_ptr.dtype.element_ty
        xa = tl.sum(part_a, axis=2).to(dt).to(tl.float32)  # [RP, PAIRS], rounded as the projection's output
        xb = tl.sum(part_b, axis=2).to(dt).to(tl.float32)
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
        part = tl.zeros((RP, BLOCK_V, BLOCK_K), tl.float32)
        part = _products(part, emb_ptr, e_base, ok, 0, H, inv_e, in_w_ptr, w_ptr, w_rows, c_ok, 0, s_w, H,
                         True, BLOCK_K)
        part = _products(part, feat_ptr, f_base, ok, 0, H, inv_f, hid_w_ptr, w_ptr, w_rows, c_ok, H, s_w, H,
                         True, BLOCK_K)
        v = tl.sum(part, axis=2).to(v_ptr.dtype.element_ty)
        v_at = b[:, None] * s_vb + (c // D)[None, :] * s_vh + slot[:, None] * s_vs + (c % D)[None, :]
        tl.store(v_ptr + v_at, v, mask=ok[:, None] & c_ok[None, :])


@triton.jit
def rows_kernel(x_ptr, idx_ptr, nw_ptr, w_ptr, res_ptr, res_idx_ptr, y_ptr, val_ptr, ix_ptr, peak_ptr, mass_ptr,
                R, KSEL, N, K, XD, s_xb, s_xt, s_xh, s_w, s_rb, s_rt, s_y, eps,
                NORM: tl.constexpr, GATHER: tl.constexpr, EPI: tl.constexpr, RES_GATHER: tl.constexpr,
                TOPK: tl.constexpr, KP: tl.constexpr, RP: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """Program n: columns n * BLOCK_N .. of y = [norm](x) @ W^T for the R rows r = b * KSEL + t; x's row r at
    ``b * s_xb + t' * s_xt`` with t' = ``idx[r]`` (GATHER) or t, entry k at ``(k // XD) * s_xh + k % XD`` past it.
    EPI: 0 y stored [R, N] (row stride s_y); 1 plus the residual row (``res`` at ``b * s_rb + t'' * s_rt``, t'' as
    t' with RES_GATHER); 2 silu(x W_n) * (x W_{n + N}) stored; 3 the block's TOPK best logits of each row (rank keys
    and column ids, [R, C, TOPK]) and its max key and sum of exp(key - max) ([R, C])."""
    pid = tl.program_id(0)
    rows = tl.arange(0, RP)
    ok = rows < R
    b, t = rows // KSEL, rows % KSEL
    if GATHER:
        t = tl.load(idx_ptr + rows, mask=ok, other=0)
    base = b * s_xb + t * s_xt
    inv = tl.zeros((RP,), tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, base, ok, K, eps, RP, BLOCK_K)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    part = tl.zeros((RP, BLOCK_N, BLOCK_K), tl.float32)
    part = _products(part, x_ptr, base, ok, s_xh, XD, inv, nw_ptr, w_ptr, n, n_ok, 0, s_w, K, NORM, BLOCK_K)
    dt = x_ptr.dtype.element_ty
    acc = tl.sum(part, axis=2).to(dt)  # [RP, BN], rounded as the matmul's output
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
        up = tl.zeros((RP, BLOCK_N, BLOCK_K), tl.float32)
        up = _products(up, x_ptr, base, ok, s_xh, XD, inv, nw_ptr, w_ptr, n + N, n_ok, 0, s_w, K, NORM, BLOCK_K)
        u = tl.sum(up, axis=2).to(dt).to(tl.float32)
        g = acc.to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(y_ptr + rows[:, None] * s_y + n[None, :], (silu * u).to(dt), mask=keep)
    else:  # the head: this block's ranking, as cycle_kernels.expand_blocks_kernel ranks a block of logits
        x = acc.to(tl.float32)
        key = tl.where((x != x) | (x == float("-inf")), FLOOR, x)
        key = tl.where(n_ok[None, :], key, float("-inf"))  # past the vocabulary: below every entry
        peak = tl.max(key, axis=1)  # [RP]
        mass = tl.sum(tl.exp(key - peak[:, None]), axis=1)
        C = tl.num_programs(0)
        r = tl.arange(0, KP)
        vals = tl.full((RP, KP), float("-inf"), tl.float32)
        idxs = tl.zeros((RP, KP), tl.int32)
        for j in tl.static_range(TOPK):
            best = tl.max(key, axis=1)  # [RP]
            at = tl.min(tl.where(key == best[:, None], n[None, :], 2147483647), axis=1)
            vals = tl.where(r[None, :] == j, best[:, None], vals)
            idxs = tl.where(r[None, :] == j, at[:, None], idxs)
            key = tl.where(n[None, :] == at[:, None], float("-inf"), key)
        out = (rows[:, None] * C + pid) * TOPK + r[None, :]
        tl.store(val_ptr + out, vals, mask=ok[:, None] & (r[None, :] < TOPK))
        tl.store(ix_ptr + out, idxs, mask=ok[:, None] & (r[None, :] < TOPK))
        tl.store(peak_ptr + rows * C + pid, peak, mask=ok)
        tl.store(mass_ptr + rows * C + pid, mass, mask=ok)
