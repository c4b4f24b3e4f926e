"""DeepSeek-V2/V3 multi-head latent attention (MLA), the attention of DeepSeek-V3 and Kimi-K2 targets.

Shapes: B batch, T new tokens, S cache length, H hidden, NH heads (local under TP), R kv_lora_rank,
Dn qk_nope_head_dim, Dr qk_rope_head_dim, Dv v_head_dim, Q q_lora_rank.

What HF ``DeepseekV3Attention`` computes (parameter names as in its checkpoints)::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))       # [B, T, NH*(Dn+Dr)]   (q_proj(x) when Q is None)
    q_nope, q_pe = split(q, [Dn, Dr])                   # per head
    c_kv, k_pe = split(kv_a_proj_with_mqa(x), [R, Dr])  # [B, T, R], [B, T, Dr]: one k_pe for all heads
    c_kv   = kv_a_layernorm(c_kv)
    q_pe, k_pe = rope(q_pe), rope(k_pe)                 # YaRN-scaled, DeepSeek's interleaved pairs
    k_nope, v = split(kv_b_proj(c_kv), [Dn, Dv])        # per head, [B, NH, S, Dn] / [B, NH, S, Dv]
    out    = softmax((q_nope.k_nope + q_pe.k_pe) * scale) @ v
    y      = o_proj(out)                                # scale = (Dn+Dr)^-0.5 * yarn_mscale(mscale_all_dim)^2

The cache keeps only the compressed row ``[c_kv, k_pe]`` per token ([R + Dr] values, one "KV head";
576 for DeepSeek-V3 / Kimi-K2 against 2 * 128 heads * 192 = 49152 if expanded). Attention reads it
without expanding ("weight absorption"): ``q_nope.k_nope = (q_nope W_UK) . c_kv`` with
``W_UK = kv_b_proj``'s key rows, and ``v`` is applied after the softmax as ``(P @ c_kv) W_UV^T``.
So attention is multi-query attention of queries ``[q_nope W_UK, q_pe]`` [B, NH, T, R+Dr] against
the cached rows [B, 1, S, R+Dr], with the rows' first R values as the values. Prefill, decode and
tree verify all take this one path.

Rotary: DeepSeek stores q_pe/k_pe's dimensions as pairs (x0, x1), (x2, x3) ...; gathering the even then
the odd dimensions and turning them with the rotate-half formula gives exactly HF's interleaved
rotation. q and k get the same permutation, so their dot products are unchanged.

Tensor parallel: heads split over ranks (q_b_proj / kv_b_proj column-parallel by head, o_proj
row-parallel, one all-reduce "attn"); q_a_proj, kv_a_proj_with_mqa and their norms are small and
replicated, and every rank caches the whole latent row (as SGLang's TP MLA does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels, RMSNorm, yarn_mscale
from eaglelab.engine.model.tp_layers import ColumnParallelLinear, RowParallelLinear, head_split
from eaglelab.engine.core.tp_group import TPGroup
from eaglelab.engine.core.kv_cache import KVCache


def mla_softmax_scale(cfg: ModelConfig) -> float:
    """(Dn + Dr)^-0.5, times yarn_mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim."""
    assert cfg.mla is not None
    scale = cfg.mla.qk_head_dim ** -0.5
    rs = cfg.rope_scaling_dict or {}
    if rs.get("rope_type", rs.get("type", "default")) != "default" and rs.get("mscale_all_dim"):
        m = yarn_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
        scale *= m * m
    return scale


class MLAttention(nn.Module):
    """Multi-head latent attention over a compressed cache (one [R + Dr] row per token per layer)."""

    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup | None, in_features: int | None = None,
                 latent_eps: float = 1e-6) -> None:
        """``in_features``: the width the q/kv a-projections read (the hidden size; an EAGLE-3 drafter's
        2H); ``latent_eps``: the q/kv latent norms' epsilon (HF's default 1e-6; the engines' drafters
        use rms_norm_eps)."""
        super().__init__()
        m = cfg.mla
        assert m is not None, "MLAttention needs cfg.mla"
        self.layer, self.tp, self.m = layer, tp, m
        heads = head_split(cfg.num_heads, cfg.num_heads, tp)  # each head its own group: a near-even split
        self.local_heads, self.local_kv_heads = heads.q_len, 1  # one latent "KV head", on every rank
        first, n, H = heads.q_start, heads.q_len, cfg.hidden_size
        X = in_features or H
        qk, kv_b = m.qk_head_dim, m.qk_nope_head_dim + m.v_head_dim
        if m.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(X, cfg.num_heads * qk, False, tp, "q_proj", rows=(first * qk, n * qk))
        else:
            self.q_a_proj = ColumnParallelLinear(X, m.q_lora_rank, False, None)  # replicated
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, latent_eps)
            self.q_b_proj = ColumnParallelLinear(m.q_lora_rank, cfg.num_heads * qk, False, tp, "q_b_proj",
                                                 rows=(first * qk, n * qk))
        self.kv_a_proj_with_mqa = ColumnParallelLinear(X, m.cache_dim, False, None)  # replicated
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, latent_eps)
        self.kv_b_proj = ColumnParallelLinear(m.kv_lora_rank, cfg.num_heads * kv_b, False, tp, "kv_b_proj",
                                              rows=(first * kv_b, n * kv_b))
        self.o_proj = RowParallelLinear(cfg.num_heads * m.v_head_dim, H, tp, "o_proj",
                                        cols=(first * m.v_head_dim, n * m.v_head_dim))
        self.scale = mla_softmax_scale(cfg)

    def _queries(self, x: torch.Tensor, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> q_nope [B, NH, T, Dn], q_pe [B, NH, T, Dr] (before rotary)."""
        B, T, _ = x.shape
        if self.m.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x), kernels))
        q = q.view(B, T, self.local_heads, self.m.qk_head_dim).transpose(1, 2)  # [B, NH, T, Dn+Dr]
        return q.split([self.m.qk_nope_head_dim, self.m.qk_rope_head_dim], dim=-1)

    def _pairs(self, x: torch.Tensor) -> torch.Tensor:
        """DeepSeek's interleaved rotary pairs gathered into rotate-half order (evens, then odds)."""
        return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1) if self.m.rope_interleave else x

    def forward(self, x, cos, sin, cache: KVCache | None, slots, mask, kv_len: int | None = None,
                kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        """x [B, T, in_features] -> [B, T, H]; writes the tokens' latent rows at ``slots`` of layer ``self.layer``."""
        B, T, _ = x.shape
        R = self.m.kv_lora_rank
        q_nope, q_pe = self._queries(x, kernels)  # [B, NH, T, Dn], [B, NH, T, Dr]
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([R, self.m.qk_rope_head_dim], dim=-1)  # [B, T, R], [B, T, Dr]
        q_pe, k_pe = kernels.rotary(self._pairs(q_pe), self._pairs(k_pe[:, None]), cos, sin)  # [B, NH, T, Dr], [B, 1, T, Dr]
        row = torch.cat((self.kv_a_layernorm(c_kv, kernels)[:, None], k_pe), dim=-1)  # [B, 1, T, R+Dr]: the cached row
        if cache is None:
            rows = row
        else:
            cache.write(self.layer, slots, row.transpose(1, 2), None)
            rows = cache.layer(self.layer, B)[0]  # [B, 1, S, R+Dr]
            if kv_len is not None:  # eager paths may attend over the used prefix only
                rows = rows[:, :, :kv_len]
        w_kv = self.kv_b_proj.weight.view(self.local_heads, -1, R)  # [NH, Dn+Dv, R]
        w_uk, w_uv = w_kv.split([self.m.qk_nope_head_dim, self.m.v_head_dim], dim=1)  # [NH, Dn, R], [NH, Dv, R]
        q = torch.cat((q_nope @ w_uk, q_pe), dim=-1)  # [B, NH, T, R+Dr]
        attn_mask = None if mask is None else mask[:, None]  # [B, 1, T, S]
        lat = F.scaled_dot_product_attention(q, rows, rows[..., :R], attn_mask=attn_mask, is_causal=mask is None,
                                             scale=self.scale, enable_gqa=True)  # [B, NH, T, R]
        out = lat @ w_uv.transpose(1, 2)  # [B, NH, T, Dv]
        out = self.o_proj(out.transpose(1, 2).reshape(B, T, -1))  # [B, T, H] (partial under TP)
        if self.tp:
            out = self.tp.all_reduce(out, self.layer, "attn")
        return out
