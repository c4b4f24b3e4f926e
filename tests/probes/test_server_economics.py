"""The live economics verdict: speedup against the user's plain baseline, break-even accepted length,
and the probable cause when speculation costs time."""

from __future__ import annotations

import pytest

from eaglelab.probes.server_economics import live_economics


def test_worked_example_an_eager_verify_below_break_even() -> None:
    """59 tok/s against 82 plain at accepted length 2.5, decode passes off CUDA graphs."""
    e = live_economics(2.5, 59.0, baseline_tokens_per_s=82.0, cuda_graph_share=0.0, engine="sglang")
    assert e.speedup == pytest.approx(59 / 82)
    assert e.break_even_accept_len == pytest.approx(2.5 * 82 / 59)  # a cycle costs 3.47 plain decodes
    assert e.cause == "verify_eager" and e.below_break_even
    assert "0.72x" in e.verdict and "break-even of 3.47" in e.verdict and "100% of decode passes" in e.verdict
    assert "--speculative-attention-mode decode" in e.verdict


def test_low_acceptance_is_the_cause_before_cost() -> None:
    e = live_economics(1.3, 70.0, baseline_tokens_per_s=82.0, expected_accept_len=2.0, cuda_graph_share=0.5)
    assert e.cause == "acceptance_low" and "check-wiring" in e.verdict


def test_a_costly_cycle_with_good_acceptance_and_graphs() -> None:
    """A few eager passes (prefills, big batches) are normal: below 10% they are not the cause."""
    for share in (1.0, 0.96):
        e = live_economics(2.5, 70.0, baseline_tokens_per_s=82.0, cuda_graph_share=share)
        assert e.cause == "cycle_costly" and "2.9 plain decodes" in e.verdict


def test_it_pays() -> None:
    e = live_economics(3.2, 373.0, baseline_tokens_per_s=158.0)
    assert e.cause == "pays" and not e.below_break_even and "2.36x" in e.verdict


def test_without_a_baseline_only_acceptance_is_judged() -> None:
    assert live_economics(2.6, 120.0).cause == "speedup_unknown"
    assert "--baseline-tok-s" in live_economics(2.6, 120.0).verdict
    low = live_economics(1.4, None, expected_accept_len=2.0)
    assert low.cause == "acceptance_low" and low.below_break_even and low.speedup is None
