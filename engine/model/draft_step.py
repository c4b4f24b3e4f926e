"""The EAGLE-3 drafter's draft step in a few kernels, for compiled draft phases on CUDA.

A draft step runs the drafter's one layer on the frontier's rows (batch x topk) and ranks its head's logits. Left
to the compiler it is ~19 kernels a step on SmolLM2's drafter, most of them a few microseconds of launch and ramp
for under one of work (``benchmarks/results/h200_2026-12-04e/P``: the draft phase 95 kernels, 188 us of them and
270 us replayed, for 5 steps). Here each matmul takes the work around it (``draft_step_kernels.py``)::

    draft_qkv    embedding and parent state gathered, both RMS-normalised, q/k/v, rotary, k/v into the cache
    attention    the runner's decode attention, as the reference calls it (``layers.attend``)
    draft_rows   o projection + the residual (the parent's state)
    draft_rows   RMSNorm + gate/up + SwiGLU
    draft_rows   down projection + the residual: the state the next step reads
    draft_rows   RMSNorm + the head, each block of logits ranked as made (never stored)
    tree_select  the frontier's candidates and the k best (``cycle_ops``)

It computes what :meth:`Eagle3Network.forward` and ``tree.expand_step`` do, rounded where they round, summed in
another order (``tests/engine/model/interpreted_draft_step.py`` checks it against them under Triton's interpreter).
:func:`applies` says where it runs: a compiled phase on CUDA, the ops loaded, a Llama-layout drafter (not MLA,
not EAGLE-3.1's ``norm_output``, no norm before the residual, no biases), 16 rows or fewer; and
``EAGLELAB_FUSED_DRAFT=0`` turns it off (the reference then runs, as it always does eagerly).
"""

from __future__ import annotations

import os

import torch

ROWS = 16  # most rows (batch x topk) a step runs here: one tensor-core tile of rows
PAIRS, BLOCK_V, BLOCK_K, STAGES = 16, 16, 128, 3  # qkv: rotary pairs or v columns a program; K a loop step; loads ahead
BLOCK_N = {"o": 16, "gate_up": 16, "down": 16, "head": 64}  # output columns a program (the head's: its ranked block)

_loaded = False
reason: str | None = None  # why the ops did not load (None: they did, or load() was not called)


def load() -> bool:
    """Import Triton and the kernels and register the two ops, once per process. -> whether they loaded."""
    global _loaded, reason
    if not _loaded and reason is None:
        try:
            from eaglelab.engine.model import draft_step_kernels  # noqa: F401 - imports triton

            _register()
            _loaded = True
        except Exception as exc:  # noqa: BLE001 - any import or registration failure: the reference runs
            reason = f"the fused draft step unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return _loaded


def refusal(net, rows: int, x: torch.Tensor) -> str | None:
    """Why a draft step of ``rows`` rows on ``net`` (states like ``x``) does not run here (None: it does)."""
    cfg = net.config
    if os.environ.get("EAGLELAB_FUSED_DRAFT", "1") == "0":
        return "off (EAGLELAB_FUSED_DRAFT=0)"
    if not (_loaded and compiled_on_cuda(x)):
        return "not a compiled phase on CUDA with the ops loaded"
    if cfg.mla is not None or cfg.norm_output or cfg.norm_before_residual:
        return "the drafter's layout (MLA, norm_output or a norm before the residual)"
    if rows > ROWS:
        return f"{rows} rows > {ROWS}"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype}"
    lins = (net.midlayer.self_attn.q_proj, net.midlayer.self_attn.o_proj, net.midlayer.mlp.gate_proj,
            net.midlayer.mlp.down_proj, net.lm_head)
    if any(lin.bias is not None for lin in lins) or cfg.head_dim % 2:
        return "biases or an odd head dim"
    return None


def prepare(net) -> None:
    """Make the fused q/k/v and gate/up weights the step reads, outside any compiled function (where the ops
    loaded)."""
    if _loaded and net.config.mla is None:
        net.midlayer.self_attn.qkv.fused_weight()
        net.midlayer.mlp.gate_up.fused_weight()


def compiled_on_cuda(x: torch.Tensor) -> bool:
    """Whether ``x``'s phase is being compiled on CUDA (a test of the compiled engine on CPU stands in for it)."""
    return torch.compiler.is_compiling() and x.is_cuda


def forward(net, tokens: torch.Tensor, hidden: torch.Tensor, parent: torch.Tensor, positions: torch.Tensor,
            cache, slots: torch.Tensor, mask: torch.Tensor, kernels) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One draft step: the frontier's ``tokens`` [B, K] (target ids) with the previous step's states ``hidden``
    [B, F, H] gathered by ``parent`` [B, K], at ``positions``/``slots`` [B, K] under ``mask`` [B, K, S].
    -> (the state the next step reads [B, K, H], the head's blocks ranked for ``cycle_ops.tree_select``)."""
    from eaglelab.engine.model.layers import attend

    cfg, layer = net.config, net.midlayer
    attn, mlp = layer.self_attn, layer.mlp
    B, K = tokens.shape
    R, H, D, NH, I = B * K, cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.intermediate_size
    hidden, parent = hidden.contiguous(), parent.reshape(R).contiguous()
    flat = [t.reshape(R).contiguous() for t in (tokens, positions, slots)]  # positions: an expanded view
    q = torch.ops.eaglelab.draft_qkv(
        flat[0], net.embed.weight, hidden, parent, layer.input_layernorm.weight, layer.hidden_norm.weight,
        attn.qkv.fused_weight(), flat[1], net.rotary.inv_freq, flat[2], cache.k, cache.v,
        NH, cfg.rms_norm_eps, float(net.rotary.attention_factor))
    k_cache, v_cache = cache.layer(0, B)
    out = attend(q.view(B, K, NH, D).transpose(1, 2), k_cache, v_cache, mask, kernels.attention)  # [B, NH, K, D]
    rows = torch.ops.eaglelab.draft_rows
    # o: the attention's [B, NH, K, D] read as rows b * K + t of NH * D entries; the residual: the parent's state
    h = rows(out, None, None, attn.o_proj.weight, hidden, parent, K, D, [out.stride(0), out.stride(2), out.stride(1)],
             [hidden.stride(0), hidden.stride(1)], 0.0, "residual", BLOCK_N["o"])
    a = rows(h, None, layer.post_attention_layernorm.weight, mlp.gate_up.fused_weight(), None, None, K, H,
             [K * H, H, 0], [0, 0], cfg.rms_norm_eps, "swiglu", BLOCK_N["gate_up"])
    nxt = rows(a, None, None, mlp.down_proj.weight, h, None, K, I, [K * I, I, 0], [K * H, H], 0.0, "residual",
               BLOCK_N["down"])
    blocks = torch.ops.eaglelab.draft_head(nxt, net.norm.weight, net.lm_head.weight, K, cfg.rms_norm_eps,
                                           BLOCK_N["head"])
    return nxt.view(B, K, H), blocks


def _qkv(tokens: torch.Tensor, emb: torch.Tensor, hidden: torch.Tensor, parent: torch.Tensor, in_w: torch.Tensor,
         hid_w: torch.Tensor, w: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, slots: torch.Tensor,
         k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, eps: float, factor: float) -> torch.Tensor:
    """See :func:`forward`: -> q [R, NH, D] rotated; k and v written in place into layer 0 of the caches
    [L, B', KVH, S, D] (the drafter's: one layer), rows 0..B-1."""
    from eaglelab.engine.model.draft_step_kernels import qkv_rope_kernel

    R, (B, F, H), (_, _, kv_heads, _, head_dim) = tokens.shape[0], hidden.shape, k_cache.shape
    q = torch.empty(R, heads, head_dim, dtype=hidden.dtype, device=hidden.device)
    n_qk = -(-(heads + kv_heads) * (head_dim // 2) // PAIRS)
    n_v = -(-kv_heads * head_dim // BLOCK_V)
    qkv_rope_kernel[(n_qk + n_v,)](
        tokens, emb, hidden, parent, in_w, hid_w, w, positions, inv_freq, slots, q, k_cache, v_cache,
        R, R // B, F, H, heads, kv_heads, n_qk, eps, factor, emb.stride(0), w.stride(0),
        k_cache.stride(1), k_cache.stride(2), k_cache.stride(3), v_cache.stride(1), v_cache.stride(2),
        v_cache.stride(3), D=head_dim, BM=_rows_tile(R), PAIRS=PAIRS, BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K, STAGES=STAGES,
        PRECISION=_precision(hidden), num_warps=4)
    return q


def _qkv_shape(tokens, emb, hidden, parent, in_w, hid_w, w, positions, inv_freq, slots, k_cache, v_cache, heads,
               eps, factor):
    return hidden.new_empty(tokens.shape[0], heads, k_cache.shape[4])


EPI = {"store": 0, "residual": 1, "swiglu": 2}  # draft_step_kernels.rows_kernel's endings by name


def _rows(x: torch.Tensor, idx: torch.Tensor | None, norm_w: torch.Tensor | None, w: torch.Tensor,
          res: torch.Tensor | None, res_idx: torch.Tensor | None, topk: int, xd: int, x_strides: list[int],
          res_strides: list[int], eps: float, ending: str, block_n: int) -> torch.Tensor:
    """y [R, N] = [norm](x's rows) @ w^T, ended by ``ending`` (``rows_kernel``'s EPI); x's row r = b * topk + t at
    ``b * x_strides[0] + t' * x_strides[1]`` (t' = ``idx[r]`` given ``idx``, else t), its entry k at
    ``(k // xd) * x_strides[2] + k % xd``; the residual's row likewise with ``res_strides`` and ``res_idx``."""
    from eaglelab.engine.model.draft_step_kernels import rows_kernel

    R, N = _row_count(x, idx), (w.shape[0] // 2 if ending == "swiglu" else w.shape[0])
    y = torch.empty(R, N, dtype=x.dtype, device=x.device)
    rs = res_strides if res is not None else [0, 0]
    rows_kernel[(-(-N // block_n),)](
        x, _or(idx, y), _or(norm_w, w), w, _or(res, y), _or(res_idx, y), y, y, y, y, y,
        R, topk, N, w.shape[1], xd, x_strides[0], x_strides[1], x_strides[2], w.stride(0), rs[0], rs[1],
        y.stride(0), eps, NORM=norm_w is not None, GATHER=idx is not None, EPI=EPI[ending],
        RES_GATHER=res_idx is not None, TOPK=1, KP=1, BM=_rows_tile(R), BLOCK_N=block_n, BLOCK_K=BLOCK_K,
        STAGES=STAGES, PRECISION=_precision(x), num_warps=4)
    return y


def _rows_shape(x, idx, norm_w, w, res, res_idx, topk, xd, x_strides, res_strides, eps, ending, block_n):
    return x.new_empty(_row_count(x, idx), w.shape[0] // 2 if ending == "swiglu" else w.shape[0])


def _head(x: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, topk: int, eps: float,
          block_n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head over x [R, H] (RMSNorm, then w [V, H]) ranked in blocks of ``block_n`` logits: -> each block's
    ``topk`` best keys and ids [R, C, topk], its max key and sum of exponentials [R, C]."""
    from eaglelab.engine.model.draft_step_kernels import rows_kernel

    (R, H), V = x.shape, w.shape[0]
    vals, idxs, peak, mass = _head_shape(x, norm_w, w, topk, eps, block_n)
    rows_kernel[(vals.shape[1],)](
        x, x, norm_w, w, x, x, x, vals, idxs, peak, mass,
        R, R, V, H, H, 0, H, 0, w.stride(0), 0, 0, 0, eps,
        NORM=True, GATHER=False, EPI=3, RES_GATHER=False, TOPK=topk, KP=_pow2(topk), BM=_rows_tile(R),
        BLOCK_N=block_n, BLOCK_K=BLOCK_K, STAGES=STAGES, PRECISION=_precision(x), num_warps=4)
    return vals, idxs, peak, mass


def _head_shape(x, norm_w, w, topk, eps, block_n):
    R, C = x.shape[0], -(-w.shape[0] // block_n)
    return (x.new_empty(R, C, topk, dtype=torch.float32), x.new_empty(R, C, topk, dtype=torch.int32),
            x.new_empty(R, C, dtype=torch.float32), x.new_empty(R, C, dtype=torch.float32))


def _or(t: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    """``t``, or an unread pointer in its place."""
    return t if t is not None else other


def _row_count(x: torch.Tensor, idx: torch.Tensor | None) -> int:
    if idx is not None:
        return idx.shape[0]
    return x.shape[0] * x.shape[2] if x.dim() == 4 else x.shape[0]  # the attention's [B, NH, T, D]: B * T rows


def _rows_tile(rows: int) -> int:
    """The rows padded to a tensor-core tile (16 at least, a power of two)."""
    return max(16, _pow2(rows))


def _precision(x: torch.Tensor) -> str:
    """float32 rows multiply exactly (no TF32); bf16/fp16 ones as they are."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def _pow2(n: int) -> int:
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def _register() -> None:
    """The three ops, opaque custom ops with shape-only (fake) implementations (``draft_qkv`` declares its writes
    into the caches), so torch.compile(fullgraph) keeps each as one call and CUDA graphs capture its launch."""
    qkv = torch.library.custom_op("eaglelab::draft_qkv", _qkv, mutates_args=("k_cache", "v_cache"))
    qkv.register_fake(_qkv_shape)
    rows = torch.library.custom_op("eaglelab::draft_rows", _rows, mutates_args=())
    rows.register_fake(_rows_shape)
    head = torch.library.custom_op("eaglelab::draft_head", _head, mutates_args=())
    head.register_fake(_head_shape)
