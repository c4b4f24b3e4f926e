"""Drafter layouts on disk: the MLA layout (``Eagle3DeepseekV2ForCausalLM``, tensors ``layers.0.*`` as the
Kimi drafters ship them) and the EAGLE-3.1 flags load into the right network and export back in each
engine's spelling; bad input (fc_norm set without its weights, fc_norm weights without the flag,
a-projections of width H, MLA sizes that do not fit the target) stops with file / field / found /
expected / fix; the static checks report the flags with the engine versions that read them."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config, speculators_config
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.model.config import MLAConfig
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork, eagle3_network
from eaglelab.engine.model.moe import kimi_like_config
from tests.conftest import random_model, tiny_config

MLA_TARGET = kimi_like_config("cpu", num_hidden_layers=4, vocab_size=160, hidden_size=64, intermediate_size=96,
                              n_routed_experts=8, moe_intermediate_size=32, num_experts_per_tok=2)
MLA = MLAConfig(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=48)
LLAMA_TARGET = tiny_config(num_hidden_layers=6)


@pytest.fixture(scope="module")
def mla_target():
    return random_model(MLA_TARGET, seed=3)


@pytest.fixture(scope="module")
def llama_target():
    return random_model(LLAMA_TARGET, seed=4)


def net_for(target, *, mla=None, **flags):
    c = target.config
    cfg = Eagle3Config(hidden_size=c.hidden_size, target_hidden_size=c.hidden_size, num_aux=3, num_heads=4,
                       num_kv_heads=1 if mla else 2, head_dim=mla.cache_dim if mla else 16, intermediate_size=96,
                       vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size, rms_norm_eps=1e-6, mla=mla, **flags)
    net = eagle3_network(cfg, target.embed_tokens)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    net.reset_buffers()
    return net.eval()


def export(net, path, *, fmt="sglang", ids=(0, 1, 2), edit=None, drop=()):
    c = net.config
    cfg = sglang_config(hidden_size=c.hidden_size, vocab_size=c.vocab_size, draft_vocab_size=c.draft_vocab_size,
                        aux_layer_ids=list(ids), num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                        intermediate_size=c.intermediate_size, target_hidden_size=c.target_hidden_size,
                        rms_norm_eps=c.rms_norm_eps, fc_norm=c.fc_norm, norm_output=c.norm_output, mla=c.mla)
    if c.mla is None:
        cfg["head_dim"] = c.head_dim
    if fmt == "speculators":
        cfg = speculators_config(cfg, aux_layer_ids=[i + 1 for i in ids])
    cfg.update(edit or {})
    tensors = {k: v.detach().clone() for k, v in net.state_dict().items() if k not in drop}
    return save_draft_checkpoint(path, cfg, tensors)


def same_logits(a, b, target):
    tokens = torch.randint(0, target.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))
    aux = torch.randn(1, 6, 3 * target.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return torch.allclose(a(tokens, a.fuse(aux), torch.arange(6)[None])[1],
                              b(tokens, b.fuse(aux), torch.arange(6)[None])[1], atol=1e-5)


# ---- round trips ----------------------------------------------------------------------------------------


def test_mla_drafter_exports_in_the_kimi_layout_and_loads_back(mla_target, tmp_path):
    net = net_for(mla_target, mla=MLA, fc_norm=True, norm_output=True)
    path = export(net, tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["fc_norm"] is True and cfg["norm_output"] is True
    assert (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (48, 32, 8)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"layers.0.self_attn.q_a_proj.weight", "layers.0.self_attn.kv_a_proj_with_mqa.weight", "fc_norm.2.weight"} <= names
    assert not any(n.startswith("midlayer.") for n in names)
    loaded, taps, _ = load_eagle3(path, mla_target, dtype=torch.float32)
    assert isinstance(loaded, Eagle3MLANetwork) and taps == (1, 2, 3)
    assert loaded.config.mla == MLA and loaded.config.fc_norm and loaded.config.norm_output
    assert same_logits(loaded, net, mla_target)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_eagle31_llama_drafter_round_trips_in_each_format(llama_target, tmp_path, fmt):
    net = net_for(llama_target, fc_norm=True, norm_output=True)
    path = export(net, tmp_path / fmt, fmt=fmt)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True  # top level in both formats
    loaded, _, _ = load_eagle3(path, llama_target, dtype=torch.float32)
    assert type(loaded) is Eagle3Network and loaded.config.fc_norm and loaded.config.norm_output
    assert same_logits(loaded, net, llama_target)


def test_legacy_use_aux_norm_turns_fc_norm_on(llama_target, tmp_path):
    net = net_for(llama_target, fc_norm=True)
    path = export(net, tmp_path / "d", edit={"fc_norm": None, "use_aux_norm": True})
    ck = read_draft_checkpoint(path)
    assert ck.layout.fc_norm_field == "use_aux_norm"
    codes = {f.code for f in ck.validate(llama_target.config)}
    assert {"eagle31_legacy", "eagle31_engines"} <= codes
    loaded, _, _ = load_eagle3(path, llama_target, dtype=torch.float32)
    assert loaded.config.fc_norm and same_logits(loaded, net, llama_target)


def test_a_plain_eagle3_checkpoint_reports_no_eagle31_caveat(llama_target, tmp_path):
    ck = read_draft_checkpoint(export(net_for(llama_target), tmp_path / "d"))
    findings = ck.validate(llama_target.config)
    assert not [f for f in findings if f.code.startswith("eagle31")]
    assert any(f.code == "layout" and "EAGLE-3" in f.message and "Llama" in f.message for f in findings)


# ---- what the static checks say ----------------------------------------------------------------------------


def test_static_check_names_the_flags_and_engine_versions(mla_target, tmp_path):
    ck = read_draft_checkpoint(export(net_for(mla_target, mla=MLA, fc_norm=True, norm_output=True), tmp_path / "d"))
    by_code = {f.code: f for f in ck.validate(mla_target.config)}
    assert "MLA" in by_code["layout"].message and "fc_norm" in by_code["layout"].message
    caveat = by_code["eagle31_engines"]
    assert caveat.severity == "warning"
    for pr in ("#26506", "#42764", "#43482"):  # SGLang's MLA 3.1, vLLM's 3.1, vLLM's deepseek fc_norm fix
        assert pr in caveat.message
    assert not [f for f in by_code.values() if f.severity == "error"]


def test_flags_inside_eagle_config_are_reported_as_unread(llama_target, tmp_path):
    net = net_for(llama_target)
    path = export(net, tmp_path / "d", edit={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                                                              "norm_output": True}})
    ck = read_draft_checkpoint(path)
    assert not ck.layout.norm_output
    misplaced = [f for f in ck.validate(llama_target.config) if f.code == "eagle31_misplaced"]
    assert [f.field for f in misplaced] == ["eagle_config.norm_output"]


# ---- bad input: exit 2 with file, field, found, expected, fix ----------------------------------------------


def test_fc_norm_without_its_weights(llama_target, tmp_path):
    net = net_for(llama_target, fc_norm=True)
    path = export(net, tmp_path / "d", drop=("fc_norm.1.weight",))
    with pytest.raises(CheckpointError) as e:
        load_eagle3(path, llama_target)
    err = e.value
    assert err.field == "fc_norm.1.weight" and err.file.endswith("model.safetensors")
    assert err.expected == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"] and err.found and err.hint


def test_fc_norm_weights_without_the_flag(llama_target, tmp_path):
    path = export(net_for(llama_target, fc_norm=True), tmp_path / "d", edit={"fc_norm": False})
    with pytest.raises(ConfigError) as e:
        load_eagle3(path, llama_target)
    err = e.value
    assert err.field == "fc_norm" and err.file.endswith("config.json") and err.expected == "fc_norm: true"
    assert "vLLM refuses" in err.hint


def test_a_projection_of_width_h_is_named(mla_target, tmp_path):
    net = net_for(mla_target, mla=MLA)
    path = export(net, tmp_path / "d")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["layers.0.self_attn.q_a_proj.weight"] = torch.randn(48, 64)  # [Q, H]: a plain MLA layer's
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        load_eagle3(path, mla_target)
    err = e.value
    assert err.field == "midlayer.self_attn.q_a_proj.weight" and err.file.endswith("model.safetensors")
    assert (err.found, err.expected) == ([48, 64], [48, 128]) and "2H" in str(err) and err.hint


def test_mla_sizes_that_do_not_fit_the_target(mla_target, tmp_path):
    other = MLAConfig(kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=48)
    path = export(net_for(mla_target, mla=other), tmp_path / "d")
    with pytest.raises(ConfigError) as e:
        load_eagle3(path, mla_target)
    err = e.value
    assert err.field == "kv_lora_rank" and err.file.endswith("config.json")
    assert "24" in str(err.found) and "32" in str(err.expected) and err.hint


def test_mla_drafter_on_a_target_without_mla(mla_target, llama_target, tmp_path):
    path = export(net_for(mla_target, mla=MLA), tmp_path / "d")
    with pytest.raises(ConfigError) as e:
        load_eagle3(path, llama_target)
    assert e.value.field == "architectures" and "latent" in str(e.value)


def test_mla_config_missing_a_size(mla_target, tmp_path):
    path = export(net_for(mla_target, mla=MLA), tmp_path / "d", edit={"kv_lora_rank": None})
    with pytest.raises(ConfigError) as e:
        read_draft_checkpoint(path)
    assert e.value.field == "kv_lora_rank" and e.value.hint


def test_unsupported_norm_before_fc_is_refused(llama_target, tmp_path):
    path = export(net_for(llama_target), tmp_path / "d", edit={"norm_before_fc": True})
    with pytest.raises(ConfigError) as e:
        load_eagle3(path, llama_target)
    assert e.value.field == "norm_before_fc" and e.value.found is True


def test_check_wiring_static_reports_the_flags(llama_target, tmp_path):
    """check-wiring's static mode prints validate()'s findings: the layout and the EAGLE-3.1 caveat."""
    from probes.wiring import check_wiring

    path = export(net_for(llama_target, norm_output=True), tmp_path / "d")
    report = check_wiring(path, target_config=llama_target.config)
    codes = {f.code for f in report.findings}
    assert {"layout", "eagle31_engines"} <= codes and report.verdict == "inconclusive"
    caveat = next(f for f in report.findings if f.code == "eagle31_engines")
    assert "#24663" in caveat.message and "norm_output" in caveat.message
