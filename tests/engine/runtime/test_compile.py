"""torch.compile of the layers' elementwise work: lossless (the eager tokens), composed with phase
graphs, cached on disk, and a compiler failure falls back to eager with its reason."""

from __future__ import annotations

import os

import pytest
import torch

from eaglelab.engine.model.layers import EAGER_KERNELS, rms_norm
from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
from eaglelab.engine.runtime.compile import CompiledOrEager, compile_report, compiled_kernels
from eaglelab.engine.runtime.drafters import Eagle3Proposer
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.engine.runtime.test_cuda_graphs import REPLAY, EmulatedRunner, Recorder

PROMPTS = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # inductor compiles three small kernels on the CPU (about a minute here)
def test_compiled_kernels_give_the_eager_tokens_inside_phase_graphs(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # unset again after the test
    model = build_scale_model("tiny", seed=3).model
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, cuda_graphs=True, compile=True)
    net, taps = random_eagle3(model, seed=5, draft_vocab=256)
    ref = Engine(model, drafter=Eagle3Proposer(net, spec, taps), spec=spec, runner=EagerRunner(model, net))
    kernels = compiled_kernels(tmp_path)
    runner = EmulatedRunner.for_engine(model, spec, Eagle3Proposer(net, spec, taps), max_len=64, buckets=(2,),
                                       kernels=kernels)
    eng = Engine(model, drafter=Eagle3Proposer(net, spec, taps), spec=spec, runner=runner, observer=Recorder())
    out = eng.generate(PROMPTS, 8)
    assert out.tokens == ref.generate(PROMPTS, 8).tokens
    seconds, reasons = compile_report(kernels)
    assert reasons == [] and seconds > 0
    assert all(v == REPLAY for c in eng.observer.cycles[1:] for v in c.graph.values())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor"), "inductor's cache: the eaglelab cache"


def test_a_piece_that_cannot_compile_runs_eagerly_and_says_why():
    logged = []
    piece = CompiledOrEager("rms_norm", rms_norm, logged.append)

    def broken(*args):
        raise RuntimeError("no C compiler found\nmore detail")

    piece.compiled = broken
    x, w = torch.randn(2, 3, 8), torch.rand(8)
    assert torch.equal(piece(x, w, 1e-6), rms_norm(x, w, 1e-6))
    assert piece.reason == "eager: rms_norm did not compile (RuntimeError: no C compiler found)"
    assert logged[-1] == piece.reason and "compiling" in logged[0]
    assert torch.equal(piece(x, w, 1e-6), rms_norm(x, w, 1e-6))  # stays eager, no second attempt


def test_fused_projections_follow_their_weights():
    """q/k/v and gate/up run as one matmul each; a weight changed in place or replaced is seen."""
    model = build_scale_model("tiny", seed=3).model
    attn = model.layers[0].self_attn
    x = torch.randn(2, 3, model.config.hidden_size)
    with torch.no_grad():
        q, k, v = attn.qkv(x)
        assert torch.allclose(q, attn.q_proj(x), atol=1e-6) and torch.allclose(v, attn.v_proj(x), atol=1e-6)
        attn.k_proj.weight.mul_(2.0)
        assert torch.allclose(attn.qkv(x)[1], 2 * k, atol=1e-5)
        attn.v_proj.weight = torch.nn.Parameter(torch.zeros_like(attn.v_proj.weight))
        assert attn.qkv(x)[2].abs().sum() == 0
    grads = attn.qkv(x)  # gradients on: the projections run separately, on their own parameters
    grads[0].sum().backward()
    assert attn.q_proj.weight.grad is not None
    assert EAGER_KERNELS.compiled is False


def test_fused_projections_of_inference_tensors():
    """Weights made under inference_mode keep no version counter: the fused matmul still runs."""
    with torch.inference_mode():
        model = build_scale_model("tiny", seed=3).model
        x = torch.randn(1, 2, model.config.hidden_size)
        q, _, _ = model.layers[0].self_attn.qkv(x)
        assert torch.allclose(q, model.layers[0].self_attn.q_proj(x), atol=1e-6)
