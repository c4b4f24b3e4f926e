"""The MLA-layout EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``) on a real GPU, over a kimi-like MLA + MoE
target in float32: speculation under real CUDA graphs (a graph per phase, and the whole cycle as one
graph) and under the compiled one-graph cycle gives plain greedy decoding's tokens, and the eager
phase-by-phase speculative run's tokens and accepted lengths. Run on the H200 as one file::

    python -m pytest -q -m gpu tests/engine/runtime/test_mla_gpu.py      # about 1-2 minutes, most of it compiling
"""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import random_model
from tests.engine.model.test_eagle3_mla import TAPS, TCFG, YARN, mla_drafter
from tests.engine.runtime.test_cuda_graphs import REPLAY, Recorder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3], [7, 7, 7, 7, 8, 1]]
NEW = 24
SHAPES = {"chain": dict(num_steps=3, topk=1, num_draft_tokens=0), "tree": dict(num_steps=3, topk=2, num_draft_tokens=5)}


@pytest.fixture(scope="module")
def target():
    model = random_model(TCFG, seed=3).to("cuda")
    assert model.config.mla is not None and model.config.moe is not None
    return model


def drafter(target, spec: SpecConfig, **flags) -> Eagle3Drafter:
    """The same MLA drafter (seed 7, YaRN) for every run: a fresh network so no run sees another's cache."""
    net = mla_drafter(target.embed_tokens, rope_scaling=YARN, **flags).to("cuda")
    return Eagle3Drafter(net, spec, TAPS)


def eager_runs(target, spec: SpecConfig, flags: dict):
    """(plain greedy, the eager phase-by-phase speculative run), both without graphs."""
    plain = Engine(target, eos_token_ids=(2,), spec=SpecConfig(), runner=EagerRunner(target)).generate(PROMPTS, NEW)
    eager_spec = SpecConfig("eagle3", **{k: getattr(spec, k) for k in ("num_steps", "topk", "num_draft_tokens")})
    d = drafter(target, eager_spec, **flags)
    ref = Engine(target, eos_token_ids=(2,), drafter=d, spec=eager_spec, runner=EagerRunner(target, d.net)).generate(PROMPTS, NEW)
    assert ref.tokens == plain.tokens, "the eager MLA speculation is not lossless"
    return plain, ref


@pytest.mark.parametrize("flags", [{}, dict(fc_norm=True, norm_output=True)], ids=["eagle3", "eagle3.1"])
@pytest.mark.parametrize("one_graph", [False, True], ids=["graph-per-phase", "one-graph-cycle"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_cuda_graphs_give_plain_greedy_and_the_eager_accepted_lengths(target, shape, one_graph, flags):
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    spec = SpecConfig("eagle3", **SHAPES[shape], cuda_graphs=True, one_graph_cycle=one_graph)
    plain, ref = eager_runs(target, spec, flags)
    d = drafter(target, spec, **flags)
    runner = CudaGraphRunner.for_engine(target, spec, d, max_len=96, buckets=(1, 4))
    eng = Engine(target, eos_token_ids=(2,), drafter=d, spec=spec, runner=runner, observer=Recorder())
    out = eng.generate(PROMPTS, NEW)
    assert not runner._failed, runner._failed
    assert all(set(c.graph.values()) == {REPLAY} for c in eng.observer.cycles if c.kind == "spec")
    assert out.tokens == plain.tokens and out.stop_reasons == plain.stop_reasons
    assert out.accept_lens == ref.accept_lens


def test_compiled_one_graph_cycle_gives_plain_greedy(target, tmp_path, monkeypatch):
    """Every phase compiled (inductor) inside the one-graph cycle: no phase falls back to eager, and the
    tokens and accepted lengths are the eager run's (a tree, EAGLE-3.1 flags on)."""
    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    flags = dict(fc_norm=True, norm_output=True)
    spec = SpecConfig("eagle3", **SHAPES["tree"], cuda_graphs=True, compile=True, one_graph_cycle=True)
    plain, ref = eager_runs(target, spec, flags)
    kernels = compiled_kernels(tmp_path)
    d = drafter(target, spec, **flags)
    runner = CudaGraphRunner.for_engine(target, spec, d, max_len=96, buckets=(4,), kernels=kernels)
    eng = Engine(target, eos_token_ids=(2,), drafter=d, spec=spec, runner=runner, observer=Recorder())
    out = eng.generate(PROMPTS, NEW)
    seconds, eager_reasons = compile_report(kernels)
    assert eager_reasons == [], eager_reasons
    assert not runner._failed, runner._failed
    assert any(p.name.startswith("cycle.") for p in kernels.compile_phase.made)
    assert out.tokens == plain.tokens and out.accept_lens == ref.accept_lens
