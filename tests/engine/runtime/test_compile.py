"""torch.compile composed with the phase graphs: whole phases compiled per bucket are lossless (the
eager tokens; speculation == plain greedy), write the KV cache in place, are cached on disk, and what
cannot compile runs eagerly with its reason; the elementwise pieces of eager runs likewise."""

from __future__ import annotations

import os
import re

import pytest
import torch

from torch._inductor.utils import run_and_get_code

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.layers import EAGER_KERNELS, prefix_mask, rms_norm
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3, randomize_, scale_config
from eaglelab.engine.runtime.compile import CompiledOrEager, compile_report, compiled_kernels
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.engine.runtime.test_cuda_graphs import REPLAY, EmulatedRunner, Recorder

PROMPTS = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]

pytestmark = pytest.mark.usefixtures("one_thread")


def _spec_engine(model, spec, runner, observer=None):
    net, taps = random_eagle3(model, seed=5, draft_vocab=256)
    return Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner(net, taps), observer=observer)


@pytest.mark.slow  # inductor compiles the decode phase of a 4-layer model on the CPU (about a minute here)
def test_compiled_decode_phase_gives_the_eager_tokens(tmp_path, monkeypatch):
    """Plain greedy decoding, float32: the compiled decode phase (replayed as a graph) == eager decoding;
    the prefill replays a graph too (the prompts padded to width 16), captured but not compiled."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # unset again after the test
    model = build_scale_model("tiny", seed=3).model
    spec = SpecConfig(cuda_graphs=True, compile=True)
    kernels = compiled_kernels(tmp_path)
    runner = EmulatedRunner.for_engine(model, spec, None, max_len=64, buckets=(2,), kernels=kernels)
    eng = Engine(model, spec=spec, runner=runner, observer=Recorder())
    out = eng.generate(PROMPTS, 8)
    assert out.tokens == Engine(model, spec=spec, runner=EagerRunner(model)).generate(PROMPTS, 8).tokens
    seconds, reasons = compile_report(kernels)
    assert reasons == [] and seconds > 0
    assert [p.name for p in kernels.compile_phase.made] == ["decode [b=2]"]
    assert runner.kernels is EAGER_KERNELS, "inside a compiled phase the layers run their eager pieces"
    assert [c.graph for c in eng.observer.cycles] == [{"prefill": REPLAY}] + [{"decode": REPLAY}] * 7
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor"), "inductor's cache: the eaglelab cache"


@pytest.mark.slow  # five phases (draft, verify, accept, draft_extend, advance) compile on the CPU: a few minutes here
@pytest.mark.parametrize("one_graph, lookup", [(True, 0), (False, 0), (True, 4)],
                         ids=["one-graph-cycle", "graph-per-phase", "one-graph-cycle-lookup"])
def test_compiled_speculation_gives_plain_greedy_tokens(tmp_path, monkeypatch, one_graph, lookup):
    """EAGLE-3 greedy speculation with every phase compiled and replayed == plain greedy eager decoding;
    the draft's top-k in blocks of 64 (the 256-token draft vocabulary takes its two-stage path). As one
    graph per cycle, each of the five parts is compiled on its own (the graph between them times them)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr("eaglelab.engine.runtime.tree.TOP_K_CHUNK", 64)
    monkeypatch.setattr("eaglelab.engine.runtime.tree.TOP_K_ONE_PASS", 128)
    model = build_scale_model("tiny", seed=3).model
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, cuda_graphs=True, compile=True,
                      one_graph_cycle=one_graph, lookup_tokens=lookup)  # the lookup writes the drafter's history
    kernels = compiled_kernels(tmp_path)
    eng = _spec_engine(model, spec, lambda net, taps: EmulatedRunner.for_engine(
        model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(2,), kernels=kernels), Recorder())
    out = eng.generate(PROMPTS, 10)
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(PROMPTS, 10)
    assert out.tokens == plain.tokens
    assert compile_report(kernels)[1] == []
    parts = ["accept [b=2]", "advance [b=2]", "draft [b=2]", "draft_extend [b=2]", "verify [b=2]"]  # not the prompt's
    assert sorted(p.name for p in kernels.compile_phase.made) == [("cycle." if one_graph else "") + p for p in parts]
    spec_cycles = [c for c in eng.observer.cycles if c.kind == "spec"]
    assert all(v == REPLAY for c in eng.observer.cycles for v in c.graph.values())
    assert all(set(c.graph) == {"draft", "verify", "draft_extend"} for c in spec_cycles)
    assert all({"draft", "verify", "accept", "draft_extend"} <= set(c.phase_ms) for c in spec_cycles)


@torch.library.custom_op("eaglelab_test::attention", mutates_args=())
def _opaque_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)


@_opaque_attention.register_fake
def _(q, k, v, mask):
    return torch.empty_like(q)


class _OpaqueAttention:
    """An attention kernel the compiler cannot look into, as the decode attention op is on a GPU."""

    reason = None
    setup_seconds = 0.0

    def refusal(self, q, k, mask):
        return None if mask is not None else "no mask"

    def __call__(self, q, k, v, mask):
        return _opaque_attention(q, k, v, mask)


@pytest.mark.slow  # compiles a three-layer decode on the CPU twice (about a minute here)
@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-layer"])
def test_a_compiled_forward_builds_its_mask_once(tmp_path, monkeypatch, share):
    """Every layer's attention op reads one mask buffer, built once (``layers.shared``), with the eager outputs;
    without it (``SHARE_MASK`` off) inductor builds the mask again for each layer."""
    import eaglelab.engine.model.layers as layers

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(layers, "SHARE_MASK", share)
    cfg = ModelConfig.from_dict({**scale_config("tiny"), "num_hidden_layers": 3}, source="test")
    model = Transformer(cfg)
    randomize_(model, 4)
    cache = model.make_cache(1, 32, dtype=torch.float32, device="cpu")
    kernels = layers.Kernels(attention=_OpaqueAttention())

    def decode(root, lengths):
        slots = lengths[:, None]
        return model(root[:, None], slots, cache, slots, prefix_mask(slots, cache.max_len), kernels=kernels)[0]

    root, lengths = torch.tensor([3]), torch.tensor([6])
    with torch.inference_mode():
        ref = decode(root, lengths)
        cache.k.zero_()
        cache.v.zero_()
        out, (code,) = run_and_get_code(torch.compile(decode, fullgraph=True, dynamic=False), root, lengths)
    assert torch.allclose(out, ref, atol=1e-5)
    call = code.split("def call")[1]
    masks = re.findall(r"torch\.ops\.eaglelab_test\.attention\.default\([^\n]*?, (\w+)\)", call)
    assert len(masks) == 3, call
    assert (len(set(masks)) == 1) == share, masks
    assert call.count("torch.ops.eaglelab.shared.default(") == (1 if share else 0)


@pytest.mark.slow  # compiles a one-layer decode on the CPU (about half a minute here)
def test_compiled_forward_writes_the_kv_cache_in_place(tmp_path, monkeypatch):
    """The compiled forward scatters the new K/V into the cache buffers: no buffer of a cache layer's
    shape, no copy of the cache back into itself (writing through ``k[layer]`` compiled to both)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = ModelConfig.from_dict({**scale_config("tiny"), "num_hidden_layers": 2}, source="test")
    model = Transformer(cfg)
    randomize_(model, 3)
    cache = model.make_cache(2, 48, dtype=torch.float32, device="cpu")  # layer buffers [2, 2, 48, 16]

    def decode(root, lengths):
        slots = lengths[:, None]  # [B, 1]
        return model(root[:, None], slots, cache, slots, prefix_mask(slots, cache.max_len))[0]

    root, lengths = torch.tensor([3, 4]), torch.tensor([5, 7])
    with torch.inference_mode():
        ref = decode(root, lengths)
        k_ref = cache.k.clone()
        cache.k.zero_()
        out, (code,) = run_and_get_code(torch.compile(decode, fullgraph=True, dynamic=False), root, lengths)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(cache.k, k_ref, atol=1e-6)
    call = code.split("def call")[1]  # the generated host code: its buffers and kernel launches
    assert "assert_size_stride(arg" in call and "48, 16)" in call, "the cache buffers are inputs"
    assert not re.search(r"empty_strided\w*\(\([^)]*48, 16\)", call), "a buffer of a cache layer's size: a copy"
    assert ".copy_(" not in call and "aten.copy_" not in call


def test_a_phase_that_cannot_compile_runs_eagerly_in_its_graph_and_says_why(tmp_path):
    """A phase dynamo cannot trace in one graph (here: a host read) runs eagerly, still captured, with the reason."""
    logged = []
    kernels = compiled_kernels(tmp_path, logged.append)
    model = build_scale_model("tiny", seed=3).model
    runner = EmulatedRunner.for_engine(model, SpecConfig(cuda_graphs=True), None, max_len=16, buckets=(2,),
                                       kernels=kernels)
    runner.make_cache(2, 16)

    def phase(x):
        return (x * len(x.tolist()),)  # .tolist(): a graph break, not allowed in a whole-phase compile

    x = torch.arange(4.0).view(2, 2)
    (y,) = runner.phase("odd", phase, {"x": x})
    assert torch.equal(y, x * 2)
    (reason,) = compile_report(kernels)[1]
    assert reason.startswith("eager: odd [b=2] did not compile (") and logged[-1] == reason
    assert "compiling each phase" in logged[0]
    assert torch.equal(runner.phase("odd", phase, {"x": x + 1})[0], (x + 1) * 2)
    assert runner._status["odd"] == REPLAY and len(runner.capture_stats) == 1  # captured: the eager phase replays


def test_combo_kernels_reach_each_phase_s_inductor_options(tmp_path, monkeypatch):
    """``compile.COMBO_KERNELS`` turns inductor's combo kernels on for every compiled phase, not under --pdl unless
    ``COMBO_WITH_PDL``; an explicit ``combo`` wins; the PDL option and a mode keep their places beside it."""
    import eaglelab.engine.runtime.compile as C

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    seen = []
    monkeypatch.setattr(C, "CompiledOrEager", lambda name, fn, log=None, **options: seen.append(options) or fn)

    def options(pdl=False, combo=None, mode=None):
        kernels = C.compiled_kernels(tmp_path, pdl=pdl, combo=combo, mode=mode)
        kernels.compile_phase("decode [b=1]", lambda: None)
        return kernels.compile_phase.combo, seen[-1]

    monkeypatch.setattr(C, "COMBO_KERNELS", False)
    assert options() == (False, {"fullgraph": True, "dynamic": False})
    assert options(mode="max-autotune-no-cudagraphs")[1]["mode"] == "max-autotune-no-cudagraphs"
    monkeypatch.setattr(C, "COMBO_KERNELS", True)
    combo, got = options()
    assert combo and got["options"] == {"combo_kernels": True} and "mode" not in got
    monkeypatch.setattr(C, "COMBO_WITH_PDL", False)
    combo, got = options(pdl=True)
    assert not combo and got["options"] == {"triton.enable_pdl": True}
    monkeypatch.setattr(C, "COMBO_WITH_PDL", True)
    combo, got = options(pdl=True)
    assert combo and got["options"] == {"triton.enable_pdl": True, "combo_kernels": True}
    combo, got = options(combo=False)
    assert not combo and "options" not in got
    combo, got = options(combo=True, mode="max-autotune-no-cudagraphs")
    assert got["options"]["combo_kernels"] and got["options"]["max_autotune"] and "mode" not in got


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


# ---- GPU: real graphs around compiled phases ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "eagle3", "eagle3-lookup"])
def test_compiled_phases_inside_cuda_graphs_give_the_eager_tokens(kind, tmp_path, monkeypatch):
    """float32 on the GPU: every phase compiled (no fallback), captured and replayed == eager tokens;
    EAGLE-3 speculation (with a lookup branch too) == plain greedy."""
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = build_scale_model("tiny", device="cuda", seed=3).model
    kernels = compiled_kernels(tmp_path)
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(PROMPTS, 12)
    if kind == "plain":
        spec = SpecConfig(cuda_graphs=True, compile=True)
        runner = CudaGraphRunner.for_engine(model, spec, None, max_len=64, buckets=(1, 2), kernels=kernels)
        eng = Engine(model, spec=spec, runner=runner, observer=Recorder())
    else:
        spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, cuda_graphs=True, compile=True,
                          lookup_tokens=5 if kind == "eagle3-lookup" else 0)
        eng = _spec_engine(model, spec, lambda net, taps: CudaGraphRunner.for_engine(
            model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(1, 2), kernels=kernels), Recorder())
        runner = eng.runner
    assert eng.generate(PROMPTS, 12).tokens == plain.tokens
    alone = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(PROMPTS[:1], 12)
    assert eng.generate(PROMPTS[:1], 12).tokens == alone.tokens  # bucket 1: its own compiled phases
    assert compile_report(kernels)[1] == [] and not runner._failed, runner._failed
    assert all(v == REPLAY for c in eng.observer.cycles[1:] for v in c.graph.values())


@pytest.mark.parametrize("compile_prefill", [True, False])
def test_compile_prefill_compiles_the_prompts_phases_too(compile_prefill):
    """With ``compile_prefill`` the prompt's phases (the target's prefill, the drafter's extend over the prompt)
    are compiled whole like the cycle's parts (dynamo's trace, backend eager: fullgraph, no fallback), and the
    tokens are plain greedy's; without it they are captured uncompiled."""
    from dataclasses import replace

    from eaglelab.engine.model.layers import EAGER_KERNELS
    from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler

    torch._dynamo.reset()
    model = build_scale_model("tiny", seed=3).model
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, cuda_graphs=True, compile=True,
                      compile_prefill=compile_prefill)
    compiler = PhaseCompiler(CompileLog(None), backend="eager")
    kernels = replace(EAGER_KERNELS, compiled=True, compile_phase=compiler)
    eng = _spec_engine(model, spec, lambda net, taps: EmulatedRunner.for_engine(
        model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(2,), kernels=kernels), Recorder())
    out = eng.generate(PROMPTS, 10)
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(PROMPTS, 10)
    assert out.tokens == plain.tokens
    names = sorted(p.name for p in compiler.made)
    prompt = ["draft_extend [b=2]", "prefill [b=2]"]  # the drafter's extend over the prompt, the target's prefill
    assert all(p.reason is None for p in compiler.made), [p.reason for p in compiler.made]
    assert (set(prompt) <= set(names)) == compile_prefill
    assert {"cycle.verify [b=2]", "cycle.draft [b=2]"} <= set(names)
    assert all(v == REPLAY for c in eng.observer.cycles for v in c.graph.values())


@pytest.mark.parametrize("compile_prefill", [False, True])
def test_an_uncompiled_prompt_runs_the_compiled_pieces(compile_prefill):
    """Under a compiling graph runner the compiled phases' layers run the eager pieces (inductor fuses across them);
    a prompt captured uncompiled runs the session's compiled pieces instead (``runner.prompt_kernels``): the norms,
    rotary and SwiGLU of its prefill are the set's, not ~10 eager ops each. Compiled whole, it runs the eager pieces
    too. Tokens: plain greedy's either way (float32)."""
    from dataclasses import replace

    from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler

    torch._dynamo.reset()
    calls: list[tuple[int, ...]] = []

    def counted_norm(x, w, eps):  # stands in for the compiled RMSNorm piece
        calls.append(tuple(x.shape))
        return rms_norm(x, w, eps)

    model = build_scale_model("tiny", seed=3).model
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5, cuda_graphs=True, compile=True,
                      compile_prefill=compile_prefill)
    kernels = replace(EAGER_KERNELS, rms_norm=counted_norm, compiled=True,
                      compile_phase=PhaseCompiler(CompileLog(None), backend="eager"))
    eng = _spec_engine(model, spec, lambda net, taps: EmulatedRunner.for_engine(
        model, spec, Eagle3Drafter(net, spec, taps), max_len=64, buckets=(2,), kernels=kernels), Recorder())
    assert eng.runner.kernels.rms_norm is rms_norm and eng.runner.prompt_kernels.rms_norm is counted_norm
    assert eng.runner.prompt_kernels.compile_phase is None
    out = eng.generate(PROMPTS, 10)
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(PROMPTS, 10)
    assert out.tokens == plain.tokens
    prompt_norms = 2 * model.config.num_layers + 1  # two a layer and the final one, over the padded [2, 16] prompts
    if compile_prefill:
        assert calls == []
    else:  # the warm-up run and the capture's: each the whole prefill, nothing of the cycles
        assert len(calls) % prompt_norms == 0 and calls and all(c[:2] == (2, 16) for c in calls), calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_combo_kernels_give_the_same_tokens_on_cuda(tmp_path, monkeypatch):
    """bf16 on the GPU, compiled phases with our GEMV and decode attention, a one-graph speculative cycle with a
    lookup branch (its verify is the target's forward a decode runs, over more rows): inductor's combo kernels
    (``compile.COMBO_KERNELS``) give the same tokens and accepted lengths as without (they launch independent
    kernels together, the same maths in each); on a GPU with dependent launches (Hopper), with ``--pdl`` too."""
    from dataclasses import replace

    from eaglelab.engine.model import pdl
    from eaglelab.engine.model.decode_attention import TritonDecodeAttention
    from eaglelab.engine.model.gemv import TritonGemv
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from tests.conftest import random_model
    from tests.engine.runtime.test_speculative import CFG, TAPS, random_drafter
    from tests.engine.runtime.test_speculative import PROMPTS as SPEC_PROMPTS

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = random_model(CFG, seed=21).to("cuda", torch.bfloat16)
    net = random_drafter(model, 5, draft_vocab=CFG["vocab_size"]).to("cuda", torch.bfloat16)
    gemv, attention = TritonGemv(), TritonDecodeAttention()  # one tuner for both: the same tilings, the same sums
    spec = SpecConfig("eagle3", 3, 4, 12, cuda_graphs=True, compile=True, lookup_tokens=4)
    ways = [(False, False), (True, False)] + ([(True, True)] if pdl.refusal("cuda") is None else [])
    got = {}
    for combo, dependent in ways:  # (combo kernels, --pdl)
        kernels = replace(compiled_kernels(tmp_path, pdl=dependent, combo=combo), gemv=gemv, attention=attention)
        assert kernels.compile_phase.combo == combo
        drafter = Eagle3Drafter(net, spec, TAPS)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=160, buckets=(1,), kernels=kernels)
        out = Engine(model, drafter=drafter, spec=spec, runner=runner).generate(SPEC_PROMPTS[:1], 32)
        assert not runner._failed and compile_report(kernels)[1] == [], (runner._failed, compile_report(kernels))
        got[combo, dependent] = (out.tokens, out.accept_lens)
    for way in ways[1:]:
        assert got[way] == got[False, False], way
