"""The cycle's bookkeeping kernels (engine/runtime/cycle_ops.py): where they apply, and the kernels against the
reference functions they replace, under Triton's interpreter (CPU, where Triton is installed: hypothesis cases, and
both ops compiled writing in place) and on CUDA (``gpu``: compiled and captured, bf16 caches)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglelab.engine.runtime import cycle_ops
from eaglelab.engine.runtime.compile import CompiledOrEager
from eaglelab.engine.runtime.verification import greedy_accept
from eaglelab.engine.runtime.loop_state import emit_and_advance
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.runtime.tree import TreeBuilder, expand_step
from tests.conftest import has_triton

ROOT = Path(__file__).resolve().parents[3]


def test_eager_and_cpu_phases_keep_the_reference():
    """Only a compiled phase on CUDA takes the kernels: eagerly (the reference the kernels are checked against) and
    on a CPU, never, whether or not the ops loaded (where Triton is, they load here first)."""
    cycle_ops.load()
    assert not cycle_ops.applies(torch.zeros(1))
    assert not torch.compile(lambda x: x + cycle_ops.applies(x), fullgraph=True)(torch.zeros(1)).any()


def test_a_compile_log_says_once_why_the_kernels_are_missing(monkeypatch):
    """Where the ops did not load on CUDA, the first phase compiled says so (once a process): compiled phases then do
    the bookkeeping the slower way, and a user should know why."""
    monkeypatch.setattr(cycle_ops, "reason", "the cycle's kernels unavailable (ImportError: no triton)")
    monkeypatch.setattr(cycle_ops, "_told", False)
    said: list[str] = []
    for name in ("first", "second"):
        assert CompiledOrEager(name, lambda x: x + 1, said.append)(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert [m for m in said if "unavailable" in m] == [
        "  the cycle's kernels unavailable (ImportError: no triton): compiled phases run the reference bookkeeping instead"]


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_the_ops_register_where_triton_is():
    """Where Triton imports, the three ops load (a schema torch cannot infer fails here, not silently on a GPU)."""
    assert cycle_ops.load(), cycle_ops.reason
    assert cycle_ops.reason is None
    assert all(hasattr(torch.ops.eaglelab, op) for op in ("greedy_commit", "emit_advance", "tree_expand"))


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_kernels_match_the_reference_under_the_triton_interpreter():
    """tests/engine/runtime/interpreted_cycle_ops.py: 60 hypothesis cases an op (trees and chains, caches with and
    without V, rows done, budgets and EOS ids met; draft steps over vocabularies of one block and several, tied,
    NaN and -inf logits), then the two writing ops in one compiled function, writing in place."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.runtime.interpreted_cycle_ops", "60"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    counts = dict(zip(done.stdout.split()[::2], map(int, done.stdout.split()[1::2])))
    assert counts["commit"] == counts["advance"] == counts["expand"] == counts["one_launch"] == 60, counts
    assert counts["compiled"] == 1, counts
    assert min(counts[k] for k in ("moved", "chain", "no_v", "eos_hit", "budget_hit", "blocks", "ties", "nan")) >= 5, counts


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_kernels_compile_for_hopper():
    """Each kernel through Triton's compiler for sm_90, no GPU needed (the interpreter runs code the compiler rejects:
    a global of a plain float compiled nowhere), at the shapes of the shipped 5/4/24 tree and a 3-wide one."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from eaglelab.engine.runtime import cycle_kernels as K

    def compile_(fn, types: dict[str, str], const: dict, warps: int = 4) -> None:
        names = list(inspect.signature(fn.fn).parameters)
        const = {"PDL": False} | const  # launched dependently or not: test_pdl.py compiles both
        sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]

    long = {n: "*i64" for n in ("pred_ptr", "tok_ptr", "par_ptr", "dep_ptr", "len_ptr", "acc_len_ptr", "path_ptr",
                                "out_tok_ptr", "bonus_ptr", "count_ptr", "new_root_ptr", "eos_ptr", "out_ptr", "n_out_ptr",
                                "limit_ptr", "root_ptr", "emitted_ptr", "cand_ptr", "sel_ptr")}
    flags = {n: "*i1" for n in ("mask_ptr", "done_ptr", "hit_ptr", "active_ptr")}
    floats = {"x_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "val_ptr": "*fp32", "idx_ptr": "*i32",
              "peak_ptr": "*fp32", "mass_ptr": "*fp32", "score_ptr": "*fp32"}
    types = long | flags | floats
    for compact, has_v in ((True, True), (True, False), (False, True)):
        compile_(K.greedy_commit_kernel, types, {"NP": 32, "DP": 8, "HP": 4, "HDP": 64, "COMPACT": compact, "HAS_V": has_v})
    for kp, ep, counted in ((8, 2, True), (1, 1, False)):
        compile_(K.emit_advance_kernel, types, {"KP": kp, "EP": ep, "HAS_COUNT": counted}, warps=1)
    for k, kp in ((4, 4), (3, 4)):
        compile_(K.expand_blocks_kernel, types, {"CHUNK": 256, "K": k, "KP": kp})
        for fp in (1, 4):
            compile_(K.expand_select_kernel, types, {"K": k, "FP": fp, "KP": kp, "CP": 64, "CKP": 256})
            compile_(K.expand_kernel, types | {"ticket_ptr": "*i32"},
                     {"CHUNK": 256, "K": k, "KP": kp, "FP": fp, "CP": 64, "CKP": 256})


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
@pytest.mark.parametrize("expansion", [[], ["one-launch"]], ids=["two-launch-expansion", "one-launch-expansion"])
def test_compiled_speculation_with_the_kernels_gives_plain_greedy_tokens_under_the_interpreter(expansion):
    """The engine's compiled one-graph cycle taking the three ops as on CUDA (the CPU's compiled phases standing in,
    the kernels interpreted): EAGLE-3 greedy speculation == plain greedy eager decoding, each op traced; a draft step's
    expansion in two launches and in one (``cycle_kernels.EXPAND_ONE_LAUNCH``)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.runtime.interpreted_cycle_ops", "engine", *expansion],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["engine", "1"], done.stdout[-500:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernels_compiled_and_captured_on_cuda_match_the_reference():
    """A 5/4/24 tree of three rows over a bf16 cache of 4 layers: the acceptance, the compacted cache and the
    advanced state of the compiled phase (the kernels) equal the eager reference's, and so does a CUDA graph of it
    replayed over the next cycle's inputs."""
    dev, B, V, S = torch.device("cuda"), 3, 50, 96
    assert cycle_ops.load()
    gen = torch.Generator(device=dev).manual_seed(0)
    root = torch.randint(0, V, (B,), device=dev, generator=gen)
    builder = TreeBuilder(root, 4)
    for s in range(5):
        builder.step(torch.randn(B, 1 if s == 0 else 4, V, device=dev, generator=gen))
    tree = builder.finish(24)
    eos = torch.tensor([7], device=dev)

    def inputs(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        logits = torch.randn(B, 24, V, device=dev, generator=g)
        for b, (toks, pars) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
            for tok, par in zip(toks[1:], pars[1:]):
                logits[b, par, tok] = 9.0  # after each node the target picks one of its drafted children: deep paths
        cache = KVCache(4, B, 3, S, 64, dtype=torch.bfloat16, device=dev)
        cache.k.normal_(generator=g)
        cache.v.normal_(generator=g)
        state = {"lengths": torch.tensor([5, 40, 60], device=dev), "root": root.clone(),
                 "out": torch.full((B, S), -1, device=dev), "n_out": torch.tensor([0, 3, 10], device=dev),
                 "done": torch.tensor([False, False, True], device=dev), "hit_eos": torch.zeros(B, dtype=torch.bool, device=dev),
                 "limit": torch.tensor([64, 5, 64], device=dev)}
        return logits, cache, state

    def reference(logits, cache, state):
        acc = greedy_accept(tree, logits)
        cache.compact_path(state["lengths"], acc.path)
        return (acc.accept_len, acc.path, acc.tokens, acc.bonus,
                *emit_and_advance(state, acc.tokens, acc.accept_len, acc.bonus, eos))

    def fused(logits, cache, state):
        assert cycle_ops.applies(logits)
        pred = logits.argmax(-1)
        acc = cycle_ops.greedy_commit(tree, pred, state["lengths"], cache.k, cache.v, compact=True)
        return (*acc, *emit_and_advance(state, acc[2], acc[0], acc[3], eos))

    def same(a, b):
        (ra, ca, sa), (rb, cb, sb) = a, b
        assert all(torch.equal(x, y) for x, y in zip(ra, rb))
        assert torch.equal(ca.k, cb.k) and torch.equal(ca.v, cb.v)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)

    compiled = torch.compile(fused, fullgraph=True, dynamic=False)
    ref_in, got_in = inputs(1), inputs(1)
    want = reference(*ref_in)
    assert int(want[0].max()) >= 4, "the test's tree should accept deep paths"
    same((want, *ref_in[1:]), (compiled(*got_in), *got_in[1:]))

    static = inputs(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        compiled(*static)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(*static)
    nxt = inputs(2)
    static[0].copy_(nxt[0])
    static[1].k.copy_(nxt[1].k)
    static[1].v.copy_(nxt[1].v)
    for k in static[2]:
        static[2][k].copy_(nxt[2][k])
    graph.replay()
    torch.cuda.synchronize()
    same((reference(*nxt), *nxt[1:]), (out, *static[1:]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("one_launch", [False, True], ids=["two-launches", "one-launch"])
def test_tree_expansion_compiled_and_captured_on_cuda_matches_the_eager_step(one_launch, monkeypatch):
    """A draft step of the shipped drafter's shape (4 frontier nodes, 12,288-entry draft vocabulary, bf16 logits):
    the compiled step (the two kernels, or the one of ``EXPAND_ONE_LAUNCH``) against the eager one, and a CUDA graph
    of it replayed over new logits, twice (the one launch's ticket counters back at 0 after each)."""
    dev = torch.device("cuda")
    assert cycle_ops.load()
    from eaglelab.engine.runtime import cycle_kernels

    monkeypatch.setattr(cycle_kernels, "EXPAND_ONE_LAUNCH", one_launch)
    gen = torch.Generator(device=dev).manual_seed(0)
    scores = -torch.rand(2, 4, device=dev, generator=gen)
    logits = (torch.randn(2, 4, 12288, device=dev, generator=gen) * 4).bfloat16()

    def step(s, x):
        e = expand_step(s, x, 4)
        return e.tokens, e.scores, e.selected

    def same(got, want):
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    same(compiled(scores, logits), step(scores, logits))
    static = logits.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        compiled(scores, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(scores, static)
    for _ in range(2):
        fresh = (torch.randn(2, 4, 12288, device=dev, generator=gen) * 4).bfloat16()
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        same(out, step(scores, fresh))
