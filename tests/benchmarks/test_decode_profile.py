"""``benchmarks/decode_profile.py`` on the CPU: the report's parts are there and add up (the figures
themselves come from a GPU run); asked for CUDA where there is none, it refuses with a clear message."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import decode_profile


def test_the_cpu_report_lists_a_steps_operators_and_its_timings(tmp_path, one_thread):
    out = tmp_path / "profile.json"
    rc = decode_profile.main(["--model", "tiny", "--device", "cpu", "--tokens", "6", "--repeats", "2",
                              "--profile-steps", "3", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"] == "plain-eager" and report["batch"] == 1
    (eager,) = report["kernels"]  # bench --profile's measure at batch 1: eager layers only on CPU
    assert (eager["batch"], eager["layers"], eager["status"]) == (1, "eager", "ran")
    names = {r["name"] for r in eager["kernels"]}
    assert names & {"aten::mm", "aten::linear", "aten::addmm"}, names
    assert eager["device_us"] > 0 and eager["launches"] >= len(eager["kernels"])
    assert report["replay_ms"]["steps"] == 5  # 6 tokens: the prefill's, then 5 decode steps
    e2e = report["end_to_end"]
    assert len(e2e["tok_per_s"]) == 2 and e2e["median_tok_per_s"] > 0
    assert e2e["ms_per_token"] == pytest.approx(1e3 / e2e["median_tok_per_s"])
    assert report["end_to_end_stop_at_once"]["median_tok_per_s"] > 0 and e2e["ratio_over_stop_at_once"] > 0
    assert 0 < e2e["prefill_ms"] < e2e["run_ms"]
    assert e2e["ms_per_decode_step"] == pytest.approx((e2e["run_ms"] - e2e["prefill_ms"]) / 5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_refusal(capsys):
    assert decode_profile.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "--device" in err


def test_an_unknown_device_is_a_clear_refusal(capsys):
    assert decode_profile.main(["--device", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown device" in err and "--device" in err
