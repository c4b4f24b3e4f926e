"""Training the MLA-layout EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``): the TTT step runs the
network's own MLA attention against the keys of every step so far, so its outputs for k steps equal the
network's own multi-step cached forward (draft-extend, then one cached forward per draft step)."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.training.ttt import ttt_hidden
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
    T, steps = 10, 3
    ids = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        aux = target.taps(ids, TAPS)
        outs = list(ttt_hidden(net, ids, aux, steps))
        state = (lambda o: net.norm(o)) if net.config.norm_output else (lambda o: o)
        cache = KVCache(1, 1, 1, T + steps, net.config.head_dim, dtype=torch.float32, device="cpu")
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1)
        pos = torch.arange(T)[None]
        h0, _ = net(nxt, net.fuse(aux), pos, cache, pos, prefix_mask(pos, T + steps))
        assert torch.allclose(h0[:, : T - 1], state(outs[0][:, : T - 1]), atol=1e-5)
        checked = 0
        for p in range(T - steps):
            feats = h0[:, p: p + 1]
            for i in range(1, steps):
                mask = torch.zeros(1, 1, T + steps, dtype=torch.bool)
                mask[..., : p + 1] = True
                mask[..., T: T + i] = True
                feats, logits = net(ids[:, p + i + 1: p + i + 2], feats, torch.tensor([[p + i]]), cache,
                                    torch.tensor([[T + i - 1]]), mask)
                assert torch.allclose(feats[0, 0], state(outs[i][0, p]), atol=1e-5), (p, i)
                ttt_logits = net.lm_head(net.norm(outs[i][:, p])).float()
                assert torch.allclose(logits[0, 0], ttt_logits[0], atol=1e-4), (p, i)
                checked += 1
    assert checked == (T - steps) * (steps - 1)
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
