"""``eaglelab train --online --layout mla`` on an MLA + MoE target (DeepseekV3ForCausalLM as transformers
saves it): the target's states come from its own forward per batch, the TTT step runs the drafter's MLA,
and the written ``Eagle3DeepseekV2ForCausalLM`` drafter loads and speculates losslessly (chain and tree)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

HF = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
          n_group=2, topk_group=1, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4, vocab_size=97,
          q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, first_k_dense_replace=1,
          max_position_embeddings=1024, initializer_range=0.2, routed_scaling_factor=2.5, eos_token_id=2,
          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32,
                        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707, "rope_theta": 10000.0})


def test_online_training_of_an_mla_drafter_on_an_mla_moe_target(tmp_path):
    from eaglelab.cli import main
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork
    from tests.conftest import add_word_tokenizer

    torch.manual_seed(0)
    hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**HF)).eval()
    with torch.no_grad():  # a non-zero correction bias: the routing choice is exercised
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.1)
    hf.save_pretrained(tmp_path / "target")
    add_word_tokenizer(tmp_path / "target", HF["vocab_size"])
    assert main(["prompts", "--out", str(tmp_path / "p"), "--count", "12"]) == 0
    assert main(["distill", "--prompts", str(tmp_path / "p"), "--out", str(tmp_path / "d"), "--model",
                 str(tmp_path / "target"), "--max-new-tokens", "8", "--batch-size", "6", "--device", "cpu",
                 "--max-prompt-tokens", "200"]) == 0
    out = tmp_path / "drafter"
    assert main(["train", "--online", "--layout", "mla", "--data", str(tmp_path / "d"), "--out", str(out),
                 "--layer-ids", "0,1,2", "--epochs", "2", "--batch-size", "4", "--ttt-length", "3",
                 "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0",
                 "--log-every", "1"]) == 0
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert (raw["kv_lora_rank"], raw["qk_rope_head_dim"], raw["q_lora_rank"]) == (16, 4, 24)
    card = json.loads((out / "eaglelab_training.json").read_text())
    assert card["online"] and card["steps"] >= 4 and card["final"]["loss"] > 0

    target = load_target(tmp_path / "target", with_tokenizer=False).model
    assert target.config.mla is not None and target.config.moe.num_experts == 8 and target.config.is_moe_layer(1)
    net, taps, _ = load_eagle3(out, target, dtype=torch.float32)
    assert isinstance(net, Eagle3MLANetwork) and taps == (1, 2, 3)
    fresh = [p for n, p in net.named_parameters() if "norm" not in n and p.dim() == 2]
    assert all(p.abs().max() > 0 for p in fresh)
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11]]
    plain = Engine(target, eos_token_ids=(2,)).generate(prompts, 16)
    for topk, steps, ndt in ((1, 3, 0), (2, 3, 5)):  # a chain, a tree
        spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt)
        got = Engine(target, eos_token_ids=(2,), drafter=Eagle3Drafter(net, spec, taps), spec=spec).generate(prompts, 16)
        assert got.tokens == plain.tokens and got.stop_reasons == plain.stop_reasons, (topk, steps)
