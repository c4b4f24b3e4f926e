"""Warm start of the MLA-layout drafter (``eaglelab train --init-from`` an ``Eagle3DeepseekV2ForCausalLM``):
the run keeps the drafter's own layout, MLA sizes, heads, rope and taps, copies every tensor, and continues;
a drafter of the other layout, or MLA sizes that do not fit the target's cache row, exit 2 naming the
file, the field, what was found and expected, and the fix."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from eaglelab.engine.formats.specforge_data import VocabMapping
from eaglelab.engine.model.config import MLAConfig
from eaglelab.engine.model.eagle3_mla import eagle3_network
from eaglelab.engine.training.train import TargetHead, drafter_config, new_drafter, save_drafter
from eaglelab.engine.training.warm_start import init_config, init_layout, warm_start
from eaglelab.engine.training.ttt import ttt_hidden
from tests.conftest import capture_tiny, draw_drafter_weights, random_model, tiny_config
from tests.engine.model.test_eagle3_mla import TCFG, V, YARN, mla_drafter

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = [0, 1, 2]  # SGLang ids of the capture below (--layer-ids 0,1,2)
DENSE = {**TCFG, "first_k_dense_replace": TCFG["num_hidden_layers"]}  # an MLA target save_hf_dir writes
# The init's own attention: the target's cache row (kv_lora_rank 32 + rope 8), the rest its own.
OWN = MLAConfig(kv_lora_rank=TCFG["kv_lora_rank"], qk_nope_head_dim=12, qk_rope_head_dim=TCFG["qk_rope_head_dim"],
                v_head_dim=20, q_lora_rank=24)


def own_drafter(target, *, mla: MLAConfig = OWN, heads: int = 2, seed: int = 11):
    """A trained-looking MLA drafter of other heads, ranks, rope theta and YaRN than the target's."""
    cfg = replace(mla_drafter(target.embed_tokens, mla=mla).config, num_heads=heads, rope_theta=10000.0,
                  rope_scaling=YARN)
    return draw_drafter_weights(eagle3_network(cfg, target.embed_tokens), torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def target():
    return random_model(DENSE, seed=3)


@pytest.fixture(scope="module")
def captured(tmp_path_factory, target):
    """A saved target with a tokenizer and 8 captured samples (taps at SGLang ids 0, 1, 2)."""
    root = tmp_path_factory.mktemp("mla-warm")
    capture_tiny(target, DENSE, root, V)
    return root


def train_args(root, out, *extra):
    return ["train", "--data", str(root / "data"), "--epochs", "1", "--batch-size", "4", "--ttt-length", "2",
            "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0",
            "--out", str(out), *extra]


def test_warm_start_keeps_the_mla_drafters_own_sizes_and_copies_every_tensor(tmp_path, target):
    old = own_drafter(target)
    save_drafter(old, tmp_path / "old", target=target.config, sglang_layer_ids=IDS, dtype=torch.float32)
    ck = read_draft_checkpoint(tmp_path / "old")
    assert init_layout(ck, target.config, None) == init_layout(ck, target.config, "mla") == "mla"
    cfg = init_config(drafter_config(target.config, 3, old.config.draft_vocab_size, layout="mla"), ck)
    assert (cfg.mla, cfg.num_heads, cfg.head_dim) == (OWN, 2, OWN.cache_dim)  # the init's, not the target's
    assert (cfg.rope_theta, cfg.rope_scaling) == (10000.0, YARN)
    head = TargetHead.from_model(target)
    net = new_drafter(cfg, head, VocabMapping(old.d2t.clone(), old.t2d.clone()), seed=5)
    ws = warm_start(net, tmp_path / "old", IDS, head.lm_head_weight)
    assert ws.head_rows_copied == old.config.draft_vocab_size and ws.head_rows_new == 0
    old_state = old.state_dict()
    for name, p in net.state_dict().items():
        assert torch.equal(p, old_state[name]), name
    # the same function: one cached-free forward of both on the same features
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        aux = target.taps(ids, (1, 2, 3))
        a, b = (list(ttt_hidden(n.eval(), ids, aux, 2)) for n in (old, net))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and a[0].abs().max() > 0.1


def test_cli_continues_training_an_mla_drafter_in_its_own_layout(tmp_path, target, captured, capsys):
    from eaglelab.cli import main
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork

    old = own_drafter(target)
    save_drafter(old, tmp_path / "old", target=target.config, sglang_layer_ids=IDS, dtype=torch.float32)
    assert main(train_args(captured, tmp_path / "new", "--init-from", str(tmp_path / "old"))) == 0
    printed = capsys.readouterr()
    assert "warm start from" in printed.out + printed.err
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    assert raw["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert (raw["q_lora_rank"], raw["qk_nope_head_dim"], raw["v_head_dim"], raw["num_attention_heads"]) == (24, 12, 20, 2)
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == IDS
    card = json.loads((tmp_path / "new" / "eaglelab_training.json").read_text())
    assert card["init_from"]["tensors"] == len([n for n, _ in old.named_parameters() if n != "lm_head.weight"])
    net, taps, _ = load_eagle3(tmp_path / "new", target, dtype=torch.float32)
    assert isinstance(net, Eagle3MLANetwork) and taps == (1, 2, 3)
    moved = net.midlayer.self_attn.kv_a_proj_with_mqa.weight - old.midlayer.self_attn.kv_a_proj_with_mqa.weight
    assert 0 < moved.abs().max() < 0.1  # trained on from the init: moved, not replaced


@pytest.mark.parametrize("case", ["llama-into-mla", "mla-into-llama", "mla-dims"])
def test_cli_refuses_a_warm_start_of_another_layout_or_unfit_mla_dims(tmp_path, target, captured, capsys, case):
    from eaglelab.cli import main

    if case == "llama-into-mla":
        llama_cfg = drafter_config(target.config, 3, 32, layout="llama")
        vocab = VocabMapping(torch.zeros(32, dtype=torch.long), torch.arange(V) < 32)
        old = new_drafter(llama_cfg, TargetHead.from_model(target), vocab, seed=1)
        extra, field, found = ["--layout", "mla"], "architectures", "LlamaForCausalLMEagle3"
    elif case == "mla-into-llama":
        old, extra, field, found = own_drafter(target), ["--layout", "llama"], "architectures", "Eagle3DeepseekV2ForCausalLM"
    else:
        old = own_drafter(target, mla=replace(OWN, kv_lora_rank=24))
        extra, field, found = [], "kv_lora_rank", "kv_lora_rank 24"
    save_drafter(old, tmp_path / "old", target=target.config, sglang_layer_ids=IDS, dtype=torch.float32)
    capsys.readouterr()
    rc = main(train_args(captured, tmp_path / "new", "--init-from", str(tmp_path / "old"), *extra))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and str(tmp_path / "old" / "config.json") in err.replace("\n", "")
    assert field in err and found in err and ("expected" in err.lower()) and not (tmp_path / "new" / "config.json").exists()


def test_an_mla_drafter_on_a_target_without_mla_is_refused(tmp_path, target):
    llama_target = random_model(tiny_config(vocab_size=V), seed=0)
    save_drafter(own_drafter(target), tmp_path, target=target.config, sglang_layer_ids=IDS, dtype=torch.float32)
    with pytest.raises(EagleLabError, match="without multi-head latent attention") as e:
        init_layout(read_draft_checkpoint(tmp_path), llama_target.config, None)
    assert e.value.field == "architectures" and "no kv_lora_rank" in str(e.value)
