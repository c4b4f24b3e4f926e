"""``benchmarks/attn_bench.py`` off the GPU: without CUDA it refuses with a clear message; its case plumbing
(inputs, errors against the fp32 reference, the planner's plan, the sweep, the report line) runs under
Triton's interpreter on CPU tensors (fp16, a SmolLM2-shaped case), its CUDA-graph timer replaced by one call
and a set figure (the figures themselves come from a GPU run)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks import attn_bench
from tests.conftest import has_triton

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_without_cuda_it_says_so_and_measures_nothing(tmp_path, capsys):
    assert attn_bench.main(["--json", str(tmp_path / "a.json")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "a.json").exists()


def test_cases_skip_used_lengths_past_the_cache():
    """Defaults: 2 shapes x B {1, 8} x T {1, 4} x (S 128: used 100; S 2048: used 100 and 1000) = 24 cases."""
    args = attn_bench.argparse.Namespace(shapes="llama3.1-8b,smollm2-135m", batch="1,8", rows="1,4",
                                         slots="128,2048", used="100,1000")
    got = list(attn_bench.cases(args))
    assert len(got) == 24 and all(used <= S for *_, S, used in got)


CASE = textwrap.dedent("""
    import argparse, torch
    from benchmarks import attn_bench
    from eaglelab.engine.model import decode_attention as A

    class CpuAttention(A.TritonDecodeAttention):
        def refusal(self, q, k, mask):  # the device check waived: the interpreter runs the kernel on CPU
            why = super().refusal(q, k, mask)
            return None if why is not None and why.startswith("not CUDA") else why

    attn_bench.SWEEP = [(32, 1), (32, 3), (64, 2), (128, 4)]  # (128, 4): more splits than blocks, left out
    figures = iter([2.0, 1.0, 1.5, 0.8, 1.2])  # sdpa, ours, then the sweep's plans in order (ms per call)
    attn_bench.graph_ms = lambda fn, layers, calls, replays: (fn(layers - 1), next(figures))[1]
    args = argparse.Namespace(sweep=True, min_bytes=0, calls=1, replays=1)
    r = attn_bench.one_case("smollm2-135m", 1, 4, 128, 100, CpuAttention(), args, device="cpu", dtype=torch.float16)
    assert r["refusal"] is None and r["kernel_reason"] is None, r
    assert r["layers"] == 1 and r["plan"] == [64, 1, 4], r["plan"]
    assert r["max_abs_err_ours"] <= 4e-3 and r["max_abs_err_sdpa"] <= 4e-3, r
    assert r["sdpa_us"] == 2000.0 and r["ours_us"] == 1000.0 and r["speedup_over_sdpa"] == 2.0
    assert [s["plan"] for s in r["sweep"]] == [[32, 1, 4], [32, 3, 4], [64, 2, 4]], r["sweep"]
    assert all(s["max_abs_err"] <= 4e-3 for s in r["sweep"]) and r["best_plan"]["plan"] == [32, 3, 4]
    print(attn_bench.line(r))
    print(attn_bench._summary([r])[0])
""")


@pytest.mark.skipif(not has_triton(), reason="Triton not installed")
def test_one_case_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CASE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line, summary = done.stdout.strip().splitlines()[-2:]
    assert "sdpa  2000.0 us  ours  1000.0 us  x2.00  plan (64, 1, 4)  best plan (32, 3, 4) 800.0 us" in line, line
    assert summary.startswith("smollm2-135m B=1 T=4 S=128 used=100: 30 layers: SDPA 60000 us, ours 30000 us"), summary
