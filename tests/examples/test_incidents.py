"""The three incident examples, run at their --small size: the verdicts they print, not their timings.

Timings on a shared CPU are noise; what must hold is what the probes conclude from the run and what
cannot depend on speed: speculation stays lossless, the broken wiring accepts less, check-wiring exits 1
with the config fix, the log probe flags the health-check batches.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_health_checks_example_flags_the_eager_health_check_batch():
    out = io.StringIO()
    reports = example("incident_health_checks").main(["--small"], Console(file=out, width=200))
    healthy, broken = reports["healthy"], reports["broken"]
    assert healthy.verdicts == () and healthy.accept_len_mean == 5.51
    assert broken.details["eager_health_check_prefill_lines"] == [9]
    assert broken.details["health_requests_before_ready"] == 1
    assert any("eaglelab wait-ready" in v for v in broken.verdicts)
    assert "1 (log line 9: graph False)" in out.getvalue() and "nothing to flag" in out.getvalue()


@pytest.mark.slow
def test_verify_eager_example_is_lossless_and_names_the_extend_verify(default_target):
    rows = example("incident_verify_eager").main(["--small", "--device", "cpu"], quiet())
    healthy, broken = rows["healthy"], rows["broken"]
    assert healthy.identical_to_plain and broken.identical_to_plain
    # the attention mode changes what verify costs, never what it accepts
    assert (healthy.accept_len, healthy.accept_rate) == (broken.accept_len, broken.accept_rate)
    assert broken.economics.inputs.attention_mode == "prefill" and healthy.economics.inputs.attention_mode == "decode"
    assert broken.verify_graph.startswith("eager")
    for row in (healthy, broken):  # the table shows the economics probe's own words first
        assert row.verdicts[0] == row.economics.verdict
    if broken.cause in ("verify_eager", "verify_costly"):
        assert "break-even verify" in broken.verdicts[0] and "--attention-mode decode" in broken.verdicts[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_verify_eager_example_on_gpu_names_verify_as_the_cause():
    rows = example("incident_verify_eager").main(["--small", "--device", "cuda"], quiet())
    healthy, broken = rows["healthy"], rows["broken"]
    assert healthy.verify_graph == "replay"
    assert broken.verify_graph.startswith("eager: attention mode prefill")
    assert broken.cause == "verify_eager" and "break-even verify" in broken.verdicts[0]
    assert broken.verify_over_decode > healthy.verify_over_decode


@pytest.mark.slow
def test_wiring_example_acceptance_drops_and_check_wiring_prints_the_fix(default_target):
    result = example("incident_wiring").main(["--small", "--device", "cpu"], quiet())
    healthy, embedding, vllm = result["rows"]
    assert all(r.identical_to_plain for r in result["rows"])  # wrong wiring costs speed, never correctness
    # The embedding tap collapses acceptance even on a few tokens; ids read one layer early cost less, and on
    # the --small run (a few dozen tokens) they may tie with the healthy wiring: check-wiring is the verdict.
    assert embedding.accept_len < healthy.accept_len and vllm.accept_len <= healthy.accept_len
    ok, emb_check, vllm_check = result["checks"]
    assert (ok.exit_code, emb_check.exit_code, vllm_check.exit_code) == (0, 1, 1)
    assert ok.fix is None and ok.verdict_line.startswith("WIRING OK")
    assert "eagle_config.eagle_aux_hidden_state_layer_ids: [-1, 1, 14] → [1, 14, 26]" in emb_check.fix
    assert "eagle_aux_hidden_state_layer_ids: None → [2, 15, 27]" in vllm_check.fix
