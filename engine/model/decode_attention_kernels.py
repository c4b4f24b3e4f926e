"""The Triton kernels behind ``torch.ops.eaglelab.decode_attention`` (see ``decode_attention.py``, which
imports this module only when it is asked for the kernel: importing it imports Triton).

``attention_kernel``: program (b * KVH + kv head, split, r) holds the r-th block of ``BLOCK_M`` (<= 64) of the
query rows of the GROUP heads that share one KV head (row m = g * T + t: head kv_head * GROUP + g, query t; one
block unless GROUP * T > 64, as in a verify of a wide tree: larger tiles spill registers), and walks the split's blocks of
``BLOCK_S`` cache slots, interleaved (blocks split, split + SPLITS, ...: the used prefix of a static cache
is spread over every split). A block whose mask slice is all False is skipped before K or V is read. Per
row it keeps an online softmax in float32 (running max, running sum, the weighted sum of V rows), in log2
units (exp2). With one split it writes the normalised output; with several, its partial (acc, max, sum)
goes to a float32 workspace and ``attention_combine_kernel`` merges the splits of each row, in order, or (MERGE,
at a few rows: :data:`ONE_LAUNCH_ROWS`) the split that finishes last merges them in the same launch. The rounds
per split are a compile-time constant (a kernel per static cache length: a run has one or two); so are the splits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglelab.engine.model import pdl
from eaglelab.engine.model.pdl_kernels import enter
from eaglelab.engine.model.tickets import counters

LOG2E = 1.4426950408889634
# query rows per program (one program of 72-128 rows spilled 16-580 bytes); more (a wide tree's verify) take more;
# equal to decode_attention.ROW_BLOCK, by which the planner counts them (the sm_90 test checks)
MAX_BLOCK_M = 64


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, acc_ptr, ml_ptr, ticket_ptr,
                     NH, T, S, GROUP, qk_scale,
                     stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks,
                     stride_vb, stride_vh, stride_vs, stride_mb, stride_mt, stride_ms,
                     stride_ob, stride_oh, stride_ot,
                     BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_D: tl.constexpr, SPLITS: tl.constexpr,
                     ROUNDS: tl.constexpr, PARTIAL: tl.constexpr, ROW_BLOCKS: tl.constexpr, PDL: tl.constexpr = False,
                     MERGE: tl.constexpr = False):
    """One KV head of one batch row, one split of the cache, one block of rows: softmax(q k^T * scale, masked) v.
    MERGE (with PARTIAL): the split that takes the last ticket of its rows (``ticket[program (0, 2)]``) merges the
    splits' partials itself, as ``attention_combine_kernel`` would, and puts the counter back to 0."""
    enter(PDL)
    pid_bh, split = tl.program_id(0), tl.program_id(1)
    KVH = NH // GROUP
    b, kvh = pid_bh // KVH, pid_bh % KVH
    rows = tl.arange(0, BLOCK_M)  # [BM] m = g * T + t (padded to BM)
    if ROW_BLOCKS > 1:  # a compile-time choice: the one-block kernel stays as lean as it was
        rows += tl.program_id(2) * BLOCK_M  # this program's block of rows (the last one padded)
    t = rows % T
    heads = kvh * GROUP + rows // T
    live = rows < GROUP * T
    d = tl.arange(0, HEAD_D)  # [D]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + t[:, None] * stride_qt + d[None, :],
                mask=live[:, None], other=0.0)  # [BM, D]
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max (log2 units)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running sum of exp2(score - max)
    acc = tl.zeros((BLOCK_M, HEAD_D), dtype=tl.float32)  # running sum of weights * V
    mask_row = mask_ptr + b * stride_mb + t[:, None] * stride_mt  # [BM, 1]
    cols = split * BLOCK_S + tl.arange(0, BLOCK_S)  # [BS] cache slots of this round
    allowed = tl.load(mask_row + cols[None, :] * stride_ms, mask=live[:, None] & (cols[None, :] < S), other=0) != 0
    for i in range(ROUNDS):  # this split's blocks: split, split + SPLITS, ... (ROUNDS = ceil(blocks / SPLITS))
        in_cache = cols < S  # False past the cache (the last round of a split may be past it)
        ahead = cols + SPLITS * BLOCK_S  # the next round's mask, loaded while this round's K and V are read
        allowed_ahead = tl.load(mask_row + ahead[None, :] * stride_ms, mask=live[:, None] & (ahead[None, :] < S),
                                other=0) != 0  # [BM, BS]
        if tl.max(allowed.to(tl.int32)) > 0:  # an all-False block costs its mask read only
            k = tl.load(k_base + cols[:, None] * stride_ks + d[None, :], mask=in_cache[:, None], other=0.0)  # [BS, D]
            v = tl.load(v_base + cols[:, None] * stride_vs + d[None, :], mask=in_cache[:, None], other=0.0)  # [BS, D]
            scores = tl.dot(q, tl.trans(k)) * qk_scale  # [BM, BS] float32, log2 units
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # [BM]
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet stays 0
            p = tl.exp2(scores - m_safe[:, None])  # [BM, BS]
            alpha = tl.exp2(m_i - m_safe)  # [BM] rescales what came before
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        cols, allowed = ahead, allowed_ahead
    if PARTIAL:  # workspace rows (b, head, t) x SPLITS: acc [.., D], (max, sum)
        row = (b * NH + heads) * T + t  # [BM]
        slot = row * SPLITS + split
        tl.store(acc_ptr + slot[:, None] * HEAD_D + d[None, :], acc, mask=live[:, None])
        tl.store(ml_ptr + slot * 2, m_i, mask=live)
        tl.store(ml_ptr + slot * 2 + 1, l_i, mask=live)
        if MERGE:
            tl.debug_barrier()  # every thread's partial stored before the ticket is taken (its release publishes them)
            group = pid_bh * ROW_BLOCKS + (tl.program_id(2) if ROW_BLOCKS > 1 else 0)
            ticket = tl.atomic_add(ticket_ptr + group, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLITS - 1:  # the other splits of these rows are in: merge them, in order
                tl.store(ticket_ptr + group, 0)
                first = row * SPLITS
                top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
                for sp in tl.static_range(SPLITS):  # read past this SM's L1: other programs wrote them
                    top = tl.maximum(top, tl.load(ml_ptr + (first + sp) * 2, mask=live, other=float("-inf"),
                                                  cache_modifier=".cg"))
                top = tl.where(top == float("-inf"), 0.0, top)
                total = tl.zeros((BLOCK_M,), dtype=tl.float32)
                merged = tl.zeros((BLOCK_M, HEAD_D), dtype=tl.float32)
                for sp in tl.static_range(SPLITS):
                    w = tl.exp2(tl.load(ml_ptr + (first + sp) * 2, mask=live, other=float("-inf"),
                                        cache_modifier=".cg") - top)  # 0 for a split that saw no allowed slot
                    total += w * tl.load(ml_ptr + (first + sp) * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
                    merged += w[:, None] * tl.load(acc_ptr + (first + sp)[:, None] * HEAD_D + d[None, :],
                                                   mask=live[:, None], other=0.0, cache_modifier=".cg")
                out = merged / tl.where(total == 0.0, 1.0, total)[:, None]
                tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + t[:, None] * stride_ot + d[None, :],
                         out.to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row with no allowed slot: zeros
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + t[:, None] * stride_ot + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def attention_combine_kernel(acc_ptr, ml_ptr, out_ptr, NH, T, SPLITS,
                   stride_ob, stride_oh, stride_ot, BLOCK_SPLITS: tl.constexpr, HEAD_D: tl.constexpr,
                   PDL: tl.constexpr = False):
    """out[b, h, t] = the splits' partials of row (b, h, t) merged: sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    enter(PDL)
    row = tl.program_id(0)
    t, h, b = row % T, (row // T) % NH, row // (T * NH)
    s = tl.arange(0, BLOCK_SPLITS)  # [BSp]
    ok = s < SPLITS
    m = tl.load(ml_ptr + (row * SPLITS + s) * 2, mask=ok, other=float("-inf"))  # [BSp]
    l = tl.load(ml_ptr + (row * SPLITS + s) * 2 + 1, mask=ok, other=0.0)
    top = tl.max(m, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(m - top)  # [BSp]: 0 for a split that saw no allowed slot
    d = tl.arange(0, HEAD_D)
    acc = tl.load(acc_ptr + (row * SPLITS + s[:, None]) * HEAD_D + d[None, :], mask=ok[:, None], other=0.0)  # [BSp, D]
    total = tl.sum(w * l, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)  # [D]
    tl.store(out_ptr + b * stride_ob + h * stride_oh + t * stride_ot + d, out.to(out_ptr.dtype.element_ty))


# Split attention merged by the split that finishes last (``attention_kernel``'s MERGE, one launch) rather than by
# ``attention_combine_kernel`` (a second launch): the same merge, its sums over the splits taken one split after
# another (the combine kernel reduces them as a tree: the last bits of float32 may differ; interpreter tests).
# Only where a KV head's query rows (GROUP * T) are at most ONE_LAUNCH_ROWS (0: never): a decode, a draft step. Timed
# on an H100 (SmolLM2's shape, batch 1, benchmarks/results/h100_2026-12-06d): merged in every case, a decode took
# 0.766 -> 0.756 ms but a verify of 40 rows 0.926 -> 0.999 (the split that finishes last merges its block's 64 rows
# alone, H1); at most 16 rows, a decode 0.758 -> 0.746, the draft phase 0.207 -> 0.204, a verify 0.901 either way (J).
ONE_LAUNCH_ROWS = 16


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, block_s: int,
                     splits: int, num_warps: int) -> torch.Tensor:
    """q [B, NH, T, D], k/v [B, KVH, S, D] (any strides but the last), mask bool [B, T, S] -> [B, NH, T, D]
    in q's dtype (stored [B, T, NH, D]: the o projection's input is then a view)."""
    B, NH, T, D = q.shape
    KVH, S = k.shape[1], k.shape[2]
    out = _empty_out(q)
    allowed = mask.view(torch.uint8)  # same bytes, same strides
    partial = splits > 1
    if partial:
        acc = torch.empty(B * NH * T * splits * D, dtype=torch.float32, device=q.device)
        ml = torch.empty(B * NH * T * splits * 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unread pointers
    rows = NH // KVH * T
    block_m = min(max(16, triton.next_power_of_2(rows)), MAX_BLOCK_M)  # tl.dot takes >= 16 rows
    row_blocks = triton.cdiv(rows, block_m)
    merge = partial and rows <= ONE_LAUNCH_ROWS
    ticket = counters("attention", q.device, B * KVH * row_blocks) if merge else out  # an unread pointer without
    attention_kernel[(B * KVH, splits, row_blocks)](
        q, k, v, allowed, out, acc, ml, ticket, NH, T, S, NH // KVH, LOG2E / D ** 0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), allowed.stride(0), allowed.stride(1), allowed.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=block_m, BLOCK_S=block_s, HEAD_D=D, SPLITS=splits, ROUNDS=triton.cdiv(triton.cdiv(S, block_s), splits),
        PARTIAL=partial, ROW_BLOCKS=row_blocks, MERGE=merge, num_warps=num_warps, num_stages=1,
        **pdl.launch_options())
    if partial and not merge:
        attention_combine_kernel[(B * NH * T,)](acc, ml, out, NH, T, splits, out.stride(0), out.stride(1), out.stride(2),
                                      BLOCK_SPLITS=triton.next_power_of_2(splits), HEAD_D=D, num_warps=1,
                                      **pdl.launch_options())
    return out


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    """[B, NH, T, D] viewing a [B, T, NH, D] buffer."""
    B, NH, T, D = q.shape
    return q.new_empty(B, T, NH, D).transpose(1, 2)


def _shape_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, block_s: int, splits: int,
                num_warps: int) -> torch.Tensor:
    """What torch.compile traces with: the output's shape, strides and dtype, no kernel."""
    return _empty_out(q)


def register():
    """``torch.ops.eaglelab.decode_attention``: an opaque custom op with a shape-only (fake) implementation,
    so torch.compile(fullgraph) keeps it as one call in its graph and CUDA graphs capture its launches.
    Called once per process (``decode_attention.load_op`` caches it)."""
    op = torch.library.custom_op("eaglelab::decode_attention", decode_attention, mutates_args=())
    op.register_fake(_shape_only)
    return op
