"""Training the MLA-layout EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``): the TTT step runs the
network's own MLA attention against the keys of every step so far, so its outputs for k steps equal the
network's own multi-step cached forward (draft-extend, then one cached forward per draft step)."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.training.ttt import ttt_hidden
from tests.engine.training.ttt_reference import assert_ttt_is_network_chain
from tests.conftest import random_model
from tests.engine.model.test_eagle3_mla import TAPS, TCFG, V, VARIANTS, YARN, mla_drafter

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return random_model(TCFG, seed=3)


CASES = {
    "eagle3": dict(),
    "eagle3.1-yarn": dict(rope_scaling=YARN, fc_norm=True, norm_output=True),
    "no-q-lora": dict(mla=VARIANTS["no-q-lora"]["mla"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ttt_steps_equal_the_networks_cached_multi_step_forward(target, case):
    net = mla_drafter(target.embed_tokens, **CASES[case])
    _, _, outs = assert_ttt_is_network_chain(net, target, TAPS)
    assert outs[1].abs().max() > 0.1 and not torch.allclose(outs[1], outs[0], atol=1e-3)


def test_ttt_backward_reaches_every_mla_weight(target):
    net = mla_drafter(target.embed_tokens).train()
    ids = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        aux = target.taps(ids, TAPS)
    sum(o.square().mean() for o in ttt_hidden(net, ids, aux, 3)).backward()
    attn = net.midlayer.self_attn
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name


def test_a_new_drafter_for_an_mla_target_is_mla_and_learns_a_fixed_batch(target):
    from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork
    from eaglelab.engine.training.draft_vocab import build_draft_vocab
    from eaglelab.engine.training.train import TargetHead, drafter_config, new_drafter
    from eaglelab.engine.training.ttt import TrainBatch, target_probs, ttt_forward

    cfg = drafter_config(target.config, len(TAPS), 64)
    assert cfg.mla == target.config.mla and (cfg.num_kv_heads, cfg.head_dim) == (1, cfg.mla.cache_dim)
    assert drafter_config(target.config, len(TAPS), 64, layout="llama").mla is None
    head = TargetHead.from_model(target)
    net = new_drafter(cfg, head, build_draft_vocab(torch.arange(V), 64).mapping, seed=0)
    assert isinstance(net, Eagle3MLANetwork)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        aux, hidden = target.taps(ids, TAPS), target.final_hidden(ids) if hasattr(target, "final_hidden") else None
    if hidden is None:
        hidden = torch.randn(2, 12, target.config.hidden_size, generator=torch.Generator().manual_seed(5))
    batch = TrainBatch(ids, torch.ones(2, 12), aux, hidden)
    rows = net.token_map()
    probs = target_probs(head.lm_head_weight[rows], head.norm(hidden) if hasattr(head, "norm") else hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        res = ttt_forward(net, batch, probs, 3)
        loss = sum(0.8 ** i * l for i, l in enumerate(res.step_loss))
        opt.zero_grad(), loss.backward(), opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_cli_trains_an_mla_drafter_saved_in_the_sglang_mla_layout(tmp_path, capsys):
    import json

    from eaglelab.cli import main
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork
    from tests.conftest import capture_tiny

    dense = {**TCFG, "first_k_dense_replace": TCFG["num_hidden_layers"]}  # an MLA target save_hf_dir writes
    model = random_model(dense, seed=3)
    data = capture_tiny(model, dense, tmp_path, V)
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--epochs", "2", "--batch-size", "4", "--ttt-length", "3",
                 "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0",
                 "--out", str(tmp_path / "new")]) == 0
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    assert raw["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert raw["kv_lora_rank"] == TCFG["kv_lora_rank"] and raw["q_lora_rank"] == TCFG["q_lora_rank"]
    names = set(read_draft_checkpoint(tmp_path / "new").tensors)
    assert "midlayer.self_attn.kv_a_proj_with_mqa.weight" in names  # read back in SGLang's spelling
    from safetensors import safe_open
    with safe_open(str(tmp_path / "new" / "model.safetensors"), "pt") as f:
        assert "layers.0.self_attn.kv_a_proj_with_mqa.weight" in set(f.keys())  # written as layers.0.*
    net, _, _ = load_eagle3(tmp_path / "new", model, dtype=torch.float32)
    assert isinstance(net, Eagle3MLANetwork)
    # --layout llama on the same target still gives the Llama layout
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "4", "--ttt-length", "2",
                 "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0",
                 "--layout", "llama", "--out", str(tmp_path / "llama")]) == 0
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
