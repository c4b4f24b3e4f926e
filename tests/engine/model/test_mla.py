"""Multi-head latent attention (DeepSeek-V3 / Kimi-K2) against HF transformers' DeepseekV3ForCausalLM:
prefill, decode over the compressed cache, tree verify, TP=2 on gloo; and speculation on an MLA target
emits plain greedy's tokens."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.moe import kimi_like_config
from tests.tp_harness import RankFailure, spawn_ranks
from eaglelab.engine.runtime.drafters import NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.tree import make_tree, tree_attention_mask

transformers = pytest.importorskip("transformers")

BASE = dict(
    hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
    n_group=2, topk_group=1, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3, vocab_size=97,
    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, first_k_dense_replace=1,
    max_position_embeddings=64, initializer_range=0.2, routed_scaling_factor=2.5,
)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.707, "rope_theta": 10000.0}
VARIANTS = {
    "yarn-qlora-interleaved": dict(rope_scaling=YARN),  # DeepSeek-V3's layout, mscale_all_dim != mscale
    "plain-rope-no-qlora": dict(q_lora_rank=None, rope_interleave=False, rope_scaling={"rope_type": "default", "rope_theta": 500.0}),
    "yarn-default-mscale": dict(rope_scaling={k: v for k, v in YARN.items() if not k.startswith("mscale")}),
}


def save_hf(tmp_path, variant: str = "yarn-qlora-interleaved", shard: str | None = None):
    """A random DeepseekV3ForCausalLM (transformers' own init, std 0.2) saved with save_pretrained."""
    cfg = transformers.DeepseekV3Config(**{**BASE, **VARIANTS[variant]})
    torch.manual_seed(0)
    hf = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():  # a non-zero correction bias, so the routing choice is exercised
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.1)
    path = tmp_path / variant
    hf.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return hf, path


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_logits_match_hf_to_1e5(variant, tmp_path):
    """2 x 24 tokens (96 token-expert pairs: the sorted MoE path): float32 logits within 1e-5 of HF's."""
    hf, path = save_hf(tmp_path, variant)
    ours = load_target(path, with_tokenizer=False).model
    assert ours.config.mla is not None and type(ours.layers[0].self_attn).__name__ == "MLAttention"
    x = ids(2, 24)
    with torch.no_grad():
        ref = hf(x).logits
        got = ours.logits(ours(x, torch.arange(24).expand(2, 24))[0])
    assert ref.abs().max() > 1.0  # not a comparison of near-zeros
    assert (got - ref).abs().max().item() < 1e-5


def test_hidden_states_match_hf(tmp_path):
    """Every HF output_hidden_states index, embedding and final norm included."""
    hf, path = save_hf(tmp_path)
    ours = load_target(path, with_tokenizer=False).model
    x = ids(1, 15, seed=1)
    with torch.no_grad():
        ref = hf(x, output_hidden_states=True).hidden_states
    got = ours.all_hidden_states(x)
    assert len(got) == len(ref) == 4
    for i, (a, b) in enumerate(zip(got, ref)):
        assert (a - b).abs().max().item() < 1e-5, f"hs[{i}]"


def test_decode_over_compressed_cache_matches_hf(tmp_path):
    """Prefill 10 tokens into the cache, then decode 8 one at a time: each step's logits equal HF's
    full-sequence logits at that position. The cache holds one [16 + 4] row per token and layer."""
    hf, path = save_hf(tmp_path)
    ours = load_target(path, with_tokenizer=False).model
    x = ids(2, 18, seed=2)
    cache = ours.make_cache(2, 32, dtype=torch.float32, device="cpu")
    assert cache.v is None and tuple(cache.k.shape) == (3, 2, 1, 32, 20)
    with torch.no_grad():
        ref = hf(x).logits  # [2, 18, V]
        pos = torch.arange(10).expand(2, 10)
        mask = pos[:, :, None] >= torch.arange(32)[None, None]  # [2, 10, 32]: causal over the cache
        got = [ours.logits(ours(x[:, :10], pos, cache, pos, mask)[0])]
        for t in range(10, 18):
            p = torch.full((2, 1), t)
            got.append(ours.logits(ours(x[:, t:t + 1], p, cache, p, torch.arange(32)[None, None] <= t)[0]))
    assert (torch.cat(got, dim=1) - ref).abs().max().item() < 1e-5


def test_tree_verify_matches_hf_per_path(tmp_path):
    """A 6-node tree verified in one forward over the cache: each node's logits equal HF's last logits
    over prefix + the node's root path.

    Worked example: parents [-1, 0, 0, 1, 1, 2] -> node 4's path is root(0) -> 1 -> 4, at positions
    P, P+1, P+2 and cache slots P, P+1, P+4.
    """
    hf, path = save_hf(tmp_path)
    ours = load_target(path, with_tokenizer=False).model
    P, S = 9, 24
    prefix = ids(1, P, seed=3)
    tree = make_tree(ids(1, 6, seed=4), torch.tensor([[-1, 0, 0, 1, 1, 2]]))
    cache = ours.make_cache(1, S, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        pos = torch.arange(P)[None]
        ours(prefix, pos, cache, pos, pos[:, :, None] >= torch.arange(S)[None, None])
        base = torch.tensor([P])
        mask = tree_attention_mask(base, tree, S)  # [1, 6, S]
        logits = ours.logits(ours(tree.tokens, tree.positions(base), cache, base[:, None] + torch.arange(6), mask)[0])
        for node in range(6):
            chain, n = [], node
            while n >= 0:
                chain.append(int(tree.tokens[0, n]))
                n = int(tree.parents[0, n])
            seq = torch.cat([prefix, torch.tensor([chain[::-1]])], dim=1)
            ref = hf(seq).logits[0, -1]
            assert (logits[0, node] - ref).abs().max().item() < 1e-5, node


def test_speculation_on_mla_target_emits_plain_greedy(tmp_path):
    """n-gram speculation (chain verify through the compressed cache, rollbacks) == plain greedy."""
    _, path = save_hf(tmp_path)
    target = load_target(path, with_tokenizer=False).model
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5], [40, 41, 42, 40, 41]]
    plain = Engine(target).generate(prompts, 12).tokens
    spec = SpecConfig("ngram", num_steps=3)
    assert Engine(target, drafter=NgramDrafter(spec), spec=spec).generate(prompts, 12).tokens == plain


def test_kimi_like_preset_uses_mla():
    """The kimi-like preset is Kimi-K2's MLA (kv rank 512 + rope 64 = a 576-wide cache row, YaRN x32)."""
    cfg = ModelConfig.from_dict(kimi_like_config("gpu"))
    assert cfg.mla is not None and cfg.mla.cache_dim == 576 and cfg.mla.q_lora_rank == 1536
    assert cfg.rope_scaling_dict["factor"] == 32.0 and cfg.rope_dim == 64
    small = Transformer(ModelConfig.from_dict(kimi_like_config("cpu", num_hidden_layers=2)))
    assert type(small.layers[0].self_attn).__name__ == "MLAttention"


def _tp_logits(tp, path, x):
    model = load_target(path, tp=tp, with_tokenizer=False).model
    with torch.no_grad():
        full = model.logits(model(x, torch.arange(x.shape[1]).expand_as(x))[0])
    plain = Engine(model).generate([[3, 4, 5, 3, 4, 5, 3]], 8).tokens
    spec = SpecConfig("ngram", num_steps=3)
    ngram = Engine(model, drafter=NgramDrafter(spec), spec=spec).generate([[3, 4, 5, 3, 4, 5, 3]], 8).tokens
    return full, model.layers[0].self_attn.local_heads, plain, ngram


def test_tp2_matches_hf(tmp_path):
    """TP=2 (gloo, 2 heads per rank, latent replicated): logits within 1e-5 of HF's on both ranks, and
    greedy tokens (plain and speculative) equal one process's."""
    hf, path = save_hf(tmp_path)
    x = ids(2, 12, seed=5)
    with torch.no_grad():
        ref = hf(x).logits
    single = load_target(path, with_tokenizer=False).model
    want = Engine(single).generate([[3, 4, 5, 3, 4, 5, 3]], 8).tokens
    for r in spawn_ranks(_tp_logits, 2, path, x):
        assert not isinstance(r, RankFailure), r
        full, local_heads, plain, ngram = r
        assert local_heads == 2
        assert (full - ref).abs().max().item() < 1e-5
        assert plain == want and ngram == want
