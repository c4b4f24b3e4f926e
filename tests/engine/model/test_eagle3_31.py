"""EAGLE-3.1's two flags in the Llama-layout drafter: ``fc_norm`` (an RMSNorm per aux state before fc) and
``norm_output`` (the next step reads the post-norm state). Each changes what the network computes, each
equals a from-scratch reference of the math (written here from SGLang's ``llama_eagle3.py``), and
speculation with each stays lossless on a tiny target."""

from __future__ import annotations

import math

import pytest
import torch

from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import draw_drafter_weights, random_model, tiny_config

CFG = tiny_config(num_hidden_layers=6)
TAPS = (2, 3, 4)
H, V, DV = 64, CFG["vocab_size"], 48


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


def drafter(target, *, fc_norm=False, norm_output=False, seed=5) -> Eagle3Network:
    """Random weights drawn in one order whatever the flags (fc_norm's own last), so two drafters that
    differ by a flag share every other weight."""
    cfg = Eagle3Config(hidden_size=H, target_hidden_size=H, num_aux=3, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=96, vocab_size=V, draft_vocab_size=DV, fc_norm=fc_norm, norm_output=norm_output)
    return draw_drafter_weights(Eagle3Network(cfg, target.embed_tokens), torch.Generator().manual_seed(seed),
                                last=lambda name: name.startswith("fc_norm"))


# ---- the reference: EAGLE-3 / 3.1 written out ----------------------------------------------------------


def rms(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta=10000.0):
    """Rotate-half rope of x [B, T, N, D] at positions pos [T]."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = (pos[:, None].double() * inv).float()  # [T, D/2]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def ref_fuse(w, aux, fc_norm):
    if fc_norm:
        aux = torch.cat([rms(c, w[f"fc_norm.{i}.weight"]) for i, c in enumerate(aux.chunk(3, dim=-1))], dim=-1)
    return aux @ w["fc.weight"].T


def ref_layer(w, emb, tokens, feats, norm_output):
    """One causal pass over T positions: (state fed to the next step, logits)."""
    B, T, _ = feats.shape
    p = "midlayer."
    x = torch.cat([rms(emb[tokens], w[p + "input_layernorm.weight"]), rms(feats, w[p + "hidden_norm.weight"])], -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, 4, 16)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, 2, 16)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, 2, 16)
    pos = torch.arange(T)
    q, k = rope(q, pos), rope(k, pos)
    k, v = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)  # 2 query heads per KV head
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(16)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    a = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, T, 64)
    h = feats + a @ w[p + "self_attn.o_proj.weight"].T
    n = rms(h, w[p + "post_attention_layernorm.weight"])
    gate, up = n @ w[p + "mlp.gate_proj.weight"].T, n @ w[p + "mlp.up_proj.weight"].T
    out = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    normed = rms(out, w["norm.weight"])
    return (normed if norm_output else out), normed @ w["lm_head.weight"].T


def two_steps(net, tokens, aux):
    """Step 1 from the target's features, step 2 from step 1's fed-back state (one position on)."""
    with torch.no_grad():
        pos = torch.arange(tokens.shape[1])[None]
        h1, l1 = net(tokens, net.fuse(aux), pos)
        h2, l2 = net(tokens[:, 1:], h1[:, :-1], pos[:, 1:] - 1)
    return h1, l1, h2, l2


def ref_two_steps(net, tokens, aux, fc_norm, norm_output):
    w = {k: v.detach() for k, v in net.state_dict().items()}
    emb = net.embed.weight.detach()
    h1, l1 = ref_layer(w, emb, tokens, ref_fuse(w, aux, fc_norm), norm_output)
    h2, l2 = ref_layer(w, emb, tokens[:, 1:], h1[:, :-1], norm_output)
    return h1, l1, h2, l2


@pytest.mark.parametrize("fc_norm,norm_output", [(False, False), (True, False), (False, True), (True, True)])
def test_network_equals_the_written_out_math(target, fc_norm, norm_output):
    net = drafter(target, fc_norm=fc_norm, norm_output=norm_output)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    aux = 3.0 * torch.randn(2, 9, 3 * H, generator=torch.Generator().manual_seed(2))  # far from unit RMS
    got, ref = two_steps(net, tokens, aux), ref_two_steps(net, tokens, aux, fc_norm, norm_output)
    assert ref[1].abs().max() > 1.0
    for name, a, b in zip(("h1", "logits1", "h2", "logits2"), got, ref):
        assert (a - b).abs().max().item() < 1e-4, name


def test_fc_norm_changes_the_features_and_every_logit(target):
    """Same weights, fc_norm on vs off: the fused features differ, so step-1 logits differ."""
    on, off = drafter(target, fc_norm=True), drafter(target)
    assert set(dict(on.named_parameters())) - set(dict(off.named_parameters())) == {f"fc_norm.{i}.weight" for i in range(3)}
    tokens = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(3))
    aux = 3.0 * torch.randn(1, 7, 3 * H, generator=torch.Generator().manual_seed(4))
    _, l_on, _, _ = two_steps(on, tokens, aux)
    _, l_off, _, _ = two_steps(off, tokens, aux)
    assert (l_on - l_off).abs().max() > 0.1


def test_norm_output_changes_only_what_is_fed_back(target):
    """norm_output leaves step-1 logits as they are and changes the state fed back, hence step 2."""
    on, off = drafter(target, norm_output=True), drafter(target)
    tokens = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(3))
    aux = torch.randn(1, 7, 3 * H, generator=torch.Generator().manual_seed(4))
    h_on, l_on, _, l2_on = two_steps(on, tokens, aux)
    h_off, l_off, _, l2_off = two_steps(off, tokens, aux)
    assert torch.allclose(l_on, l_off, atol=1e-5)
    assert torch.allclose(h_on, off.norm(h_off), atol=1e-5)  # the post-norm state, exactly
    assert (l2_on - l2_off).abs().max() > 0.1


@pytest.mark.parametrize("flags", [dict(fc_norm=True), dict(norm_output=True), dict(fc_norm=True, norm_output=True)])
@pytest.mark.parametrize("shape", [(1, 3, 0), (2, 3, 5)])  # (topk, steps, draft tokens): a chain, a tree
def test_speculation_with_eagle31_flags_is_lossless(target, flags, shape):
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt)
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10]]
    plain = Engine(target, eos_token_ids=(3,)).generate(prompts, 14)
    prop = Eagle3Drafter(drafter(target, **flags), spec, TAPS)
    out = Engine(target, eos_token_ids=(3,), drafter=prop, spec=spec).generate(prompts, 14)
    assert out.tokens == plain.tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fc_norm_on_a_stacked_view_equals_each_chunks_own_norm(target, dtype):
    """``fuse`` normalises the n aux states at once ([B, T, 3*64] viewed as [B, T, 3, 64], weights stacked
    [3, 64]); the result is bit-for-bit that of ``fc_norm.{i}`` applied to each 64-wide chunk and cat, in
    float32 and in bf16 (where the upcast and the cast back before the weight must happen alike), and the
    state-dict keys stay ``fc_norm.{i}.weight`` (SGLang / vLLM names)."""
    net = drafter(target, fc_norm=True).to(dtype)
    assert [k for k in net.state_dict() if k.startswith("fc_norm")] == [f"fc_norm.{i}.weight" for i in range(3)]
    assert all(not torch.equal(n.weight, torch.ones_like(n.weight)) for n in net.fc_norm)  # drawn, not ones
    aux = 3.0 * torch.randn(2, 9, 3 * H, generator=torch.Generator().manual_seed(6))
    chunks = aux.to(dtype).chunk(3, dim=-1)  # 3 x [2, 9, 64]
    per_chunk = torch.cat([norm(c) for norm, c in zip(net.fc_norm, chunks)], dim=-1)  # the per-module path
    with torch.no_grad():
        got, ref = net.fuse(aux), net.fc(per_chunk)
    assert got.dtype == dtype and got.shape == (2, 9, H)
    assert torch.equal(got, ref)
