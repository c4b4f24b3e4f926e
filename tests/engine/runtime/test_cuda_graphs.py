"""The CUDA-graph runner: buckets, plans, eager fallbacks and their reasons, static-buffer replay.

On CPU the runner's replay logic (static buffers, pad rows, copy in/out, the static drafter
cache) is exercised with an emulated graph whose replay re-runs the captured function on the
static buffers, which is what a CUDA graph does. The GPU test compares real graphs with eager.
"""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.cuda_graphs import (
    EAGER_EXTEND, EAGER_HOST_DRAFTER, EAGER_NO_CUDA, EAGER_OFF, EAGER_PREFILL, REPLAY,
    MOE_PREFILL_TOKENS, CudaGraphRunner, GraphPlan, bucket_for, draft_cache_len, prefill_bucket,
)
from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector

PROMPTS = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3], [7, 7, 7, 7, 8, 1], [40, 41, 42, 43, 44]]


class Recorder(CycleCollector):
    def __init__(self) -> None:
        super().__init__()
        self.captures, self.warnings = [], []

    def on_graph_captured(self, stats) -> None:
        self.captures.append(stats)

    def on_warning(self, *args, **kw) -> None:
        self.warnings.append((args, kw))


class EmulatedGraph:
    """Stands in for torch.cuda.CUDAGraph: replay re-runs the function over the same static buffers."""

    def __init__(self, fn, outputs) -> None:
        self.fn, self.outputs, self.replays = fn, outputs, 0

    def replay(self) -> None:
        self.replays += 1
        for dst, src in zip(self.outputs, self.fn()):
            if dst is not None:
                dst.copy_(src)


class EmulatedRunner(CudaGraphRunner):
    """The graph runner with CUDA capture replaced by :class:`EmulatedGraph` (runs on CPU)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        if self.disabled_reason == EAGER_NO_CUDA:
            self.disabled_reason = None

    def _reserved(self) -> int:
        return 0

    def _record(self, fn, eager=None):
        if eager is not None:
            eager()
        outputs = fn()
        return EmulatedGraph(fn, outputs), outputs


def _phase_graph(runner, name, bucket, prompt: bool = False):
    """The one graph captured for phase ``name`` in ``bucket``: of a cycle, or with ``prompt`` of a prompt
    (the prefill and the drafter's extend over the prompt: their inputs hold the padded ``ids``)."""
    found = [g for k, g in runner._graphs.items() if k[0] == "phase" and k[1] == name and k[2] == bucket
             and any(i[0] == "ids" for i in k[4]) == prompt]
    assert len(found) == 1, sorted(str(k) for k in runner._graphs)
    return found[0]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_scale_model("tiny", seed=3).model


def _engine(model, spec, drafter, runner):
    return Engine(model, drafter=drafter if spec.enabled else None, spec=spec, runner=runner, observer=Recorder())


def _drafter(model, spec, kind):
    if kind == "ngram":
        return NgramDrafter(spec)
    net, taps = random_eagle3(model, seed=5, draft_vocab=256)
    return Eagle3Drafter(net, spec, taps)


# ---- pure helpers ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=6, unique=True), st.integers(1, 80))
def test_bucket_for_is_the_smallest_bucket_that_fits(buckets, batch):
    got = bucket_for(batch, tuple(buckets))
    fits = [b for b in buckets if b >= batch]
    if not fits:
        assert got is None
    else:
        assert got == min(fits) and got >= batch


def test_plan_captures_what_the_spec_runs():
    plain = GraphPlan.for_spec(SpecConfig(cuda_graphs=True), False, 256, (4, 1, 2))
    assert plain.buckets == (1, 2, 4) and plain.decode and plain.verify_tokens == () and plain.draft_width == 0
    spec = SpecConfig("eagle3", num_steps=5, topk=2, num_draft_tokens=8, attention_mode="decode")
    p = GraphPlan.for_spec(spec, True, 256)
    assert (p.decode, p.verify_tokens, p.draft_width, p.extend_width) == (False, (8,), 2, 6)
    pre = GraphPlan.for_spec(SpecConfig("eagle3", num_steps=3, attention_mode="prefill"), True, 256)
    assert pre.verify_tokens == () and pre.draft_width == 1 and pre.extend_width == 4
    ngram = GraphPlan.for_spec(SpecConfig("ngram", num_steps=4), False, 256)
    assert ngram.verify_tokens == (5,) and ngram.draft_width == 0
    assert draft_cache_len(256, spec) == 256 + 5 * 2 + 2


# ---- fallback reasons without CUDA -----------------------------------------------------------------
def test_without_cuda_everything_is_eager_and_says_why(tiny):
    spec = SpecConfig("ngram", num_steps=3, attention_mode="decode", cuda_graphs=True)
    runner = CudaGraphRunner.for_engine(tiny, spec, NgramDrafter(spec), max_len=128)
    assert runner.make_cache(1, 64) is None and runner.capture() == []
    eng = _engine(tiny, spec, NgramDrafter(spec), runner)
    out = eng.generate(PROMPTS[:2], 6)
    ref = _engine(tiny, spec, NgramDrafter(spec), EagerRunner(tiny)).generate(PROMPTS[:2], 6)
    assert out.tokens == ref.tokens
    graphs = [c.graph for c in eng.observer.cycles]
    assert graphs[0] == {"prefill": EAGER_NO_CUDA}
    assert all(g == {"draft": EAGER_NO_CUDA, "verify": EAGER_NO_CUDA, "draft_extend": EAGER_NO_CUDA} for g in graphs[1:])


def test_graphs_off_says_so(tiny):
    runner = CudaGraphRunner.for_engine(tiny, SpecConfig(cuda_graphs=False), None)
    eng = _engine(tiny, SpecConfig(), None, runner)
    eng.generate(PROMPTS[:1], 3)
    assert [c.graph for c in eng.observer.cycles[1:]] == [{"decode": EAGER_OFF}] * 2
    assert runner.fallbacks[("decode", EAGER_OFF)] == 2


# ---- replay logic with emulated graphs -------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 3])
def test_plain_replay_matches_eager_and_pads_to_the_bucket(tiny, batch):
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(tiny, spec, None, max_len=64, buckets=(1, 2, 4))
    eng = _engine(tiny, spec, None, runner)
    out = eng.generate(PROMPTS[:batch], 8)
    ref = _engine(tiny, spec, None, EagerRunner(tiny)).generate(PROMPTS[:batch], 8)
    assert out.tokens == ref.tokens
    cycles = eng.observer.cycles
    assert cycles[0].graph == {"prefill": REPLAY}
    assert [c.graph for c in cycles[1:]] == [{"decode": REPLAY}] * 7
    bucket = bucket_for(batch, (1, 2, 4))
    assert _phase_graph(runner, "decode", bucket).graph.replays == 7
    assert _phase_graph(runner, "prefill", bucket, prompt=True).inputs["ids"].shape == (bucket, 16)
    # lazily: the graphs of the bucket this run needed (the prompts padded to 16), reported to the observer
    assert [(s.name, s.batch_size) for s in eng.observer.captures] == [("prefill", bucket), ("decode", bucket)]


@pytest.mark.parametrize("kind", ["ngram", "eagle3"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_spec_replay_matches_eager(tiny, kind, mode):
    spec = SpecConfig("eagle3" if kind == "eagle3" else "ngram", num_steps=3, topk=1, attention_mode=mode, cuda_graphs=True)
    drafter = _drafter(tiny, spec, kind)
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=64, buckets=(1, 2, 4))
    eng = _engine(tiny, spec, drafter, runner)
    out = eng.generate(PROMPTS[:3], 10)
    ref = _engine(tiny, spec, _drafter(tiny, spec, kind), EagerRunner(tiny, getattr(drafter, "net", None)))
    assert out.tokens == ref.generate(PROMPTS[:3], 10).tokens
    graphs = [c.graph for c in eng.observer.cycles[1:]]
    assert graphs, "at least one speculative cycle"
    verify = REPLAY if mode == "decode" else EAGER_EXTEND
    draft = REPLAY if kind == "eagle3" else EAGER_HOST_DRAFTER
    for g in graphs:
        assert g["verify"] == verify and g["draft_extend"] == draft
        assert g["draft"] == (draft if kind == "ngram" else REPLAY)
    if kind == "eagle3":  # the proposer drafted on the runner's static cache (the graphs bind it)
        assert runner.draft_cache is not None and drafter.cache is runner.draft_cache
        cycle = "cycle" if mode == "decode" else "draft"  # decode-mode verify: the whole cycle one graph
        assert _phase_graph(runner, cycle, 4).graph.replays == len(graphs)
        assert _phase_graph(runner, "draft_extend", 4, prompt=True).graph.replays == 1  # over the prompt
        assert not [r for (_, r) in runner.fallbacks if r != EAGER_EXTEND], runner.fallbacks


@given(st.integers(1, 5000))
def test_a_prefill_bucket_is_the_next_power_of_two_from_16(n):
    w = prefill_bucket(n)
    assert w >= max(n, 16) and w & (w - 1) == 0 and (w == 16 or w < 2 * n)


def test_a_small_target_captures_batched_prompts_past_4096_tokens(tiny):
    """A target under 1B parameters captures prefills up to 16,384 tokens (SmolLM2's 32 prompts of up to 512 ran
    eagerly at 4,096 and cost a quarter of each request): eight prompts padded to 1,024 replay (8,192 tokens), with
    the eager runner's tokens; an 8B target keeps 4,096, an MoE one 256."""
    from eaglelab.engine.runtime.cuda_graphs import PREFILL_TOKENS, SMALL_PREFILL_TOKENS, default_prefill_tokens

    assert default_prefill_tokens(134_515_008, moe=False) == SMALL_PREFILL_TOKENS == 16384
    assert default_prefill_tokens(8_030_261_248, moe=False) == PREFILL_TOKENS == 4096
    assert default_prefill_tokens(134_515_008, moe=True) == MOE_PREFILL_TOKENS
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(tiny, spec, None, max_len=1040, buckets=(8,))
    assert runner.prefill_tokens == SMALL_PREFILL_TOKENS
    eng = _engine(tiny, spec, None, runner)
    prompts = [[(i * 13 + r) % 200 + 1 for i in range(520 + 40 * r)] for r in range(8)]  # 520..800 tokens: width 1024
    assert eng.generate(prompts, 3).tokens == _engine(tiny, spec, None, EagerRunner(tiny)).generate(prompts, 3).tokens
    assert eng.observer.cycles[0].graph == {"prefill": REPLAY}


def test_prompts_replay_per_padded_width_and_long_ones_run_eager(tiny):
    """Prompts of 7 and 5 tokens share the width-16 graphs; 20 tokens capture width 32; 40 tokens (64 wide,
    above ``prefill_tokens``) run eagerly, by design (no warning). Every run's tokens == the eager runner's,
    for the speculative engine too (the drafter's extend over the prompt follows the prefill's choice)."""
    spec = SpecConfig("eagle3", num_steps=3, topk=1, cuda_graphs=True)
    drafter = _drafter(tiny, spec, "eagle3")
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=96, buckets=(1,), prefill_tokens=32)
    eng = _engine(tiny, spec, drafter, runner)
    ref = _engine(tiny, spec, _drafter(tiny, spec, "eagle3"), EagerRunner(tiny, drafter.net))
    long = [(i * 7) % 50 + 1 for i in range(40)]
    for prompt, status in ((PROMPTS[0], REPLAY), (PROMPTS[3], REPLAY), (long[:20], REPLAY), (long, EAGER_PREFILL)):
        eng.observer.cycles.clear()
        assert eng.generate([prompt], 6).tokens == ref.generate([prompt], 6).tokens
        assert eng.observer.cycles[0].graph == {"prefill": status}
    widths = sorted(g.inputs["ids"].shape[1] for k, g in runner._graphs.items() if k[1] == "prefill")
    assert widths == [16, 32]
    assert runner.fallbacks[("prefill", EAGER_PREFILL)] == 1 == runner.fallbacks[("draft_extend", EAGER_PREFILL)]
    assert not eng.observer.warnings


@pytest.mark.parametrize("spec", [SpecConfig(cuda_graphs=True),
                                  SpecConfig("eagle3", num_steps=2, topk=2, num_draft_tokens=4, cuda_graphs=True)])
def test_a_sampled_prefill_replays_the_eager_draws(tiny, spec):
    """Sampling: the prefill's first token comes from noise drawn outside the graph, so a replayed run
    and an eager one with the same seed draw the same tokens."""
    from eaglelab.engine.runtime.sampling import SamplingParams

    sampling = SamplingParams(temperature=0.9, top_k=20)
    drafter = _drafter(tiny, spec, "eagle3") if spec.enabled else None
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=64, buckets=(2,))
    ref = EagerRunner(tiny, drafter.net if drafter else None)
    outs = []
    for eng in (_engine(tiny, spec, drafter, runner), _engine(tiny, spec, _drafter(tiny, spec, "eagle3"), ref)):
        outs.append(eng.generate(PROMPTS[:2], 6, sampling, torch.Generator().manual_seed(11)).tokens)
    assert outs[0] == outs[1]
    assert _phase_graph(runner, "prefill", 2, prompt=True).graph.replays == 1


@pytest.mark.parametrize("one_graph, lookup, spill", [(True, 0, False), (False, 0, False), (True, 4, False),
                                                      (False, 4, False), (True, 4, True), (False, 4, True)])
def test_eagle3_tree_replay_matches_eager(tiny, one_graph, lookup, spill):
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, attention_mode="decode", cuda_graphs=True,
                      one_graph_cycle=one_graph, lookup_tokens=lookup, lookup_spill=spill)
    drafter = _drafter(tiny, spec, "eagle3")
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=64, buckets=(2,))
    out = _engine(tiny, spec, drafter, runner).generate(PROMPTS[1:3], 8)
    ref = _engine(tiny, spec, _drafter(tiny, spec, "eagle3"), EagerRunner(tiny, drafter.net)).generate(PROMPTS[1:3], 8)
    assert out.tokens == ref.tokens
    assert out.accept_lens == ref.accept_lens, "the same drafts: the static cache's history is the eager one's"
    for phase in ("cycle",) if one_graph else ("draft", "verify", "accept", "draft_extend", "advance"):
        assert _phase_graph(runner, phase, 2).graph.replays > 0, phase
    assert not any(k[1] == ("draft" if one_graph else "cycle") for k in runner._graphs)
    for phase in ("prefill", "draft_extend"):
        assert _phase_graph(runner, phase, 2, prompt=True).graph.replays == 1, phase


def test_batch_above_the_largest_bucket_runs_eager(tiny):
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(tiny, spec, None, max_len=64, buckets=(1, 2))
    eng = _engine(tiny, spec, None, runner)
    eng.generate(PROMPTS[:3], 3)
    assert eng.observer.cycles[1].graph == {"decode": "eager: batch 3 above the largest bucket 2"}
    assert runner.capture_stats == []  # nothing was needed


def test_a_run_longer_than_the_static_cache_runs_eager(tiny):
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(tiny, spec, None, max_len=16, buckets=(1,))
    eng = _engine(tiny, spec, None, runner)
    eng.generate(PROMPTS[:1], 12)  # needs 7 + 12 + 2 + 2 = 23 slots
    assert eng.observer.cycles[1].graph == {"decode": "eager: run needs 23 cache slots > graph capacity 16"}


def test_a_speculative_run_longer_than_the_static_cache_binds_no_loop_state(tiny):
    """Only a run on the static cache binds the loop state: a longer one (its ``out`` as wide as its own
    cache) runs its cycle eagerly (one phase: the advance in it too), and leaves no buffer nor graph of its width."""
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, attention_mode="decode", cuda_graphs=True)
    drafter = _drafter(tiny, spec, "eagle3")
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=32, buckets=(1,))
    eng = _engine(tiny, spec, drafter, runner)
    eng.generate(PROMPTS[:1], 4)  # on the static cache: the phases' graphs, the state's buffers
    graphs, buffers = set(runner._graphs), set(runner._state)
    for n in (30, 31):  # 7 + n + 2 * 5 + 2 slots > 32
        out = eng.generate(PROMPTS[:1], n)
        ref = _engine(tiny, spec, _drafter(tiny, spec, "eagle3"), EagerRunner(tiny, drafter.net)).generate(PROMPTS[:1], n)
        assert out.tokens == ref.tokens
    assert set(runner._graphs) == graphs and set(runner._state) == buffers
    # the whole cycle is one phase, on both caches: the run's own cache says why first
    assert runner._status["cycle"] == "eager: run needs 50 cache slots > graph capacity 32"


def test_pad_rows_are_reset_and_never_leak(tiny):
    """A batch of 1 in bucket 2 after a batch of 2: row 1 of the loop's static state is a pad row again
    (done: it emits nothing and never moves), and the decode graph reads no copied inputs at all."""
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(tiny, spec, None, max_len=64, buckets=(2,))
    eng = _engine(tiny, spec, None, runner)
    eng.generate(PROMPTS[:2], 4)
    out = eng.generate(PROMPTS[2:3], 4)
    assert _phase_graph(runner, "decode", 2).inputs == {}
    state = {key[0]: buf for key, buf in runner._state.items()}
    assert state["root"][1].tolist() == 0 and state["lengths"][1].tolist() == 0
    assert state["done"][1].tolist() is True and state["n_out"][1].tolist() == 0
    ref = _engine(tiny, spec, None, EagerRunner(tiny)).generate(PROMPTS[2:3], 4)
    assert out.tokens == ref.tokens


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_graphs_update_the_bound_loop_state_and_the_lagged_step_changes_nothing(tiny, kind):
    """Emulated graphs that emit and advance in-graph (the loop state bound, not copied), with the stop
    check a step late as on CUDA, give the eager tokens, stop reasons and cycles of a loop that stops
    at once; the bookkeeping phases replay."""
    algo = {"plain": "none", "eagle3": "eagle3"}[kind]
    spec = SpecConfig(algo, num_steps=3, topk=2, num_draft_tokens=5, attention_mode="decode", cuda_graphs=True)
    drafter = None if kind == "plain" else _drafter(tiny, spec, kind)
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=64, buckets=(1, 4))
    eng = Engine(tiny, eos_token_ids=(7,), drafter=drafter, spec=spec, runner=runner, stop_lag=1)
    ref_drafter = None if kind == "plain" else _drafter(tiny, spec, kind)
    ref = Engine(tiny, eos_token_ids=(7,), drafter=ref_drafter, spec=spec, stop_lag=0,
                 runner=EagerRunner(tiny, getattr(ref_drafter, "net", None)))
    for batch in (3, 1):
        out, want = eng.generate(PROMPTS[:batch], 10), ref.generate(PROMPTS[:batch], 10)
        assert (out.tokens, out.stop_reasons, out.cycles) == (want.tokens, want.stop_reasons, want.cycles)
        assert out.accept_lens == want.accept_lens
    phase = "decode" if kind == "plain" else "cycle"
    assert runner._status[phase] == REPLAY and not runner._failed, runner._failed
    assert _phase_graph(runner, phase, 4).graph.replays > 0


def test_a_phase_given_state_not_made_by_the_runner_runs_eagerly_and_says_why(tiny):
    """State tensors a graph would bind must be the runner's static buffers (make_state); others run eagerly."""
    runner = EmulatedRunner.for_engine(tiny, SpecConfig(cuda_graphs=True), None, max_len=16, buckets=(2,))
    cache = runner.make_cache(2, 16)

    def bump(x, n_out):
        n_out += 1
        return (x * 2,)

    x = torch.arange(4.0).view(2, 2)
    mine = {"n_out": torch.zeros(2, dtype=torch.long)}
    assert torch.equal(runner.phase("bump", bump, {"x": x}, state=mine)[0], x * 2)
    assert runner._status["bump"] == "eager: loop state not the graph runner's" and mine["n_out"].tolist() == [1, 1]
    bound = runner.make_state({"n_out": torch.tensor([5])}, cache)  # batch 1 in bucket 2: row 1 a pad row
    for _ in range(3):
        runner.phase("bump", bump, {"x": x[:1]}, state=bound)
    assert runner._status["bump"] == REPLAY and bound["n_out"].tolist() == [8]


# ---- GPU: real graphs ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "ngram", "eagle3", "eagle3-lookup"])
def test_cuda_graphs_give_the_eager_tokens(kind):
    model = build_scale_model("tiny", device="cuda", seed=3).model
    algo = {"plain": "none", "ngram": "ngram"}.get(kind, "eagle3")
    spec = SpecConfig(algo, num_steps=3, attention_mode="decode", cuda_graphs=True,
                      lookup_tokens=5 if kind == "eagle3-lookup" else 0)
    for batch in (1, 2, 3):
        drafter = None if kind == "plain" else _drafter(model, spec, kind)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=64, buckets=(1, 2, 4))
        eng = _engine(model, spec, drafter, runner)
        out = eng.generate(PROMPTS[:batch], 12)
        ref_drafter = None if kind == "plain" else _drafter(model, spec, kind)
        ref = _engine(model, spec, ref_drafter, EagerRunner(model, getattr(ref_drafter, "net", None)))
        assert out.tokens == ref.generate(PROMPTS[:batch], 12).tokens, f"batch {batch}"
        replayed = [v for c in eng.observer.cycles[1:] for v in c.graph.values()]
        assert REPLAY in replayed and not runner._failed, runner._failed
        assert len(eng.observer.captures) == len(runner.capture_stats) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_collection_during_capture_frees_no_other_graph_into_it():
    """An earlier engine's graphs, garbage in a reference cycle, and the collector set to run at nearly every
    allocation: the next runner's captures still succeed (a collection inside a capture freed such a graph, whose
    reset is illegal while a stream captures, and the phase fell back to eager)."""
    import gc

    model = build_scale_model("tiny", device="cuda", seed=3).model
    spec = SpecConfig(cuda_graphs=True)

    def serve():
        runner = CudaGraphRunner.for_engine(model, spec, None, max_len=64, buckets=(1, 2, 4))
        _engine(model, spec, None, runner).generate(PROMPTS[:3], 8)
        return runner

    old = serve()
    assert old._graphs and not old._failed
    old.loop = [old]  # only a collection frees it now
    del old
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        new = serve()
    finally:
        gc.set_threshold(*thresholds)
    assert new._graphs and not new._failed, new._failed


# ---- MLA targets: the cache is K-only (one compressed row per token, no V buffer) ------------------
@pytest.fixture(scope="module")
def mla():
    from eaglelab.engine.model.moe import kimi_like_config
    from tests.conftest import random_model

    model = random_model(kimi_like_config("cpu", num_hidden_layers=3, vocab_size=512), seed=3, std=0.1)
    assert model.config.mla is not None
    return model


def test_capture_restores_the_rows_of_a_k_only_mla_cache(mla):
    """Warm-up runs write into the static cache; a capture in the middle of a run (lazy) puts rows < b
    back as they were, whether the capture succeeds or fails, and never touches a V buffer it lacks."""
    runner = EmulatedRunner.for_engine(mla, SpecConfig(cuda_graphs=True), None, max_len=16, buckets=(1, 3))
    cache = runner.make_cache(2, 16)
    assert cache is runner.cache and cache.v is None and cache.k.shape[1] == 3
    cache.k.normal_()
    before = cache.k.clone()

    def scribble():  # what a warm-up run does: write the rows it runs on
        cache.k[:, :2].fill_(7.0)
        return (cache.k[0, :2, 0, 0, :1].clone(),)

    def broken():
        cache.k[:, :2].fill_(3.0)
        raise RuntimeError("operation not permitted when stream is capturing")

    runner._capture(("phase", "decode", 2, 1), "decode", 2, {}, scribble, (cache, None))
    assert torch.equal(cache.k, before) and ("phase", "decode", 2, 1) in runner._graphs
    runner._capture(("phase", "decode", 3, 1), "decode", 2, {}, broken, (cache,))
    assert torch.equal(cache.k, before)
    assert runner._failed[("phase", "decode", 3, 1)] == "eager: capture failed (operation not permitted when stream is capturing)"


def test_a_capture_that_compiles_ends_with_a_garbage_collection_timed_as_set_up(mla, monkeypatch):
    """The objects a compile leaves are collected inside the capture's set-up time, not by a collection the
    generation loop would trigger (a full one costs ~0.1-1 s, inside tok/s); a failed capture that compiled too.
    A capture that compiles nothing (a prompt width's eager prefill after the compiles) does not walk the whole
    heap again: no collection. Without compiled or Triton kernels there is nothing to collect: no collection."""
    import gc

    from dataclasses import replace

    from eaglelab.engine.model.layers import EAGER_KERNELS
    from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler

    calls = []
    collect = gc.collect

    def slow_collect(*args):
        if args:  # dynamo's own young-generation collection (gc.collect(1)) as it compiles: not the runner's
            return collect(*args)
        calls.append(args)  # a full collection, the runner's
        time.sleep(0.05)
        return 0

    monkeypatch.setattr(gc, "collect", slow_collect)
    phases = PhaseCompiler(CompileLog(None), backend="eager")  # dynamo's trace alone: a real first call on CPU
    runner = EmulatedRunner.for_engine(mla, SpecConfig(cuda_graphs=True), None, max_len=16, buckets=(1, 3),
                                       kernels=replace(EAGER_KERNELS, compiled=True, compile_phase=phases))
    cache = runner.make_cache(2, 16)
    read = lambda: (cache.k[0, :2, 0, 0, :1] * 2,)  # noqa: E731
    before = runner.setup_seconds
    first = runner._compiled("decode [b=2]", read)
    runner._capture(("phase", "decode", 2, 1), "decode", 2, {}, first, (cache, None))
    assert phases.made[0].tried and len(calls) == 1 and runner.setup_seconds - before >= 0.05
    runner._capture(("phase", "prefill", 2, 16), "prefill", 2, {}, read, (cache,))  # compiles nothing
    assert len(calls) == 1 and ("phase", "prefill", 2, 16) in runner._graphs

    def broken():
        raise RuntimeError("operation not permitted when stream is capturing")

    failing = runner._compiled("decode [b=3]", lambda: broken())
    runner._capture(("phase", "decode", 3, 1), "decode", 2, {}, failing, (cache,))
    assert len(calls) == 2 and runner.setup_seconds - before >= 0.1
    runner._capture(("phase", "decode", 3, 2), "decode", 2, {}, broken, (cache,))  # failed, compiled nothing
    assert len(calls) == 2 and ("phase", "decode", 3, 2) in runner._failed
    plain = EmulatedRunner.for_engine(mla, SpecConfig(cuda_graphs=True), None, max_len=16, buckets=(1, 3))
    plain._capture(("phase", "decode", 2, 1), "decode", 2, {}, read, (cache,))
    assert len(calls) == 2


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_mla_replay_matches_eager(mla, kind):
    """kimi-like shapes (MLA + MoE): the graph runner's replay gives the eager tokens, plain and speculative."""
    spec = SpecConfig("none" if kind == "plain" else "eagle3", num_steps=3, topk=1, attention_mode="decode", cuda_graphs=True)
    drafter = None if kind == "plain" else _drafter(mla, spec, kind)
    runner = EmulatedRunner.for_engine(mla, spec, drafter, max_len=64, buckets=(1, 2, 4))
    eng = _engine(mla, spec, drafter, runner)
    out = eng.generate(PROMPTS[:3], 8)
    ref_drafter = None if kind == "plain" else _drafter(mla, spec, kind)
    ref = _engine(mla, spec, ref_drafter, EagerRunner(mla, getattr(ref_drafter, "net", None))).generate(PROMPTS[:3], 8)
    assert out.tokens == ref.tokens
    assert runner.cache.v is None and runner.capture_stats, "the MLA cache was captured on"
    assert all(REPLAY in c.graph.values() for c in eng.observer.cycles)
    assert runner.prefill_tokens == MOE_PREFILL_TOKENS, "an MoE target captures short prompts only"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_cuda_graphs_on_an_mla_target_give_the_eager_tokens(mla, kind):
    """Real CUDA graphs over the K-only MLA cache (the kimi-like capture that failed on the H200)."""
    model = mla.to("cuda")
    try:
        spec = SpecConfig("none" if kind == "plain" else "eagle3", num_steps=3, attention_mode="decode", cuda_graphs=True)
        drafter = None if kind == "plain" else _drafter(model, spec, kind)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=64, buckets=(1, 2, 4))
        eng = _engine(model, spec, drafter, runner)
        out = eng.generate(PROMPTS[:3], 12)
        assert not runner._failed, runner._failed  # the prefill too: its MoE layers take the sync-free path
        assert all(REPLAY in c.graph.values() for c in eng.observer.cycles)
        ref_drafter = None if kind == "plain" else _drafter(model, spec, kind)
        ref = _engine(model, spec, ref_drafter, EagerRunner(model, getattr(ref_drafter, "net", None)))
        assert out.tokens == ref.generate(PROMPTS[:3], 12).tokens
    finally:
        mla.to("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_graph_keeps_alive_the_engine_tensors_it_reads():
    """The decode graph reads the capturing engine's EOS ids at their address; the bench builds a new
    Engine per run over one runner, so the graph must keep the first engine's tensor from being freed
    (and its memory reused) when that engine goes."""
    import gc
    import weakref

    model = build_scale_model("tiny", device="cuda", seed=3).model
    spec = SpecConfig(cuda_graphs=True)
    runner = CudaGraphRunner.for_engine(model, spec, None, max_len=64, buckets=(1,))
    first = Engine(model, eos_token_ids=(7,), spec=spec, runner=runner)
    want = first.generate(PROMPTS[:1], 12)
    eos = weakref.ref(first.eos)
    del first
    gc.collect()
    assert eos() is not None
    again = Engine(model, eos_token_ids=(7,), spec=spec, runner=runner).generate(PROMPTS[:1], 12)
    assert runner._status["decode"] == REPLAY and (again.tokens, again.stop_reasons) == (want.tokens, want.stop_reasons)
