"""``benchmarks/gemv_bench.py --tilings``: extra tilings are read before anything is measured; a malformed one is a
usage error naming the flag (the timings themselves come from a GPU run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/gemv_bench.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_malformed_tiling_is_a_usage_error():
    got = _run("--tilings", "8,512,1,8,1;16,256")
    assert got.returncode == 2 and "--tilings" in got.stderr and "five comma-separated ints" in got.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_well_formed_tilings_pass_to_the_cuda_check():
    got = _run("--tilings", "8,512,1,8,1;16,512,3,4,1", "--model", "smollm2-135m")
    assert got.returncode == 2 and "needs a CUDA device" in got.stderr
