"""The fused draft step's kernels (``engine/model/draft_step_kernels.py``) run by Triton's interpreter on CPU tensors,
through their registered ops, against the reference they replace: ``Eagle3Network.forward`` on the gathered parent
states, then ``tree.expand_step`` on its logits (``test_draft_step.py`` runs this module in a subprocess with
``TRITON_INTERPRET=1``; it needs Triton).

Hypothesis draws the shapes (batch, topk, the previous frontier's width, hidden size, heads and KV heads, MLP width
and draft vocabulary that are no multiple of a program's block, on purpose), the weights, the frontier, its parents,
the rows' lengths and a tree mask, in float16 (numpy has no bfloat16). The two must agree: the K/V the step writes
into the cache and the state it hands on, to float16 rounding; the candidates' scores to that rounding of the logits;
and the candidates' tokens and the selected frontier wherever the reference's ranking is not within that rounding
of a tie.
"""

from __future__ import annotations

import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model import draft_step
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.runtime import cycle_ops
from eaglelab.engine.runtime.tree import expand_step

CASES = int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 12
SEEN = {"cases": 0, "rows_compared": 0, "gather": 0, "near_ties": 0}


@st.composite
def step_cases(draw):
    heads, kv = draw(st.sampled_from([(2, 1), (3, 1), (4, 2)]))
    D = draw(st.sampled_from([8, 16]))
    return dict(B=draw(st.integers(1, 2)), K=draw(st.integers(1, 4)), F=draw(st.integers(1, 4)),
                H=draw(st.sampled_from([24, 40])), heads=heads, kv=kv, D=D, I=draw(st.sampled_from([20, 36])),
                V=draw(st.sampled_from([70, 130])), prefix=draw(st.integers(0, 9)), seed=draw(st.integers(0, 2**16)))


def _network(c, gen) -> Eagle3Network:
    cfg = Eagle3Config(hidden_size=c["H"], target_hidden_size=c["H"], num_aux=3, num_heads=c["heads"],
                       num_kv_heads=c["kv"], head_dim=c["D"], intermediate_size=c["I"], vocab_size=150,
                       draft_vocab_size=c["V"], rms_norm_eps=1e-5, rope_theta=10000.0)
    embed = torch.nn.Embedding(150, c["H"])
    net = Eagle3Network(cfg, embed)
    with torch.no_grad():
        for p in list(net.parameters()) + [embed.weight]:
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0))
    embed.half()
    return net.half().eval()


@settings(max_examples=CASES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(step_cases())
def check_step(c) -> None:
    gen = torch.Generator().manual_seed(c["seed"])
    net = _network(c, gen)
    B, K, F, H = c["B"], c["K"], c["F"], c["H"]
    S = c["prefix"] + 3 * K + 4
    lengths = torch.randint(0, c["prefix"] + 1, (B,), generator=gen)
    tokens = torch.randint(0, 150, (B, K), generator=gen)
    parent = torch.randint(0, F, (B, K), generator=gen)
    hidden = torch.randn(B, F, H, generator=gen).half()
    positions = (lengths + 1)[:, None].expand(B, K)
    slots = lengths[:, None] + K + torch.arange(K)
    mask = torch.rand(B, K, S, generator=gen) < 0.6
    mask |= torch.arange(S)[None, None, :] < lengths[:, None, None]  # the prefix: always seen
    mask[torch.arange(B)[:, None], torch.arange(K)[None, :], slots] = True  # each row sees itself
    scores = -torch.rand(B, K, generator=gen) * 3
    caches = [KVCache(1, B, c["kv"], S, c["D"], dtype=torch.float16, device="cpu") for _ in range(2)]
    start = torch.randn(caches[0].k.shape, generator=gen).half(), torch.randn(caches[0].v.shape, generator=gen).half()
    for cache in caches:
        cache.k.copy_(start[0])
        cache.v.copy_(start[1])

    with torch.no_grad():
        feats = hidden.gather(1, parent[..., None].expand(-1, -1, H))
        ref_hidden, ref_logits = net(tokens, feats, positions, caches[0], slots, mask)
        ref = expand_step(scores, ref_logits, K)
        ours_hidden, blocks = draft_step.forward(net, tokens, hidden, parent, positions, caches[1], slots, mask,
                                                 _NoKernels())
        tok, cand, sel = cycle_ops.tree_select(scores, blocks, K)

    tol = dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(caches[1].k.float(), caches[0].k.float(), **tol)
    torch.testing.assert_close(caches[1].v.float(), caches[0].v.float(), **tol)
    torch.testing.assert_close(ours_hidden.float(), ref_hidden.float(), atol=6e-2, rtol=3e-2)
    torch.testing.assert_close(cand, ref.scores.float(), atol=6e-2, rtol=2e-2)
    # tokens: equal where the reference's K-th and (K+1)-th logits are apart by more than the rounding
    top = ref_logits.float().topk(min(K + 1, c["V"]), dim=-1).values  # [B, K, K+1]
    for b in range(B):
        for f in range(K):
            if K < c["V"] and (top[b, f, :-1].diff().abs().min() if K > 1 else 1.0) < 0.05 \
                    or (top[b, f, K - 1] - top[b, f, K]).abs() < 0.05:
                SEEN["near_ties"] += 1
                continue
            assert tok[b, f * K:(f + 1) * K].tolist() == ref.tokens[b, f * K:(f + 1) * K].tolist(), (b, f, c)
            SEEN["rows_compared"] += 1
    SEEN["cases"] += 1
    SEEN["gather"] += int(F > 1)


def check_engine() -> None:
    """The engine's compiled one-graph cycle on CPU standing in for CUDA's, the ops interpreted: every draft step
    fused, EAGLE-3 greedy speculation (float32) == plain greedy eager decoding."""
    import tempfile
    from pathlib import Path

    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from tests.engine.runtime.test_cuda_graphs import EmulatedRunner

    traced = {"forward": 0}
    fused = draft_step.forward

    def counted(*args, **kwargs):
        traced["forward"] += 1
        return fused(*args, **kwargs)

    draft_step.forward = counted
    cycle_ops.applies = lambda x: torch.compiler.is_compiling()  # the CPU's compiled phases as CUDA's
    draft_step.compiled_on_cuda = lambda x: torch.compiler.is_compiling()
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    model = build_scale_model("tiny", seed=3).model
    net, taps = random_eagle3(model, seed=5, draft_vocab=300)
    spec = SpecConfig("eagle3", num_steps=3, topk=3, num_draft_tokens=8, cuda_graphs=True, compile=True)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = compiled_kernels(Path(tmp))
        runner = EmulatedRunner.for_engine(model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(2,),
                                           kernels=kernels)
        eng = Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner)
        out = eng.generate(prompts, 12)
        assert compile_report(kernels)[1] == [], compile_report(kernels)[1]
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 12)
    assert out.tokens == plain.tokens, (out.tokens, plain.tokens)
    assert traced["forward"] >= 2, traced  # both draft steps after the root's, traced once
    print("engine", traced["forward"])


class _NoKernels:
    attention = None  # SDPA, as the reference's default kernels


def main() -> None:
    assert draft_step.load(), draft_step.reason
    assert cycle_ops.load(), cycle_ops.reason
    if sys.argv[1:] == ["engine"]:
        check_engine()
        return
    check_step()
    print("seen", SEEN)
    assert SEEN["cases"] == CASES and SEEN["rows_compared"] > 0 and SEEN["gather"] > 0, SEEN


if __name__ == "__main__":
    main()
