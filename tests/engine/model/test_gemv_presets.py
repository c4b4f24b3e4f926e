"""Tilings measured before (a device profile's) in the Triton GEMV (engine/model/gemv.py, ``TritonGemv.adopt``):
taken untimed where they were measured on this GPU, dtype, torch and Triton, checked against F.linear on first
use; refused with the differing versions named otherwise, and then every shape is tuned as without them.

On CPU the kernel is stood in by ``run_op`` (F.linear, or a wrong result) and the timer by a counter, so these
pin the tuner's decisions, not the kernel (test_gemv.py checks the kernel itself)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglelab.engine.model import gemv as G

HERE = {"gpu": "NVIDIA H200", "dtype": "float16", "torch": "2.11.0+cu130", "triton": "3.6.0"}
W_N, W_K = 40, 64


class _Gemv(G.TritonGemv):
    """The GEMV as if Triton were here (the tests stand in for the kernel and the timer)."""

    def __init__(self, said: list[str]):
        super().__init__(log=said.append)
        self.reason = None


@pytest.fixture
def kernel(monkeypatch):
    """``run_op`` as F.linear (a tiling whose block_k is 99: off by one), and a timer that counts its calls
    (each tiling 2 ms, F.linear 3 ms: the tuner picks the first candidate)."""
    timed: list[int] = []

    def run_op(x, weight, bias, cfg):
        y = F.linear(x, weight, bias)
        return y + 1 if cfg.block_k == 99 else y

    def time_in_turn(call, copies, reps):
        timed.append(copies)
        return 3.0 if len(timed) == len(G.candidates(1)) + 1 else 2.0

    monkeypatch.setattr(G, "run_op", run_op)
    monkeypatch.setattr(G, "time_in_turn", time_in_turn)
    return timed


def _xw(rows: int):
    return torch.randn(rows, W_K).half(), torch.randn(W_N, W_K).half(), torch.randn(W_N).half()


@torch.no_grad()
def test_adopted_tilings_on_the_same_setup_are_used_without_timing(kernel):
    """M = 1 and M = 3 (bucket 4) adopted: no tiling is timed, the chosen table is the profile's; M = 8 was not
    in it and is tuned as usual (the timer's first call is its)."""
    said: list[str] = []
    gemv = _Gemv(said)
    preset = {(W_N, W_K, 1): (8, 512, 1, 4, 3), (W_N, W_K, 4): (0, 0, 0, 0, 0)}
    assert gemv.adopt(preset, dict(HERE), dict(HERE), source="p.json") is None
    assert said[-1].startswith("GEMV tilings for 2 shapes from p.json")
    for rows in (1, 3):
        x, w, b = _xw(rows)
        assert torch.equal(gemv(x, w, b), F.linear(x, w, b))
    assert kernel == [], "an adopted shape is never timed"
    assert gemv.chosen == {(W_N, W_K, 1): G.GemvConfig(8, 512, 1, 4, 3), (W_N, W_K, 4): G.LINEAR}
    x, w, b = _xw(8)
    gemv(x, w, b)
    assert len(kernel) == len(G.candidates(8)) + 1 and (W_N, W_K, 8) in gemv.chosen


@torch.no_grad()
@pytest.mark.parametrize("field, value, named", [
    ("torch", "2.13.0+cu130", "torch 2.11.0+cu130 (here 2.13.0+cu130)"),
    ("triton", "3.7.0", "triton 3.6.0 (here 3.7.0)"),
    ("gpu", "NVIDIA A100-SXM4-80GB", "gpu NVIDIA H200 (here NVIDIA A100-SXM4-80GB)"),
    ("dtype", "bfloat16", "dtype float16 (here bfloat16)"),
])
def test_tilings_from_another_setup_are_refused_with_the_difference_and_the_shape_is_tuned(kernel, field, value,
                                                                                           named):
    said: list[str] = []
    gemv = _Gemv(said)
    why = gemv.adopt({(W_N, W_K, 1): (8, 512, 1, 4, 3)}, dict(HERE), dict(HERE, **{field: value}), source="p.json")
    assert why == f"GEMV tilings from p.json not used, measured with {named}: each shape is tuned here"
    assert said == [why] and gemv.preset == {}
    x, w, b = _xw(1)
    gemv(x, w, b)
    assert len(kernel) == len(G.candidates(1)) + 1, "every candidate and F.linear timed"
    assert gemv.chosen == {(W_N, W_K, 1): G.candidates(1)[0]}


def test_a_missing_recorded_version_is_a_difference():
    assert G.environment_mismatch({"gpu": "NVIDIA H200"}, {"gpu": "NVIDIA H200", "torch": "2.11.0"}) == \
        "torch not recorded (here 2.11.0)"
    assert G.environment_mismatch(HERE, dict(HERE)) is None


@torch.no_grad()
def test_an_adopted_tiling_that_disagrees_here_is_said_and_the_shape_tuned(kernel):
    said: list[str] = []
    gemv = _Gemv(said)
    gemv.adopt({(W_N, W_K, 1): (8, 99, 1, 4, 3)}, dict(HERE), dict(HERE))
    x, w, b = _xw(1)
    assert torch.equal(gemv(x, w, b), F.linear(x, w, b))
    assert any(s.startswith("  GEMV [64 -> 40] M<=1: the adopted block_n 8, block_k 99, split_k 1, warps 4, "
                            "stages 3 failed here (max |error| 1 against F.linear") for s in said), said
    assert len(kernel) == len(G.candidates(1)) + 1 and gemv.chosen == {(W_N, W_K, 1): G.candidates(1)[0]}


def test_tuning_environment_names_gpu_dtype_torch_and_triton(monkeypatch):
    """Triton's version from its package metadata (here stood in by 3.9.1), "absent" without the package."""
    import importlib.metadata

    def version(name: str) -> str:
        if name == "triton" and absent:
            raise importlib.metadata.PackageNotFoundError(name)
        return {"triton": "3.9.1"}[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    absent = False
    env = G.tuning_environment(torch.device("cpu"), torch.bfloat16)
    assert list(env) == ["gpu", "dtype", "torch", "triton"]
    assert (env["gpu"], env["dtype"], env["torch"], env["triton"]) == ("cpu", "bfloat16", torch.__version__, "3.9.1")
    absent = True
    assert G.tuning_environment(torch.device("cpu"), "float16") == dict(env, dtype="float16", triton="absent")


class _PdlGemv(_Gemv):
    """The GEMV of phases that launch dependently (``--pdl``)."""

    def __init__(self, said: list[str]):
        super().__init__(said)
        self.pdl = True


@torch.no_grad()
@pytest.mark.parametrize("pdl", [False, True])
def test_a_pdl_tuner_times_its_tilings_in_dependent_launches(monkeypatch, pdl):
    """Each candidate (and F.linear, whose cuBLAS launch takes no part) is timed while our launches are dependent
    exactly when the tuner is a --pdl one; the switch is back off after, as before."""
    from eaglelab.engine.model import pdl as P

    seen: list[bool] = []
    monkeypatch.setattr(G, "run_op", lambda x, w, b, cfg: F.linear(x, w, b))
    monkeypatch.setattr(G, "time_in_turn", lambda call, copies, reps: (seen.append(P.active()), 2.0)[1])
    said: list[str] = []
    gemv = (_PdlGemv if pdl else _Gemv)(said)
    x, w, b = _xw(1)
    gemv(x, w, b)
    assert seen == [pdl] * (len(G.candidates(1)) + 1) and not P.active()
    assert ("timed in chains of dependent launches" in said[0]) == pdl, said


def test_pdl_choices_are_kept_apart_from_plain_ones(kernel):
    """A --pdl tuner's environment names its launches; plain choices (a shipped profile's: no launches recorded)
    are not adopted by it, nor its choices by a plain tuner: each names what differs and tunes."""
    plain, dependent = _Gemv([]), _PdlGemv([])
    here = plain.environment(torch.device("cpu"), "float16")
    assert "launches" not in here and dependent.environment(torch.device("cpu"), "float16") == dict(
        here, launches=G.DEPENDENT)
    said: list[str] = []
    dependent.log = said.append
    why = dependent.adopt({(W_N, W_K, 1): (8, 512, 1, 4, 3)}, dict(HERE), dict(HERE, launches=G.DEPENDENT))
    assert why.endswith("measured with launches plain (here dependent (PDL)): each shape is tuned here"), why
    assert dependent.preset == {} and said == [why]
    why = plain.adopt({(W_N, W_K, 1): (8, 512, 1, 4, 3)}, dict(HERE, launches=G.DEPENDENT), dict(HERE))
    assert "launches dependent (PDL) (here plain)" in why and plain.preset == {}
    assert dependent.adopt({(W_N, W_K, 1): (8, 512, 1, 4, 3)}, dict(HERE, launches=G.DEPENDENT),
                           dict(HERE, launches=G.DEPENDENT)) is None
    assert dependent.preset == {(W_N, W_K, 1): G.GemvConfig(8, 512, 1, 4, 3)}


@torch.no_grad()
def test_an_output_several_kernels_read_takes_no_more_shares_than_the_compiler_folds(monkeypatch):
    """q/k/v-like (``readers`` 3) at K 128: a tiling of 8 shares is checked and timed adding them in its launch
    (inductor would add them in a kernel of its own), one of 4 as the shares the reader adds; read whole (o, down)
    both leave their shares to the reader. A profile's 8-share tiling, timed as shares, is not taken for the
    q/k/v-like call (the log says why, and the shape is tuned) and is taken for the whole one."""
    eight, four, whole = G.GemvConfig(16, 16, 8, 4, 3), G.GemvConfig(16, 32, 4, 4, 3), G.GemvConfig(16, 32, 1, 4, 3)
    seen: list[tuple[G.GemvConfig, bool]] = []

    def disagreement(x, weight, bias, cfg, ref, bound, shares=False):
        seen.append((cfg, shares))
        return None

    monkeypatch.setattr(G, "candidates", lambda rows: (eight, four, whole))
    monkeypatch.setattr(G, "disagreement", disagreement)
    monkeypatch.setattr(G, "time_in_turn", lambda call, copies, reps: 2.0)
    monkeypatch.setattr(G, "run_op", lambda x, weight, bias, cfg: F.linear(x, weight, bias))
    x, w = torch.randn(4, 128).half(), torch.randn(W_N, 128).half()
    for readers, ways in ((3, [False, True, False]), (1, [True, True, False])):
        seen.clear()
        _Gemv([])(x, w, None, sums_fused=True, readers=readers)
        assert seen == list(zip((eight, four, whole), ways)), (readers, seen)
    for readers, taken in ((3, False), (1, True)):
        said: list[str] = []
        gemv = _Gemv(said)
        assert gemv.adopt({(W_N, 128, 4): tuple(eight)}, dict(HERE), dict(HERE)) is None
        seen.clear()
        gemv(x, w, None, sums_fused=True, readers=readers)
        assert len(seen) == (1 if taken else 4), seen  # taken: its one check; else the check, then each candidate
        if not taken:
            assert any("timed as 8 shares added by the reader; here 3 projections read them, and past 4 reads"
                       in s for s in said), said
