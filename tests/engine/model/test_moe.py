"""The DeepSeek-V3 style MoE block against a slow per-token reference and HF transformers' DeepseekV3MoE."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.formats.loader import load_random
from eaglelab.engine.model.weights import copy_sharded
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.tp_layers import DenseMLP
from eaglelab.engine.model import moe as moe_module
from eaglelab.engine.model.moe import MoEBlock, kimi_like_config


def tiny_cfg(**over) -> ModelConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                n_routed_experts=8, moe_intermediate_size=16, num_experts_per_tok=3, num_hidden_layers=3,
                vocab_size=97, n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1)
    base.update(over)
    return ModelConfig.from_dict(kimi_like_config("cpu", **base))


def random_block(cfg: ModelConfig, seed: int = 0) -> MoEBlock:
    torch.manual_seed(seed)
    block = MoEBlock(cfg, layer=1, tp=None)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.normal_(0, 0.3 if "bias" not in name else 0.2)
    return block


@torch.no_grad()
def reference_moe(block: MoEBlock, x: torch.Tensor) -> torch.Tensor:
    """The DeepSeek-V3 recipe, one token at a time, in float64."""
    m = block.gate
    E = m.weight.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for n, tok in enumerate(x.double().reshape(-1, x.shape[-1])):
        logits = m.weight.double() @ tok
        scores = logits.sigmoid() if m.scoring == "sigmoid" else logits.softmax(-1)
        choice = scores + (m.e_score_correction_bias.double() if m.e_score_correction_bias is not None else 0)
        per = E // m.num_groups
        groups = [sorted(choice[g * per:(g + 1) * per].tolist(), reverse=True) for g in range(m.num_groups)]
        gscore = [sum(g[:2]) if m.scoring == "sigmoid" else g[0] for g in groups]
        kept = sorted(range(m.num_groups), key=lambda g: -gscore[g])[: m.topk_group]
        allowed = [e for e in range(E) if e // per in kept]
        chosen = sorted(allowed, key=lambda e: -float(choice[e]))[: m.top_k]
        w = torch.stack([scores[e] for e in chosen])
        if m.norm_topk_prob:
            w = w / w.sum()
        w = w * m.scale
        y = torch.zeros(x.shape[-1], dtype=torch.float64)
        ex = block.experts
        for wk, e in zip(w, chosen):
            h = torch.nn.functional.silu(ex.gate_proj[e].double() @ tok) * (ex.up_proj[e].double() @ tok)
            y += wk * (ex.down_proj[e].double() @ h)
        sh = block.shared_experts
        h = torch.nn.functional.silu(sh.gate_proj.weight.double() @ tok) * (sh.up_proj.weight.double() @ tok)
        y += sh.down_proj.weight.double() @ h
        out.view(-1, x.shape[-1])[n] = y
    return out


@pytest.mark.parametrize("gather_max", [10_000, 0, -1], ids=["gathered", "sorted", "dense"])
@pytest.mark.parametrize("over", [
    {},  # sigmoid, bias, 4 groups keep 2, normalised
    {"n_group": 1, "topk_group": 1, "norm_topk_prob": False},
    {"scoring_func": "softmax", "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.0},
], ids=["sigmoid-grouped", "sigmoid-ungrouped-unnormalised", "softmax-grouped"])
def test_moe_block_matches_per_token_reference(over, gather_max, monkeypatch):
    """Every expert path, batch 3 x 5 tokens, equals the slow per-token recipe to 1e-5 (-1: the
    dense path a captured or compiled forward with many pairs takes)."""
    cfg = tiny_cfg(**over)
    block = random_block(cfg)
    block.experts.gather_max = max(gather_max, 0)
    if gather_max < 0:
        monkeypatch.setattr(moe_module, "capturing_or_compiling", lambda: True)
    x = torch.randn(3, 5, cfg.hidden_size)
    with torch.no_grad():
        got = block(x)
    want = reference_moe(block, x)
    assert got.shape == (3, 5, cfg.hidden_size)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_correction_bias_changes_choice_not_weights():
    """A large bias on expert 0 forces it into every token's choice, with its unbiased score as weight."""
    cfg = tiny_cfg(n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0)
    block = random_block(cfg)
    x = torch.randn(6, cfg.hidden_size)
    with torch.no_grad():
        block.gate.e_score_correction_bias.zero_()
        block.gate.e_score_correction_bias[0] = 100.0
        w, idx = block.gate(x)
    assert (idx == 0).any(dim=1).all()
    expected = torch.sigmoid(x @ block.gate.weight.T)[:, 0]
    got = w[idx == 0]
    torch.testing.assert_close(got, expected)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_group=st.sampled_from([1, 2, 4]), tokens=st.integers(1, 6))
def test_router_stays_inside_kept_groups(seed, n_group, tokens):
    """Chosen experts are distinct, all from the topk_group best groups; normalised weights sum to the scale."""
    cfg = tiny_cfg(n_group=n_group, topk_group=min(2, n_group) if n_group > 1 else 1)
    block = random_block(cfg, seed)
    x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        w, idx = block.gate(x)
    assert all(len(set(r)) == cfg.moe.top_k for r in idx.tolist())
    groups_used = {tuple(sorted({e // (8 // n_group) for e in r})) for r in idx.tolist()}
    assert all(len(g) <= block.gate.topk_group for g in groups_used)
    torch.testing.assert_close(w.sum(-1), torch.full((tokens,), cfg.moe.routed_scaling_factor))


def test_router_weights_stay_float32_in_bf16_model():
    """Casting the block to bfloat16 keeps the router in float32 (a bf16 bias would reorder experts)."""
    block = random_block(tiny_cfg()).to(torch.bfloat16)
    assert block.gate.weight.dtype == torch.float32
    assert block.gate.e_score_correction_bias.dtype == torch.float32
    assert block.experts.gate_proj.dtype == torch.bfloat16
    y = block(torch.randn(2, 3, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16


def test_routing_stays_float32_under_bf16_autocast():
    """Training under bf16 autocast routes exactly as float32 inference does (autocast would run the router's
    linear in bf16: other combine weights, sometimes other experts)."""
    block = random_block(tiny_cfg(), seed=5)
    x = torch.randn(64, 32)
    w, idx = block.gate(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w_auto, idx_auto = block.gate(x)
    assert w_auto.dtype == torch.float32 and torch.equal(idx_auto, idx) and torch.equal(w_auto, w)


def test_matches_hf_transformers_deepseek_v3_moe():
    """Same weights in HF's DeepseekV3MoE (experts stacked as gate_up_proj) give the same output."""
    hf_mod = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    from transformers import DeepseekV3Config

    cfg = tiny_cfg()
    block = random_block(cfg, seed=3)
    hc = DeepseekV3Config(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, n_shared_experts=1, norm_topk_prob=True,
        num_attention_heads=4, num_hidden_layers=2, vocab_size=97,
    )
    hf = hf_mod.DeepseekV3MoE(hc).eval()
    ex = block.experts
    with torch.no_grad():
        hf.gate.weight.copy_(block.gate.weight)
        hf.gate.e_score_correction_bias.copy_(block.gate.e_score_correction_bias)
        hf.experts.gate_up_proj.copy_(torch.cat([ex.gate_proj, ex.up_proj], dim=1))
        hf.experts.down_proj.copy_(ex.down_proj)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(hf.shared_experts, n).weight.copy_(getattr(block.shared_experts, n).weight)
        x = torch.randn(2, 7, 32)
        torch.testing.assert_close(block(x), hf(x), rtol=1e-5, atol=1e-5)


def test_kimi_like_config_shapes():
    """61 layers, layer 0 dense, the rest MoE with Kimi-K2's routing; the cpu width is small."""
    for width in ("gpu", "cpu"):
        cfg = ModelConfig.from_dict(kimi_like_config(width))
        assert cfg.num_layers == 61 and cfg.family == "deepseek_v3"
        assert not cfg.is_moe_layer(0) and all(cfg.is_moe_layer(i) for i in range(1, 61))
        assert (cfg.moe.top_k, cfg.moe.scoring, cfg.moe.num_shared_experts) == ((8 if width == "gpu" else 4), "sigmoid", 1)
    gpu = ModelConfig.from_dict(kimi_like_config("gpu"))
    assert gpu.hidden_size == 7168 and gpu.vocab_size == 163840  # Kimi-K2's all-reduce and head sizes
    assert ModelConfig.from_dict(kimi_like_config("cpu", num_hidden_layers=4)).num_layers == 4
    with pytest.raises(ValueError):
        kimi_like_config("tpu")


def test_loader_stacks_per_expert_checkpoint_tensors():
    """HF per-expert names (experts.E.gate_proj.weight) load into the stacked parameters, in order."""
    cfg = tiny_cfg()
    src = Transformer(cfg)
    load_random(src, seed=5)
    state = {}
    for name, p in src.named_parameters():
        if ".experts." in name and "shared" not in name:
            for e in range(p.shape[0]):
                state[name.replace("experts.", f"experts.{e}.") + ".weight"] = p[e].clone()
        else:
            state[name] = p.detach().clone()
    dst = Transformer(cfg)
    copy_sharded(dst, lambda n: (state[n], n) if n in state else None, "test")
    for (n, a), (_, b) in zip(src.named_parameters(), dst.named_parameters()):
        assert torch.equal(a, b), n
    assert isinstance(dst.layers[0].mlp, DenseMLP) and isinstance(dst.layers[1].mlp, MoEBlock)
    del state["layers.2.mlp.experts.5.up_proj.weight"]
    with pytest.raises(CheckpointError, match="missing tensor") as err:
        copy_sharded(Transformer(cfg), lambda n: (state[n], n) if n in state else None, "test")
    assert "layers.2.mlp.experts.5.up_proj.weight" in str(err.value.field)


def test_saved_random_checkpoint_loads_as_load_random(tmp_path):
    """save_random_checkpoint writes HF names (per-expert) that load_target reads back to load_random's weights."""
    from eaglelab.engine.formats.loader import load_target, save_random_checkpoint

    d = kimi_like_config("cpu", hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, n_routed_experts=4, moe_intermediate_size=16, num_experts_per_tok=2,
                         num_hidden_layers=2, vocab_size=50)
    save_random_checkpoint(d, tmp_path, seed=4)
    loaded = load_target(tmp_path, with_tokenizer=False).model
    direct = Transformer(ModelConfig.from_dict(d))
    load_random(direct, seed=4)
    for (n, a), (_, b) in zip(loaded.named_parameters(), direct.named_parameters()):
        assert torch.equal(a, b), n


def test_many_pairs_compile_whole_without_a_host_sync():
    """A verify-sized forward (more pairs than gather_max) compiles with fullgraph=True (the sorted path's
    host read would break the graph) and gives the eager (sorted) result."""
    cfg = tiny_cfg()
    block = random_block(cfg)
    block.experts.gather_max = 0
    x = torch.randn(2, 6, cfg.hidden_size)
    with torch.no_grad():
        want = block(x)
        got = torch.compile(block, fullgraph=True, dynamic=False)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
