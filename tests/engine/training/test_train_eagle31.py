"""EAGLE-3.1 in training: the TTT step feeds back norm(out) under ``norm_output`` (as the network's own
multi-step forward does), ``save_drafter`` writes ``fc_norm`` / ``norm_output`` at the config's top
level, and ``eaglelab train --init-from`` a 3.1 drafter keeps both flags and the fc_norm weights."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import TargetHead, drafter_config, new_drafter, save_drafter
from eaglelab.engine.training.ttt import ttt_hidden
from tests.engine.training.ttt_reference import assert_ttt_is_network_chain
from tests.conftest import capture_tiny, random_model, tiny_config

VOCAB, DRAFT_VOCAB = 128, 64
CFG = tiny_config(vocab_size=VOCAB)
IDS, TAPS = [0, 1, 2], (1, 2, 3)

pytestmark = pytest.mark.usefixtures("one_thread")


def drafter31(model, *, fc_norm=True, norm_output=True, seed=1):
    """A random drafter with the EAGLE-3.1 flags; norms off 1 so that applying one shows."""
    vocab = build_draft_vocab(torch.arange(VOCAB), DRAFT_VOCAB)
    cfg = replace(drafter_config(model.config, 3, DRAFT_VOCAB), fc_norm=fc_norm, norm_output=norm_output)
    net = new_drafter(cfg, TargetHead.from_model(model), vocab.mapping, seed=seed, init_lm_head="random")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else 0.15 * torch.randn(p.shape, generator=g))
    return net.eval()


def test_ttt_feeds_back_the_post_norm_state_as_the_network_does():
    """Step i at anchor p of TTT = the network's own chain (draft-extend, then one forward per step with
    the state it hands on), logits included; the same weights without norm_output give other steps."""
    model = random_model(CFG, seed=5)
    net = drafter31(model)
    ids, aux, outs = assert_ttt_is_network_chain(net, model, TAPS, steps=3)
    with torch.no_grad():
        # the pre-norm feedback (EAGLE-3) is a different chain from step 1 on
        plain = drafter31(model, norm_output=False)
        plain.load_state_dict(net.state_dict())
        pre = list(ttt_hidden(plain, ids, aux, 3))
    assert torch.allclose(pre[0], outs[0])
    assert not torch.allclose(pre[1], outs[1], atol=1e-3)


def test_save_drafter_writes_the_flags_at_the_top_level(tmp_path):
    model = random_model(CFG, seed=0)
    net = drafter31(model)
    out = save_drafter(net, tmp_path / "d", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    raw = json.loads((out / "config.json").read_text())
    assert raw["fc_norm"] is True and raw["norm_output"] is True
    assert "fc_norm" not in raw["eagle_config"] and "norm_output" not in raw["eagle_config"]
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(read_draft_checkpoint(out).tensors)
    loaded, _, _ = load_eagle3(out, model, dtype=torch.float32)
    assert loaded.config.fc_norm and loaded.config.norm_output
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        aux = model.taps(ids, TAPS)
        pos = torch.arange(7)[None]
        assert torch.allclose(loaded(ids, loaded.fuse(aux), pos)[1], net(ids, net.fuse(aux), pos)[1], atol=1e-5)
    plain = drafter31(model, fc_norm=False, norm_output=False)
    raw = json.loads(save_drafter(plain, tmp_path / "p", target=model.config, sglang_layer_ids=IDS)
                     .joinpath("config.json").read_text())
    assert "fc_norm" not in raw and "norm_output" not in raw


def test_train_from_an_eagle31_drafter_keeps_both_flags(tmp_path, capsys):
    """`eaglelab train --init-from` a 3.1 drafter: the written drafter keeps fc_norm and norm_output, its
    fc_norm weights start from the old ones and were trained."""
    from eaglelab.cli import main

    model = random_model(CFG, seed=3)
    data = capture_tiny(model, CFG, tmp_path, VOCAB)
    old = drafter31(model)
    save_drafter(old, tmp_path / "old", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "4", "--ttt-length", "3",
                 "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0",
                 "--out", str(tmp_path / "new"), "--init-from", str(tmp_path / "old")]) == 0
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    assert raw["fc_norm"] is True and raw["norm_output"] is True
    net, _, _ = load_eagle3(tmp_path / "new", model, dtype=torch.float32)
    assert net.config.fc_norm and net.config.norm_output
    for i in range(3):
        w_new, w_old = net.fc_norm[i].weight, old.fc_norm[i].weight
        assert not torch.equal(w_new, w_old)  # trained ...
        assert (w_new - w_old).abs().max() < 0.1 * w_old.abs().max()  # ... from the old weights, not from 1
