"""The EAGLE-3 drafter with DeepSeek multi-head latent attention (``Eagle3DeepseekV2ForCausalLM``): the
layout of ``lightseekorg/kimi-k2.5-eagle3-mla`` and ``kimi-k2.6-eagle3.1-mla``, as SGLang's
``kimi_k25_eagle3.py`` and vLLM's ``deepseek_eagle3.py`` build it.

Everything but the attention is :class:`~eaglelab.engine.model.eagle3.Eagle3Network`'s (fc, the EAGLE-3.1
flags, the norms, the SwiGLU MLP, lm_head, d2t/t2d). The attention is the target's MLA
(:class:`~eaglelab.engine.model.mla.MLAttention`, shared code) with its two a-projections reading the
2H-wide ``x = cat(input_layernorm(embed), hidden_norm(f))``::

    q        = q_b_proj(q_a_layernorm(q_a_proj(x)))        # q_a_proj [Q, 2H]  (q_proj [NH*(Dn+Dr), 2H] when Q is null)
    c_kv, k_pe = split(kv_a_proj_with_mqa(x), [R, Dr])     # kv_a_proj_with_mqa [R + Dr, 2H]
    k_nope, v  = split(kv_b_proj(kv_a_layernorm(c_kv)), [Dn, Dv]) per head
    a        = o_proj(softmax(q_nope.k_nope + rope(q_pe).rope(k_pe)) * scale) @ v)

Rope and the softmax scale come from the drafter's own config (rope_theta / rope_scaling; DeepSeek's
interleaved pairs and YaRN mscale, as the target's MLA). The drafter's KV cache holds the target's
row layout, one [R + Dr] latent row per token (``Eagle3Config.num_kv_heads`` = 1, ``head_dim`` = R + Dr).
The residual around attention is the fc output ``f`` (SGLang; vLLM also honours ``norm_before_residual``).
SGLang refuses ``q_lora_rank: null``; vLLM builds ``q_proj`` then; both are built here.

Under tensor parallelism this drafter is replicated on every rank, as the Llama-layout one is
(:mod:`eaglelab.engine.model.tp_layers` says why): built with ``tp=None``, it holds every head and the
whole latent row, and a draft step runs no collective (``tests/engine/model/test_tp_mla_drafter.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels
from eaglelab.engine.model.mla import MLAttention


def attention_config(cfg: Eagle3Config) -> ModelConfig:
    """The :class:`ModelConfig` :class:`MLAttention` reads (heads, MLA sizes, rope scaling for the scale)."""
    assert cfg.mla is not None, "the MLA drafter needs Eagle3Config.mla"
    return ModelConfig(
        architecture="DeepseekV3ForCausalLM", family="deepseek_v3", vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_layers=1,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_heads, head_dim=cfg.mla.qk_head_dim,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, mla=cfg.mla,
    )


class Eagle3MLAttention(MLAttention):
    """The target's MLA over the drafter's [embed ; features] input (2H wide), one layer, replicated under TP."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__(attention_config(cfg), 0, None, in_features=2 * cfg.hidden_size, latent_eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache: KVCache | None, slots, mask,  # type: ignore[override]
                kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        """x [B, T, 2H] -> [B, T, H] (the Llama drafter attention's call)."""
        return super().forward(x, cos, sin, cache, slots, mask, None, kernels)


class Eagle3MLANetwork(Eagle3Network):
    """The MLA-layout drafter network: :class:`Eagle3Network` with :class:`Eagle3MLAttention`."""

    @staticmethod
    def make_attention(cfg: Eagle3Config) -> nn.Module:
        return Eagle3MLAttention(cfg)

    @staticmethod
    def rope_dim(cfg: Eagle3Config) -> int:
        assert cfg.mla is not None
        return cfg.mla.qk_rope_head_dim


def eagle3_network(cfg: Eagle3Config, embed: nn.Embedding) -> Eagle3Network:
    """The network for ``cfg``'s layout: MLA when ``cfg.mla`` is set, else Llama."""
    return Eagle3MLANetwork(cfg, embed) if cfg.mla is not None else Eagle3Network(cfg, embed)
