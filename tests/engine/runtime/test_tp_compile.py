"""TP under --compile: collectives inside a compiled phase."""

from __future__ import annotations

import pytest
import torch


def test_a_compiled_phase_runs_its_collectives_untimed(tmp_path):
    """--compile under TP: a phase with an all-reduce compiles whole (fullgraph); the collective still
    sums, and neither the timing hook nor the arrival clock is traced into it."""
    import torch.distributed as dist

    from eaglelab.engine.core.tp_group import TPGroup

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        seen: list = []
        tp = TPGroup(rank=0, world_size=1, backend="nccl", hook=lambda *a: seen.append(a))
        tp.arrivals = []

        def step(x):
            y = x * 2
            tp.all_reduce(y, 0, "attn")
            return y + 1

        out = torch.compile(step, fullgraph=True, dynamic=False)(torch.ones(4))
        assert torch.equal(out, torch.full((4,), 3.0))
        assert seen == [] and tp.arrivals == []
    finally:
        dist.destroy_process_group()


class _CompilingRunner:
    """The eager runner with each phase compiled whole as the CUDA-graph runner compiles it under
    --compile (``fullgraph=True, dynamic=False``, one compile per phase and shape, an eager call first
    so lazy state is built outside the compiler), without the capture: CPU-runnable. ``backend``
    "eager" traces with dynamo (where graph breaks and untraceable calls show) and runs the traced
    graph without code generation."""

    def __init__(self, target, drafter, backend: str) -> None:
        from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler
        from eaglelab.engine.runtime.runner import EagerRunner

        self.eager = EagerRunner(target, drafter)
        self.compiler = PhaseCompiler(CompileLog(None), backend=backend)
        self.phases: dict[tuple, object] = {}

    def __getattr__(self, name):  # everything but phase(): the eager runner's
        return getattr(self.eager, name)

    def phase(self, name, fn, inputs, caches=(), variant=None, state=None, eager=None, compile=True):
        state = state or {}
        if eager is not None or not compile:  # as the graph runner: an eager or uncompiled phase
            return tuple(fn(**inputs, **state))
        key = (name, variant, tuple(id(c) for c in caches),
               tuple((k, tuple(v.shape), v.dtype) for k, v in {**inputs, **state}.items()))
        if key not in self.phases:
            tp = self.eager.target.tp
            kept, tp.arrivals = tp.arrivals, None
            before = {k: v.clone() for k, v in state.items()}
            fn(**inputs, **state)  # as the graph runner's warm-up (untimed): lazy state (fused weights) built eagerly
            for k, v in before.items():  # ... and, like its capture, leaving the loop's state as it was
                state[k].copy_(v)
            tp.arrivals = kept
            self.phases[key] = self.compiler(f"{name} {key[3]}", fn)
        return tuple(self.phases[key](**inputs, **state))


def _compiled_phases_rank(tp, backend: str):
    """This rank's tokens from eager and compiled-phase runs (plain and speculative), the phases
    that compiled, and every fallback reason."""
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.draft_registry import tree_spec

    torch._dynamo.reset()
    target = build_scale_model("tiny", tp=tp, seed=0).model
    net, taps = random_eagle3(target, seed=1)
    spec = tree_spec("eagle3", 3, 2, 6)
    prompts = [[1, 5, 9, 13, 2], [7, 3, 8, 4, 6]]
    out, seen, reasons = {}, set(), []
    for kind in ("plain", "spec"):
        drafter = Eagle3Drafter(net, spec, taps) if kind == "spec" else None
        kw = {"drafter": drafter, "spec": spec} if drafter else {}
        eager = Engine(target, **kw).generate(prompts, 6).tokens
        runner = _CompilingRunner(target, net if drafter else None, backend)
        drafter = Eagle3Drafter(net, spec, taps) if kind == "spec" else None
        kw = {"drafter": drafter, "spec": spec} if drafter else {}
        tp.arrivals = []  # as the bench's observed call: the probe's clocks on
        compiled = Engine(target, runner=runner, **kw).generate(prompts, 6).tokens
        outside = len(tp.arrivals)  # collectives timed outside compiled phases (the eager prefill's)
        tp.arrivals = None
        out[kind] = (eager, compiled, outside)
        seen |= {p.name.split(" ")[0] for p in runner.compiler.made}
        reasons += [p.reason for p in runner.compiler.made if p.reason]
    return out, sorted(seen), reasons


def test_tp2_phases_compile_whole_on_every_rank():
    """Two gloo ranks, the tiny model: decode, verify, accept, draft, draft_extend and advance each compile
    whole (fullgraph, static shapes) with the target's all-reduces and logits all-gather inside, no
    phase falls back to eager, and the compiled runs give the eager runs' tokens on every rank.
    Only the eager prefill's collectives reach the probe's clock (2 per layer + the gather)."""
    from tests.tp_harness import RankFailure, spawn_ranks

    ranks = spawn_ranks(_compiled_phases_rank, 2, "eager", timeout_s=300.0)
    for rank, got in enumerate(ranks):
        assert not isinstance(got, RankFailure), got
        out, seen, reasons = got
        assert reasons == [], (rank, reasons)
        assert seen == ["accept", "advance", "decode", "draft", "draft_extend", "verify"], seen
        for kind, (eager, compiled, outside) in out.items():
            assert compiled == eager, (rank, kind)
            assert outside == 9, (rank, kind, outside)  # tiny: 4 layers x 2 + the head's gather, prefill only
    assert ranks[0][0] == ranks[1][0]


def _compiled_graphs_rank(tp, cache_root: str):
    """NCCL: plain and speculative runs with every phase compiled whole inside its CUDA graph. ->
    (tokens per run, each cycle phase's most common graph status, the compile fallbacks)."""
    from pathlib import Path

    from eaglelab.bench.harness import PhaseCollector
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.draft_registry import tree_spec

    dev = torch.device("cuda", tp.local_rank)
    target = build_scale_model("tiny", device=dev, dtype=torch.bfloat16, tp=tp, seed=0).model
    net, taps = random_eagle3(target, seed=1)
    kernels = compiled_kernels(Path(cache_root))
    prompts = [[1, 5, 9, 13, 2], [7, 3, 8, 4, 6]]
    out, status = {}, {}
    for kind in ("plain", "spec"):
        spec = (tree_spec("eagle3", 3, 2, 6, cuda_graphs=True, compile=True) if kind == "spec"
                else SpecConfig(cuda_graphs=True, compile=True))
        drafter = Eagle3Drafter(net, spec, taps) if kind == "spec" else None
        runner = CudaGraphRunner.for_engine(target, spec, drafter, max_len=128, buckets=(2,), kernels=kernels)
        col = PhaseCollector()
        out[kind] = Engine(target, drafter=drafter, spec=spec, observer=col, runner=runner).generate(prompts, 6).tokens
        status[kind] = col.graph_summary()
    return out, status, compile_report(kernels)[1]


@pytest.mark.gpu
def test_tp_phases_compile_inside_their_graphs_on_nccl(tmp_path):
    """NCCL ranks (2 GPUs if there, else 1), bf16: with --compile every phase of a plain and a
    speculative run compiles whole and replays from its graph (no phase but the prefill runs eagerly,
    no compile falls back), and the ranks emit the same tokens."""
    from tests.tp_harness import RankFailure, spawn_ranks

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    world = min(2, torch.cuda.device_count())
    ranks = spawn_ranks(_compiled_graphs_rank, world, str(tmp_path), backend="nccl", timeout_s=400)
    for got in ranks:
        assert not isinstance(got, RankFailure), got
        out, status, reasons = got
        assert reasons == [], reasons
        assert status["plain"] == {"decode": "replay"}, status
        assert status["spec"] == {p: "replay" for p in ("draft", "verify", "draft_extend")}, status
    assert all(got[0] == ranks[0][0] for got in ranks)
