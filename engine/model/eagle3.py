"""The EAGLE-3 drafter: one Llama-style layer over [embedding ; fused target features].

The network reads no file: :func:`eaglelab.engine.formats.drafter_loader.load_eagle3` builds one from
SGLang/SpecForge (``LlamaForCausalLMEagle3``) and speculators (``Eagle3Speculator``) checkpoints
unchanged. The token embedding is the
target's; ``fc`` fuses the target's aux hidden states (n x H_target -> H); later draft steps feed
back the drafter's own hidden state (H). Draft-vocabulary ids map to target ids through
``d2t`` (target id = draft id + d2t[draft id]). The MLA layout (``Eagle3DeepseekV2ForCausalLM``,
DeepSeek's latent attention in place of q/k/v) is :class:`~eaglelab.engine.model.eagle3_mla.Eagle3MLANetwork`.

One step, per position p (token t_{p+1} is the next token, f_p the features at p)::

    e = input_layernorm(embed(t_{p+1}))          # [B, T, H]
    g = hidden_norm(f_p)                         # f_p = fc(aux_p) or the drafter's own output
    a = attn(cat(e, g))                          # q/k/v take 2H inputs
    h = f_p + a  (or g + a with norm_before_residual)
    out = h + mlp(post_attention_layernorm(h))   # pre-norm hidden, fed back next step
    logits = lm_head(norm(out))                  # [B, T, V_draft]

EAGLE-3.1 (two config flags, both off by default; SGLang, vLLM and speculators read them at the top
level of config.json)::

    fc_norm:     fc(cat(fc_norm.0(aux_0), ..., fc_norm.{n-1}(aux_{n-1})))   # an RMSNorm per target state
    norm_output: the state fed back next step is norm(out), not out        # lm_head then reads it as is
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.config import MLAConfig
from eaglelab.engine.model.layers import EAGER_KERNELS, FusedLinear, Kernels, RMSNorm, Rotary, attend, rms_norm


@dataclass(frozen=True)
class Eagle3Config:
    """The drafter's shapes (from a DraftCheckpoint or chosen for a new drafter).

    ``num_kv_heads`` x ``head_dim`` is also the shape of the drafter's KV cache rows; with ``mla`` set
    (the MLA layout) they are 1 x (kv_lora_rank + qk_rope_head_dim), the one latent row MLA caches.
    """

    hidden_size: int
    target_hidden_size: int
    num_aux: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    norm_before_residual: bool = False
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm [target_hidden_size] per aux state before fc
    norm_output: bool = False  # EAGLE-3.1: the next draft step reads the post-norm hidden state
    mla: MLAConfig | None = None  # the MLA layout's attention sizes; None: Llama q/k/v attention

    @property
    def aux_size(self) -> int:
        return self.num_aux * self.target_hidden_size


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        H, D = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, D
        self.q_proj = nn.Linear(2 * H, cfg.num_heads * D, bias=False)
        self.k_proj = nn.Linear(2 * H, cfg.num_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(2 * H, cfg.num_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * D, H, bias=False)
        self.qkv = FusedLinear(self.q_proj, self.k_proj, self.v_proj, sums_fused=True)  # read by rotary, cache write
        self.o = FusedLinear(self.o_proj, sums_fused=True)  # read by the residual add

    def forward(self, x, cos, sin, cache: KVCache | None, slots, mask, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, kernels.gemv)  # one matmul (separate ones while training)
        q = q.view(B, T, self.num_heads, self.head_dim)  # [B, T, NH, D]
        k = k.view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, KVH, D]
        v = v.view(B, T, self.num_kv_heads, self.head_dim)
        q, k = kernels.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        if cache is None:
            out = attend(q, k, v.transpose(1, 2), mask)
        else:
            cache.write(0, slots, k.transpose(1, 2), v)
            k_all, v_all = cache.layer(0, B)
            out = attend(q, k_all, v_all, mask, kernels.attention)
        return self.o(out.transpose(1, 2).reshape(B, T, -1), kernels.gemv)[0]


class Eagle3MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = FusedLinear(self.gate_proj, self.up_proj, sums_fused=True)  # read by the SwiGLU
        self.down = FusedLinear(self.down_proj, sums_fused=True)  # read by the residual add

    def forward(self, x: torch.Tensor, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        gate, up = self.gate_up(x, kernels.gemv)
        return self.down(kernels.swiglu(gate, up), kernels.gemv)[0]


class Eagle3MidLayer(nn.Module):
    """The one decoder layer; ``attention`` takes the 2H input (Llama q/k/v, or MLA's a-projections)."""

    def __init__(self, cfg: Eagle3Config, attention: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Eagle3MLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, embeds, feats, cos, sin, cache, slots, mask, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        g = self.hidden_norm(feats, kernels)
        residual = g if self.norm_before_residual else feats
        x = torch.cat([self.input_layernorm(embeds, kernels), g], dim=-1)  # [B, T, 2H]
        h = residual + self.self_attn(x, cos, sin, cache, slots, mask, kernels)
        return h + self.mlp(self.post_attention_layernorm(h, kernels), kernels)


class Eagle3Network(nn.Module):
    """The drafter network. ``embed`` is the target's embedding, shared, not owned."""

    def __init__(self, cfg: Eagle3Config, embed: nn.Embedding) -> None:
        super().__init__()
        assert (cfg.mla is None) == (type(self) is Eagle3Network), "an MLA config needs Eagle3MLANetwork"
        self.config = cfg
        self.fc = nn.Linear(cfg.aux_size, cfg.hidden_size, bias=False)
        self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux)) \
            if cfg.fc_norm else None
        self.midlayer = Eagle3MidLayer(cfg, self.make_attention(cfg))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(self.rope_dim(cfg), cfg.rope_theta, dict(cfg.rope_scaling) if cfg.rope_scaling else None)
        self._embed = [embed]  # a list, so the target's weights are not registered as ours
        self.lm = FusedLinear(self.lm_head)  # the device's fast layout (or the few-row kernel's copy)

    @staticmethod
    def make_attention(cfg: Eagle3Config) -> nn.Module:
        """The layer's attention (Llama q/k/v here; the MLA network overrides it)."""
        return Eagle3Attention(cfg)

    @staticmethod
    def rope_dim(cfg: Eagle3Config) -> int:
        """Width the rotary embedding turns."""
        return cfg.head_dim

    @property
    def embed(self) -> nn.Embedding:
        return self._embed[0]

    def token_map(self) -> torch.Tensor:
        """Target id of each draft id, [V_draft]."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux features [B, T, n*H_t] -> drafter features [B, T, H] (EAGLE-3.1's ``fc_norm``:
        each H_t-wide state normalised first, all n at once on an [B, T, n, H_t] view: the same math as
        ``fc_norm.{i}`` applied to each chunk, without n norms and a cat per call)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            weight = torch.stack([norm.weight for norm in self.fc_norm])  # [n, H_t]
            states = aux.unflatten(-1, (self.config.num_aux, -1))  # [B, T, n, H_t]
            aux = rms_norm(states, weight, self.config.rms_norm_eps).flatten(-2)  # [B, T, n*H_t]
        return self.fc(aux)

    def forward(
        self,
        tokens: torch.Tensor,
        feats: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        kernels: Kernels = EAGER_KERNELS,
        float32: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T] (the NEXT tokens), feats [B, T, H], positions [B, T].

        Returns the hidden state fed to the next step [B, T, H] (see :meth:`hidden`) and draft logits
        [B, T, V_draft] (float32; ``float32=False``: see :meth:`head`).
        """
        out = self.hidden(tokens, feats, positions, cache, slots, mask, kernels)  # [B, T, H]
        return out, self.head(out, kernels, float32=float32)

    def hidden(self, tokens, feats, positions, cache=None, slots=None, mask=None,
               kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        """The midlayer: the state handed to the next draft step [B, T, H], the pre-norm output or, under
        ``norm_output`` (EAGLE-3.1), ``norm`` of it (callers that need few rows' logits take
        :meth:`head` of those rows only)."""
        embeds = self.embed(tokens).to(feats.dtype)  # [B, T, H]
        cos, sin = self.rotary(positions, feats.dtype)
        out = self.midlayer(embeds, feats, cos, sin, cache, slots, mask, kernels)  # [B, T, H] pre-norm
        return self.norm(out, kernels) if self.config.norm_output else out

    def head(self, hidden: torch.Tensor, kernels: Kernels = EAGER_KERNELS, float32: bool = True) -> torch.Tensor:
        """:meth:`hidden`'s state [..., H] -> draft logits [..., V_draft] (float32): lm_head(norm(out))
        either way (under ``norm_output`` the state is already normalised). ``float32=False``: in the head's dtype,
        for the engine's draft steps, whose top-k reads them in float32 itself (converted exactly) without a float32
        copy written first."""
        x = hidden if self.config.norm_output else self.norm(hidden, kernels)
        out = self.lm(x, kernels.gemv)[0]
        return out.float() if float32 else out

    def reset_buffers(self) -> None:
        from eaglelab.engine.model.layers import rope_inv_freq

        cfg = self.config
        scaling = dict(cfg.rope_scaling) if cfg.rope_scaling else None
        self.rotary.inv_freq = rope_inv_freq(self.rope_dim(cfg), cfg.rope_theta, scaling).to(self.fc.weight.device)
