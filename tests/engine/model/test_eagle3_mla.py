"""The MLA-layout EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``, SGLang ``kimi_k25_eagle3.py``).

Its forward is compared with a reference written here from SGLang's code in the non-absorbed form (the
network runs the target's absorbed MLA, so the two share no attention code): q = q_b(norm(q_a(x))),
kv = kv_b(norm(kv_a(x)[:R])) split per head into k_nope / v, the rope part k_pe from kv_a's tail shared by
every head, DeepSeek's interleaved rotary pairs. Then speculation with it on a tiny MLA + MoE
(kimi-like) target: lossless, chain and tree, and the drafter's logits while drafting equal one causal
pass (its latent-row cache and positions are right, not merely harmless).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.config import MLAConfig
from eaglelab.engine.model.eagle3 import Eagle3Config
from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork, eagle3_network
from eaglelab.engine.model.layers import prefix_mask, rope_attention_factor, rope_inv_freq, yarn_mscale
from eaglelab.engine.model.moe import kimi_like_config
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import draw_drafter_weights, random_model

TCFG = kimi_like_config("cpu", num_hidden_layers=4, vocab_size=160, hidden_size=64, intermediate_size=96,
                        n_routed_experts=8, moe_intermediate_size=32, num_experts_per_tok=2, eos_token_id=2)
TAPS = (1, 2, 3)  # HF indices of the 4-layer target
MLA = MLAConfig(kv_lora_rank=TCFG["kv_lora_rank"], qk_nope_head_dim=TCFG["qk_nope_head_dim"],
                qk_rope_head_dim=TCFG["qk_rope_head_dim"], v_head_dim=TCFG["v_head_dim"], q_lora_rank=TCFG["q_lora_rank"])
YARN = tuple(sorted({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}.items()))
H, V, DV = TCFG["hidden_size"], TCFG["vocab_size"], 64


@pytest.fixture(scope="module")
def target():
    return random_model(TCFG, seed=3)


def mla_drafter(embed, *, mla=MLA, rope_scaling=None, seed=7, **flags) -> Eagle3MLANetwork:
    cfg = Eagle3Config(hidden_size=H, target_hidden_size=H, num_aux=3, num_heads=4, num_kv_heads=1,
                       head_dim=mla.cache_dim, intermediate_size=96, vocab_size=V, draft_vocab_size=DV,
                       rms_norm_eps=1e-6, rope_theta=50000.0, rope_scaling=rope_scaling, mla=mla, **flags)
    net = eagle3_network(cfg, embed)
    assert isinstance(net, Eagle3MLANetwork)
    return draw_drafter_weights(net, torch.Generator().manual_seed(seed))


# ---- the reference, from SGLang's Eagle3MLADecoderLayer / DeepseekV2AttentionMLA ------------------------


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_pairs(x, pos, inv_freq, factor):
    """DeepSeek's rotary: dims (2i, 2i+1) turned by pos * inv_freq[i]; x [B, T, N, Dr], pos [T]."""
    ang = pos[:, None].float() * inv_freq  # [T, Dr/2]
    cos, sin = (ang.cos() * factor)[None, :, None], (ang.sin() * factor)[None, :, None]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)


def reference(net, tokens, feats):
    """Logits [B, T, V_draft] and the pre-norm output of one causal pass, non-absorbed MLA."""
    c, m = net.config, net.config.mla
    w = {k: v.detach() for k, v in net.state_dict().items()}
    p, a = "midlayer.", "midlayer.self_attn."
    B, T, _ = feats.shape
    NH, Dn, Dr, Dv, R = c.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    x = torch.cat([rms(net.embed.weight.detach()[tokens], w[p + "input_layernorm.weight"]),
                   rms(feats, w[p + "hidden_norm.weight"])], dim=-1)  # [B, T, 2H]
    if m.q_lora_rank is None:
        q = x @ w[a + "q_proj.weight"].T
    else:
        q = rms(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"]) @ w[a + "q_b_proj.weight"].T
    q_nope, q_pe = q.view(B, T, NH, Dn + Dr).split([Dn, Dr], dim=-1)
    latent, k_pe = (x @ w[a + "kv_a_proj_with_mqa.weight"].T).split([R, Dr], dim=-1)
    kv = (rms(latent, w[a + "kv_a_layernorm.weight"]) @ w[a + "kv_b_proj.weight"].T).view(B, T, NH, Dn + Dv)
    k_nope, v = kv.split([Dn, Dv], dim=-1)
    scaling = dict(c.rope_scaling) if c.rope_scaling else None
    inv, factor, pos = rope_inv_freq(Dr, c.rope_theta, scaling), rope_attention_factor(scaling), torch.arange(T)
    q_pe, k_pe = rope_pairs(q_pe, pos, inv, factor), rope_pairs(k_pe[:, :, None], pos, inv, factor)
    qh = torch.cat([q_nope, q_pe], dim=-1)
    kh = torch.cat([k_nope, k_pe.expand(B, T, NH, Dr)], dim=-1)
    scale = (Dn + Dr) ** -0.5 * (yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2 if scaling else 1.0)
    s = torch.einsum("bqhd,bkhd->bhqk", qh, kh) * scale
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, T, NH * Dv) @ w[a + "o_proj.weight"].T
    h = feats + attn  # the residual is the fc output (SGLang)
    n = rms(h, w[p + "post_attention_layernorm.weight"])
    out = h + (F.silu(n @ w[p + "mlp.gate_proj.weight"].T) * (n @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(out, w["norm.weight"]) @ w["lm_head.weight"].T, out


VARIANTS = {
    "plain-rope": dict(),
    "yarn": dict(rope_scaling=YARN),
    "no-q-lora": dict(mla=MLAConfig(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_equals_non_absorbed_reference(target, variant):
    net = mla_drafter(target.embed_tokens, **VARIANTS[variant])
    g = torch.Generator().manual_seed(1)
    tokens, feats = torch.randint(0, V, (2, 11), generator=g), torch.randn(2, 11, H, generator=g)
    positions = torch.arange(11).expand(2, 11)
    with torch.no_grad():
        hidden, logits = net(tokens, feats, positions)
        ref_logits, ref_out = reference(net, tokens, feats)
        # the drafter's own path: latent rows written to a cache, attention over it under a prefix mask
        cache = KVCache(1, 2, 1, 16, net.config.mla.cache_dim, dtype=torch.float32, device="cpu")
        cached = net.hidden(tokens, feats, positions, cache, positions, prefix_mask(positions, 16))
    assert ref_logits.abs().max() > 1.0
    assert (logits - ref_logits).abs().max().item() < 1e-4
    assert (hidden - ref_out).abs().max().item() < 1e-4
    assert (cached - hidden).abs().max().item() < 1e-5
    assert cache.k[0, :, 0, 11:].abs().max() == 0  # rows past the written slots untouched


def test_cache_holds_the_targets_row_layout(target):
    """One latent row of kv_lora_rank + qk_rope_head_dim per token: the target's MLA row."""
    net = mla_drafter(target.embed_tokens)
    assert (net.config.num_kv_heads, net.config.head_dim) == (1, target.config.mla.cache_dim)
    assert target.make_cache(1, 4, dtype=torch.float32, device="cpu").k.shape[-1] == net.config.head_dim


@pytest.mark.parametrize("flags", [{}, dict(fc_norm=True, norm_output=True)])  # EAGLE-3 and EAGLE-3.1
@pytest.mark.parametrize("shape", [(1, 3, 0), (2, 3, 5)])  # (topk, steps, draft tokens): a chain, a tree
def test_speculation_on_mla_moe_target_is_lossless(target, flags, shape):
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt)
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11]]
    plain = Engine(target, eos_token_ids=(2,)).generate(prompts, 12)
    prop = Eagle3Drafter(mla_drafter(target.embed_tokens, rope_scaling=YARN, **flags), spec, TAPS)
    out = Engine(target, eos_token_ids=(2,), drafter=prop, spec=spec).generate(prompts, 12)
    assert out.tokens == plain.tokens and out.stop_reasons == plain.stop_reasons


def test_drafting_state_equals_a_full_recompute(target):
    """The root logits of every cycle equal one causal pass of the network over (tokens, the target's
    features): the latent cache, positions and draft-extend bookkeeping are right."""
    net = mla_drafter(target.embed_tokens, rope_scaling=YARN, fc_norm=True)
    prop = Eagle3Drafter(net, SpecConfig("eagle3", num_steps=1, topk=1), TAPS)
    seen: list[torch.Tensor] = []
    original = prop._draft  # the draft phase, whether run alone or inside the one-graph cycle

    def spy(root, lengths, hidden, logits):
        seen.append(logits[0].clone())
        return original(root, lengths, hidden, logits)

    prop._draft = spy
    prompt = [5, 6, 7, 8, 9]
    out = Engine(target, drafter=prop, spec=prop.spec).generate([prompt], 8).tokens[0]
    seq = torch.tensor([prompt + out])
    with torch.no_grad():
        aux = target.taps(seq, TAPS)  # [1, T, 3H]
        _, full = net(seq[:, 1:], net.fuse(aux[:, :-1]), torch.arange(seq.shape[1] - 1)[None])
    assert len(seen) >= 3
    for i, root_logits in enumerate(seen):
        assert torch.allclose(root_logits, full[0, len(prompt) + i - 1], atol=1e-4), f"cycle {i}"
