"""A DeepSeek-V3 / Kimi-K2 style mixture-of-experts block, and the ``kimi-like`` scale-model config.

One MoE layer (``model.layers.N.mlp`` in HF checkpoints)::

    logits = x @ gate.weight^T                          # [N, E], float32
    scores = sigmoid(logits)  (or softmax)              # [N, E]
    choice = scores + gate.e_score_correction_bias      # sigmoid only: the bias steers the choice ...
    choice = keep the best topk_group of n_group groups # group score = sum of its top-2 (max for softmax)
    idx    = top_k(choice)                              # [N, k]
    w      = scores[idx]  (/ sum if norm_topk_prob) * routed_scaling_factor   # ... never the weights
    y      = sum_k w_k * expert_{idx_k}(x) + shared_experts(x)                # [N, H]

Parameters are named as in HF checkpoints (``gate.weight``, ``gate.e_score_correction_bias``,
``shared_experts.{gate,up,down}_proj.weight``); the routed experts are stored stacked,
``experts.{gate,up,down}_proj`` [E, I, H] / [E, H, I], and read from the per-expert checkpoint
names ``experts.E.{gate,up,down}_proj.weight`` (see :meth:`RoutedExperts.checkpoint_names`).

Tensor parallel: every rank keeps all E experts with each expert's intermediate width split over
ranks (I / world), the way SGLang's default TP MoE shards them, rather than E / world whole experts
per rank (expert parallel). Why: in the regime speculative decoding runs in (a few tokens per
forward), expert parallelism puts the k chosen experts on whichever ranks own them, so one rank may
do three experts' work while another does none and every rank then waits at the all-reduce for the
busiest; splitting each expert gives every rank exactly 1/world of the work for any routing, and
the arrival skew the all-reduce probe measures stays a property of the hardware, not of the router.
The router (``gate``) is replicated: every rank routes identically. Routed and shared outputs are
summed before the block's single all-reduce (site ``"moe"``).

The attention of these targets is multi-head latent attention (``engine/model/mla.py``), chosen
by ``kv_lora_rank`` in config.json; the ``kimi-like`` configs below use it with Kimi-K2's sizes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels
from eaglelab.engine.model.tp_layers import DenseMLP
from eaglelab.engine.core.tp_group import TPGroup


class Router(nn.Module):
    """Top-k gating. Weights stay float32 whatever the model dtype (routing is decided on them)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        m = cfg.moe
        assert m is not None, "a Router needs cfg.moe"
        assert m.num_experts % m.n_group == 0, f"n_routed_experts={m.num_experts} not divisible by n_group={m.n_group}"
        self.top_k, self.num_groups, self.topk_group = m.top_k, m.n_group, m.topk_group
        self.scoring, self.norm_topk_prob, self.scale = m.scoring, m.norm_topk_prob, m.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(m.num_experts, cfg.hidden_size))
        bias = torch.zeros(m.num_experts) if m.scoring == "sigmoid" else None
        self.e_score_correction_bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def _apply(self, fn: Callable, recurse: bool = True):
        # Follow device moves but not dtype casts: a bf16 correction bias would reorder experts.
        def keep_fp32(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            if t.dtype == torch.float32 and out.dtype != torch.float32 and out.is_floating_point():
                return t.to(device=out.device)
            return out

        return super()._apply(keep_fp32, recurse)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> combine weights [N, k] (float32) and expert ids [N, k]."""
        if torch.is_autocast_enabled(x.device.type):  # training under bf16 autocast: route in float32 all the
            with torch.autocast(x.device.type, enabled=False):  # same (the context only then: ~5 us a call)
                return self(x)
        logits = F.linear(x.float(), self.weight.float())  # [N, E]
        scores = logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if self.num_groups > 1:
            choice = self._limit_groups(choice)
        idx = choice.topk(self.top_k, dim=-1).indices  # [N, k]
        w = scores.gather(-1, idx)  # [N, k]: the unbiased scores
        if self.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.scale, idx

    def _limit_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Mask (-inf) the experts outside the best ``topk_group`` of ``n_group`` groups."""
        N, E = choice.shape
        grouped = choice.view(N, self.num_groups, E // self.num_groups)  # [N, G, E/G]
        if self.scoring == "sigmoid":  # DeepSeek-V3: a group scores the sum of its two best
            group_score = grouped.topk(min(2, E // self.num_groups), dim=-1).values.sum(-1)  # [N, G]
        else:  # DeepSeek-V2 (softmax): a group scores its best
            group_score = grouped.max(dim=-1).values
        keep = group_score.topk(self.topk_group, dim=-1).indices  # [N, topk_group]
        mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)  # [N, G]
        return choice.masked_fill(~mask.repeat_interleave(E // self.num_groups, dim=1), float("-inf"))


def capturing_or_compiling() -> bool:
    """Whether this forward may not sync with the host: it is being compiled, captured into a CUDA graph,
    or warmed up for a capture (the graph runner's warm-ups turn CUDA's sync debug mode on)."""
    if torch.compiler.is_compiling():
        return True
    if not torch.cuda.is_available():
        return False
    return torch.cuda.is_current_stream_capturing() or torch.cuda.get_sync_debug_mode() != 0


class RoutedExperts(nn.Module):
    """The routed SwiGLU experts of one layer, stacked; each expert's intermediate split over ranks.

    Three ways to run them, chosen by shape and by whether the forward is being captured or compiled
    (the same on every rank, and in a single process): up to ``gather_max`` (token, expert) pairs
    gather the chosen experts' weights per pair (no host sync, fixed shapes: decode and small verify
    and draft forwards); more pairs in a forward being captured into a CUDA graph or compiled (a verify
    at batch 8) run every expert over every token under a routing matrix that is zero where a token
    did not choose the expert (fixed shapes, no host sync; it reads every expert once); more pairs
    eagerly (prefill) sort the pairs by expert and run each expert once over its tokens, which reads
    the expert counts back to the host.
    """

    def __init__(self, cfg: ModelConfig, tp: TPGroup | None, gather_max: int = 64) -> None:
        super().__init__()
        m = cfg.moe
        assert m is not None
        self.tp, self.gather_max = tp, gather_max
        E, H = m.num_experts, cfg.hidden_size
        local_inter = tp.split(m.expert_intermediate_size, "moe_intermediate_size")[1] if tp else m.expert_intermediate_size
        self.gate_proj = nn.Parameter(torch.empty(E, local_inter, H))
        self.up_proj = nn.Parameter(torch.empty(E, local_inter, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, local_inter))

    # ---- loading -----------------------------------------------------------------------------
    def checkpoint_names(self, name: str) -> list[str]:
        """The per-expert checkpoint tensors (relative to this module) stacked into parameter ``name``."""
        return [f"{e}.{name}.weight" for e in range(self.gate_proj.shape[0])]

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of one expert's weight ([I, H] gate/up, [H, I] down) or of the stack."""
        if self.tp is None:
            return full
        dim = full.dim() - (1 if name == "down_proj" else 2)  # the intermediate axis
        return full.narrow(dim, *self.tp.split(full.shape[dim]))

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights [N, k] float32, idx [N, k] -> [N, H] (a partial sum under TP)."""
        if idx.numel() <= self.gather_max:
            return self._gathered(x, weights, idx)
        if capturing_or_compiling():
            return self._dense(x, weights, idx)
        return self._sorted(x, weights, idx)

    def _gathered(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        xs = x[:, None, :, None]  # [N, 1, H, 1]
        h = F.silu(self.gate_proj[idx] @ xs) * (self.up_proj[idx] @ xs)  # [N, k, I, 1]
        y = (self.down_proj[idx] @ h).squeeze(-1)  # [N, k, H]
        return (y.float() * weights[..., None]).sum(dim=1).to(x.dtype)  # [N, H]

    def _dense(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        route = torch.zeros(x.shape[0], self.gate_proj.shape[0], dtype=torch.float32, device=x.device)
        route.scatter_add_(1, idx, weights.float())  # [N, E]: a token's weight for each expert it chose, else 0
        h = F.silu(torch.einsum("nh,eih->eni", x, self.gate_proj)) * torch.einsum("nh,eih->eni", x, self.up_proj)  # [E, N, I]
        y = torch.einsum("eni,ehi->enh", h, self.down_proj)  # [E, N, H]
        return torch.einsum("enh,ne->nh", y.float(), route).to(x.dtype)  # [N, H]

    def _sorted(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        N, k = idx.shape
        flat = idx.flatten()  # [N*k]
        order = flat.argsort(stable=True)  # pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.gate_proj.shape[0]).tolist()  # host sync (eager path)
        rows = order // k  # [N*k] token of each sorted pair
        parts = []
        for e, xe in enumerate(x[rows].split(counts)):  # xe [n_e, H]
            if xe.shape[0]:
                parts.append(F.linear(F.silu(F.linear(xe, self.gate_proj[e])) * F.linear(xe, self.up_proj[e]), self.down_proj[e]))
        y = torch.cat(parts).float() * weights.flatten()[order, None]  # [N*k, H]
        return torch.zeros(N, x.shape[1], dtype=torch.float32, device=x.device).index_add_(0, rows, y).to(x.dtype)


class MoEBlock(nn.Module):
    """Routed experts plus shared experts, one all-reduce (site ``"moe"``) under TP."""

    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup | None) -> None:
        super().__init__()
        m = cfg.moe
        assert m is not None, f"layer {layer} is an MoE layer but the config has no MoE fields"
        self.layer, self.tp = layer, tp
        self.gate = Router(cfg)
        self.experts = RoutedExperts(cfg, tp)
        shared = m.expert_intermediate_size * m.num_shared_experts
        self.shared_experts = DenseMLP(cfg, layer, tp, intermediate=shared) if shared else None

    def forward(self, x: torch.Tensor, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        B, T, H = x.shape
        flat = x.reshape(B * T, H)  # [N, H]
        weights, idx = self.gate(flat)  # [N, k], [N, k]
        y = self.experts(flat, weights, idx)  # [N, H] (partial under TP)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat, reduce=False, kernels=kernels)
        y = y.view(B, T, H)
        if self.tp:
            y = self.tp.all_reduce(y, self.layer, "moe")
        return y


# ---- the kimi-like scale model ---------------------------------------------------------------

# Kimi-K2 (moonshotai/Kimi-K2-Instruct config.json): 61 layers, hidden 7168, 64 heads of MLA
# (q rank 1536, kv rank 512, nope 128 + rope 64, v 128; YaRN factor 32 over 4096 positions),
# dense first layer (intermediate 18432), 384 routed experts of width 2048, top-8, one shared
# expert, sigmoid routing with a correction bias, one expert group, scaling 2.827, vocab 163840.
_KIMI_K2 = dict(
    num_hidden_layers=61, hidden_size=7168, intermediate_size=18432, num_attention_heads=64,
    n_routed_experts=384, moe_intermediate_size=2048, num_experts_per_tok=8, n_shared_experts=1,
    first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.827, vocab_size=163840,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    max_position_embeddings=131072,
    rope_scaling={"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
)

# Widths cut to fit. "gpu": Kimi-K2's hidden size (so the same all-reduce bytes per token), depth,
# heads and MLA sizes, top-8 routing and vocabulary, with 32 routed experts of width 512 instead of
# 384 of width 2048 (30.7 B parameters, 61 GB in bf16: one H200). "cpu": small enough for a 2-core
# CPU, with the default model's vocabulary so its tokenizer can print the (random) text.
# num_key_value_heads / head_dim do not shape MLA; they size a random EAGLE-3 drafter for the target.
KIMI_LIKE_WIDTHS: dict[str, dict[str, int]] = {
    "gpu": dict(n_routed_experts=32, moe_intermediate_size=512, num_key_value_heads=8, head_dim=128),
    "cpu": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, n_routed_experts=16, moe_intermediate_size=64, num_experts_per_tok=4,
                vocab_size=49152, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                v_head_dim=16),
}


def kimi_like_config(width: str = "gpu", **overrides: Any) -> dict[str, Any]:
    """The HF ``config.json`` dict of a Kimi-K2-shaped model with widths cut (``width``: gpu | cpu).

    61 layers, layer 0 dense and the rest MoE (sigmoid routing with correction bias, top-k,
    one shared expert), multi-head latent attention with YaRN rope. Any field can
    be overridden, e.g. ``kimi_like_config("gpu", num_hidden_layers=8)``. Parse the result with
    ``ModelConfig.from_dict``; the weights are the caller's (random for a scale model).
    """
    if width not in KIMI_LIKE_WIDTHS:
        raise ValueError(f"width must be one of {sorted(KIMI_LIKE_WIDTHS)}, got {width!r}")
    d: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **_KIMI_K2,
        "num_key_value_heads": 8,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    d["rope_scaling"] = dict(_KIMI_K2["rope_scaling"])  # a fresh copy the caller may edit
    d.update(KIMI_LIKE_WIDTHS[width])
    d.update(overrides)
    return d
