"""The fused draft step (``engine/model/draft_step.py``): where it runs, its kernels against the reference under
Triton's interpreter, the compiled engine taking it, its kernels through the compiler for sm_90, and on CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglelab.engine.model import draft_step
from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3

ROOT = Path(__file__).resolve().parents[3]


def has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


needs_triton = pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")


def _interpreted(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.engine.model.interpreted_draft_step", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_refusal_names_why_a_step_runs_the_reference(monkeypatch):
    """Eager (as every CPU forward) the reference runs; the switch, the layouts and the row count say so too."""
    model = build_scale_model("tiny", seed=3).model
    net, _ = random_eagle3(model, seed=5, draft_vocab=300)
    x = torch.zeros(1, 1, net.config.hidden_size)
    assert "not a compiled phase on CUDA" in draft_step.refusal(net, 4, x)
    monkeypatch.setattr(draft_step, "_loaded", True)
    monkeypatch.setattr(draft_step, "compiled_on_cuda", lambda t: True)
    assert draft_step.refusal(net, 4, x) is None
    assert draft_step.refusal(net, 17, x) == "17 rows > 16"
    assert draft_step.refusal(net, 4, x.to(torch.float64)) == "dtype torch.float64"
    monkeypatch.setenv("EAGLELAB_FUSED_DRAFT", "0")
    assert draft_step.refusal(net, 4, x) == "off (EAGLELAB_FUSED_DRAFT=0)"


@needs_triton
def test_the_ops_register_where_triton_is():
    assert draft_step.load(), draft_step.reason
    assert all(hasattr(torch.ops.eaglelab, op) for op in ("draft_qkv", "draft_rows", "draft_head"))


@needs_triton
def test_kernels_match_the_reference_under_the_triton_interpreter():
    """tests/engine/model/interpreted_draft_step.py: 30 hypothesis cases (shapes no multiple of a block, gathered
    parents, a tree mask): the cache's K/V, the state handed on, the candidates' scores and tokens."""
    done = _interpreted("30")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = eval(done.stdout.split("seen", 1)[1].strip().splitlines()[0])  # noqa: S307 - our own dict's repr
    assert seen["cases"] == 30 and seen["rows_compared"] >= 30 and seen["gather"] >= 5, seen


@needs_triton
def test_compiled_speculation_with_the_fused_step_gives_plain_greedy_tokens_under_the_interpreter():
    """The engine's compiled one-graph cycle taking the fused step as on CUDA (the kernels interpreted): EAGLE-3
    greedy speculation (float32) == plain greedy eager decoding."""
    done = _interpreted("engine")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.split()[-2] == "engine", done.stdout[-500:]


@needs_triton
def test_kernels_compile_for_hopper():
    """Each kernel and ending through Triton's compiler for sm_90, no GPU needed (the interpreter runs code the
    compiler rejects), at the shipped drafter's shapes, bf16 and float32."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from eaglelab.engine.model import draft_step_kernels as K

    def compile_(fn, types: dict[str, str], const: dict) -> None:
        names = list(inspect.signature(fn.fn).parameters)
        sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
        for n in ("eps", "factor"):
            if n in sig:
                sig[n] = "fp32"
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]

    bf16 = {n: "*bf16" for n in ("emb_ptr", "feat_ptr", "in_w_ptr", "hid_w_ptr", "w_ptr", "q_ptr", "k_ptr", "v_ptr",
                                 "x_ptr", "nw_ptr", "res_ptr", "y_ptr")}
    ints = {n: "*i64" for n in ("tok_ptr", "par_ptr", "pos_ptr", "slot_ptr", "idx_ptr", "res_idx_ptr")}
    other = {"freq_ptr": "*fp32", "val_ptr": "*fp32", "ix_ptr": "*i32", "peak_ptr": "*fp32", "mass_ptr": "*fp32"}
    types = bf16 | ints | other
    for bm, precision in ((16, "tf32"), (16, "ieee")):
        compile_(K.qkv_rope_kernel, types, {"D": 64, "BM": bm, "PAIRS": 16, "BLOCK_V": 16, "BLOCK_K": 128, "STAGES": 3,
                                            "PRECISION": precision})
        for epi, norm, gather, res_gather in ((1, False, False, True), (2, True, False, False),
                                              (1, False, False, False), (3, True, False, False)):
            compile_(K.rows_kernel, types, {"NORM": norm, "GATHER": gather, "EPI": epi, "RES_GATHER": res_gather,
                                            "TOPK": 4 if epi == 3 else 1, "KP": 4 if epi == 3 else 1, "BM": bm,
                                            "BLOCK_N": 64 if epi == 3 else 16, "BLOCK_K": 128, "STAGES": 3,
                                            "PRECISION": precision})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_step_on_cuda_matches_the_reference_at_the_shipped_drafters_shape():
    """bf16 on CUDA, SmolLM2's drafter shape (H 576, 9/3 heads of 64, MLP 1,536, 12,288-token draft vocabulary),
    random weights, 4 frontier rows over a 300-slot prefix: the K/V written, the state handed on and the candidates'
    scores agree to bf16 rounding, and the candidates' tokens in nearly every row."""
    from eaglelab.engine.core.kv_cache import KVCache
    from eaglelab.engine.runtime import cycle_ops
    from eaglelab.engine.runtime.tree import expand_step

    assert draft_step.load() and cycle_ops.load()
    dev, B, K, F, S = torch.device("cuda"), 1, 4, 4, 512
    model = build_scale_model("smollm2-135m", seed=0).model
    net, _ = random_eagle3(model, seed=1, draft_vocab=12288)
    net = net.to(dev, torch.bfloat16)
    net.embed.to(dev, torch.bfloat16)
    gen = torch.Generator(device=dev).manual_seed(0)
    H = net.config.hidden_size
    lengths = torch.tensor([300], device=dev)
    tokens = torch.randint(0, net.config.vocab_size, (B, K), device=dev, generator=gen)
    parent = torch.randint(0, F, (B, K), device=dev, generator=gen)
    hidden = torch.randn(B, F, H, device=dev, generator=gen, dtype=torch.bfloat16)
    positions, slots = (lengths + 2)[:, None].expand(B, K), lengths[:, None] + 8 + torch.arange(K, device=dev)
    mask = torch.arange(S, device=dev)[None, None, :] < lengths[:, None, None]
    mask = mask.expand(B, K, S).clone()
    mask[0, torch.arange(K), slots[0]] = True
    scores = -torch.rand(B, K, device=dev, generator=gen)
    caches = [KVCache(1, B, net.config.num_kv_heads, S, net.config.head_dim, dtype=torch.bfloat16, device=dev)
              for _ in range(2)]
    for cache in caches:
        cache.k.copy_(torch.randn(cache.k.shape, device=dev, generator=gen.manual_seed(3)))
        cache.v.copy_(torch.randn(cache.v.shape, device=dev, generator=gen.manual_seed(4)))
    draft_step.prepare(net)
    with torch.no_grad():
        feats = hidden.gather(1, parent[..., None].expand(-1, -1, H))
        ref_hidden, ref_logits = net(tokens, feats, positions, caches[0], slots, mask)
        ref = expand_step(scores, ref_logits, K)
        ours, blocks = draft_step.forward(net, tokens, hidden, parent, positions, caches[1], slots, mask,
                                          type("NoKernels", (), {"attention": None})())
        tok, cand, _ = cycle_ops.tree_select(scores, blocks, K)
    torch.testing.assert_close(caches[1].k.float(), caches[0].k.float(), atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(caches[1].v.float(), caches[0].v.float(), atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(ours.float(), ref_hidden.float(), atol=0.1, rtol=3e-2)
    torch.testing.assert_close(cand, ref.scores.float(), atol=5e-2, rtol=2e-2)
    assert (tok == ref.tokens).float().mean() >= 0.85, (tok, ref.tokens)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_captured_speculation_with_the_fused_step_is_plain_greedy_on_cuda(tmp_path, monkeypatch):
    """float32 on CUDA, compiled phases in CUDA graphs, the one-graph cycle: each draft step fused, and greedy
    speculation's tokens are plain greedy decoding's."""
    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig

    traced = []
    fused = draft_step.forward
    monkeypatch.setattr(draft_step, "forward", lambda *a, **k: traced.append(1) or fused(*a, **k))
    dev = torch.device("cuda")
    model = build_scale_model("tiny", seed=3).model.to(dev)
    net, taps = random_eagle3(model, seed=5, draft_vocab=300)
    net = net.to(dev)
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    spec = SpecConfig("eagle3", num_steps=4, topk=4, num_draft_tokens=12, cuda_graphs=True, compile=True)
    kernels = compiled_kernels(tmp_path)
    drafter = Eagle3Drafter(net, spec, taps)
    runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=96, buckets=(2,), kernels=kernels)
    out = Engine(model, drafter=drafter, spec=spec, runner=runner).generate(prompts, 24)
    assert compile_report(kernels)[1] == [], compile_report(kernels)[1]
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 24)
    assert out.tokens == plain.tokens
    assert traced, "no draft step took the fused kernels"
