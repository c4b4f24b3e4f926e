"""The target model: one implementation for the Llama family (Llama 3.x, SmolLM2, Qwen2, Qwen3),
with a DeepSeek-style MoE block (``engine/model/moe.py``) and multi-head latent attention
(``engine/model/mla.py``) for DeepSeek-V3 / Kimi-like targets.

Shapes: B batch, T new tokens, S cache length, H hidden, NH/KVH heads, D head dim, V vocab.

The forward takes explicit positions (RoPE) and explicit cache slots (where K/V are written), and
a boolean mask over the cache, so prefill, decode, padded batches and tree verification are all the
same call. Aux hidden-state taps use HF ``output_hidden_states`` indices: ``hs[0]`` the embedding
output, ``hs[i]`` the residual stream after decoder layer ``i-1``, ``hs[L]`` after the final norm.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.layers import (EAGER_KERNELS, FusedLinear, Kernels, RMSNorm, Rotary, attend, rope_inv_freq,
                                          shared)
from eaglelab.engine.model.tp_layers import (
    ColumnParallelLinear,
    DenseMLP,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    head_split,
)
from eaglelab.engine.core.tp_group import TPGroup


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup | None) -> None:
        super().__init__()
        self.layer, self.tp = layer, tp
        heads = head_split(cfg.num_heads, cfg.num_kv_heads, tp)  # whole GQA groups per rank
        self.local_heads, self.local_kv_heads = heads.q_len, heads.kv_len
        self.head_dim = D = cfg.head_dim
        q_rows, kv_rows = (heads.q_start * D, heads.q_len * D), (heads.kv_start * D, heads.kv_len * D)
        bias = cfg.attention_bias
        self.q_proj = ColumnParallelLinear(cfg.hidden_size, cfg.q_size, bias, tp, "q_proj", rows=q_rows)
        self.k_proj = ColumnParallelLinear(cfg.hidden_size, cfg.kv_size, bias, tp, "k_proj", rows=kv_rows)
        self.v_proj = ColumnParallelLinear(cfg.hidden_size, cfg.kv_size, bias, tp, "v_proj", rows=kv_rows)
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, tp, "o_proj", cols=q_rows)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv = FusedLinear(self.q_proj, self.k_proj, self.v_proj, sums_fused=True)  # read by rotary, cache write
        self.o = FusedLinear(self.o_proj, sums_fused=tp is None)  # read by the residual add (under TP: all-reduced)

    def forward(self, x, cos, sin, cache: KVCache | None, slots, mask, kv_len: int | None = None,
                kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, kernels.gemv)  # one matmul: [B, T, (NH + 2 KVH) * D] split
        q = q.view(B, T, self.local_heads, self.head_dim)  # [B, T, NH, D]
        k = k.view(B, T, self.local_kv_heads, self.head_dim)  # [B, T, KVH, D]
        v = v.view(B, T, self.local_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q, kernels), self.k_norm(k, kernels)
        q, k = kernels.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, NH, T, D], [B, KVH, T, D]
        if cache is None:
            out = attend(q, k, v.transpose(1, 2), mask)
        else:
            cache.write(self.layer, slots, k.transpose(1, 2), v)
            k_all, v_all = cache.layer(self.layer, B)  # [B, KVH, S, D]
            if kv_len is not None:  # eager paths may attend over the used prefix only
                k_all, v_all = k_all[:, :, :kv_len], v_all[:, :, :kv_len]
            out = attend(q, k_all, v_all, mask, kernels.attention)
        (out,) = self.o(out.transpose(1, 2).reshape(B, T, -1), kernels.gemv)  # [B, T, H] (partial under TP)
        if self.tp:
            out = self.tp.all_reduce(out, self.layer, "attn")
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.mla is not None:
            from eaglelab.engine.model.mla import MLAttention

            self.self_attn: nn.Module = MLAttention(cfg, layer, tp)
        else:
            self.self_attn = Attention(cfg, layer, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_moe_layer(layer):
            from eaglelab.engine.model.moe import MoEBlock

            self.mlp: nn.Module = MoEBlock(cfg, layer, tp)
        else:
            self.mlp = DenseMLP(cfg, layer, tp)

    def forward(self, x, cos, sin, cache, slots, mask, kv_len=None, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, kernels), cos, sin, cache, slots, mask, kv_len, kernels)
        return x + self.mlp(self.post_attention_layernorm(x, kernels), kernels=kernels)


class Transformer(nn.Module):
    """The target. Parameter names follow HF checkpoints with the ``model.`` prefix dropped."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None, replicate_embedding: bool = True) -> None:
        super().__init__()
        self.config, self.tp = cfg, tp
        # under TP: replicated (no collective) unless asked for the vocab-parallel lookup (all-reduce "embed")
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, replicate_embedding)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp, cfg.num_layers)  # all-gather "head"
        self._tie()
        self.rotary = Rotary(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling_dict)
        self.head = FusedLinear(self.lm_head)  # without TP: the head's matmul in the device's fast layout

    def make_cache(self, batch: int, max_len: int, *, dtype: torch.dtype, device: torch.device | str) -> KVCache:
        """A KV cache of ``max_len`` slots for this model on this rank: K and V per local KV head,
        or (MLA) one compressed [kv_lora_rank + qk_rope_head_dim] row per token."""
        cfg, attn = self.config, self.layers[0].self_attn
        if cfg.mla is not None:
            return KVCache(cfg.num_layers, batch, 1, max_len, cfg.mla.cache_dim, dtype=dtype, device=device, with_v=False)
        return KVCache(cfg.num_layers, batch, attn.local_kv_heads, max_len, cfg.head_dim, dtype=dtype, device=device)

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (after building on the meta device) and re-tie the head."""
        cfg = self.config
        inv = rope_inv_freq(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling_dict)
        self.rotary.inv_freq = inv.to(self.embed_tokens.weight.device)
        self._tie()

    def _tie(self) -> None:
        """Share the head with the embedding when tied and both hold the same rows (under TP the
        embedding is whole and the head a vocab shard: the head then has its own copy of its rows)."""
        if self.config.tie_word_embeddings and self.lm_head.weight.shape == self.embed_tokens.weight.shape:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        kv_len: int | None = None,
        kernels: Kernels = EAGER_KERNELS,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the decoder stack.

        input_ids, positions, slots: [B, T]; mask: bool [B, T, S] over the cache (or [B, T, T]
        without a cache; None = causal). ``taps`` are HF ``output_hidden_states`` indices.
        Returns the final-normed hidden state [B, T, H] and the taps concatenated
        [B, T, len(taps) * H] (None without taps). ``kv_len`` limits attention to the first
        ``kv_len`` cache slots (the mask is then [B, T, kv_len]); None = the whole cache.
        """
        x = self.embed_tokens(input_ids)  # [B, T, H]
        cos, sin = self.rotary(positions, x.dtype)
        if mask is not None:
            mask = shared(mask, len(self.layers))  # compiled: one mask for every layer's attention
        tapped: dict[int, torch.Tensor] = {}
        if 0 in taps:
            tapped[0] = x
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, slots, mask, kv_len, kernels)
            if i + 1 in taps and i + 1 < len(self.layers):
                tapped[i + 1] = x
        x = self.norm(x, kernels)
        if len(self.layers) in taps:
            tapped[len(self.layers)] = x
        aux = torch.cat([tapped[i] for i in taps], dim=-1) if taps else None
        return x, aux

    def logits(self, hidden: torch.Tensor, kernels: Kernels = EAGER_KERNELS, float32: bool = True) -> torch.Tensor:
        """[..., H] -> [..., V], in float32; ``float32=False``: in the head's own dtype (float32 under tensor
        parallelism, whose head all-gathers float32 shards), for a phase that hands its logits to another: every
        value converts to float32 exactly, so a pick or a distribution made there is the same, and the phase does
        not write float32 copies (a verify of 40 rows: 7.9 MB for SmolLM2's 49,152-token vocabulary)."""
        if self.tp is not None:  # vocab-parallel: the head all-gathers its shards
            return self.lm_head(hidden, torch.float32)
        out = self.head(hidden, kernels.gemv)[0]
        return out.float() if float32 else out

    @torch.no_grad()
    def all_hidden_states(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """HF ``output_hidden_states`` for a causal pass over input_ids [B, T]: L+1 tensors [B, T, H]."""
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device).expand_as(input_ids)
        taps = tuple(range(self.config.num_layers + 1))
        _, aux = self.forward(input_ids, positions, taps=taps)
        assert aux is not None
        return list(aux.split(self.config.hidden_size, dim=-1))

    @torch.no_grad()
    def taps(self, input_ids: torch.Tensor, hf_indices: tuple[int, ...]) -> torch.Tensor:
        """The aux features [B, T, n*H] at ``hf_indices`` for a causal pass over input_ids [B, T]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        _, aux = self.forward(input_ids, positions, taps=hf_indices)
        assert aux is not None
        return aux
