"""The Triton decode attention (engine/model/decode_attention.py): which calls take it and why the others
do not, how a call is cut (plan), that every attention of a decode, a verify and a draft step reaches it
through ``Kernels.attention`` while prefill keeps SDPA, that without Triton it is off with a reason and the
forward is unchanged; the kernel itself against SDPA under Triton's interpreter (CPU, where Triton is
installed: hypothesis over shapes and masks) and on CUDA (``gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eaglelab.engine.model import decode_attention as A
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels, attend
from eaglelab.engine.runtime.compile import compile_report
from tests.conftest import assert_compiles_and_captures, has_triton, random_model, tiny_config

ROOT = Path(__file__).resolve().parents[3]


class RecordingAttention:
    """A stand-in for CPU tests: takes every call the real kernel's ``refusal`` would take but for the device
    and the dtype (float32 models here), computes SDPA and records (T, S, NH, KVH) per call, so the routing
    is checked without a GPU."""

    reason = None
    setup_seconds = 0.5

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, int]] = []

    def refusal(self, q, k, mask):
        why = A.refusal(q.half(), k.half(), mask)
        return None if why is not None and why.startswith("not CUDA") else why

    def __call__(self, q, k, v, mask):
        assert mask.shape == (q.shape[0], q.shape[2], k.shape[2]), (q.shape, k.shape, mask.shape)
        self.calls.append((q.shape[2], k.shape[2], q.shape[1], k.shape[1]))
        return A.sdpa(q, k, v, mask)


# ---- which calls take it ------------------------------------------------------------------------
@torch.no_grad()
def test_refusal_names_each_reason_in_order():
    """Example: q [1, 4, 1, 64] bf16 over k [1, 2, 100, 64] under a [1, 1, 100] bool mask on the CPU is refused
    only for the device; no mask, 17 rows, float32, head dim 80, 5 heads over 2, a float mask come first."""
    q = torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 100, 64, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 100, dtype=torch.bool)
    assert A.refusal(q, k, mask) == "not CUDA (device cpu)"
    assert A.refusal(q, k, mask, unavailable="no triton") == "no triton"
    assert A.refusal(q, k, None) == "no mask (a causal prefill: SDPA's job)"
    q65 = torch.zeros(1, 4, 65, 64, dtype=torch.bfloat16)
    assert A.refusal(q65, k, torch.ones(1, 65, 100, dtype=torch.bool)) == "65 query rows (the decode attention takes 1..64)"
    q64 = torch.zeros(1, 4, 64, 64, dtype=torch.bfloat16)
    assert A.refusal(q64, k, torch.ones(1, 64, 100, dtype=torch.bool)) == "not CUDA (device cpu)", "64 rows: taken"
    assert "dtypes torch.float32/torch.float32" in A.refusal(q.float(), k.float(), mask)
    assert "dtypes torch.float16/torch.bfloat16" in A.refusal(q.half(), k, mask)
    assert A.refusal(torch.zeros(1, 4, 1, 80, dtype=torch.bfloat16), torch.zeros(1, 2, 100, 80, dtype=torch.bfloat16),
                     mask) == "head dim 80 (the decode attention takes 16, 32, 64, 128, 256)"
    assert A.refusal(torch.zeros(1, 5, 1, 64, dtype=torch.bfloat16), k, mask) == "5 query heads over 2 KV heads (not whole groups)"
    assert A.refusal(q, k, mask.float()).startswith("mask torch.float32 (1, 1, 100)")
    assert A.refusal(q, k, mask[:, :, :50]).startswith("mask torch.bool (1, 1, 50) (expected bool (1, 1, 100))")
    with torch.enable_grad():
        assert A.refusal(q, k, mask) == "gradients on (the decode attention has no backward)"


def test_plan_cuts_the_cache_for_about_one_program_per_sm():
    """132 SMs (an H200). 8B decode (8 KV heads, 4 query rows, D 128: 8 warps) at bs 1: 128 slots = 2 blocks
    of 64 -> one split (no merge); 2048 slots -> min(ceil(132 / 8) = 17, 32 blocks, 16) = 16 splits; bs 8 ->
    ceil(132 / 64) = 3. SmolLM2 (3 KV heads, D 64: 4 warps) at bs 1 over 1024 slots: min(44, 16 blocks, 16)
    = 16; 200 slots (4 blocks): 4. An 8B verify (D 128) of 16 over 4 heads (64 rows, one program): blocks of 64
    slots; of 24 (96 rows: two programs of rows): blocks of 128, splits a power of two near 132 / (bs x 8 x 2):
    8 at bs 1, 1 at bs 8. SmolLM2's verify of 24 (72 rows, D 64): blocks of 32, splits per head as a decode's.
    The H200 sweep behind these cuts: benchmarks/results/h200_2026-12-04/attn."""
    assert A.plan(1, 8, 128, 132, rows=4, head_dim=128) == A.AttnPlan(64, 1, 8)
    assert A.plan(1, 8, 2048, 132, rows=4, head_dim=128) == A.AttnPlan(64, 16, 8)
    assert A.plan(8, 8, 2048, 132, rows=4, head_dim=128) == A.AttnPlan(64, 3, 8)
    assert A.plan(1, 3, 1024, 132, rows=3, head_dim=64) == A.AttnPlan(64, 16, 4)
    assert A.plan(1, 3, 200, 132, rows=3, head_dim=64) == A.AttnPlan(64, 4, 4)
    assert A.plan(1, 8, 2048, 132, rows=64, head_dim=128) == A.AttnPlan(64, 16, 8)
    assert A.plan(8, 8, 2048, 132, rows=64, head_dim=128) == A.AttnPlan(64, 2, 8), "132 / 64 -> 2"
    assert A.plan(1, 8, 128, 132, rows=64, head_dim=128) == A.AttnPlan(64, 1, 8), "2 blocks of 64: one split"
    assert A.plan(1, 8, 2048, 132, rows=96, head_dim=128) == A.AttnPlan(128, 8, 8), "132 / 16 -> 8"
    assert A.plan(8, 8, 2048, 132, rows=96, head_dim=128) == A.AttnPlan(128, 1, 8), "132 / 128 -> 1"
    assert A.plan(1, 8, 2048, 132, rows=256, head_dim=128) == A.AttnPlan(128, 4, 8), "4 row blocks: 132 / 32 -> 4"
    assert A.plan(1, 8, 640, 132, rows=96, head_dim=128) == A.AttnPlan(128, 4, 8), "5 blocks: at most 4 (a power of 2)"
    assert A.plan(1, 3, 2048, 132, rows=72, head_dim=64) == A.AttnPlan(32, 16, 4)
    assert A.plan(8, 3, 2048, 132, rows=72, head_dim=64) == A.AttnPlan(32, 6, 4)
    assert A.plan(1, 4, 2048, 132, rows=96, head_dim=256) == A.AttnPlan(32, 16, 8), "D 256: not swept, as before"
    assert A.plan(1, 8, 64, 132, rows=64, head_dim=64) == A.AttnPlan(32, 1, 4), "2 blocks of 32: one split"
    assert A.plan(64, 8, 4096, 132).splits == 1, "enough programs without splitting"
    for B, KVH, S in ((1, 1, 1), (3, 2, 65), (16, 8, 100_000)):
        p = A.plan(B, KVH, S, 132)
        assert 1 <= p.splits <= max(1, -(-S // p.block_s)), (B, KVH, S, p)


# ---- without Triton --------------------------------------------------------------------------
def _no_triton():
    raise ImportError("No module named 'triton'")


@torch.no_grad()
def test_without_triton_it_is_off_with_a_reason_and_sdpa_runs(monkeypatch):
    monkeypatch.setattr(A, "load_op", _no_triton)
    attention = A.TritonDecodeAttention()
    assert attention.reason == "Triton decode attention unavailable (ImportError: No module named 'triton')"
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 20, 16, generator=g), torch.randn(2, 2, 20, 16, generator=g)
    mask = torch.rand(2, 3, 20, generator=g) < 0.5
    mask[..., 0] = True
    assert attention.refusal(q, k, mask) == attention.reason
    expected = attend(q, k, v, mask)
    assert torch.equal(attend(q, k, v, mask, attention), expected), "the forward without it, exactly"
    assert torch.equal(attention(q, k, v, mask), expected), "called anyway: SDPA"
    assert compile_report(Kernels(attention=attention)) == (0.0, [attention.reason])


# ---- the first eager call's check ----------------------------------------------------------------
def _inputs(T: int = 3):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, T, 16, generator=g).half()
    k, v = torch.randn(2, 2, 2, 40, 16, generator=g).half()
    mask = torch.rand(2, T, 40, generator=g) < 0.5
    mask[:, 1] = False  # a row with nothing to attend to: SDPA's NaN there is not held against the kernel
    return q, k, v, mask


@torch.no_grad()
def test_first_eager_call_per_shape_checks_the_kernel_then_trusts_it(monkeypatch):
    """The op stood in by SDPA itself (zeros where a row sees nothing, as the kernel): the first call of shape
    (T 3, D 16, group 2) runs it twice (check, then the call), later calls once; another T is checked anew."""
    monkeypatch.setattr(A, "triton_unavailable", lambda: None)
    calls = []

    def op(q, k, v, mask, cut):
        calls.append((q.shape[2], tuple(cut)))
        return A.sdpa(q.float(), k.float(), v.float(), mask).nan_to_num().to(q.dtype)

    monkeypatch.setattr(A, "run_op", op)
    attention = A.TritonDecodeAttention(sms=132)
    q, k, v, mask = _inputs()
    out = attention(q, k, v, mask)
    assert attention.reason is None and attention.checked == {(3, 16, 2)} and len(calls) == 2
    assert calls[0][1] == tuple(A.plan(2, 2, 40, 132, rows=6, head_dim=16)) == (64, 1, 4)
    attention(q, k, v, mask)
    assert len(calls) == 3, "checked once per shape"
    attention(*_inputs(T=2))
    assert len(calls) == 5 and attention.checked == {(3, 16, 2), (2, 16, 2)}
    assert torch.equal(out, op(q, k, v, mask, A.AttnPlan(64, 1, 4)))


@pytest.mark.parametrize("wrong, reason", [
    (lambda out: out + 1.0, "eager: Triton decode attention disagreed with SDPA (T 3, D 16: max |error| 1 > "),
    (None, "eager: Triton decode attention failed (T 3, D 16: RuntimeError: out of resources: shared memory)")])
@torch.no_grad()
def test_a_kernel_that_disagrees_or_fails_is_switched_off_for_good(monkeypatch, wrong, reason):
    """Off with the reason (logged once), this call and every later one on SDPA, the op never called again."""
    monkeypatch.setattr(A, "triton_unavailable", lambda: None)
    calls = []

    def op(q, k, v, mask, cut):
        calls.append(1)
        if wrong is None:
            raise RuntimeError("out of resources: shared memory")
        return wrong(A.sdpa(q.float(), k.float(), v.float(), mask).nan_to_num()).to(q.dtype)

    monkeypatch.setattr(A, "run_op", op)
    logged = []
    attention = A.TritonDecodeAttention(log=logged.append, sms=132)
    q, k, v, mask = _inputs()
    expected = A.sdpa(q, k, v, mask)
    torch.testing.assert_close(attention(q, k, v, mask), expected, rtol=0, atol=0, equal_nan=True)
    assert attention.reason.startswith(reason) and logged == [attention.reason] and not attention.checked
    assert attention.refusal(q, k, mask) == attention.reason, "callers take SDPA from now on"
    torch.testing.assert_close(attention(q, k, v, mask), expected, rtol=0, atol=0, equal_nan=True)
    assert len(calls) == 1 and attention.setup_seconds > 0


@pytest.mark.parametrize("failure", ["raises", "slower"])
@torch.no_grad()
def test_past_16_rows_a_failing_or_slower_shape_keeps_sdpa_alone(monkeypatch, failure):
    """T 24 (a wide tree's verify): the kernel failing there, or SDPA timing faster, keeps SDPA for that shape only
    (said once, the op not called again for it) and the kernel on for T 3."""
    monkeypatch.setattr(A, "triton_unavailable", lambda: None)
    calls = []

    def op(q, k, v, mask, cut):
        calls.append(q.shape[2])
        if failure == "raises" and q.shape[2] > A.FEW:
            raise RuntimeError("out of resources: registers")
        return A.sdpa(q.float(), k.float(), v.float(), mask).nan_to_num().to(q.dtype)

    monkeypatch.setattr(A, "run_op", op)
    monkeypatch.setattr(A, "slower_than_sdpa", lambda *a: "SDPA faster: 9.0 us against 12.0 us" if failure == "slower" else None)
    logged = []
    attention = A.TritonDecodeAttention(log=logged.append, sms=132)
    q, k, v, mask = _inputs(T=24)
    expected = A.sdpa(q, k, v, mask)
    for _ in range(2):
        torch.testing.assert_close(attention(q, k, v, mask), expected, rtol=0, atol=0, equal_nan=True)
    assert calls == [24] and attention.reason is None and list(attention.declined) == [(24, 16, 2)]
    why = "failed (T 24, D 16: RuntimeError: out of resources: registers)" if failure == "raises" else \
        "SDPA faster: 9.0 us against 12.0 us"
    assert logged == [f"  decode attention (T 24, D 16, group 2): SDPA for this shape ({'Triton decode attention ' if failure == 'raises' else ''}{why})"]
    attention(*_inputs(T=3))
    assert calls == [24, 3, 3] and attention.checked == {(3, 16, 2)}, "T 3 checked and run on the kernel"


# ---- routing ---------------------------------------------------------------------------------
@torch.no_grad()
def test_decode_attention_of_every_layer_goes_through_kernels_attention_and_prefill_keeps_sdpa():
    """Tiny model (4 layers, 4 heads over 2 KV heads, D 16) with an 80-slot cache: a prefill of 70 tokens
    (T 70 > 64: SDPA, no call), then a decode of B = 2 rows (4 calls of T 1 over S 80); the logits equal
    the eager forward's."""
    from eaglelab.engine.model.layers import prefix_mask

    model = random_model(tiny_config())
    attention = RecordingAttention()
    kernels = replace(EAGER_KERNELS, attention=attention)
    outs = []
    for ks in (kernels, EAGER_KERNELS):
        cache = model.make_cache(2, 80, dtype=torch.float32, device="cpu")
        ids = torch.randint(0, 96, (2, 70), generator=torch.Generator().manual_seed(1))
        slots = torch.arange(70).expand(2, 70)
        model(ids, slots, cache, slots, prefix_mask(slots, 80), kernels=ks)
        slot = torch.full((2, 1), 70)
        hidden, _ = model(ids[:, -1:], slot, cache, slot, prefix_mask(slot, 80), kernels=ks)
        outs.append(model.logits(hidden))
    assert attention.calls == [(1, 80, 4, 2)] * 4
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


@torch.no_grad()
def test_engine_phases_reach_the_kernel_and_speculation_stays_lossless():
    """Plain greedy and EAGLE-3 speculation (float32, chain of 3 draft steps, 4 tokens verified) with every
    attention of <= 16 rows on the stand-in give the plain eager tokens; the verify hands it T = 4 rows per
    target layer, and the drafter's layer takes its steps too (its KV heads: the drafter's)."""
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig

    model = build_scale_model("tiny", seed=3).model
    L = model.config.num_layers
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 8).tokens
    attention = RecordingAttention()
    kernels = replace(EAGER_KERNELS, attention=attention)
    got = Engine(model, spec=SpecConfig(), runner=EagerRunner(model, kernels=kernels)).generate(prompts, 8).tokens
    assert got == plain
    assert sum(1 for t, *_ in attention.calls if t == 1) == 7 * L, "one call per layer in each of 7 decode steps"
    spec = SpecConfig("eagle3", num_steps=3, topk=1, num_draft_tokens=4)
    net, taps = random_eagle3(model, seed=5, draft_vocab=256)
    attention.calls.clear()
    runner = EagerRunner(model, net, kernels=kernels)
    out = Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner).generate(prompts, 8)
    assert out.tokens == plain
    target_heads = (model.config.num_heads, model.config.num_kv_heads)
    assert any(t == 4 and (nh, kvh) == target_heads for t, _, nh, kvh in attention.calls), "the verify of 4 tokens"
    drafter_heads = (net.config.num_heads, net.config.num_kv_heads)
    assert sum(1 for *_, nh, kvh in attention.calls if (nh, kvh) == drafter_heads) >= 3, "the draft steps"


def test_eager_pieces_keep_the_attention_kernel():
    """Inside a compiled phase the layers run the eager pieces: with the set's attention kernel and GEMV."""
    attention = RecordingAttention()
    compiled_like = Kernels(rms_norm=lambda *a: None, compiled=True, attention=attention)
    pieces = compiled_like.eager_pieces()
    assert pieces.attention is attention and pieces.gemv is None and pieces.rms_norm is EAGER_KERNELS.rms_norm
    assert compile_report(Kernels(attention=attention)) == (0.5, []), "its checking time counts as set-up"


# ---- the switch: run and bench ----------------------------------------------------------------
def test_bench_runs_attn_configs_only_when_named():
    from eaglelab.bench.configs import CONFIGS, pick_configs

    default = pick_configs(None)
    assert "plain-compile-gemv" not in default and not any(name.endswith("-attn") for name in default)
    named = pick_configs("plain-compile-gemv,plain-compile-gemv-attn,spec-compile-gemv-attn")
    assert named == ["plain-compile-gemv", "plain-compile-gemv-attn", "spec-compile-gemv-attn"]
    for name in named[1:]:
        cfg = CONFIGS[name]
        assert cfg.attn and cfg.gemv and cfg.compile and cfg.graphs, cfg
    assert not CONFIGS["plain-compile-gemv"].attn


@pytest.mark.parametrize("device, dtype, triton, note", [
    ("cpu", torch.bfloat16, True, "--decode-attn: off on cpu (a CUDA kernel), SDPA instead"),
    ("cuda", torch.bfloat16, False, "--decode-attn: off, SDPA instead: Triton decode attention unavailable "
                                    "(ImportError: No module named 'triton')"),
    ("cuda", torch.float32, True, "--decode-attn: off for float32 weights (the decode attention takes bfloat16 or "
                                  "float16), SDPA instead"),
    ("cuda", torch.bfloat16, True, "--decode-attn: attention of <= 64 query rows on the Triton decode attention "
                                   "(bf16/fp16; past 16 rows SDPA per shape where it is faster); longer prefills on "
                                   "SDPA")])
def test_run_notes_say_why_the_kernel_is_off(monkeypatch, device, dtype, triton, note):
    from types import SimpleNamespace

    from eaglelab.session import _add_decode_attn

    if triton:
        monkeypatch.setattr(A, "triton_unavailable", lambda: None)
    else:
        monkeypatch.setattr(A, "load_op", _no_triton)
    s = SimpleNamespace(target=SimpleNamespace(device=torch.device(device), dtype=dtype), kernels=None, notes=[])
    _add_decode_attn(s, log=lambda m: None)
    assert s.notes == [note] and s.kernels.attention is not None and s.kernels.gemv is None


def test_run_flag_reaches_the_session(tiny_dir, capsys):
    """``eaglelab run --decode-attn`` on a CPU: the run goes on with SDPA and says why, no traceback."""
    from tests.conftest import run_cli

    rc, text = run_cli(capsys, "run", "w1 w2 w3", "--model", str(tiny_dir), "--device", "cpu", "--draft", "none",
                       "--max-new-tokens", "3", "--decode-attn")
    assert rc == 0 and "Traceback" not in text
    assert "--decode-attn: off on cpu (a CUDA kernel), SDPA instead" in text


# ---- the kernel --------------------------------------------------------------------------------
@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_kernel_matches_sdpa_under_the_triton_interpreter():
    """The kernel's indexing and online softmax on the CPU (tests/engine/model/interpreted_attention.py): fp16,
    60 hypothesis cases of prefix and tree masks, GQA groups 1..4, T up to 40 (past 64 rows: several programs of
    rows), blocks of 16 to 128 slots (64 and 128: the 8B verify's cuts), cache lengths not a multiple of the
    block, 1..5 splits (merged by a second kernel and in the same launch), NaN in the K/V of all-False blocks (so
    they must be skipped); then a row with no allowed slot gives zeros."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.model.interpreted_attention", "60"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    counts = dict(zip(done.stdout.split()[::2], map(int, done.stdout.split()[1::2])))
    assert counts["cases"] == 60 and counts["poisoned"] >= 10 and counts["split"] >= 10 and counts["tree"] >= 5, counts
    assert counts["wide"] >= 5 and counts["row_blocks"] >= 5 and counts["merged"] >= 10, counts


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_splits_merge_in_the_attention_launch_only_at_few_rows(monkeypatch):
    """``ONE_LAUNCH_ROWS``: where a KV head's query rows (GROUP * T) are at most that many, the split that finishes
    last merges the splits in the attention launch (MERGE, with a ticket counter) and no merge kernel launches;
    at more rows, or with it 0, the merge kernel does; one split needs no merge either way."""
    from eaglelab.engine.model import decode_attention_kernels as AK

    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **meta: launches.append((self.name, meta.get("MERGE")))

    monkeypatch.setattr(AK, "attention_kernel", Recorder("attention"))
    monkeypatch.setattr(AK, "attention_combine_kernel", Recorder("merge"))

    def kernels(T, splits, rows_limit):  # 9 heads over 3 KV heads: GROUP 3
        monkeypatch.setattr(AK, "ONE_LAUNCH_ROWS", rows_limit)
        launches.clear()
        q = torch.zeros(1, 9, T, 16, dtype=torch.float16)
        k = v = torch.zeros(1, 3, 64, 16, dtype=torch.float16)
        AK.decode_attention(q, k, v, torch.ones(1, T, 64, dtype=torch.bool), 16, splits, 4)
        return list(launches)

    assert kernels(1, 3, 0) == [("attention", False), ("merge", None)]
    assert kernels(1, 3, 16) == [("attention", True)]  # a decode: 3 rows
    assert kernels(5, 3, 16) == [("attention", True)]  # 15 rows
    assert kernels(6, 3, 16) == [("attention", False), ("merge", None)]  # 18 rows
    assert kernels(40, 3, 16) == [("attention", False), ("merge", None)]  # a verify of 40: 120 rows
    assert kernels(1, 1, 16) == [("attention", False)]


COMPILED = textwrap.dedent("""
    import torch
    from dataclasses import replace
    from eaglelab.engine.model import decode_attention as A, decode_attention_kernels as AK
    from eaglelab.engine.model.layers import EAGER_KERNELS, prefix_mask
    from tests.conftest import random_model, tiny_config

    class CpuAttention(A.TritonDecodeAttention):
        def refusal(self, q, k, mask):  # the device check waived: the interpreter runs the kernel on CPU
            why = super().refusal(q, k, mask)
            return None if why is not None and why.startswith("not CUDA") else why

    model = random_model(tiny_config()).half()
    attention = CpuAttention()
    kernels = replace(EAGER_KERNELS, attention=attention)
    cache = model.make_cache(2, 40, dtype=torch.float16, device="cpu")
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(0))
    slots = torch.arange(24).expand(2, 24)
    calls = []
    real = AK._empty_out  # called once per op call, fake or real
    AK._empty_out = lambda q: (calls.append(1), real(q))[1]
    def forward(ids, slot, kernels):
        hidden, _ = model(ids, slot, cache, slot, prefix_mask(slot, 40), kernels=kernels)
        return model.logits(hidden)
    with torch.inference_mode():
        forward(ids, slots, EAGER_KERNELS)  # the prefill (SDPA) fills the cache
        rows = torch.full((2, 3), 24) + torch.arange(3)  # a chain verify of 3 tokens
        eager_sdpa = forward(ids[:, :3], rows, EAGER_KERNELS)
        eager = forward(ids[:, :3], rows, kernels)  # checks the shape against SDPA once
        assert attention.reason is None and attention.checked == {(3, 16, 2)}, (attention.reason, attention.checked)
        compiled = torch.compile(lambda a, s: forward(a, s, kernels), fullgraph=True, dynamic=False)
        compiled(ids[:, :3], rows)
        calls.clear()
        out = compiled(ids[:, :3], rows)
    print("calls", len(calls), "err_sdpa", (eager - eager_sdpa).abs().max().item(), "err_compiled",
          (out - eager).abs().max().item())
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_compiled_forward_keeps_the_op_in_its_graph(tmp_path):
    """A tiny fp16 model compiled whole (inductor, fullgraph) on the CPU, the kernel run by Triton's interpreter,
    for a verify of 3 tokens over a 40-slot cache: one op call per layer (4) in the compiled forward, and its
    logits within fp16 rounding of the eager forward with the kernel, itself within rounding of SDPA's."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", COMPILED], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    assert words[:2] == ["calls", "4"], done.stdout
    assert float(words[3]) < 0.05 and float(words[5]) < 0.05, done.stdout


ENGINE = textwrap.dedent("""
    import torch
    from dataclasses import replace
    from eaglelab.engine.model import decode_attention as A
    from eaglelab.engine.model.layers import EAGER_KERNELS
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig

    class CpuAttention(A.TritonDecodeAttention):
        calls = 0
        def refusal(self, q, k, mask):  # the device check waived: the interpreter runs the kernel on CPU
            why = super().refusal(q, k, mask)
            return None if why is not None and why.startswith("not CUDA") else why
        def __call__(self, q, k, v, mask):
            CpuAttention.calls += 1
            return super().__call__(q, k, v, mask)

    model = build_scale_model("tiny", seed=3, dtype=torch.float16).model
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    attention = CpuAttention()
    kernels = replace(EAGER_KERNELS, attention=attention)
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 8).tokens
    ours = Engine(model, spec=SpecConfig(), runner=EagerRunner(model, kernels=kernels)).generate(prompts, 8).tokens
    print("plain", ours == plain, CpuAttention.calls)
    for topk, steps, tokens in ((1, 3, 4), (2, 3, 6)):
        spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=tokens)
        net, taps = random_eagle3(model, seed=5, draft_vocab=256)
        runner = EagerRunner(model, net, kernels=kernels)
        out = Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner).generate(prompts, 8)
        print(f"spec{topk}", out.tokens == plain, CpuAttention.calls)
    print("reason", attention.reason, "rows", ",".join(str(t) for t, _, _ in sorted(attention.checked)))
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_engine_with_the_kernel_gives_sdpas_tokens_under_the_interpreter():
    """The real kernel inside the engine (fp16 tiny model, 2 rows, 8 tokens, Triton's interpreter on CPU): plain
    greedy gives SDPA's tokens; EAGLE-3 speculation, a chain (3 steps, 4 tokens) and a tree (top-2, 6 tokens:
    the engine's own tree masks), gives them too; each shape it met (T 1, 2, 4, 6, and 7: the drafter's extend over
    the 7-token prompt) passed its check against SDPA."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", ENGINE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.strip().splitlines()]
    (_, plain, n_plain), (_, chain, n_chain), (_, tree, n_tree), last = lines
    assert plain == chain == tree == "True", done.stdout
    assert 0 < int(n_plain) < int(n_chain) < int(n_tree), "every run called the kernel"
    assert last == ["reason", "None", "rows", "1,2,4,6,7"], done.stdout


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_planned_cuts_compile_for_sm90_within_its_shared_memory():
    """The kernels as the planner cuts them (the 8B, SmolLM2 and a head-dim-256 shape; batch 1 and 8; T 1, 16, 24
    and 64; 128 and 2048 slots; a decode's and a verify of 24's split cuts over 2,048 slots at batch 1 also merging
    in the same launch) and the merge kernel compile for an H200 (sm_90, no GPU needed:
    tests/engine/model/sm90_attention.py) and each takes at most the 227 KB of shared memory a block may have there
    (a cut past it compiles but fails at launch, and the engine would fall back to SDPA for good).
    Spills are printed, not bounded: the H200 sweep timed the 8B verify's 128-slot cuts, which ptxas says spill
    ~1.4 KB under Triton 3.6 (~0.7 KB under 3.8), up to 4.2x faster than the spill-free 32-slot cuts before them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.model.sm90_attention"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and ("ImportError" in done.stderr or "ModuleNotFoundError" in done.stderr):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    shared = [int(line.split("shared=", 1)[1].split()[0]) for line in lines]
    merged = [line for line in lines if line.startswith("merged ")]
    assert len(lines) - len(merged) == 3 * 2 * 4 * 2 + 1 and len(merged) >= 3, done.stdout
    sm90_shared = 232_448  # bytes of shared memory one block may take on sm_90 (227 KB)
    assert max(shared) <= sm90_shared and min(shared[:-1]) > 0, done.stdout
    # the cuts the sweep measured are the ones compiled: the 8B verify of 24 at bs 1 over 2048 slots
    assert "llama3.1-8b B=1 T=24 S=2048 (128, 8, 8)" in done.stdout, done.stdout


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_op_shape_under_fake_tensors():
    """torch.compile traces the op with fake tensors: [B, NH, T, D] out in q's dtype, stored [B, T, NH, D]."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    A.load_op()
    with FakeTensorMode():
        q = torch.empty(2, 32, 4, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 8, 2048, 128, dtype=torch.bfloat16)
        mask = torch.empty(2, 4, 2048, dtype=torch.bool)
        out = torch.ops.eaglelab.decode_attention(q, k, k, mask, *A.AttnPlan(64, 16, 4))
    assert tuple(out.shape) == (2, 32, 4, 128) and out.dtype == torch.bfloat16
    assert out.stride() == (4 * 32 * 128, 128, 32 * 128, 1)


# ---- on CUDA -----------------------------------------------------------------------------------
def _cuda_case(B, NH, KVH, T, D, S, used, dtype, g, tree: bool = False):
    """q, the layer views k/v of a [2, B, KVH, S, D] cache, and a prefix (or random tree) mask at ``used``."""
    dev = torch.device("cuda")
    q = torch.randn(B, T, NH, D, device=dev, generator=g).to(dtype).transpose(1, 2)
    cache = torch.randn(2, B, KVH, S, D, device=dev, generator=g).to(dtype)
    cols = torch.arange(S, device=dev)
    slots = used - T + torch.arange(T, device=dev)
    mask = (cols[None, None, :] <= slots[None, :, None]).expand(B, T, S).clone()
    if tree:  # each new row sees the prefix, itself and a random half of the rows before it
        keep = torch.rand(B, T, T, device=dev, generator=g) < 0.5
        keep = keep.tril(-1) | torch.eye(T, dtype=torch.bool, device=dev)
        mask[:, :, used - T:used] = keep
    return q, cache[0], cache[1], mask


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("one_launch", [False, True], ids=["merge-kernel", "merged-in-launch"])
@torch.no_grad()
def test_kernel_matches_sdpa_on_cuda_eager_compiled_and_captured(one_launch, monkeypatch):
    """8B (32 / 8 heads, D 128) and SmolLM2 (9 / 3, D 64) shapes, bf16 and fp16, B 1 to 3, T 1, 4, 16, 24 and 64
    (prefix and tree masks), 128 and 2048 slots with 100 or 1000 used: within twice SDPA's own error against
    an fp32 reference plus an ulp; the default plan and a 1-split and a 5-split one alike. Then a call
    compiled whole (fullgraph) and replayed from a CUDA graph gives the eager kernel's exact output. The splits
    merged by the merge kernel or in the same launch (``decode_attention_kernels.ONE_LAUNCH_ROWS``, here at every
    row count)."""
    from eaglelab.engine.model import decode_attention_kernels

    monkeypatch.setattr(decode_attention_kernels, "ONE_LAUNCH_ROWS", 1 << 20 if one_launch else 0)
    attention = A.TritonDecodeAttention()
    assert attention.reason is None, attention.reason
    g = torch.Generator(device="cuda").manual_seed(0)
    for (NH, KVH, D), dtype, B, T, (S, used), tree in [
            ((32, 8, 128), torch.bfloat16, 1, 1, (128, 100), False), ((32, 8, 128), torch.bfloat16, 1, 4, (2048, 1000), True),
            ((32, 8, 128), torch.bfloat16, 3, 16, (2048, 100), True), ((9, 3, 64), torch.bfloat16, 1, 1, (2048, 100), False),
            ((9, 3, 64), torch.float16, 3, 4, (128, 100), True), ((9, 3, 64), torch.float16, 1, 16, (2048, 1000), False),
            ((9, 3, 64), torch.bfloat16, 1, 24, (2048, 1000), True), ((32, 8, 128), torch.bfloat16, 1, 64, (2048, 100), True),
            ((9, 3, 64), torch.float16, 2, 64, (128, 100), False)]:  # 17-64 rows: blocks of 64 rows per program
        q, k, v, mask = _cuda_case(B, NH, KVH, T, D, S, used, dtype, g, tree)
        ref = A.sdpa(q.float(), k.float(), v.float(), mask)
        ulp = ref.abs().max().item() * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
        bound = 2 * (A.sdpa(q, k, v, mask).float() - ref).abs().max().item() + ulp
        assert attention.refusal(q, k, mask) is None
        for plan in (attention.plan(q, k), A.AttnPlan(64, 1, 4), A.AttnPlan(32, 5, 4)):
            err = (torch.ops.eaglelab.decode_attention(q, k, v, mask, *plan).float() - ref).abs().max().item()
            assert err <= bound, ((NH, KVH, D), dtype, B, T, S, used, plan, err, bound)
        assert (attention(q, k, v, mask).float() - ref).abs().max().item() <= bound
    assert attention.reason is None and attention.checked
    q, k, v, mask = _cuda_case(1, 32, 8, 4, 128, 2048, 300, torch.bfloat16, g, tree=True)
    assert_compiles_and_captures(lambda a: attention(a, k, v, mask), q)
