"""Write an EAGLE-3 drafter directory (``eaglelab train``, tests): a SGLang/SpecForge or speculators
``config.json`` and its ``model.safetensors``. Reading is :mod:`eaglelab.engine.formats.draft_checkpoint`.

Layouts: Llama (``LlamaForCausalLMEagle3``, tensors ``midlayer.*``; speculators ``layers.0.*``) and MLA
(``Eagle3DeepseekV2ForCausalLM`` with the five MLA sizes, tensors ``layers.0.*`` as the Kimi drafters
ship them; SGLang and vLLM read either prefix). EAGLE-3.1 flags are written as ``fc_norm`` /
``norm_output`` at the top level, the spelling SGLang, vLLM and speculators all read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from eaglelab.engine.formats.draft_files import detect_format
from eaglelab.engine.formats.drafter_layouts import MLA_ARCHITECTURES
from eaglelab.engine.model.config import MLAConfig


def sglang_config(
    *,
    hidden_size: int,
    vocab_size: int,
    draft_vocab_size: int,
    aux_layer_ids: list[int] | None,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    target_hidden_size: int | None = None,
    max_position_embeddings: int = 8192,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-5,
    fc_norm: bool = False,
    norm_output: bool = False,
    mla: MLAConfig | None = None,
) -> dict[str, Any]:
    """A SGLang/SpecForge ``config.json`` dict; ``aux_layer_ids=None`` leaves out ``eagle_config``;
    ``mla`` writes the MLA layout (``Eagle3DeepseekV2ForCausalLM``); the EAGLE-3.1 flags are written
    only when set (absent = off for every engine)."""
    cfg: dict[str, Any] = {
        "architectures": [MLA_ARCHITECTURES[0] if mla is not None else "LlamaForCausalLMEagle3"],
        "model_type": "deepseek_v3" if mla is not None else "llama",
        "num_hidden_layers": 1,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta,
        "rms_norm_eps": rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    if target_hidden_size is not None:
        cfg["target_hidden_size"] = target_hidden_size
    if mla is not None:
        cfg.update(q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank, qk_nope_head_dim=mla.qk_nope_head_dim,
                   qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim)
        if not mla.rope_interleave:
            cfg["rope_interleave"] = False
    cfg.update({k: True for k, on in (("fc_norm", fc_norm), ("norm_output", norm_output)) if on})
    if aux_layer_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids), "use_aux_hidden_state": True}
    return cfg


def speculators_config(sglang_cfg: Mapping[str, Any], *, aux_layer_ids: list[int] | None, verifier: str = "target") -> dict[str, Any]:
    """The speculators form of a SGLang config dict; ``aux_layer_ids`` in vLLM convention (None: null).
    The EAGLE-3.1 flags move to the speculators config's top level; the MLA layout has no speculators form."""
    if any(a in MLA_ARCHITECTURES for a in sglang_cfg.get("architectures") or ()):
        raise ValueError("the MLA drafter layout has no speculators form: write the SGLang config")
    flags = {k: True for k in ("fc_norm", "norm_output") if sglang_cfg.get(k)}
    layer = {k: v for k, v in sglang_cfg.items()
             if k not in ("eagle_config", "draft_vocab_size", "target_hidden_size", "architectures", *flags)}
    layer["architectures"] = ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": sglang_cfg.get("draft_vocab_size"),
        "target_hidden_size": sglang_cfg.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids) if aux_layer_ids is not None else None,
        "norm_before_residual": False,
        **flags,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }


def save_draft_checkpoint(path: str | Path, config: Mapping[str, Any], tensors: Mapping[str, "torch.Tensor"]) -> Path:  # noqa: F821
    """Write ``config.json`` and ``model.safetensors``; ``tensors`` use SGLang names, written in the
    config's format and layout (speculators and MLA: ``midlayer.*`` -> ``layers.0.*``)."""
    from safetensors.torch import save_file

    from eaglelab.engine.formats.safe_write import write_atomic

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fmt = detect_format(config, path / "config.json")
    mla = any(a in MLA_ARCHITECTURES for a in config.get("architectures") or ())
    rename = (lambda n: "layers.0." + n[len("midlayer."):] if n.startswith("midlayer.") else n) \
        if fmt == "speculators" or mla else (lambda n: n)
    if tensors:  # weights first: a full disk then leaves no new config.json naming weights that are not there
        named = {rename(k): v.contiguous() for k, v in tensors.items()}
        write_atomic(path / "model.safetensors", lambda tmp: save_file(named, str(tmp)), what="drafter weights")
    text = json.dumps(dict(config), indent=2) + "\n"
    write_atomic(path / "config.json", lambda tmp: tmp.write_text(text), what="drafter config")
    return path
