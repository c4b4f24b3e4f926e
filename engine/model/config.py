"""Frozen model configuration read from an HF ``config.json``.

One dataclass covers the Llama family (Llama 2/3.x, SmolLM2, Qwen2, Qwen3) and the DeepSeek-V3 /
Kimi-K2 style MoE fields. Derived sizes are properties; nothing edits a config in place
(``dataclasses.replace`` makes a new one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglelab.engine.errors import ConfigError, read_json_object
from eaglelab.engine.core.fields import check_int, check_real, check_rope_scaling, real_number

# HF architectures we run, and the family they map to.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v3",
    "KimiK2ForCausalLM": "deepseek_v3",
}

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(frozen=True)
class MoEConfig:
    """DeepSeek-V3 style mixture of experts (routed top-k experts plus shared experts)."""

    num_experts: int  # n_routed_experts
    top_k: int  # num_experts_per_tok
    expert_intermediate_size: int  # moe_intermediate_size
    num_shared_experts: int = 1  # n_shared_experts
    first_dense_layers: int = 0  # first_k_dense_replace
    scoring: str = "sigmoid"  # "sigmoid" (DeepSeek-V3) | "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek-V2/V3 multi-head latent attention sizes (HF ``DeepseekV3Config`` field names)."""

    kv_lora_rank: int  # width of the compressed KV latent c_kv (what the cache stores, with k_pe)
    qk_nope_head_dim: int  # per-head query/key width without rotary
    qk_rope_head_dim: int  # per-head query width with rotary; k_pe is one such vector shared by all heads
    v_head_dim: int
    q_lora_rank: int | None = None  # None: q_proj straight from the hidden state
    rope_interleave: bool = True  # rotary dims stored as pairs (x0, x1), (x2, x3) ... (DeepSeek's layout)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_dim(self) -> int:
        """Values per token per layer in the compressed cache: c_kv then k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    """What the target model is. Built by :meth:`from_dict` / :meth:`from_json`."""

    architecture: str  # HF architectures[0]
    family: str  # "llama" | "qwen2" | "qwen3" | "deepseek_v3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted items of HF rope_scaling
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None  # DeepSeek-V3 attention (set when config.json has kv_lora_rank)
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    notes: tuple[str, ...] = field(default=(), compare=False, repr=False)  # how config.json was read, for a run's notes

    # ---- derived sizes ------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_dim(self) -> int:
        """Width the rotary embedding turns: the head dim, or MLA's qk_rope_head_dim."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.first_dense_layers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.pop("notes")
        d["rope_scaling"] = self.rope_scaling_dict
        return d

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(
                "no config.json",
                file=path,
                hint="point at an HF-format model directory (config.json + *.safetensors)",
            )
        data = read_json_object(path)
        return cls.from_dict(data, source=path)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str | Path = "config.json") -> "ModelConfig":
        wrapped = _text_model(d)
        if wrapped is not None:  # a multimodal wrapper (Kimi-K2.5): run its text model
            inner, note = wrapped
            return replace(cls.from_dict(inner, source), notes=(note,))
        archs = d.get("architectures") or []
        arch = (archs[0] if archs else None) if isinstance(archs, list) else archs
        if arch is not None and not isinstance(arch, str):
            raise ConfigError("must be a list of architecture names", file=source, field="architectures",
                              found=repr(archs)[:80], expected=" | ".join(sorted(ARCHITECTURES)))
        if arch is None:
            model_type = d.get("model_type", "")
            family = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(
                model_type if isinstance(model_type, str) else "", None
            )
            if family is None:
                raise ConfigError(
                    "no 'architectures' and no known 'model_type'",
                    file=source,
                    field="architectures",
                    found=d.get("model_type"),
                    expected=sorted(ARCHITECTURES),
                )
            arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(family, "Qwen3ForCausalLM")
        if arch not in ARCHITECTURES:
            raise ConfigError(
                "unsupported architecture",
                file=source,
                field="architectures",
                found=arch,
                expected=" | ".join(sorted(ARCHITECTURES)),
                hint="eaglelab runs Llama-family (Llama, SmolLM2, Qwen2/3) and DeepSeek-V3-style MoE targets",
            )
        for key in _REQUIRED:
            if key not in d:
                raise ConfigError("missing field", file=source, field=key, hint="copy it from the model's original config.json")
            if not isinstance(d[key], int) or isinstance(d[key], bool) or d[key] <= 0:
                raise ConfigError("must be a positive integer", file=source, field=key, found=d[key])
        family = ARCHITECTURES[arch]
        heads = d["num_attention_heads"]
        kv_heads = check_int(d.get("num_key_value_heads") or heads, source, "num_key_value_heads", low=1)
        head_dim = check_int(d.get("head_dim") or d["hidden_size"] // heads, source, "head_dim", low=1)
        mla = _mla_from_dict(d, source) if family == "deepseek_v3" and d.get("kv_lora_rank") else None
        if mla is not None and heads % kv_heads:  # MLA has no KV heads; the field only shapes a random drafter
            kv_heads = heads
        if heads % kv_heads:
            raise ConfigError(
                "num_attention_heads must be a multiple of num_key_value_heads",
                file=source,
                field="num_key_value_heads",
                found=kv_heads,
                expected=f"a divisor of {heads}",
            )
        rope_scaling = d.get("rope_scaling")
        params = d.get("rope_parameters")
        if rope_scaling is None and isinstance(params, dict) and params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"}  # transformers >= 5 writes it here
        rope_scaling = check_rope_scaling(rope_scaling, source)
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        for token in eos_ids:
            check_int(token, source, "eos_token_id", low=0, high=d["vocab_size"] - 1)
        bos = d.get("bos_token_id")
        if bos is not None:
            check_int(bos, source, "bos_token_id", low=0, high=d["vocab_size"] - 1)
        known = set(_REQUIRED) | {
            "architectures", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
            "rope_scaling", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
            "bos_token_id", "eos_token_id", "torch_dtype", "dtype", "model_type",
            "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave",
        }
        rope_theta = d.get("rope_theta")
        if rope_theta is None:
            rope_params = d.get("rope_parameters")
            rope_theta = (rope_params.get("rope_theta") if isinstance(rope_params, dict) else None) or 10000.0
        rope_theta = check_real(rope_theta, source, "rope_theta", low=0.0, low_open=True)
        eps = real_number(d, "rms_norm_eps", source, default=1e-6 if family != "llama" else 1e-5, low=0.0, high=1.0, low_open=True)
        max_pos = check_int(d.get("max_position_embeddings", 2048), source, "max_position_embeddings", low=1)
        return cls(
            architecture=arch,
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=eps,
            rope_theta=rope_theta,
            rope_scaling=tuple(sorted(rope_scaling.items())) if rope_scaling else None,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            moe=_moe_from_dict(d, source) if family == "deepseek_v3" else None,
            mla=mla,
            extra=tuple(sorted((k, str(v)) for k, v in d.items() if k not in known)),
        )


# text_config model types we read, and the architecture each names (a wrapper's text_config may omit it)
_TEXT_MODEL_TYPES = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                     "kimi_k2": "DeepseekV3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3": "Qwen3ForCausalLM"}
# top-level fields a wrapper may hold for its text model (the text_config's own value wins)
_WRAPPER_FIELDS = ("eos_token_id", "bos_token_id", "torch_dtype", "tie_word_embeddings")


def _text_model(d: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """A multimodal wrapper's text model: (its config, the note saying so), or None when ``d`` is not a wrapper
    (its own architecture is one we read) or its ``text_config`` is not a text model we read (the wrapper's
    architecture is then refused as unsupported). Kimi-K2.5: ``KimiK25ForConditionalGeneration`` around a
    DeepSeek-V3 (``kimi_k2``) text model; its weights are named ``language_model.model.*`` /
    ``language_model.lm_head.*``, which the loader maps."""
    text = d.get("text_config")
    archs = d.get("architectures")
    top = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if not isinstance(text, dict) or top in ARCHITECTURES:
        return None
    inner_archs = text.get("architectures")
    arch = inner_archs[0] if isinstance(inner_archs, list) and inner_archs and isinstance(inner_archs[0], str) else None
    if arch is None:
        arch = _TEXT_MODEL_TYPES.get(str(text.get("model_type")))
    if arch not in ARCHITECTURES:
        return None
    inner = {k: d[k] for k in _WRAPPER_FIELDS if k in d} | dict(text) | {"architectures": [arch]}
    note = (f"config.json: {top or d.get('model_type') or 'a multimodal model'} wraps a text model; running its "
            f"text_config ({arch}), the text path only (no vision tower)")
    return inner, note


def _mla_from_dict(d: dict[str, Any], source: str | Path) -> MLAConfig:
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not isinstance(d.get(key), int) or isinstance(d.get(key), bool) or d[key] <= 0:
            raise ConfigError("missing or not a positive integer (multi-head latent attention needs it)", file=source,
                              field=key, found=d.get(key), hint="copy it from the model's original config.json")
    if d["qk_rope_head_dim"] % 2:
        raise ConfigError("must be even (rotary turns pairs)", file=source, field="qk_rope_head_dim", found=d["qk_rope_head_dim"])
    if d.get("attention_bias"):
        raise ConfigError("attention biases are not supported with multi-head latent attention", file=source,
                          field="attention_bias", found=True, expected="false (as in DeepSeek-V3 and Kimi-K2)")
    q_rank = d.get("q_lora_rank")
    return MLAConfig(
        kv_lora_rank=d["kv_lora_rank"], qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
        v_head_dim=d["v_head_dim"], q_lora_rank=int(q_rank) if q_rank else None,
        rope_interleave=bool(d.get("rope_interleave", True)),
    )


def _moe_from_dict(d: dict[str, Any], source: str | Path) -> MoEConfig:
    for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"):
        if key not in d:
            raise ConfigError("missing MoE field", file=source, field=key, hint="DeepSeek-V3 / Kimi-K2 configs carry it")
    scoring = d.get("scoring_func", "sigmoid")
    if not isinstance(scoring, str) or scoring not in ("sigmoid", "softmax"):
        raise ConfigError("unsupported gating", file=source, field="scoring_func", found=scoring, expected="sigmoid | softmax")
    experts = check_int(d["n_routed_experts"], source, "n_routed_experts", low=1)
    groups = check_int(d.get("n_group", 1) or 1, source, "n_group", low=1, high=experts)
    return MoEConfig(
        num_experts=experts,
        top_k=check_int(d["num_experts_per_tok"], source, "num_experts_per_tok", low=1, high=experts),
        expert_intermediate_size=check_int(d["moe_intermediate_size"], source, "moe_intermediate_size", low=1),
        num_shared_experts=check_int(d.get("n_shared_experts", 1) or 0, source, "n_shared_experts", low=0),
        first_dense_layers=check_int(d.get("first_k_dense_replace", 0), source, "first_k_dense_replace", low=0),
        scoring=scoring,
        n_group=groups,
        topk_group=check_int(d.get("topk_group", 1) or 1, source, "topk_group", low=1, high=groups),
        routed_scaling_factor=real_number(d, "routed_scaling_factor", source, default=1.0, low=0.0, low_open=True),
        norm_topk_prob=bool(d.get("norm_topk_prob", True)),
    )
