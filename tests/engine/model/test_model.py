"""The target model against HF transformers (the reference forward), the KV cache against full
recomputation, padded batches against rows alone, aux taps against ``output_hidden_states``.
"""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.formats.loader import load_target
from tests.conftest import random_model, save_hf_dir, tiny_config

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "llama": tiny_config(),
    "llama-tied": tiny_config(tie_word_embeddings=True),
    "llama3-rope": tiny_config(
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "qwen2": tiny_config(architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
    "qwen3": tiny_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32),
}


def _hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_logits_match_hf_to_1e5(variant, tmp_path):
    """Same weights, same tokens: our float32 logits equal HF's within 1e-5 at every position."""
    cfg = VARIANTS[variant]
    model = random_model(cfg, seed=1, std=0.1)
    if cfg["architectures"][0] == "Qwen2ForCausalLM":  # give the q/k/v biases real values
        with torch.no_grad():
            for layer in model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    path = save_hf_dir(model, cfg, tmp_path / variant)
    ours = load_target(path, with_tokenizer=False).model
    hf = _hf_model(path)
    ids = torch.randint(0, cfg["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        hidden, _ = ours(ids, torch.arange(40).expand(2, 40))
        got = ours.logits(hidden)
    assert (got - ref).abs().max().item() < 1e-5


def test_aux_taps_equal_hf_hidden_states(tmp_path):
    """taps=(i,) returns HF output_hidden_states[i] for every i, the last one after the final norm."""
    cfg = tiny_config()
    model = random_model(cfg, seed=2, std=0.1)
    hf = _hf_model(save_hf_dir(model, cfg, tmp_path / "m"))
    ids = torch.randint(0, cfg["vocab_size"], (1, 17), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True).hidden_states
    got = model.all_hidden_states(ids)
    assert len(got) == len(ref) == cfg["num_hidden_layers"] + 1
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), f"hs[{i}]: {(a - b).abs().max().item():.2e}"
    taps = model.taps(ids, (3, 1, 2))  # any order, concatenated in that order
    assert torch.allclose(taps, torch.cat([ref[3], ref[1], ref[2]], dim=-1), atol=1e-5)


def test_kv_cache_decode_equals_full_recomputation():
    """Decoding token by token through the static cache gives the logits of one full forward."""
    cfg = tiny_config()
    model = random_model(cfg, seed=4, std=0.1)
    T = 24
    ids = torch.randint(0, cfg["vocab_size"], (1, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model.logits(model(ids, torch.arange(T)[None])[0])[0]  # [T, V]
        cache = KVCache(cfg["num_hidden_layers"], 1, 2, 32, 16, dtype=torch.float32, device="cpu")
        steps = []
        for t in range(T):
            slot = torch.tensor([[t]])
            h, _ = model(ids[:, t: t + 1], slot, cache, slot, prefix_mask(slot, 32))
            steps.append(model.logits(h)[0, 0])
    assert torch.allclose(torch.stack(steps), full, atol=1e-5, rtol=1e-5)


def test_padded_batch_equals_rows_alone():
    """Prompts of different lengths in one batch generate exactly what each does alone."""
    model = random_model(tiny_config(), seed=6)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    engine = Engine(model)
    together = engine.generate(prompts, 12).tokens
    alone = [engine.generate([p], 12).tokens[0] for p in prompts]
    assert together == alone
    assert len({tuple(t) for t in together}) == 3  # the rows really differ


def test_eos_ends_a_row_at_the_eos_token():
    model = random_model(tiny_config(), seed=7)
    prompt = [3, 4, 5]
    free = Engine(model).generate([prompt], 10).tokens[0]
    eos = free[4]
    out = Engine(model, eos_token_ids=(eos,)).generate([prompt, prompt], 10)
    first = free.index(eos)
    assert out.tokens[0] == free[: first + 1]
    assert out.stop_reasons == ["eos", "eos"]


def test_sampling_is_reproducible_with_a_generator():
    from eaglelab.engine.runtime.sampling import SamplingParams

    model = random_model(tiny_config(), seed=8)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return Engine(model).generate([[1, 2, 3]], 16, params, g).tokens

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_sharded_checkpoint_with_index_loads_the_same(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    cfg = tiny_config()
    model = random_model(cfg, seed=9)
    path = save_hf_dir(model, cfg, tmp_path / "one")
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(sharded / fname))
        weight_map.update({n: fname for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (sharded / "config.json").write_text(json.dumps(cfg))
    a = load_target(path, with_tokenizer=False).model
    b = load_target(sharded, with_tokenizer=False).model
    for (n1, p1), (n2, p2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
