"""Random-weight models of named real shapes, for cost measurements where weight values do not matter.

A decode step's cost depends on the shapes (bytes of weights read, KV read, kernel count), not on
the weights' values, so a model of the right shape with random weights measures it without the
checkpoint. Its outputs are meaningless: a drafter on it accepts whatever the random target
happens to repeat, so acceptance figures from scale models say nothing.

Presets (``SCALE_PRESETS``):

- ``llama3.1-8b``: Llama 3.1 8B (32 layers, hidden 4096, 32/8 heads, intermediate 14336,
  vocab 128256, llama3 rope scaling); 8.0 B parameters, 16 GB in bf16.
- ``kimi-like``: :func:`eaglelab.engine.model.moe.kimi_like_config` ("gpu" widths): Kimi-K2's 61 layers,
  hidden 7168, 64 heads of multi-head latent attention (Kimi-K2's ranks and YaRN rope), sigmoid top-8
  routing and vocab, with 32 routed experts of width 512 plus one shared expert; 30.7 B parameters,
  61 GB in bf16.
  Needs the MoE block (``engine/model/moe.py``); without it the preset says so.
- ``smollm2-135m``: SmolLM2-135M-Instruct's shape (30 layers, hidden 576, 9/3 heads, intermediate
  1536, vocab 49152, tied embeddings): the default model's costs without its GGUF.
- ``tiny``: 4 layers, hidden 64, vocab 512, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.errors import ConfigError
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.core.tp_group import TPGroup

_LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
}

_SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "max_position_embeddings": 8192, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}

_TINY: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}

SCALE_PRESETS: tuple[str, ...] = ("llama3.1-8b", "kimi-like", "smollm2-135m", "tiny")


@dataclass(frozen=True)
class ScaleModel:
    """A built scale model: the random-weight target and what it stands for."""

    name: str
    model: Transformer
    config: ModelConfig
    hf_config: dict[str, Any]  # the config.json this shape comes from (builds an HF peer)


def scale_config(name: str) -> dict[str, Any]:
    """The HF ``config.json`` dict of preset ``name`` (a fresh copy)."""
    if name == "llama3.1-8b":
        return dict(_LLAMA31_8B)
    if name == "tiny":
        return dict(_TINY)
    if name == "smollm2-135m":
        return dict(_SMOLLM2_135M)
    if name == "kimi-like":
        try:
            from eaglelab.engine.model.moe import kimi_like_config
        except ImportError as exc:
            raise ConfigError(
                f"the kimi-like preset needs the MoE block (eaglelab.engine.model.moe), not available here: {exc}",
                field="--scale-model", found=name, hint="use --scale-model llama3.1-8b",
            ) from None
        return kimi_like_config("gpu")
    raise ConfigError("unknown scale model", field="--scale-model", found=name, expected=" | ".join(SCALE_PRESETS))


def build_scale_model(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                      seed: int = 0, tp: TPGroup | None = None, per_tensor_seed: bool = False) -> ScaleModel:
    """Preset ``name`` with random weights (normal, std 0.02; norms 1), built straight on ``device``.

    With ``tp`` (or ``per_tensor_seed``), each full tensor is drawn from a generator seeded by its
    name and this rank keeps its slice (:func:`randomize_sharded_`): every TP size holds the same
    model, so TP=1 and TP=N runs of one seed give the same tokens.
    """
    hf = scale_config(name)
    cfg = ModelConfig.from_dict(hf, source=f"scale preset {name}")
    device = torch.device(device)
    if tp is not None or per_tensor_seed:
        with torch.device("meta"):
            net = Transformer(cfg, tp)
        net = net.to(dtype).to_empty(device=device)
        randomize_sharded_(net, seed)
        net.reset_buffers()
        return ScaleModel(name, net.eval(), cfg, hf)
    if device.type == "cpu":  # small enough to build in place (and skips the meta kernels' imports)
        net = Transformer(cfg).to(dtype)
    else:  # build on meta, then allocate on the device in its dtype: no float32 copy of a large model
        with torch.device("meta"):
            net = Transformer(cfg)
        net = net.to(dtype).to_empty(device=device)
    randomize_(net, seed)
    net.reset_buffers()
    return ScaleModel(name, net.eval(), cfg, hf)


@torch.no_grad()
def randomize_(module: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Fill parameters in place, drawn on their own device: matrices ~ N(0, std), norm weights 1,
    other vectors 0. Deterministic for a seed and device."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            if p.device not in gens:
                gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, std, generator=gens[p.device])
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.zero_()


@torch.no_grad()
def randomize_sharded_(model: Transformer, seed: int, std: float = 0.02) -> None:
    """Fill a (sharded or single-process) target in place: every full checkpoint tensor is drawn on
    the model's device in its dtype from a generator seeded by (seed, name), and this rank keeps its
    slice; matrices ~ N(0, std), norm weights 1, other vectors 0. One full tensor at a time is held."""
    import zlib

    from eaglelab.engine.model.weights import checkpoint_shapes, copy_sharded

    shapes = checkpoint_shapes(model.config)
    p = next(model.parameters())

    def read(name: str) -> tuple[torch.Tensor, str] | None:
        shape = shapes.get(name)
        if shape is None:
            return None
        if len(shape) < 2:
            full = (torch.ones if "norm" in name else torch.zeros)(shape, dtype=p.dtype, device=p.device)
        else:
            g = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.empty(shape, dtype=p.dtype, device=p.device).normal_(0.0, std, generator=g)
        return full, f"random seed {seed}"

    copy_sharded(model, read, f"random weights (seed {seed})")


def default_taps(num_layers: int) -> tuple[int, ...]:
    """HF indices a drafter taps on a model of ``num_layers``: 2, L//2, L-3 (1, L//2, L-1 when small)."""
    if num_layers >= 6:
        return (2, num_layers // 2, num_layers - 3)
    return (1, max(1, num_layers // 2), num_layers - 1)


RANDOM_DRAFT_VOCAB = 32000  # a random drafter's draft vocabulary (capped at the target's) unless asked otherwise


def random_eagle3(target: Transformer, seed: int = 1, draft_vocab: int = RANDOM_DRAFT_VOCAB) -> tuple[Eagle3Network, tuple[int, ...]]:
    """A random-weight EAGLE-3 drafter shaped for ``target`` (one layer of its width), and its taps.

    For cost only: its proposals are noise. Draft ids map to target ids one to one (d2t = 0).
    """
    cfg = target.config
    param = next(target.parameters())
    dcfg = Eagle3Config(
        hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size, num_aux=3,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        draft_vocab_size=min(draft_vocab, cfg.vocab_size), rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
    )
    if param.device.type == "cpu":
        net = Eagle3Network(dcfg, target.embed_tokens).to(param.dtype)
    else:
        with torch.device("meta"):
            net = Eagle3Network(dcfg, target.embed_tokens)
        net = net.to(param.dtype).to_empty(device=param.device)
    net._embed = [target.embed_tokens]
    randomize_(net, seed)
    net.d2t = torch.zeros(dcfg.draft_vocab_size, dtype=torch.long, device=param.device)
    net.t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=param.device)
    net.t2d[: dcfg.draft_vocab_size] = True
    net.reset_buffers()
    return net.eval(), default_taps(cfg.num_layers)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of all parameters (tied ones counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def decode_weight_bytes(model: Transformer) -> int:
    """Weight bytes one batch-1 decode step must read: everything but the embedding table (one row
    of it is read; unless tied to the head), with each MoE layer's routed experts counted at
    ``top_k / num_experts`` of their bytes (a token reads only its experts).
    """
    cfg = model.config
    total = 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if name == "embed_tokens.weight" and not cfg.tie_word_embeddings:
            continue
        if cfg.moe is not None and ".mlp." in name and "experts" in name and "shared" not in name:
            nbytes = nbytes * cfg.moe.top_k // cfg.moe.num_experts
        total += nbytes
    return total
