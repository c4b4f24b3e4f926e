"""What a TTT step must equal: the drafter network's own multi-step cached forward, written once for the tests.

The engine drafts by a draft-extend over the prompt (each position's state handed on), then, from an anchor
position ``p``, one cached forward per draft step ``i`` feeding back the state the previous step handed on;
TTT computes the same chain for every anchor at once. Worked example, T = 4 tokens, 3 steps: anchors p = 0, 1;
step i = 1, 2 at position p + i reads the extend's keys at slots <= p and the chain's own keys at slots
T .. T + i - 1.
"""

from __future__ import annotations

import torch

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.training.ttt import ttt_hidden


def network_chain(net, ids: torch.Tensor, aux: torch.Tensor, steps: int, cache) -> tuple[torch.Tensor, list]:
    """-> (h0 [1, T, H]: what the draft-extend hands on at each position, [(p, i, state [H], logits [V]), ...]
    for every anchor p < T - steps and step 1 <= i < steps). ``cache`` holds T + steps slots."""
    T = ids.shape[1]
    nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1)
    pos = torch.arange(T)[None]
    h0, _ = net(nxt, net.fuse(aux), pos, cache, pos, prefix_mask(pos, T + steps))
    chain = []
    for p in range(T - steps):
        feats = h0[:, p: p + 1]
        for i in range(1, steps):
            mask = torch.zeros(1, 1, T + steps, dtype=torch.bool)
            mask[..., : p + 1] = True
            mask[..., T: T + i] = True
            feats, logits = net(ids[:, p + i + 1: p + i + 2], feats, torch.tensor([[p + i]]), cache,
                                torch.tensor([[T + i - 1]]), mask)
            chain.append((p, i, feats[0, 0], logits[0, 0]))
    return h0, chain


def assert_ttt_is_network_chain(net, target, taps, *, T: int = 10, steps: int = 3) -> tuple:
    """Step i at anchor p of TTT = the network's own chain on T seeded tokens: the state each forward hands
    on (norm(out) under ``norm_output``, else out) and its logits. -> (ids [1, T], aux, TTT's outs per step)."""
    ids = torch.randint(0, net.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        aux = target.taps(ids, taps)
        outs = list(ttt_hidden(net, ids, aux, steps))
        state = net.norm if net.config.norm_output else (lambda o: o)
        cache = KVCache(1, 1, net.config.num_kv_heads, T + steps, net.config.head_dim, dtype=torch.float32,
                        device="cpu")
        h0, chain = network_chain(net, ids, aux, steps, cache)
        assert torch.allclose(h0[:, : T - 1], state(outs[0][:, : T - 1]), atol=1e-5)  # the last has no next token
        assert len(chain) == (T - steps) * (steps - 1)
        for p, i, feats, logits in chain:
            assert torch.allclose(feats, state(outs[i][0, p]), atol=1e-5), (p, i)
            ttt_logits = net.lm_head(net.norm(outs[i][:, p])).float()
            assert torch.allclose(logits, ttt_logits[0], atol=1e-4), (p, i)
    return ids, aux, outs
