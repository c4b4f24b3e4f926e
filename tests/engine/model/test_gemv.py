"""The Triton GEMV (engine/model/gemv.py): which calls take it and why the others do not, that every
projection of the model (and the head) reaches it through ``Kernels.gemv`` with the right fused weight,
that without Triton it is off with a reason and the forward is unchanged; the kernel itself against
``F.linear`` under Triton's interpreter (CPU, where Triton is installed) and on CUDA (``gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eaglelab.engine.model import gemv as G
from eaglelab.engine.model import gemv_tiling as GT
from eaglelab.engine.model.layers import EAGER_KERNELS, FusedLinear, Kernels
from eaglelab.engine.runtime.compile import compile_report
from tests.conftest import assert_compiles_and_captures, has_triton, random_model, tiny_config

ROOT = Path(__file__).resolve().parents[3]


class RecordingGemv:
    """A stand-in GEMV for CPU tests: takes every call (as if on CUDA), computes ``F.linear`` and records
    the (rows, N, K) it was given, so the routing is checked without a GPU."""

    reason = None
    setup_seconds = 0.25
    layout = None  # reads [N, K] as nn.Linear keeps it

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.fused: list[bool] = []  # each call's sums_fused
        self.readers: list[int] = []  # each call's readers (the projections its output is split among)

    def pack(self, weight):
        return weight

    def refusal(self, x, weight):
        return None

    def __call__(self, x, weight, bias, sums_fused=False, readers=1):
        assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1], (x.shape, weight.shape)
        self.calls.append((x.shape[0], weight.shape[0], weight.shape[1]))
        self.fused.append(sums_fused)
        self.readers.append(readers)
        return F.linear(x, weight, bias)


# ---- which calls take it ------------------------------------------------------------------------
@torch.no_grad()
def test_refusal_names_each_reason_in_order():
    """Example: x [1, 1, 64] bf16 with a [96, 64] bf16 weight on the CPU is refused only for the device;
    257 rows (65 with the range cut to 64 as benchmarks/ab_constants.py --gemv-max-rows 64 does), float32, or a
    transposed weight are refused for that first."""
    w = torch.zeros(96, 64, dtype=torch.bfloat16)
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    assert G.MAX_ROWS == G.KERNEL_ROWS == 256
    assert G.refusal(x, w) == "not CUDA (device cpu)"
    assert G.refusal(x, w, unavailable="no triton") == "no triton"
    assert G.refusal(torch.zeros(8, 20, 64, dtype=torch.bfloat16), w) == "not CUDA (device cpu)", "a b8 verify"
    assert G.refusal(torch.zeros(8, 32, 64, dtype=torch.bfloat16), w) == "not CUDA (device cpu)", "256 rows"
    assert G.refusal(torch.zeros(257, 64, dtype=torch.bfloat16), w) == "257 rows (the GEMV takes 1..256)"
    assert G.refusal(torch.zeros(2, 129, 64, dtype=torch.bfloat16), w) == "258 rows (the GEMV takes 1..256)"
    assert G.refusal(torch.zeros(0, 64, dtype=torch.bfloat16), w) == "0 rows (the GEMV takes 1..256)"
    with pytest.MonkeyPatch.context() as mp:  # cuBLAS past 64 rows (benchmarks/ab_constants.py --gemv-max-rows 64)
        mp.setattr(G, "MAX_ROWS", 64)
        assert G.refusal(torch.zeros(65, 64, dtype=torch.bfloat16), w) == "65 rows (the GEMV takes 1..64)"
        assert G.refusal(torch.zeros(2, 32, 64, dtype=torch.bfloat16), w) == "not CUDA (device cpu)", "64 rows: taken"
        assert G.refusal(torch.zeros(17, 64, dtype=torch.bfloat16), w) == "not CUDA (device cpu)", "17 rows: taken"
        assert G.refusal(torch.zeros(2, 33, 64, dtype=torch.bfloat16), w) == "66 rows (the GEMV takes 1..64)"
    assert "dtypes torch.float32/torch.bfloat16" in G.refusal(x.float(), w)
    assert "dtypes torch.float16/torch.bfloat16" in G.refusal(x.half(), w)
    assert G.refusal(x, torch.zeros(64, 96, dtype=torch.bfloat16).t()) == "weight not row-major [N, K]"


def test_refusal_with_gradients_on():
    x, w = torch.zeros(1, 64, dtype=torch.float16), torch.zeros(8, 64, dtype=torch.float16)
    with torch.enable_grad():
        assert G.refusal(x, w) == "gradients on (the GEMV has no backward)"
    with torch.no_grad():
        assert G.refusal(x, w) == "not CUDA (device cpu)"


def test_row_buckets_and_splits():
    """M buckets: 1, 2, 4, ..., 256; past 64 rows the kernel cuts x into blocks of 64. Split-K: K 4096 in 3 splits:
    ceil(4096 / 3) = 1366 rounded up to whole 256-wide steps = 1536 per program, 3 programs (1536, 1536, 1024)."""
    assert [G.row_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 96, 160, 256)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64, 64, 128, 128, 256, 256]
    assert GT.splits(4096, GT.GemvConfig(16, 256, 3, 4, 3)) == (1536, 3)
    assert GT.splits(4096, GT.GemvConfig(16, 256, 1, 4, 3)) == (4096, 1)
    assert GT.splits(100, GT.GemvConfig(16, 256, 4, 4, 3)) == (256, 1)
    assert G.candidates(2) == G.FEW_ROWS and G.candidates(17) == G.candidates(64) == G.candidates(256) == G.MANY_ROWS
    assert set(G.candidates(16)) < set(G.FEW_ROWS)  # (4, 512, ...)'s sums fit 8 rows, not 16
    assert G.GemvConfig(4, 512, 1, 4, 2) in G.candidates(8) and G.GemvConfig(4, 512, 1, 4, 2) not in G.candidates(16)
    for rows in (1, 4, 16, 32, 64, 160, 256):  # every tiling the tuner tries is one the kernel can take
        for cfg in G.candidates(rows):
            assert cfg.block_k % 16 == 0 and cfg.split_k >= 1, cfg
    # the CUDA-core path's [padded rows, block_n, block_k] float32 sums, at most 128 a thread (4 warps: 16,384)
    wide = GT.GemvConfig(4, 512, 1, 4, 2)
    assert GT.fits_registers(wide, 5) and not GT.fits_registers(wide, 9)  # padded to 8: 16,384; to 16: twice that
    assert GT.fits_registers(GT.GemvConfig(4, 512, 1, 8, 2), 16)  # 8 warps hold twice as many
    assert GT.fits_registers(GT.GemvConfig(8, 64, 1, 4, 3), 16)
    assert not GT.fits_registers(GT.GemvConfig(8, 512, 1, 4, 1), 24)
    assert GT.fits_registers(GT.GemvConfig(16, 512, 1, 4, 2), 64) and GT.fits_registers(wide, 1)  # dot / one row
    assert any(c.block_n < 16 for c in G.FEW_ROWS)  # 2-16 rows: the CUDA cores beside the dot
    assert any(c.split_k > 1 and c.block_n == 16 for c in G.MANY_ROWS)  # 17-64 rows: the dot split along K
    # the kernel's rows: a power of two, at least 16 for the dot (block_n >= 16), as they are for the CUDA cores
    assert [GT.padded_rows(m, 16) for m in (1, 3, 16, 24)] == [1, 16, 16, 32]
    assert [GT.padded_rows(m, 8) for m in (1, 3, 16, 24)] == [1, 4, 16, 32]
    # past 64 rows: blocks of 64 (a b8 verify's 160 rows in 3, the last padded; a b32 verify's 96 in 2)
    assert [GT.padded_rows(m, 16) for m in (64, 65, 160, 256)] == [64, 64, 64, 64]
    assert [GT.row_blocks(m, 16) for m in (1, 24, 64, 65, 96, 160, 256)] == [1, 1, 1, 2, 2, 3, 4]


# ---- a shape no tiling runs ----------------------------------------------------------------------
class _NoDeviceCheck(G.TritonGemv):
    """The GEMV as if Triton were here (no CUDA either: the device check waived)."""

    def __init__(self):
        super().__init__()
        self.reason = None

    def refusal(self, x, weight):
        why = super().refusal(x, weight)
        return None if why is not None and why.startswith("not CUDA") else why


@torch.no_grad()
def test_past_16_rows_a_shape_no_tiling_runs_keeps_linear_and_the_kernel_stays_on(monkeypatch):
    """Every tiling failing (out of shared memory, say) for 24 rows: that shape keeps F.linear (exactly its
    output), said once, and the kernel stays on for the others; for 3 rows the same failure is the kernel
    failing here: off for good, with the reason."""
    def fails(x, weight, bias, cfg):
        raise RuntimeError("out of resources: shared memory, Required: 270336, Hardware limit: 232448")
    monkeypatch.setattr(G, "run_op", fails)
    said: list[str] = []
    gemv = _NoDeviceCheck()
    gemv.log = said.append
    w, b = torch.randn(40, 64).half(), torch.randn(40).half()
    x24 = torch.randn(24, 64).half()
    assert torch.equal(gemv(x24, w, b), F.linear(x24, w, b))
    assert gemv.chosen == {(40, 64, 32): G.LINEAR} and gemv.reason is None
    assert said[-1].startswith("  GEMV [64 -> 40] M<=32: F.linear (no tiling ran: (32, 128, 1, 4, 3): RuntimeError: "
                               "out of resources: shared memory")
    assert torch.equal(gemv(x24[:20], w, b), F.linear(x24[:20], w, b)) and len(said) == 2, "tuned once per bucket"
    x3 = torch.randn(3, 64).half()
    assert torch.equal(gemv(x3, w, b), F.linear(x3, w, b))
    assert gemv.reason.startswith("eager: Triton GEMV failed on [64 -> 40] ((32, 128, 1, 4, 4): RuntimeError: out of")


# ---- without Triton --------------------------------------------------------------------------
def _no_triton():
    raise ImportError("No module named 'triton'")


@torch.no_grad()
def test_without_triton_the_gemv_is_off_with_a_reason_and_linear_runs(monkeypatch):
    monkeypatch.setattr(G, "load_op", _no_triton)
    gemv = G.TritonGemv()
    assert gemv.reason == "Triton GEMV unavailable (ImportError: No module named 'triton')"
    lin = nn.Linear(64, 32)
    x = torch.randn(1, 1, 64)
    assert gemv.refusal(x, lin.weight) == gemv.reason
    torch.testing.assert_close(gemv(x[0], lin.weight, lin.bias), F.linear(x[0], lin.weight, lin.bias), rtol=0, atol=0)
    fused = FusedLinear(lin)
    torch.testing.assert_close(fused(x, gemv)[0], fused(x)[0], rtol=0, atol=0, msg="the forward without it, exactly")
    seconds, reasons = compile_report(Kernels(gemv=gemv))
    assert seconds == 0.0 and reasons == [gemv.reason], "asked for and off: the compile report says why"


# ---- routing ---------------------------------------------------------------------------------
@torch.no_grad()
def test_fused_projections_reach_the_gemv_as_one_matmul():
    """q/k/v (out 32, 16, 16 from in 64) as one [64 -> 64] call on x [2, 3, 64] -> 6 rows; outputs split back."""
    torch.manual_seed(0)
    q, k, v = nn.Linear(64, 32, bias=True), nn.Linear(64, 16, bias=True), nn.Linear(64, 16, bias=True)
    fused, gemv = FusedLinear(q, k, v), RecordingGemv()
    x = torch.randn(2, 3, 64)
    got = fused(x, gemv)
    assert gemv.calls == [(6, 64, 64)]
    for y, lin in zip(got, (q, k, v)):
        torch.testing.assert_close(y, lin(x), rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # training runs each projection on its own parameters, never the GEMV
        fused(x, gemv)
    assert gemv.calls == [(6, 64, 64)]


@torch.no_grad()
def test_every_projection_and_the_head_go_through_kernels_gemv():
    """Tiny model (4 layers, H 64, I 128, 4 heads of 16, 2 KV heads, V 96), a decode of B = 2 rows: per layer
    qkv [64 -> 128], o [64 -> 64], gate_up [64 -> 256], down [128 -> 64], then the head [64 -> 96]; the
    logits equal the eager forward's."""
    model = random_model(tiny_config())
    gemv = RecordingGemv()
    kernels = replace(EAGER_KERNELS, gemv=gemv)
    ids = torch.tensor([[5], [7]])
    hidden, _ = model(ids, torch.zeros_like(ids), kernels=kernels)
    logits = model.logits(hidden, kernels)
    per_layer = [(2, 128, 64), (2, 64, 64), (2, 256, 64), (2, 64, 128)]
    assert gemv.calls == per_layer * 4 + [(2, 96, 64)]
    ref_hidden, _ = model(ids, torch.zeros_like(ids))
    torch.testing.assert_close(logits, model.logits(ref_hidden), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_only_projections_read_by_elementwise_code_may_leave_their_sums():
    """``sums_fused`` (a split's K shares left for the compiled reader to add) on every projection of the target's
    and the drafter's layers, whose outputs a norm, the rotary, the SwiGLU or a residual add reads; off for both
    heads, whose logits leave the compiled code (their shares would cost a kernel of their own)."""
    from eaglelab.engine.model.scale_models import random_eagle3

    model = random_model(tiny_config())
    gemv = RecordingGemv()
    kernels = replace(EAGER_KERNELS, gemv=gemv)
    ids = torch.tensor([[5], [7]])
    hidden, _ = model(ids, torch.zeros_like(ids), kernels=kernels)
    model.logits(hidden, kernels)
    assert gemv.fused == [True] * 16 + [False]
    assert gemv.readers == [3, 1, 2, 1] * 4 + [1]  # q/k/v split three ways, gate/up two, o and down whole
    drafter, _ = random_eagle3(model, seed=0)
    layer = drafter.midlayer
    flags = [(name, m.sums_fused) for part in (layer.self_attn, layer.mlp) for name, m in vars(part).items()
             if isinstance(m, FusedLinear)]
    assert flags == [("qkv", True), ("o", True), ("gate_up", True), ("down", True)]
    assert drafter.lm.sums_fused is False


def test_the_reader_adds_shares_one_kernel_folds_into_each_of_several(monkeypatch):
    """A split tiling's K shares go to the compiled reader for a ``sums_fused`` call; where the output is split among
    several projections, only while its shares (and bias) are at most inductor's ``realize_reads_threshold`` reads.
    Example: q/k/v at K 576 in (16, 64, 3, 4, 3), three shares: the reader adds them; (16, 64, 6, 4, 3) makes five
    (576 in steps of 128): the kernel adds them; o, read whole, leaves its five to the reader."""
    from torch._inductor import config

    assert G.reuse_reads() == config.realize_reads_threshold == 4
    three, five, whole = GT.GemvConfig(16, 64, 3, 4, 3), GT.GemvConfig(16, 64, 6, 4, 3), GT.GemvConfig(8, 256, 1, 4, 3)
    assert GT.splits(576, three)[1] == 3 and GT.splits(576, five)[1] == 5
    assert G.reader_adds(three, 576, 3, False) and not G.reader_adds(five, 576, 3, False)
    assert G.reader_adds(five, 576, 1, False) and G.reader_adds(five, 576, 1, True)
    four = GT.GemvConfig(16, 64, 4, 4, 3)  # K 512 in four shares of 128; K 576 in three of 192
    assert GT.splits(512, four)[1] == 4 and GT.splits(576, four)[1] == 3
    assert G.reader_adds(four, 512, 2, False) and G.reader_adds(four, 576, 2, True)  # four reads: still folded
    assert not G.reader_adds(four, 512, 2, True)  # four shares and a bias: five reads
    assert not G.reader_adds(whole, 576, 1, False) and not G.reader_adds(three, 576, None, False)
    monkeypatch.setattr(G, "SHARES", False)
    assert not G.reader_adds(three, 576, 1, False)


def test_inductor_adds_shares_several_kernels_read_in_a_kernel_of_their_own_past_reuse_reads():
    """What :func:`gemv.reader_adds` relies on, checked on this torch (CPU inductor, no Triton): q/k/v's output
    (576 + 192 + 192 columns, 24 rows) as ``add_shares`` of S shares, read by the rotary-like q and k kernels and a
    residual-like v: up to ``reuse_reads()`` shares fold into each reader; one more costs a kernel of its own. o's
    output, read by one kernel, folds any number."""
    import torch._inductor.metrics as metrics
    from torch._inductor import config

    def qkv(shares, cos, sin, r):
        y = G.add_shares(shares, None, torch.bfloat16)
        q, k, v = y[:, :576], y[:, 576:768], y[:, 768:]
        return (q.float() * cos).to(torch.bfloat16), (k.float() * sin).to(torch.bfloat16), v + r

    def o(shares, cos, sin, r):
        return (G.add_shares(shares, None, torch.bfloat16)[:, :192].float() + r.float()).to(torch.bfloat16)

    def kernels(fn, s):
        torch._dynamo.reset()
        metrics.reset()
        args = (torch.randn(s, 24, 960), torch.randn(24, 576), torch.randn(24, 192),
                torch.randn(24, 192, dtype=torch.bfloat16))
        with config.patch(fx_graph_cache=False):
            torch.compile(fn, fullgraph=True)(*args)
        return metrics.generated_kernel_count

    n = G.reuse_reads()
    assert kernels(qkv, n + 1) == kernels(qkv, n) + 1
    assert kernels(qkv, n) == kernels(qkv, 2)
    assert kernels(o, n + 2) == kernels(o, 2)
    torch._dynamo.reset()


@torch.no_grad()
def test_engine_phases_pass_the_gemv_to_the_head_and_speculation_stays_lossless():
    """Plain greedy and EAGLE-3 speculation (float32) with every projection on the stand-in GEMV give the
    plain eager tokens; the prefill and the decode phase hand the head their rows (B = 2: [2, H] -> V; the
    prefill its rows' last positions only) and the verify phase hands it the tree's (B x N = 2 x 4 = 8 rows)."""
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.runner import EagerRunner
    from eaglelab.engine.runtime.spec_config import SpecConfig

    model = build_scale_model("tiny", seed=3).model
    V = model.config.vocab_size
    prompts = [[5, 9, 33, 7, 5, 9, 33], [100, 2, 3]]
    plain = Engine(model, spec=SpecConfig(), runner=EagerRunner(model)).generate(prompts, 8).tokens
    gemv = RecordingGemv()
    kernels = replace(EAGER_KERNELS, gemv=gemv)
    got = Engine(model, spec=SpecConfig(), runner=EagerRunner(model, kernels=kernels)).generate(prompts, 8).tokens
    assert got == plain
    assert sum(1 for rows, n, _ in gemv.calls if n == V and rows == 2) == 8, "the head of the prefill and 7 decode steps"
    spec = SpecConfig("eagle3", num_steps=3, topk=1, num_draft_tokens=4)
    net, taps = random_eagle3(model, seed=5, draft_vocab=256)
    gemv.calls.clear()
    runner = EagerRunner(model, net, kernels=kernels)
    out = Engine(model, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner).generate(prompts, 8)
    assert out.tokens == plain
    assert any(rows == 8 and n == V for rows, n, _ in gemv.calls), "the verify's head over 2 x 4 tree nodes"


def test_eager_pieces_keep_the_gemv():
    """Inside a compiled phase the layers run the eager pieces: with the set's GEMV, if it has one."""
    assert EAGER_KERNELS.eager_pieces() is EAGER_KERNELS
    gemv = RecordingGemv()
    compiled_like = Kernels(rms_norm=lambda *a: None, compiled=True, gemv=gemv)
    pieces = compiled_like.eager_pieces()
    assert pieces.gemv is gemv and pieces.rms_norm is EAGER_KERNELS.rms_norm and not pieces.compiled
    assert compile_report(Kernels(gemv=gemv)) == (0.25, []), "the GEMV's tuning time counts as set-up"


def test_bench_runs_gemv_configs_only_when_named():
    from eaglelab.bench.configs import CONFIGS, pick_configs

    default = pick_configs(None)
    assert "plain-compile" in default and not any(name.endswith("-gemv") for name in default)
    named = pick_configs("plain-compile,plain-compile-gemv")
    assert named == ["plain-compile", "plain-compile-gemv"] and CONFIGS["plain-compile-gemv"].gemv


# ---- the kernel --------------------------------------------------------------------------------
INTERPRETED = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from eaglelab.engine.model import gemv as G
    from eaglelab.engine.model import gemv_tiling as GT
    G.load_op()
    torch.manual_seed(0)
    checked = 0
    def check(x, w, b, cfg):
        global checked
        y = torch.ops.eaglelab.gemv(x, w, b, *cfg)
        ref = F.linear(x.float(), w.float(), None if b is None else b.float())
        assert y.shape == ref.shape and y.dtype == x.dtype, (y.shape, y.dtype)
        err = (y.float() - ref).abs().max().item()
        assert err <= 2e-2 * ref.abs().max().item(), (tuple(x.shape), tuple(w.shape), cfg, err)
        checked += 1
    tilings = [GT.GemvConfig(16, 32, 1, 4, 2), GT.GemvConfig(16, 32, 3, 4, 2), GT.GemvConfig(32, 64, 2, 4, 2),
               GT.GemvConfig(8, 32, 1, 4, 2), GT.GemvConfig(4, 64, 2, 4, 2)]  # the last two: CUDA cores at M > 1
    for K, N in ((64, 48), (200, 37), (96, 130)):
        w = (torch.randn(N, K) * K ** -0.5).half()
        b = torch.randn(N).half()
        for M in (1, 3, 16, 24, 64):  # x padded to 16, 32, 64 rows for the dot
            x = torch.randn(M, K).half()
            for cfg in tilings:
                check(x, w, b, cfg)
                check(x, w, None, cfg)
        for cfg in tilings[:2]:  # bf16: the interpreter's tl.dot misreads bf16, so M = 1 only (no dot there)
            check(torch.randn(1, K).bfloat16(), w.bfloat16(), b.bfloat16(), cfg)
        for cfg in tilings[3:]:  # the CUDA-core path has no dot: bf16 at several rows
            check(torch.randn(24, K).bfloat16(), w.bfloat16(), b.bfloat16(), cfg)
        strided = torch.randn(4, 2, K).half()[:, 0]  # rows 2K apart: the row stride is an argument
        check(strided, w, b, tilings[0])
        for M in (100, 130):  # past 64 rows: blocks of 64 rows of x, a program each (the split: a ticket per block)
            x = torch.randn(M, K).half()
            for cfg in tilings[:3]:
                check(x, w, b, cfg)
    from eaglelab.engine.model import gemv_kernels as GK
    from eaglelab.engine.model.tickets import made
    left = made("gemv", torch.device("cpu"))
    assert left is not None and not left.any()  # split calls took tickets, and left every counter at 0
    print("checked", checked)
    # Under --pdl each program loads its first weight tile (or two) before it waits: the same sums in the same order
    for K, N in ((64, 48), (200, 37)):
        w = (torch.randn(N, K) * K ** -0.5).half()
        for M in (1, 3, 24):
            x = torch.randn(M, K).half()
            for cfg in tilings:
                plain = GK.launch(x, w, None, cfg, False, 0)
                for early in (1, 2):
                    assert torch.equal(GK.launch(x, w, None, cfg, False, early), plain), (K, M, cfg, early)
    print("early same")

    # The tuner (its CUDA-graph timer replaced by set figures): F.linear kept where it is faster, else a tiling.
    from tests.conftest import InterpretedGemv as CpuGemv
    figures = iter([1.0] * len(G.ONE_ROW) + [0.5] + [0.2] + [1.0] * (len(G.FEW_ROWS) - 1) + [0.5])
    G.time_in_turn = lambda call, copies, reps: (call(copies - 1), next(figures))[1]
    gemv = CpuGemv()
    w = (torch.randn(48, 64) * 0.125).half()
    x1, x3 = torch.randn(1, 64).half(), torch.randn(3, 64).half()
    assert torch.equal(gemv(x1, w, None), F.linear(x1, w)) and gemv.chosen[(48, 64, 1)] == G.LINEAR
    gemv(x3, w, None)
    assert gemv.chosen[(48, 64, 4)] == G.FEW_ROWS[0], gemv.chosen
    print("tuner ok")
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_kernel_matches_linear_under_the_triton_interpreter():
    """The kernel's indexing on the CPU: Triton's interpreter runs it on CPU tensors (fp16: M 1, 3, 16, 24, 64, and
    100, 130 in blocks of 64 rows; K not a multiple of the tile; N not a multiple of block_n; split-K in 2 and 3
    parts; with and without bias).
    Split calls leave their ticket counters at 0 (else the next call's shares would be added by the wrong program).
    Each program's first weight tile loaded ahead (as under --pdl) gives the same bits.
    Then the tuner, its timer replaced by set figures: F.linear kept where it was faster, else the fastest tiling."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["checked", str(3 * (5 * 5 * 2 + 2 + 2 + 1 + 2 * 3)), "early", "same", "tuner", "ok"]


COMPILED = textwrap.dedent("""
    import torch
    from dataclasses import replace
    from eaglelab.engine.model import gemv as G, gemv_kernels as GK
    from eaglelab.engine.model.layers import EAGER_KERNELS
    from tests.conftest import InterpretedGemv as CpuGemv, random_model, tiny_config

    G.time_in_turn = lambda call, copies, reps: (call(copies - 1), 1.0)[1]  # no CUDA events here: the tilings tie, the first wins

    model = random_model(tiny_config()).half()
    gemv = CpuGemv()
    kernels = replace(EAGER_KERNELS, gemv=gemv)
    ids = torch.tensor([[5], [7]])
    def forward(ids, kernels):
        hidden, _ = model(ids, torch.zeros_like(ids), kernels=kernels)
        return model.logits(hidden, kernels)
    calls = []
    real = GK.splits  # called once per op call
    GK.splits = lambda *a: (calls.append(1), real(*a))[1]
    with torch.inference_mode():
        forward(ids, EAGER_KERNELS)  # fuses the CPU layout's weights (compiled code only reads them)
        eager = forward(ids, kernels)  # tunes the five shapes, fuses the x W^T layout's weights
        assert gemv.reason is None and len(gemv.chosen) == 5, (gemv.reason, gemv.chosen)
        compile = lambda k: torch.compile(lambda a: forward(a, k), fullgraph=True, dynamic=False)
        with_gemv = compile(kernels)
        with_gemv(ids)
        calls.clear()
        out = with_gemv(ids)
        without = compile(EAGER_KERNELS)(ids)
    print("calls", len(calls), "same", torch.equal(out, without), "eager_err", (out - eager).abs().max().item())
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_compiled_forward_keeps_the_op_in_its_graph(tmp_path):
    """A tiny fp16 model compiled whole (inductor, fullgraph) on the CPU, the kernel run by Triton's interpreter:
    one op call per projection (4 layers x 4 + the head = 17) in each compiled forward, and the logits equal
    the compiled forward without the GEMV (which equals F.linear here), within fp16 rounding of eager."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", COMPILED], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    assert words[:4] == ["calls", "17", "same", "True"], done.stdout
    assert float(words[5]) < 0.02, "compiled vs eager: fp16 rounding of the fused elementwise work only"


SHARES = textwrap.dedent("""
    import torch
    from eaglelab.engine.model import gemv as G, gemv_tiling as GT
    G.load_op()
    torch.manual_seed(0)
    checked = 0
    tilings = [GT.GemvConfig(16, 32, 2, 4, 2), GT.GemvConfig(16, 32, 3, 4, 2), GT.GemvConfig(32, 64, 2, 4, 2),
               GT.GemvConfig(4, 64, 2, 4, 2)]  # the last: the CUDA-core path at M > 1
    for K, N in ((64, 48), (200, 37), (96, 130)):
        w = (torch.randn(N, K) * K ** -0.5).half()
        b = torch.randn(N).half()
        for M in (1, 3, 24, 100):
            x = torch.randn(M, K).half()
            for cfg in (tilings if M <= 64 else tilings[:3]):  # past 64 rows: the dot's blocks of 64 rows
                parts = torch.ops.eaglelab.gemv_shares(x, w, *cfg)
                assert parts.dtype == torch.float32 and tuple(parts.shape) == (GT.splits(K, cfg)[1], M, N), parts.shape
                for bias in (b, None):
                    kernel = torch.ops.eaglelab.gemv(x, w, bias, *cfg)
                    assert torch.equal(G.add_shares(parts, bias, x.dtype), kernel), (K, N, M, cfg)
                    checked += 1
    print("checked", checked)
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_shares_added_outside_give_the_kernels_own_sums_under_the_triton_interpreter():
    """A split tiling's K shares written as the output (``gemv_shares``, float32 [S, M, N]) and added by
    ``add_shares`` give bit for bit what the kernel gives adding them itself (the same order, then the bias):
    M 1, 3, 24, 100 (two blocks of rows); K not a multiple of the tile; 2 and 3 shares; the dot and the CUDA-core
    paths."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SHARES], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["checked", str(3 * (3 * 4 + 3) * 2)]


COMPILED_SHARES = textwrap.dedent("""
    import re, sys, torch
    from dataclasses import replace
    from torch._inductor.utils import run_and_get_code
    from eaglelab.engine.model import gemv as G
    from eaglelab.engine.model.gemv_tiling import GemvConfig
    from eaglelab.engine.model.layers import EAGER_KERNELS
    from tests.conftest import InterpretedGemv as CpuGemv, random_model, tiny_config

    G.SHARES = sys.argv[1] != "off"
    if sys.argv[1] == "capped":  # two shares stand for more than inductor folds into each of several readers
        import torch._inductor.config
        torch._inductor.config.realize_reads_threshold = 1
        G.reuse_reads.cache_clear()
    G.candidates = lambda rows: (GemvConfig(16, 32, 2, 4, 2),)  # every shape split along K in 2
    figures = iter([1.0, 2.0] * 8)  # per shape the one tiling, then F.linear: the tiling wins
    G.time_in_turn = lambda call, copies, reps: (call(copies - 1), next(figures))[1]

    model = random_model(tiny_config()).half()
    gemv = CpuGemv()
    kernels = replace(EAGER_KERNELS, gemv=gemv)
    ids = (torch.arange(80) % 90 + 3)[None] if sys.argv[1] == "blocks" else torch.tensor([[5, 6, 7]])
    def forward(ids, kernels):
        hidden, _ = model(ids, torch.zeros_like(ids), kernels=kernels)
        return model.logits(hidden, kernels)
    with torch.inference_mode():
        forward(ids, EAGER_KERNELS)
        eager = forward(ids, kernels)  # tunes
        assert set(gemv.chosen.values()) == {GemvConfig(16, 32, 2, 4, 2)}, gemv.chosen
        out, code = run_and_get_code(torch.compile(lambda a: forward(a, kernels), fullgraph=True, dynamic=False), ids)
    src = "\\n".join(code)
    print("shares", len(re.findall(r"eaglelab\\.gemv_shares\\.default\\(", src)),
          "gemv", len(re.findall(r"eaglelab\\.gemv\\.default\\(", src)),
          "kernels", len(re.findall(r"^cpp_fused_\\w+ = ", src, re.M)), "err", (out - eager).abs().max().item())
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_compiled_forward_adds_the_shares_inside_the_kernels_that_read_them(tmp_path):
    """A tiny fp16 model compiled whole on the CPU (inductor; the kernel run by Triton's interpreter), every shape
    on a tiling split along K: with ``SHARES`` the 16 layer projections take ``gemv_shares`` and the head (its logits
    leave the graph) the kernel that adds its own; adding the shares costs no kernel of its own (no more generated
    kernels than with ``SHARES`` off, where every projection adds in the kernel); the logits within fp16 rounding.
    Then with inductor folding a value several kernels read only while it reads one input (two shares are too many):
    q/k/v and gate/up, split among several readers, add their shares in the kernel; o and down leave them (8 each).
    And at 80 rows (blocks of 64 rows of x), as at 3 rows."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runs = {}
    for mode in ("on", "off", "capped", "blocks"):
        done = subprocess.run([sys.executable, "-c", COMPILED_SHARES, mode], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        words = done.stdout.split()
        runs[mode] = dict(zip(words[::2], (float(w) for w in words[1::2])))
    on, off = runs["on"], runs["off"]
    assert (on["shares"], on["gemv"], off["shares"], off["gemv"]) == (16, 1, 0, 17), runs
    assert on["kernels"] <= off["kernels"], runs
    assert (runs["capped"]["shares"], runs["capped"]["gemv"]) == (8, 9), runs
    assert (runs["blocks"]["shares"], runs["blocks"]["gemv"]) == (16, 1), runs
    assert max(r["err"] for mode, r in runs.items() if mode != "blocks") < 0.02, runs
    # 80 positions of fp16 compiled against eager: 0.031 here (logits up to 5.7), as with SHARES off (0.030)
    assert runs["blocks"]["err"] < 0.05, runs


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_op_shape_under_fake_tensors():
    """torch.compile traces the op with fake tensors: [M, K] @ [N, K]^T -> [M, N] in x's dtype, no kernel run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    G.load_op()
    with FakeTensorMode():
        x = torch.empty(3, 4096, dtype=torch.bfloat16)
        w = torch.empty(6144, 4096, dtype=torch.bfloat16)
        y = torch.ops.eaglelab.gemv(x, w, None, *GT.GemvConfig(32, 256, 2, 4, 3))
        parts = torch.ops.eaglelab.gemv_shares(x, w, *GT.GemvConfig(32, 256, 3, 4, 3))  # 4096 in 3 shares of 1,536
    assert tuple(y.shape) == (3, 6144) and y.dtype == torch.bfloat16
    assert tuple(parts.shape) == (3, 3, 6144) and parts.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_gemv_matches_linear_on_cuda_eager_compiled_and_captured():
    """Every tiling, on 8B-shaped weights (K 4096 -> N 6144, K 14336 -> N 4096) in bf16 and an odd biased shape (K 1000
    -> N 777, nothing a multiple of 16) in bf16 and fp16, M = 1, 4, 16, 24, 64, 96, 160 (past 64 in blocks of 64
    rows): within rounding of an fp32 reference (no worse than twice F.linear's error plus one ulp of the largest
    output); the tuner's pick (a tiling or F.linear) likewise; a split tiling's K shares added outside give its own
    sums. Then a split tiling's call compiled whole (fullgraph) and replayed from a CUDA graph gives the eager
    kernel's exact output, with its shares added in the kernel and by the compiled code that reads them
    (``sums_fused``)."""
    gemv = G.TritonGemv()
    assert gemv.reason is None, gemv.reason
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    cases = [(torch.bfloat16, 4096, 6144, False), (torch.bfloat16, 14336, 4096, False),
             (torch.bfloat16, 1000, 777, True), (torch.float16, 1000, 777, True)]
    for dtype, K, N, bias in cases:
        w = (torch.randn(N, K, device=dev, generator=g) * K ** -0.5).to(dtype)
        b = torch.randn(N, device=dev, generator=g).to(dtype) if bias else None
        for M in (1, 4, 16, 24, 64, 96, 160):
            x = torch.randn(M, K, device=dev, generator=g).to(dtype)
            ref = F.linear(x.float(), w.float(), None if b is None else b.float())
            ulp = ref.abs().max().item() * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
            bound = 2 * (F.linear(x, w, b).float() - ref).abs().max().item() + ulp
            for cfg in G.candidates(M):
                y = torch.ops.eaglelab.gemv(x, w, b, *cfg)
                err = (y.float() - ref).abs().max().item()
                assert err <= bound, (dtype, K, N, M, cfg, err, bound)
                if cfg.split_k > 1:  # its K shares, added outside, are the kernel's own sums
                    assert torch.equal(G.add_shares(torch.ops.eaglelab.gemv_shares(x, w, *cfg), b, dtype), y), cfg
            assert gemv.refusal(x, w) is None
            assert (gemv(x, w, b).float() - ref).abs().max().item() <= bound
            assert (N, K, G.row_bucket(M)) in gemv.chosen
    x = torch.randn(4, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16)
    gemv.chosen[(6144, 4096, 4)] = GT.GemvConfig(32, 256, 2, 4, 3)  # a split-K tiling, whatever the tuner chose
    assert_compiles_and_captures(lambda a: gemv(a, w, None), x)
    # its shares added by the compiled reader (gemv_shares + add_shares, one kernel fewer): the eager kernel's bits
    assert_compiles_and_captures(lambda a: gemv(a, w, None, sums_fused=True), x)


def test_tilings_from_text():
    """A tiling's text form (gemv_bench --tilings, ab_constants --gemv-tilings): five ints, ';' between tilings."""
    both = (GT.GemvConfig(8, 512, 1, 8, 1), GT.GemvConfig(16, 256, 6, 4, 1))
    assert GT.parse_tilings("8,512,1,8,1; 16,256,6,4,1;") == both
    assert GT.parse_tilings("") == ()
    for bad, why in (("8,512,1,8", "five comma-separated ints"), ("8,512,x,8,1", "five comma-separated ints"),
                     ("8,500,1,8,1", "powers of two"), ("6,512,1,8,1", "powers of two"), ("8,512,0,8,1", ">= 1")):
        with pytest.raises(ValueError, match=why):
            GT.parse_tilings(bad)
