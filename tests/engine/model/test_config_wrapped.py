"""A multimodal wrapper's config.json (Kimi-K2.5: ``KimiK25ForConditionalGeneration`` with the DeepSeek-V3 text
model under ``text_config``) is read as its text model, with a note; weights under ``language_model.`` load
(``language_model.model.*``, ``language_model.lm_head.weight``), the vision tower's are left alone; a wrapper
whose text model we do not read is refused naming its architecture."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.errors import ConfigError
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.moe import kimi_like_config
from tests.conftest import random_model

TCFG = kimi_like_config("cpu", num_hidden_layers=2, vocab_size=96, hidden_size=64, intermediate_size=96,
                        n_routed_experts=4, moe_intermediate_size=32, num_experts_per_tok=2, eos_token_id=2)


def wrapped(text: dict, *, drop=("architectures", "eos_token_id", "torch_dtype")) -> dict:
    """Kimi-K2.5's shape: the wrapper's own architecture, the text model under text_config (its model_type
    kimi_k2, no architectures of its own), some fields at the top level only, a vision config beside it."""
    inner = {k: v for k, v in text.items() if k not in drop} | {"model_type": "kimi_k2"}
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": inner,
            "vision_config": {"hidden_size": 32, "num_hidden_layers": 1}, "eos_token_id": text["eos_token_id"],
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def test_the_text_config_is_read_with_a_note():
    plain = ModelConfig.from_dict(TCFG)
    cfg = ModelConfig.from_dict(wrapped(TCFG))
    assert cfg == plain and cfg.architecture == "DeepseekV3ForCausalLM" and cfg.mla is not None and cfg.moe is not None
    assert cfg.eos_token_ids == (2,) and cfg.torch_dtype == "bfloat16"  # from the wrapper's top level
    assert len(cfg.notes) == 1 and "KimiK25ForConditionalGeneration" in cfg.notes[0] and "text_config" in cfg.notes[0]
    assert plain.notes == () and "notes" not in cfg.to_dict()


def test_a_wrapper_of_a_text_model_we_do_not_read_is_refused():
    d = wrapped(TCFG) | {"text_config": {"model_type": "gemma3_text", "hidden_size": 64}}
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(d)
    assert "unsupported architecture" in str(e.value) and "KimiK25ForConditionalGeneration" in str(e.value.found)


def test_language_model_weights_load_and_run_as_the_text_model(tmp_path):
    from safetensors.torch import save_file

    model = random_model(TCFG, seed=4)
    tensors = {"vision_tower.patch_embed.weight": torch.randn(8, 8)}  # not ours: left alone
    for name, p in model.named_parameters():
        hf = "language_model." + (name if name.startswith("lm_head") else "model." + name)
        stem, _, proj = hf.rpartition(".")
        if stem.endswith(".mlp.experts"):  # stacked [E, out, in] -> HF's per-expert names
            tensors.update({f"{stem}.{e}.{proj}.weight": p[e].detach().clone() for e in range(p.shape[0])})
        else:
            tensors[hf] = p.detach().clone().contiguous()
    path = tmp_path / "kimi-k2.5-tiny"
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(wrapped(TCFG)))
    loaded = load_target(path, dtype=torch.float32, with_tokenizer=False)
    assert any("text_config" in n for n in loaded.notes)
    ids = torch.randint(3, TCFG["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(6)[None]
    with torch.no_grad():
        want = model.logits(model(ids, pos)[0])
        got = loaded.model.logits(loaded.model(ids, pos)[0])
    assert torch.allclose(got, want, atol=1e-5)
