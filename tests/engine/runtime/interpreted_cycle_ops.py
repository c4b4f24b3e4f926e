"""The cycle's two bookkeeping kernels (``engine/runtime/cycle_kernels.py``) run by Triton's interpreter on CPU
tensors, through their registered ops, against the reference functions they replace (``test_cycle_ops.py`` runs
this module in a subprocess with ``TRITON_INTERPRET=1``; it needs Triton).

``greedy_commit`` against ``greedy_accept`` + ``KVCache.copy_slots``: hypothesis draws the trees (random parents
before children, or a chain, whose batch-expanded tensors have stride 0; tokens from a tiny vocabulary so paths
run deep), the target's picks, batch, layers, KV heads and head dim (non-powers of two on purpose), with or without
a V buffer, and the rows' lengths; every output and both whole caches must be equal. ``emit_advance`` against
``emit_and_advance``: drawn rows done or not, budgets, EOS lists (or none), tokens with -1 padding past each count.
``tree_expand`` against ``tree.expand_step``, in two launches and in one (``cycle_kernels.EXPAND_ONE_LAUNCH``).
"""

from __future__ import annotations

import sys

import torch
from torch._inductor.utils import run_and_get_code
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime import cycle_ops
from eaglelab.engine.runtime import cycle_kernels as CK  # imports Triton: this module runs under its interpreter
from eaglelab.engine.runtime.verification import greedy_accept
from eaglelab.engine.runtime.loop_state import emit_and_advance
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.tickets import made
from eaglelab.engine.runtime.tree import chain_tree, expand_step, make_tree

CASES = int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 40  # hypothesis cases per op
SEEN = {"commit": 0, "moved": 0, "chain": 0, "no_v": 0, "advance": 0, "eos_hit": 0, "budget_hit": 0, "expand": 0,
        "one_launch": 0, "blocks": 0, "ties": 0, "nan": 0}


@st.composite
def commit_cases(draw):
    B, N = draw(st.integers(1, 3)), draw(st.integers(1, 26))
    chain = draw(st.booleans())
    parents = [[-1] + [draw(st.integers(0, i - 1)) for i in range(1, N)] for _ in range(B)]
    vocab = draw(st.integers(2, 3))
    tokens = [[draw(st.integers(0, vocab - 1)) for _ in range(N)] for _ in range(B)]
    pred = [[draw(st.integers(0, vocab - 1)) for _ in range(N)] for _ in range(B)]
    L, H, D = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([4, 6, 16]))
    S = draw(st.integers(N + 1, N + 12))
    lengths = [draw(st.integers(0, S - N)) for _ in range(B)]
    return chain, parents, tokens, pred, L, H, D, S, lengths, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=CASES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(commit_cases())
def check_commit(case) -> None:
    chain, parents, tokens, pred, L, H, D, S, lengths, with_v, seed = case
    tok = torch.tensor(tokens)
    tree = chain_tree(tok) if chain else make_tree(tok, torch.tensor(parents))
    pred_t = torch.tensor(pred)
    logits = torch.nn.functional.one_hot(pred_t, 4).float()  # the target's pick at each node = pred
    gen = torch.Generator().manual_seed(seed)
    ours = KVCache(L, len(lengths), H, S, D, dtype=torch.float16, device="cpu", with_v=with_v)
    ours.k.copy_(torch.randn(ours.k.shape, generator=gen))
    if with_v:
        ours.v.copy_(torch.randn(ours.v.shape, generator=gen))
    ref = KVCache(L, len(lengths), H, S, D, dtype=torch.float16, device="cpu", with_v=with_v)
    ref.k.copy_(ours.k)
    if with_v:
        ref.v.copy_(ours.v)
    lens = torch.tensor(lengths)

    want = greedy_accept(tree, logits)
    ref.compact_path(lens, want.path)
    got = cycle_ops.greedy_commit(tree, pred_t, lens, ours.k, ours.v, compact=True)

    for name, g in zip(("accept_len", "path", "tokens", "bonus"), got):
        assert torch.equal(g, getattr(want, name)), (name, g, getattr(want, name), case)
    assert torch.equal(ours.k, ref.k), case
    assert not with_v or torch.equal(ours.v, ref.v), case
    SEEN["commit"] += 1
    SEEN["moved"] += int(bool((want.path[:, 1:] > torch.arange(1, want.path.shape[1])).any()))
    SEEN["chain"] += int(chain)
    SEEN["no_v"] += int(not with_v)


@st.composite
def advance_cases(draw):
    B, K = draw(st.integers(1, 4)), draw(st.integers(1, 7))
    S = draw(st.integers(K + 2, 24))
    eos = draw(st.sampled_from([[-1], [1], [1, 3], [0, 2, 5]]))  # [-1]: no EOS ids, as the engine passes them
    rows = []
    for _ in range(B):
        count = draw(st.integers(1, K))
        toks = [draw(st.integers(0, 6)) for _ in range(count)] + [-1] * (K - count)
        n_out = draw(st.integers(0, S - K - 1))
        rows.append((toks, count, n_out, draw(st.integers(n_out, S)), draw(st.booleans()), draw(st.integers(0, 9))))
    return S, eos, rows, draw(st.booleans())


@settings(max_examples=CASES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(advance_cases())
def check_advance(case) -> None:
    S, eos, rows, one_each = case
    B = len(rows)
    state = {
        "lengths": torch.tensor([10 * b + 3 for b in range(B)]),
        "root": torch.tensor([100 + b for b in range(B)]),
        "out": torch.full((B, S), -1, dtype=torch.long),
        "n_out": torch.tensor([r[2] for r in rows]),
        "done": torch.tensor([r[4] for r in rows]),
        "hit_eos": torch.tensor([r[4] and r[5] % 2 == 0 for r in rows]),
        "limit": torch.tensor([r[3] for r in rows]),
    }
    toks = torch.tensor([r[0] for r in rows])
    count = None if one_each else torch.tensor([r[1] for r in rows])
    if one_each:
        toks = toks[:, :1]
    new_root = torch.tensor([r[5] for r in rows])
    eos_t = torch.tensor(eos)
    ref = {k: v.clone() for k, v in state.items()}
    want = emit_and_advance(ref, toks, count, new_root, eos_t)
    got = cycle_ops.emit_advance(state, toks, count, new_root, eos_t)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got, want, case)
    for name in state:
        assert torch.equal(state[name], ref[name]), (name, state[name], ref[name], case)
    SEEN["advance"] += 1
    SEEN["eos_hit"] += int(bool((ref["hit_eos"] & ~state["done"].new_tensor([r[4] for r in rows])).any()))
    SEEN["budget_hit"] += int(bool((ref["n_out"] >= ref["limit"]).any()))


@st.composite
def expand_cases(draw):
    topk = draw(st.integers(1, 6))
    V = draw(st.sampled_from([topk, 7, 100, 256, 300, 777, 1100]))
    V = max(V, topk)
    ties = draw(st.booleans())  # small integer logits: many equal entries, ties broken by index
    # ties within a frontier node's row only: across rows, equal log-probabilities come from sums in another order
    B, F = draw(st.integers(1, 3)), 1 if ties else draw(st.sampled_from([1, topk]))
    poison = draw(st.booleans())  # a few NaN and -inf logits
    return topk, V, B, F, ties, poison, draw(st.sampled_from([torch.float32, torch.bfloat16])), draw(st.integers(0, 2**16))


@settings(max_examples=CASES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(expand_cases())
def check_expand(case) -> None:
    topk, V, B, F, ties, poison, dtype, seed = case
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 3, (B, F, V), generator=gen).float() if ties else torch.randn(B, F, V, generator=gen) * 3
    if poison:
        logits.view(-1)[torch.randint(0, B * F * V, (max(B * F * V // 50, 1),), generator=gen)] = float("nan")
        logits.view(-1)[torch.randint(0, B * F * V, (max(B * F * V // 50, 1),), generator=gen)] = float("-inf")
    logits = logits.to(dtype)
    scores = -torch.rand(B, F, generator=gen) * 4
    want = expand_step(scores, logits, topk)  # eager: the reference
    real = torch.isfinite(want.scores)  # -inf candidates (a row of fewer live entries than topk) have no order
    for one_launch in (False, True):  # two kernels, or one whose last block of a row selects (its tickets back at 0)
        CK.EXPAND_ONE_LAUNCH = one_launch
        try:
            tokens, cand, selected = cycle_ops.tree_expand(scores, logits, topk)
        finally:
            CK.EXPAND_ONE_LAUNCH = False
        torch.testing.assert_close(cand, want.scores, rtol=1e-5, atol=1e-5, msg=lambda m: f"{m} {case} {one_launch}")
        assert torch.equal(tokens[real], want.tokens[real]), (tokens, want.tokens, case, one_launch)
        assert torch.equal(selected, want.selected) or not real.all(), (selected, want.selected, case, one_launch)
        left = made("expansion", logits.device)
        assert not one_launch or (left is not None and not left.any()), "no ticket taken, or a counter left above 0"
        SEEN["one_launch"] += int(one_launch)
    SEEN["expand"] += 1
    SEEN["blocks"] += int(V > 256)
    SEEN["ties"] += int(ties)
    SEEN["nan"] += int(poison)


def check_compiled_in_place() -> None:
    """Both ops inside one torch.compile'd function (fullgraph; the kernels still interpreted): the results of the
    eager calls, the cache and the state written in place (the generated host code copies neither back)."""
    tree = make_tree(torch.tensor([[9, 4, 7, 5], [9, 7, 4, 5]]), torch.tensor([[-1, 0, 0, 1], [-1, 0, 0, 2]]))
    pred = torch.tensor([[4, 5, 1, 8], [4, 1, 5, 8]])  # row 0: path 0 -> 1 -> 3; row 1: 0 -> 2 -> 3
    lengths = torch.tensor([3, 5])
    caches = [KVCache(2, 2, 3, 17, 8, dtype=torch.float16, device="cpu") for _ in range(2)]
    for c in caches:
        c.k.copy_(torch.arange(c.k.numel()).reshape(c.k.shape) % 251)
        c.v.copy_(-c.k)
    states = [{"lengths": lengths.clone(), "root": torch.tensor([1, 2]), "out": torch.full((2, 17), -1),
               "n_out": torch.tensor([0, 4]), "done": torch.tensor([False, False]),
               "hit_eos": torch.tensor([False, False]), "limit": torch.tensor([8, 6])} for _ in range(2)]
    eos = torch.tensor([8])

    def cycle_end(cache, state):
        acc = cycle_ops.greedy_commit(tree, pred, state["lengths"], cache.k, cache.v, compact=True)
        return (*acc, *cycle_ops.emit_advance(state, acc[2], acc[0], acc[3], eos))

    eager = cycle_end(caches[0], states[0])
    compiled, (code,) = run_and_get_code(torch.compile(lambda: cycle_end(caches[1], states[1]), fullgraph=True))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b), (a, b)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert eager[0].tolist() == [3, 3] and eager[2].tolist() == [[4, 5, 8, -1]] * 2
    assert states[0]["out"][0, :4].tolist() == [4, 5, 8, -1] and states[0]["hit_eos"].tolist() == [True, False]
    assert states[0]["out"][1, 4:7].tolist() == [4, 5, -1] and states[0]["done"].tolist() == [True, True]  # budget
    call = code.split("def call")[1]
    assert "greedy_commit" in call and "emit_advance" in call
    assert ".copy_(" not in call and "aten.copy_" not in call, "a buffer copied back: not written in place"
    SEEN["compiled"] = 1


def check_engine() -> None:
    """EAGLE-3 greedy speculation on a tiny random model, every phase compiled as one graph a cycle, the three ops
    taken as on CUDA (here by the CPU's compiled phases, the kernels interpreted) == plain greedy eager decoding."""
    import tempfile

    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from tests.engine.runtime.test_cuda_graphs import EmulatedRunner

    traced = {"greedy_commit": 0, "emit_advance": 0, "tree_expand": 0}
    for name in traced:
        def counted(*args, _name=name, _fn=getattr(cycle_ops, name), **kwargs):
            traced[_name] += 1
            return _fn(*args, **kwargs)
        setattr(cycle_ops, name, counted)
    cycle_ops.applies = lambda x: torch.compiler.is_compiling()  # the CPU's compiled phases as CUDA's
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    model = build_scale_model("tiny", seed=3).model
    net, taps = random_eagle3(model, seed=5, draft_vocab=300)  # two blocks of the expansion's first pass
    spec = SpecConfig("eagle3", num_steps=3, topk=3, num_draft_tokens=8, cuda_graphs=True, compile=True)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = compiled_kernels(tmp)
        runner = EmulatedRunner.for_engine(model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(2,),
                                           kernels=kernels)
        eng = Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner)
        out = eng.generate(prompts, 12)
        assert compile_report(kernels)[1] == []
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 12)
    assert out.tokens == plain.tokens, (out.tokens, plain.tokens)
    assert all(traced.values()), traced
    SEEN["engine"] = 1


if __name__ == "__main__":
    assert cycle_ops.load(), "Triton did not load"
    if sys.argv[1:2] == ["engine"]:
        CK.EXPAND_ONE_LAUNCH = sys.argv[2:] == ["one-launch"]
        check_engine()
        print(" ".join(f"{k} {v}" for k, v in SEEN.items() if v))
        sys.exit(0)
    check_commit()
    check_advance()
    check_expand()
    check_compiled_in_place()
    print(" ".join(f"{k} {v}" for k, v in SEEN.items()))
