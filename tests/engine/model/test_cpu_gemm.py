"""The few-row C kernel for CPU projections (engine/model/cpu_gemm.py): the packed layout, its results against
F.linear, a row's result independent of the other rows, the fallback without a compiler, and speculation
with it still equal to plain greedy decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eaglelab.engine.model.cpu_gemm import BLOCK, MAX_ROWS, CpuGemm, pack
from eaglelab.engine.model.layers import FusedLinear, Kernels, fused_linears
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import random_model
from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    kernel = CpuGemm(tmp_path_factory.mktemp("cache"))
    if kernel.reason is not None:
        pytest.skip(kernel.reason)
    return kernel


def test_pack_puts_64_columns_per_block_and_zero_pads():
    """N = 96, K = 8 -> data [2, 8, 64]; data[j, k, c] == weight[64 j + c, k]; columns 96..127 are zeros."""
    w = torch.arange(96 * 8, dtype=torch.float32).reshape(96, 8) + 1
    p = pack(w)
    assert p.n == 96 and p.data.shape == (2, 8, BLOCK) and p.data.is_contiguous()
    assert p.data[1, 3, 5] == w[69, 3] and p.data[0, 7, 63] == w[63, 7]
    assert p.data[1, :, 32:].abs().sum() == 0
    assert p.data.dtype == torch.float32, "769 is no bfloat16 value: the weights stay float32"


def test_bf16_valued_weights_pack_in_half_the_bytes_with_the_same_results(gemm):
    """A bf16 checkpoint run in float32 (the shipped drafter): its weights are bfloat16 values, packed as bfloat16
    (lossless), and the kernel's results are bit for bit those of the float32 packing."""
    from eaglelab.engine.model.cpu_gemm import Packed

    g = torch.Generator().manual_seed(2)
    w = torch.randn(130, 96, generator=g).bfloat16().float()
    p = pack(w)
    assert p.data.dtype == torch.bfloat16 and torch.equal(p.data.float()[:, :, :].permute(1, 0, 2).reshape(96, -1).t()[:130], w)
    as_f32 = Packed(p.data.float(), p.n)
    for m in (1, 4, 7):
        x = torch.randn(m, 96, generator=g)
        assert torch.equal(gemm(x, p, None), gemm(x, as_f32, None))
        torch.testing.assert_close(gemm(x, p, None), F.linear(x, w), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("n, k", [(200, 72), (64, 64), (5, 3), (576, 1536)])
def test_kernel_matches_f_linear_for_every_row_count(gemm, n, k):
    g = torch.Generator().manual_seed(n + k)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    p = pack(w)
    for m in (*range(1, 18), 63, MAX_ROWS):
        x = torch.randn(m, k, generator=g)
        tol = 1e-6 * k  # float32 sums of k products of N(0, 1) values, in another order
        torch.testing.assert_close(gemm(x, p, None), F.linear(x, w), atol=tol, rtol=1e-5)
        torch.testing.assert_close(gemm(x, p, b), F.linear(x, w, b), atol=tol, rtol=1e-5)


def test_a_rows_result_does_not_depend_on_the_other_rows(gemm):
    """Bit for bit: a decode (1 row) and a verify (4 or 9 rows) get the same projection of the same input."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(300, 576, generator=g)
    p = pack(w)
    x = torch.randn(9, 576, generator=g)
    together = gemm(x, p, None)
    for r in range(9):
        assert torch.equal(gemm(x[r: r + 1], p, None)[0], together[r])
    assert torch.equal(gemm(x[:4], p, None), together[:4])


def test_refusals_name_the_reason(gemm):
    w = torch.randn(8, 4)
    with torch.no_grad():
        assert gemm.refusal(torch.randn(MAX_ROWS + 1, 4), w) == f"{MAX_ROWS + 1} rows (the kernel takes 1..{MAX_ROWS})"
        assert "float32" in gemm.refusal(torch.randn(2, 4, dtype=torch.float64), w.double())
        assert gemm.refusal(torch.randn(3, 4), w) is None
    assert gemm.refusal(torch.randn(3, 4), w) == "gradients on (the kernel has no backward)"


def test_an_unwritable_cache_turns_it_off_with_the_reason(tmp_path):
    """The cache folder cannot be made (a file stands where it goes): off, said, MKL; no traceback."""
    (tmp_path / "taken").write_text("a file, not a folder")
    kernel = CpuGemm(tmp_path / "taken")
    assert kernel.reason is not None and kernel.reason.startswith("few-row CPU kernel off (cannot write its cache folder")
    assert str(tmp_path / "taken" / "kernels") in kernel.reason and kernel.reason.endswith("MKL instead")


def test_without_a_compiler_it_is_off_and_fused_linears_use_mkl(tmp_path):
    kernel = CpuGemm(tmp_path, compiler="no-such-cc-for-eaglelab")
    assert kernel.reason == "few-row CPU kernel off (no C compiler: 'no-such-cc-for-eaglelab' not found): MKL instead"
    lin = nn.Linear(8, 5)
    fused = FusedLinear(lin)
    fused.prepare(torch.device("cpu"), kernel)
    assert set(fused._fused) == {"kn"}, "off: the transposed MKL copy, as without a kernel"
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, kernel)[0], lin(x))


def test_fused_linears_run_on_the_packed_copy_and_follow_their_weights(gemm):
    """q/k/v on the kernel (3 and 20 rows), a long prefill (MAX_ROWS + 1 rows) on each projection's own weight:
    no transposed copy; a weight changed in place is seen."""
    q, k, v = nn.Linear(16, 32, bias=False), nn.Linear(16, 8, bias=False), nn.Linear(16, 8, bias=False)
    fused = FusedLinear(q, k, v)
    fused.prepare(torch.device("cpu"), gemm)
    assert set(fused._fused) == {gemm.layout}
    with torch.no_grad():
        for rows in (3, 20, MAX_ROWS + 1):
            x = torch.randn(1, rows, 16)
            for got, lin in zip(fused(x, gemm), (q, k, v)):
                torch.testing.assert_close(got, lin(x), atol=1e-5, rtol=1e-5)
        k.weight.mul_(2.0)
        x = torch.randn(1, 2, 16)
        torch.testing.assert_close(fused(x, gemm)[1], k(x), atol=1e-5, rtol=1e-5)
    assert set(fused._fused) == {gemm.layout}


@pytest.mark.parametrize("topk, steps, tokens", [(1, 3, 0), (2, 3, 5)])
def test_speculation_on_the_kernel_equals_plain_greedy(gemm, topk, steps, tokens):
    """Every projection of the target and the drafter on the kernel (decode, verify, draft, draft-extend):
    greedy speculative output == plain greedy output, and the runner built every packed copy up front."""
    target = random_model(CFG, seed=21)
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=tokens)
    proposer = Eagle3Drafter(random_drafter(target, 3), spec, TAPS)
    kernels = Kernels(gemv=gemm)
    runner = EagerRunner(target, proposer.net, kernels=kernels)
    assert all(gemm.layout in fl._fused for fl in fused_linears(target) + fused_linears(proposer.net))
    out = Engine(target, drafter=proposer, spec=spec, runner=runner).generate(PROMPTS, 12)
    plain = Engine(target, runner=EagerRunner(target, kernels=kernels)).generate(PROMPTS, 12)
    assert out.tokens == plain.tokens
    assert out.tokens == Engine(target).generate(PROMPTS, 12).tokens, "the kernel's plain decode == MKL's"


@pytest.mark.slow
def test_shipped_drafter_on_the_kernel_is_lossless(default_target, tmp_path):
    """The real model and the shipped drafter, every projection of <= 16 rows on the kernel: speculative ==
    plain greedy, and plain on the kernel == plain on MKL."""
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.draft_registry import shipped_drafter_dir

    kernel = CpuGemm(tmp_path)
    if kernel.reason is not None:
        pytest.skip(kernel.reason)
    model, tok = default_target.model, default_target.tokenizer
    net, taps, _ = load_eagle3(shipped_drafter_dir(), model)
    spec = SpecConfig("eagle3", num_steps=3, topk=1)
    ids = [tok.chat_ids("Summarize the key ideas of open source software in a few bullet points.")]
    eos, kernels = tok.eos_token_ids, Kernels(gemv=kernel)
    out = Engine(model, eos_token_ids=eos, drafter=Eagle3Drafter(net, spec, taps), spec=spec,
                 runner=EagerRunner(model, net, kernels=kernels)).generate(ids, 40)
    plain = Engine(model, eos_token_ids=eos, runner=EagerRunner(model, kernels=kernels)).generate(ids, 40)
    assert out.tokens == plain.tokens == Engine(model, eos_token_ids=eos).generate(ids, 40).tokens
    assert out.mean_accept_len > 1.8


def test_a_profiled_call_is_an_operator_of_the_trace_with_the_same_result(gemm):
    """torch cannot see into the ctypes call: under a profiler the kernel runs as the operator eaglelab::cpu_gemm
    (listed by TensorBoard's Operator view), bit for bit the same."""
    w, x = torch.randn(100, 48), torch.randn(3, 48)
    p = pack(w)
    with torch.no_grad(), torch.profiler.profile() as prof:
        traced = gemm(x, p, None)
    assert "eaglelab::cpu_gemm" in {e.key for e in prof.key_averages()}
    with torch.no_grad():
        assert torch.equal(traced, gemm(x, p, None))


class _Tick:
    """A clock that moves 1 ms per reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-3
        return self.t


def test_one_row_times_each_shape_once_and_counts_it_as_often_as_it_occurs(gemm, monkeypatch):
    """Three weights of one shape and one of another, float32: two shapes timed a pass; on a clock that moves 1 ms
    per reading each timed call reads 1 ms, so a pass is 3 + 1 = 4 ms on each side; a bfloat16 or 1-D tensor is no
    projection of a float32 model and is left out; 5 passes timed after an untimed one."""
    from eaglelab.engine.model import cpu_gemm as C

    calls = []
    real = C.CpuGemm.__call__
    monkeypatch.setattr(C.CpuGemm, "__call__", lambda self, x, w, b: calls.append(w.n) or real(self, x, w, b))
    a, b = torch.randn(8, 16), torch.randn(24, 16)
    (got,) = C.time_rows(gemm, [a, a, a, b, torch.randn(8, 16).bfloat16(), torch.randn(8)], passes=5, clock=_Tick())
    assert got.kernel_ms == pytest.approx(4.0) and got.mkl_ms == pytest.approx(4.0)
    assert calls == [8, 24] * 6 and not got.kernel_faster
    assert C.time_rows(gemm, [], rows=(4, 1)) == (C.Timed(0.0, 0.0), C.Timed(0.0, 0.0))


@pytest.mark.parametrize("kernel_ms, mkl_ms, on_kernel", [(10.0, 20.0, True), (20.0, 10.0, False)])
def test_plain_decoding_takes_the_kernel_only_where_it_timed_faster(gemm, monkeypatch, kernel_ms, mkl_ms, on_kernel):
    """The session times one row through the target's projections (one weight per shape, each fused projection
    counted) and plain decoding, a --draft none run's and a speculative run's baseline, takes the faster; a note
    gives both times and the flag that overrides it."""
    from types import SimpleNamespace

    from eaglelab import session as S
    from eaglelab.engine.model import cpu_gemm as C

    model = random_model(CFG)
    seen = []
    monkeypatch.setattr(C, "time_rows", lambda g, ws, rows: seen.append((ws, rows)) or (C.Timed(kernel_ms, mkl_ms),))
    s = SimpleNamespace(kernels=Kernels(gemv=gemm), target=SimpleNamespace(model=model), notes=[])
    assert S._on_cpu_kernel(s, 1) == (on_kernel,)
    fused = fused_linears(model)
    ws, rows = seen[0]
    assert rows == (1,) and len(ws) == len(fused) and len({id(w) for w in ws}) == len({tuple(w.shape) for w in ws})
    where, flag = ("on the few-row CPU kernel", "--no-gemv") if on_kernel else ("on MKL", "--gemv")
    assert s.notes == [f"gemv: plain decoding {where}: one row through every projection {kernel_ms:.1f} ms on the "
                       f"kernel, {mkl_ms:.1f} ms on MKL, timed now ({flag}: "
                       f"{'MKL' if on_kernel else 'the kernel'})"]
    s.kernels = Kernels()  # the kernel off: MKL, nothing timed
    assert S._on_cpu_kernel(s, 1) == (False,) and len(seen) == 1


def test_a_verify_is_timed_at_its_rows_and_its_note_says_so(gemm, monkeypatch):
    """time_rows(rows=(5, 1)) multiplies 5 rows of x, then 1, on both sides in each pass over one packing of the
    weights; the session times both sides in one call, and its note for the speculative side names the verify's
    rows."""
    from types import SimpleNamespace

    from eaglelab import session as S
    from eaglelab.engine.model import cpu_gemm as C

    shapes = []
    real = C.CpuGemm.__call__
    monkeypatch.setattr(C.CpuGemm, "__call__",
                        lambda self, x, w, b: shapes.append(tuple(x.shape)) or real(self, x, w, b))
    packs = []
    real_pack = C.CpuGemm.pack
    monkeypatch.setattr(C.CpuGemm, "pack", lambda self, w: packs.append(tuple(w.shape)) or real_pack(self, w))
    five, one = C.time_rows(gemm, [torch.randn(8, 16)], rows=(5, 1), passes=2, clock=_Tick())
    assert shapes == [(5, 16), (1, 16)] * 3 and packs == [(8, 16)]
    assert five.kernel_ms == pytest.approx(1.0) and one.mkl_ms == pytest.approx(1.0)
    calls = []
    monkeypatch.setattr(C, "time_rows", lambda g, ws, rows: calls.append(rows) or tuple(C.Timed(7.0 * r, 20.0)
                                                                                        for r in rows))
    s = SimpleNamespace(kernels=Kernels(gemv=gemm), target=SimpleNamespace(model=random_model(CFG)), notes=[])
    assert S._on_cpu_kernel(s, 4, 1) == (False, True) and calls == [(4, 1)]
    assert s.notes[0] == ("gemv: speculation on MKL: the verify's 4 rows through every projection 28.0 ms on the "
                          "kernel, 20.0 ms on MKL, timed now (--gemv: the kernel)")
    assert s.notes[1].startswith("gemv: plain decoding on the few-row CPU kernel: one row through every projection")


def test_one_row_times_a_large_weight_on_its_first_rows_and_scales_them(gemm, monkeypatch):
    """With max_bytes of 128 rows x 16 floats, a [512, 16] weight is timed on its first 128 rows (packed and
    transposed copies of those only) and counted 4 times; 1 ms per reading: 4 ms a pass on each side."""
    from eaglelab.engine.model import cpu_gemm as C

    packed = []
    monkeypatch.setattr(C.CpuGemm, "pack", lambda self, w: packed.append(tuple(w.shape)) or C.pack(w))
    (got,) = C.time_rows(gemm, [torch.randn(512, 16)], passes=3, clock=_Tick(), max_bytes=128 * 16 * 4)
    assert packed == [(128, 16)] and got.kernel_ms == pytest.approx(4.0) and got.mkl_ms == pytest.approx(4.0)
