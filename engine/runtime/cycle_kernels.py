"""The Triton kernels behind ``torch.ops.eaglelab.greedy_commit``, ``emit_advance`` and ``tree_expand`` (see
``cycle_ops.py``, which imports this module only in :func:`cycle_ops.load`: importing it imports Triton).

``greedy_commit_kernel``: program (b, layer) walks row b's draft tree against the target's greedy picks (every
program of the row the same walk: 24 nodes cost less than a launch), and moves that layer's K/V of the accepted path
onto consecutive slots; the layer-0 program also stores the acceptance (length, path, committed tokens, bonus).
``emit_advance_kernel``: program b emits row b's committed tokens up to EOS and its budget and moves its length and
root, as ``loop_state.emit_and_advance`` does in ~10 operations.
``expand_blocks_kernel`` then ``expand_select_kernel``: a draft step's expansion (``tree.expand_step``), the
drafter's logits ranked in blocks of :data:`CHUNK` entries (each block's best k, max and sum of exponentials, as
``tree._top_k_fused`` does), then per batch row each frontier node's best k, their log-probabilities and cumulative
scores, and the k best of those candidates (ties to the lower index throughout, as the reference); or
``expand_kernel``, both in one launch (:data:`EXPAND_ONE_LAUNCH`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglelab.engine.model import pdl
from eaglelab.engine.model.pdl_kernels import enter
from eaglelab.engine.model.tickets import counters

# Vocabulary entries a program of the first pass ranks: tree.TOP_K_CHUNK's value, not imported (tree.py imports
# cycle_ops, which loads this module: no import back). The result does not depend on it, only the speed.
CHUNK = 256


@triton.jit
def greedy_commit_kernel(pred_ptr, tok_ptr, par_ptr, dep_ptr, mask_ptr, len_ptr,
                         acc_len_ptr, path_ptr, out_tok_ptr, bonus_ptr, k_ptr, v_ptr,
                         N, D1, H, HD,
                         s_pred_b, s_pred_n, s_tok_b, s_tok_n, s_par_b, s_par_n, s_dep_b, s_dep_n,
                         s_mask_b, s_mask_i, s_mask_j,
                         sk_l, sk_b, sk_h, sk_s, sv_l, sv_b, sv_h, sv_s,
                         NP: tl.constexpr, DP: tl.constexpr, HP: tl.constexpr, HDP: tl.constexpr,
                         COMPACT: tl.constexpr, HAS_V: tl.constexpr, PDL: tl.constexpr = False):
    """Row b = program_id(0); layer = program_id(1) (the cache's layers; 1 without compaction)."""
    enter(PDL)
    b, layer = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, NP)  # nodes (padded)
    real = i < N
    tok = tl.load(tok_ptr + b * s_tok_b + i * s_tok_n, mask=real, other=-1)
    par = tl.load(par_ptr + b * s_par_b + i * s_par_n, mask=real, other=-1)
    dep = tl.load(dep_ptr + b * s_dep_b + i * s_dep_n, mask=real, other=0)
    # the target's pick after each node's parent; a node matches when its token is that pick (the root always)
    after_parent = tl.load(pred_ptr + b * s_pred_b + tl.maximum(par, 0) * s_pred_n, mask=real, other=-2)
    match = (tok == after_parent) | (par < 0)
    # anc[i, j]: node j is node i or one of its ancestors; node i is accepted when every such j matches
    anc = tl.load(mask_ptr + b * s_mask_b + i[:, None] * s_mask_i + i[None, :] * s_mask_j,
                  mask=real[:, None] & real[None, :], other=0) != 0
    misses = tl.sum((anc & (match == 0)[None, :]).to(tl.int32), axis=1)
    key = tl.where((misses == 0) & real, dep, -1)
    last = tl.min(tl.where(key == tl.max(key, axis=0), i, NP), axis=0)  # the first of the deepest accepted
    on_path = tl.sum(tl.where(i[:, None] == last, anc.to(tl.int32), 0), axis=0) > 0  # anc's row `last`
    level = tl.arange(0, DP)
    at = on_path[None, :] & (dep[None, :] == level[:, None])  # [DP, NP]: the path's node at each level
    path = tl.where(tl.sum(at.to(tl.int32), axis=1) > 0, tl.sum(tl.where(at, i[None, :], 0), axis=1), -1)
    if layer == 0:
        accept_len = tl.sum(tl.where(i == last, dep, 0), axis=0) + 1
        bonus = tl.load(pred_ptr + b * s_pred_b + last * s_pred_n)
        below = on_path[None, :] & (dep[None, :] == level[:, None] + 1)  # the path's node one level down
        drafts = tl.where(tl.sum(below.to(tl.int32), axis=1) > 0, tl.sum(tl.where(below, tok[None, :], 0), axis=1), -1)
        keep = level < D1
        tl.store(acc_len_ptr + b, accept_len)
        tl.store(bonus_ptr + b, bonus)
        tl.store(path_ptr + b * D1 + level, path, mask=keep)
        tl.store(out_tok_ptr + b * D1 + level, tl.where(level == accept_len - 1, bonus, drafts), mask=keep)
    if COMPACT:  # tree slot base + path[l] -> slot base + l, this layer, every KV head (sources are never below)
        base = tl.load(len_ptr + b)
        move = (level < D1) & (path >= 0) & (path != level)
        h, d = tl.arange(0, HP), tl.arange(0, HDP)
        sel = move[:, None, None] & (h < H)[None, :, None] & (d < HD)[None, None, :]
        src, dst = (base + path)[:, None, None], (base + level)[:, None, None]
        k_row = k_ptr + layer * sk_l + b * sk_b + h[None, :, None] * sk_h + d[None, None, :]
        moved = tl.load(k_row + src * sk_s, mask=sel)
        tl.store(k_row + dst * sk_s, moved, mask=sel)
        if HAS_V:
            v_row = v_ptr + layer * sv_l + b * sv_b + h[None, :, None] * sv_h + d[None, None, :]
            moved_v = tl.load(v_row + src * sv_s, mask=sel)
            tl.store(v_row + dst * sv_s, moved_v, mask=sel)


@triton.jit
def emit_advance_kernel(tok_ptr, count_ptr, new_root_ptr, eos_ptr, out_ptr, n_out_ptr, done_ptr, hit_ptr, limit_ptr,
                        len_ptr, root_ptr, emitted_ptr, active_ptr, K, E, S, s_tok_b, s_tok_k, s_out_b, s_root,
                        KP: tl.constexpr, EP: tl.constexpr, HAS_COUNT: tl.constexpr, PDL: tl.constexpr = False):
    """Row b = program_id(0): tokens[b, :count[b]] (count 1 without HAS_COUNT) emitted into out[b] at n_out[b]."""
    enter(PDL)
    b = tl.program_id(0)
    k = tl.arange(0, KP)
    done = tl.load(done_ptr + b) != 0
    n_out = tl.load(n_out_ptr + b)
    limit = tl.load(limit_ptr + b)
    if HAS_COUNT:
        count = tl.load(count_ptr + b)
    else:
        count = n_out * 0 + 1
    toks = tl.load(tok_ptr + b * s_tok_b + k * s_tok_k, mask=k < K, other=0)  # -1 padding: past the count
    live = tl.load(done_ptr + b + k * 0) == 0  # the row is not done, in every lane (a vector: masks take no scalar)
    valid = (k < K) & (k < count) & (k < limit - n_out) & live
    e = tl.arange(0, EP)
    eos = tl.load(eos_ptr + e, mask=e < E, other=-2)  # below every id and the -1 padding: matches no token
    is_eos = (tl.sum((toks[:, None] == eos[None, :]).to(tl.int32), axis=1) > 0) & valid
    eos_i = is_eos.to(tl.int32)
    keep = valid & ((tl.cumsum(eos_i, axis=0) - eos_i) == 0)  # up to the first EOS
    tl.store(out_ptr + b * s_out_b + tl.minimum(n_out + k, S - 1), toks, mask=keep)
    emitted = tl.sum(keep.to(tl.int64), axis=0)
    hit = (tl.load(hit_ptr + b) != 0) | (tl.sum((is_eos & keep).to(tl.int32), axis=0) > 0)
    n_new = n_out + emitted
    tl.store(n_out_ptr + b, n_new)
    tl.store(hit_ptr + b, hit)
    tl.store(done_ptr + b, done | hit | (n_new >= limit))
    tl.store(emitted_ptr + b, emitted)
    tl.store(active_ptr + b, done == 0)
    if done == 0:
        tl.store(len_ptr + b, tl.load(len_ptr + b) + count)
        tl.store(root_ptr + b * s_root, tl.load(new_root_ptr + b))


FLOOR = tl.constexpr(-3.4028234663852886e38)  # float32's lowest: a NaN or -inf entry's rank key, as tree._top_k_fused's


@triton.jit
def _rank_block(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, row, c, V, C, s_x_row,
                CHUNK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr):
    """Block c (CHUNK entries) of the drafter's logits row ``row``: its best K entries in K rounds of a max (ties to
    the lower index), their rank keys and indices; the block's max key and sum of exp(key - max)."""
    j = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * s_x_row + j, mask=j < V, other=0.0).to(tl.float32)
    key = tl.where((x != x) | (x == float("-inf")), FLOOR, x)
    key = tl.where(j < V, key, float("-inf"))  # padding past the vocabulary: below every entry
    peak = tl.max(key, axis=0)
    mass = tl.sum(tl.exp(key - peak), axis=0)
    r = tl.arange(0, KP)
    vals = tl.full((KP,), float("-inf"), tl.float32)
    idxs = tl.zeros((KP,), tl.int32)
    for t in tl.static_range(K):
        best = tl.max(key, axis=0)
        at = tl.min(tl.where(key == best, j, 2147483647), axis=0)
        vals = tl.where(r == t, best, vals)
        idxs = tl.where(r == t, at, idxs)
        key = tl.where(j == at, float("-inf"), key)
    out = (row * C + c) * K + r
    tl.store(val_ptr + out, vals, mask=r < K)
    tl.store(idx_ptr + out, idxs, mask=r < K)
    tl.store(peak_ptr + row * C + c, peak)
    tl.store(mass_ptr + row * C + c, mass)


@triton.jit
def _shared_load(ptr, mask, other, CG: tl.constexpr):
    """A load of what other programs of this launch wrote (CG: past this SM's L1, as the ticket's last reader)."""
    if CG:
        return tl.load(ptr, mask=mask, other=other, cache_modifier=".cg")
    return tl.load(ptr, mask=mask, other=other)


@triton.jit
def _select_row(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, score_ptr, tok_ptr, cand_ptr, sel_ptr, b,
                F, C, s_x_b, s_x_f, s_score_b, s_score_f,
                K: tl.constexpr, FP: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr, CKP: tl.constexpr,
                CG: tl.constexpr):
    """Batch row b: for each of the F frontier rows, the best K of its blocks' candidates (K rounds, ties to the first
    candidate: the lower index), their log-probabilities (less the row's log-sum-exp from the blocks' maxima and
    sums) added to the frontier node's score: F * K candidates; then the K best candidates (ranks counted, ties to
    the lower candidate)."""
    f = tl.arange(0, FP)[:, None]  # [FP, 1]
    q = tl.arange(0, CKP)[None, :]  # [1, CKP]: candidate c * K + t of the blocks
    rows = b * F + f
    real = (f < F) & (q < C * K)
    cand = _shared_load(val_ptr + rows * (C * K) + q, real, float("-inf"), CG)
    cand_idx = _shared_load(idx_ptr + rows * (C * K) + q, real, 0, CG)
    r = tl.arange(0, KP)[None, :]  # [1, KP]
    picks = tl.zeros((FP, KP), tl.int32)
    for t in tl.static_range(K):
        best = tl.max(cand, axis=1)[:, None]  # [FP, 1]
        at = tl.min(tl.where(cand == best, q, 2147483647), axis=1)[:, None]
        picks = tl.where(r == t, tl.sum(tl.where(q == at, cand_idx, 0), axis=1)[:, None], picks)
        cand = tl.where(q == at, float("-inf"), cand)
    c = tl.arange(0, CP)[None, :]
    peak = _shared_load(peak_ptr + rows * C + c, (f < F) & (c < C), float("-inf"), CG)
    mass = _shared_load(mass_ptr + rows * C + c, (f < F) & (c < C), 0.0, CG)
    top = tl.max(peak, axis=1)[:, None]  # [FP, 1]
    lse = top + tl.log(tl.sum(tl.where(c < C, mass * tl.exp(peak - top), 0.0), axis=1)[:, None])
    valid = (f < F) & (r < K)  # [FP, KP]
    x = tl.load(x_ptr + b * s_x_b + f * s_x_f + picks, mask=valid, other=0.0).to(tl.float32)
    logp = tl.where(x != x, float("-inf"), x) - lse
    logp = tl.where(logp != logp, float("-inf"), tl.minimum(logp, 0.0))  # log p <= 0; -inf less -inf: -inf
    score = tl.load(score_ptr + b * s_score_b + f * s_score_f, mask=f < F, other=0.0) + logp  # [FP, KP]
    flat = f * K + r  # the candidate's index, frontier-major
    tl.store(tok_ptr + b * F * K + flat, picks.to(tl.int64), mask=valid)
    tl.store(cand_ptr + b * F * K + flat, score, mask=valid)
    # the K best candidates, best first: candidate j ranks before i when it scores higher, or the same and j < i
    s_i = tl.reshape(score, (FP * KP,))
    ok = tl.reshape(valid, (FP * KP,))
    pos = tl.arange(0, FP * KP)  # [M]: padded positions keep the candidates' order
    s_j = s_i[None, :]
    tie = (s_j == s_i[:, None]) & (pos[None, :] < pos[:, None])
    before = ok[None, :] & ((ok == 0)[:, None] | (s_j > s_i[:, None]) | tie)
    rank = tl.sum(before.to(tl.int32), axis=1)  # [M]
    index = (pos // KP) * K + pos % KP
    t = tl.arange(0, KP)
    chosen = tl.sum(tl.where((rank[None, :] == t[:, None]) & ok[None, :], index[None, :], 0), axis=1)
    tl.store(sel_ptr + b * K + t, chosen.to(tl.int64), mask=t < K)


@triton.jit
def expand_blocks_kernel(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, V, C, s_x_row,
                         CHUNK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, c): block c of the drafter's logits row ranked (``_rank_block``)."""
    enter(PDL)
    _rank_block(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, tl.program_id(0), tl.program_id(1), V, C, s_x_row,
                CHUNK, K, KP)


@triton.jit
def expand_select_kernel(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, score_ptr, tok_ptr, cand_ptr, sel_ptr,
                         F, C, s_x_b, s_x_f, s_score_b, s_score_f,
                         K: tl.constexpr, FP: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr, CKP: tl.constexpr,
                         PDL: tl.constexpr = False):
    """Program b: batch row b's candidates and picks (``_select_row``) from the blocks the kernel before ranked."""
    enter(PDL)
    _select_row(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, score_ptr, tok_ptr, cand_ptr, sel_ptr, tl.program_id(0),
                F, C, s_x_b, s_x_f, s_score_b, s_score_f, K, FP, KP, CP, CKP, False)


@triton.jit
def expand_kernel(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, score_ptr, tok_ptr, cand_ptr, sel_ptr, ticket_ptr,
                  V, F, C, s_x_row, s_x_b, s_x_f, s_score_b, s_score_f,
                  CHUNK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, FP: tl.constexpr, CP: tl.constexpr,
                  CKP: tl.constexpr, PDL: tl.constexpr = False):
    """Both passes in one launch: program (row, c) ranks its block, then takes a ticket of its batch row
    (``ticket[row // F]``); the program that takes the row's last (F * C) selects for it and puts the counter back
    to 0 for the next call, as the split GEMV's last share adds the others (``gemv_kernels``)."""
    enter(PDL)
    row, c = tl.program_id(0), tl.program_id(1)
    _rank_block(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, row, c, V, C, s_x_row, CHUNK, K, KP)
    tl.debug_barrier()  # every thread's results stored before the ticket is taken (its release publishes them)
    b = row // F
    ticket = tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel", scope="gpu")
    if ticket == F * C - 1:  # the row's other blocks are in
        tl.store(ticket_ptr + b, 0)
        _select_row(x_ptr, val_ptr, idx_ptr, peak_ptr, mass_ptr, score_ptr, tok_ptr, cand_ptr, sel_ptr, b,
                    F, C, s_x_b, s_x_f, s_score_b, s_score_f, K, FP, KP, CP, CKP, True)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def greedy_commit(pred: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
                  mask: torch.Tensor, lengths: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                  max_depth: int, compact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``cycle_ops.greedy_commit``; k/v ``[L, B, KVH, S, D]`` (D contiguous), moved in place when ``compact``."""
    B, N = tokens.shape
    D1 = max_depth + 1
    accept_len = torch.empty(B, dtype=torch.long, device=tokens.device)
    bonus = torch.empty(B, dtype=torch.long, device=tokens.device)
    path = torch.empty(B, D1, dtype=torch.long, device=tokens.device)
    committed = torch.empty(B, D1, dtype=torch.long, device=tokens.device)
    L, _, H, _, HD = k.shape
    assert k.stride(4) == 1 and (v is None or v.stride(4) == 1), "the caches' head dim must be contiguous"
    vv = v if v is not None else k  # an unread pointer without V
    greedy_commit_kernel[(B, L if compact else 1)](
        pred, tokens, parents, depth, mask, lengths, accept_len, path, committed, bonus, k, vv,
        N, D1, H, HD, *pred.stride(), *tokens.stride(), *parents.stride(), *depth.stride(), *mask.stride(),
        *k.stride()[:4], *vv.stride()[:4],
        NP=_pow2(N), DP=_pow2(D1), HP=_pow2(H), HDP=_pow2(HD), COMPACT=compact, HAS_V=v is not None,
        num_warps=4, **pdl.launch_options())
    return accept_len, path, committed, bonus


def emit_advance(tokens: torch.Tensor, count: torch.Tensor | None, new_root: torch.Tensor, eos: torch.Tensor,
                 out: torch.Tensor, n_out: torch.Tensor, done: torch.Tensor, hit_eos: torch.Tensor,
                 limit: torch.Tensor, lengths: torch.Tensor, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``cycle_ops.emit_advance``; the state tensors updated in place."""
    B, K = tokens.shape
    emitted = torch.empty(B, dtype=torch.long, device=tokens.device)
    active = torch.empty(B, dtype=torch.bool, device=tokens.device)
    emit_advance_kernel[(B,)](
        tokens, count if count is not None else tokens, new_root, eos, out, n_out, done, hit_eos, limit, lengths, root,
        emitted, active, K, eos.numel(), out.shape[1], *tokens.stride(), out.stride(0), root.stride(0),
        KP=_pow2(K), EP=_pow2(eos.numel()), HAS_COUNT=count is not None, num_warps=1,
        **pdl.launch_options())
    return emitted, active


# A draft step's expansion as one launch (``expand_kernel``: the blocks then, by ticket, the selection) or two
# (``expand_blocks_kernel``, ``expand_select_kernel``). The same results either way (tests under the interpreter).
# Off: timed on an H100 together with decode_attention_kernels.ONE_LAUNCH (benchmarks/results/h100_2026-12-06d), the
# draft phase moved 0.228 -> 0.225 ms (0.200 -> 0.203 with --pdl): within the processes' spread.
EXPAND_ONE_LAUNCH = False


def tree_expand(scores: torch.Tensor, logits: torch.Tensor,
                topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # spelled out: the op's schema
    """See ``cycle_ops.tree_expand``: blocks of ``CHUNK`` entries per program, then one program per batch row (in
    the same launch with :data:`EXPAND_ONE_LAUNCH`)."""
    B, F, V = logits.shape
    chunk = min(CHUNK, _pow2(V))
    C = triton.cdiv(V, chunk)
    rows = logits.reshape(B * F, V).contiguous()  # a view of the drafter's logits (they are contiguous)
    dev = logits.device
    vals = torch.empty(B * F, C, topk, dtype=torch.float32, device=dev)
    idxs = torch.empty(B * F, C, topk, dtype=torch.int32, device=dev)
    peak = torch.empty(B * F, C, dtype=torch.float32, device=dev)
    mass = torch.empty(B * F, C, dtype=torch.float32, device=dev)
    tokens = torch.empty(B, F * topk, dtype=torch.long, device=dev)
    cand = torch.empty(B, F * topk, dtype=torch.float32, device=dev)
    selected = torch.empty(B, topk, dtype=torch.long, device=dev)
    sc = scores.float()
    shapes = dict(K=topk, KP=_pow2(topk), FP=_pow2(F), CP=_pow2(C), CKP=_pow2(C * topk))
    if EXPAND_ONE_LAUNCH:
        ticket = counters("expansion", dev, B)
        expand_kernel[(B * F, C)](rows, vals, idxs, peak, mass, sc, tokens, cand, selected, ticket,
                                  V, F, C, rows.stride(0), F * rows.stride(0), rows.stride(0), *sc.stride(),
                                  CHUNK=chunk, **shapes, num_warps=4, **pdl.launch_options())
        return tokens, cand, selected
    expand_blocks_kernel[(B * F, C)](rows, vals, idxs, peak, mass, V, C, rows.stride(0),
                                     CHUNK=chunk, K=topk, KP=shapes["KP"], num_warps=4, **pdl.launch_options())
    expand_select_kernel[(B,)](rows, vals, idxs, peak, mass, sc, tokens, cand, selected, F, C,
                               F * rows.stride(0), rows.stride(0), *sc.stride(), **shapes, num_warps=4,
                               **pdl.launch_options())
    return tokens, cand, selected


def _commit_shapes(pred, tokens, parents, depth, mask, lengths, k, v, max_depth, compact):
    """What torch.compile traces with: the outputs' shapes and dtypes, no kernel."""
    B = tokens.shape[0]
    return (tokens.new_empty(B), tokens.new_empty(B, max_depth + 1), tokens.new_empty(B, max_depth + 1),
            tokens.new_empty(B))


def _advance_shapes(tokens, count, new_root, eos, out, n_out, done, hit_eos, limit, lengths, root):
    return n_out.new_empty(tokens.shape[0]), done.new_empty(tokens.shape[0])


def _expand_shapes(scores, logits, topk):
    B, F, _ = logits.shape
    return (scores.new_empty(B, F * topk, dtype=torch.long), scores.new_empty(B, F * topk, dtype=torch.float32),
            scores.new_empty(B, topk, dtype=torch.long))


def register():
    """The three ops, each an opaque custom op with a shape-only (fake) implementation and its in-place writes
    declared (the caches; the loop state; the expansion writes none), so torch.compile(fullgraph) keeps each as one
    call in its graph, writing the buffers in place, and CUDA graphs capture its launches. Called once per process
    (``cycle_ops.load``)."""
    commit = torch.library.custom_op("eaglelab::greedy_commit", greedy_commit, mutates_args=("k", "v"))
    commit.register_fake(_commit_shapes)
    advance = torch.library.custom_op("eaglelab::emit_advance", emit_advance,
                                      mutates_args=("out", "n_out", "done", "hit_eos", "lengths", "root"))
    advance.register_fake(_advance_shapes)
    expand = torch.library.custom_op("eaglelab::tree_expand", tree_expand, mutates_args=())
    expand.register_fake(_expand_shapes)
    return commit, advance, expand
