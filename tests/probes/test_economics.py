"""Economics: predicted speedup, break-even verify, ratio and the verdict, against hand figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes.economics import EconomicsInputs, analyse

# The verify-cost deployment: eager extend verify, 29.5 ms against a 12 ms decode.
EAGER_VERIFY = EconomicsInputs(
    decode_ms=12.0, draft_ms=3.0, verify_ms=29.5, accept_ms=0.5, extend_ms=2.0, accept_len=2.5,
    verify_graph="eager: attention mode prefill", attention_mode="prefill", expected_accept_len=2.0,
)
# The wiring deployment: verify is fine, acceptance collapsed.
LOW_ACCEPTANCE = EconomicsInputs(
    decode_ms=11.0, draft_ms=4.0, verify_ms=13.0, accept_ms=0.5, extend_ms=1.5, accept_len=1.3,
    verify_graph="replay", attention_mode="decode", expected_accept_len=2.5,
)
PAYS = EconomicsInputs(decode_ms=12.0, draft_ms=3.0, verify_ms=13.0, accept_ms=0.5, extend_ms=1.5, accept_len=3.5)
DRAFT_HEAVY = EconomicsInputs(decode_ms=10.0, draft_ms=12.0, verify_ms=10.5, accept_ms=1.0, extend_ms=3.0, accept_len=2.2)


def test_eager_verify_figures_by_hand() -> None:
    e = analyse(EAGER_VERIFY)
    # cycle = 3 + 29.5 + 0.5 + 2 = 35; speedup = 2.5 * 12 / 35
    assert EAGER_VERIFY.cycle_ms == pytest.approx(35.0)
    assert e.predicted_speedup == pytest.approx(30 / 35)
    assert e.break_even_verify_ms == pytest.approx(30 - 5.5)
    assert e.verify_decode_ratio == pytest.approx(29.5 / 12)
    assert e.speedup_if_verify_as_decode == pytest.approx(30 / 17.5)
    assert e.speedup_if_expected_acceptance == pytest.approx(30 / 35)
    assert e.cause == "verify_eager"
    assert e.verdict.startswith("speculation is slower than plain decoding (0.86x predicted): ")
    assert "verify costs 2.5x a decode and runs eagerly (attention mode prefill)" in e.verdict
    assert "break-even verify is 24.5 ms" in e.verdict
    assert e.verdict.endswith("try --attention-mode decode")


def test_break_even_verify_gives_speedup_one() -> None:
    e = analyse(EAGER_VERIFY)
    assert EAGER_VERIFY.speedup(verify_ms=e.break_even_verify_ms) == pytest.approx(1.0)


def test_low_acceptance_figures_by_hand() -> None:
    e = analyse(LOW_ACCEPTANCE)
    # cycle = 4 + 13 + 0.5 + 1.5 = 19; speedup = 1.3 * 11 / 19
    assert e.predicted_speedup == pytest.approx(14.3 / 19)
    assert e.break_even_verify_ms == pytest.approx(14.3 - 6.0)
    assert e.speedup_if_expected_acceptance == pytest.approx(27.5 / 19)
    assert e.speedup_if_verify_as_decode == pytest.approx(14.3 / 17)
    assert e.cause == "acceptance_low"
    assert "acceptance too low: mean accepted length 1.30 (expected >= 2.5 for this drafter)" in e.verdict
    assert e.verdict.endswith("check wiring with eaglelab check-wiring")


def test_pays() -> None:
    e = analyse(PAYS)
    assert e.predicted_speedup == pytest.approx(42 / 18)
    assert e.break_even_verify_ms == pytest.approx(37.0)
    assert e.cause == "pays"
    assert e.verdict.startswith("speculation pays: 2.33x predicted")


def test_costly_verify_on_a_graph_is_not_called_eager() -> None:
    inputs = EconomicsInputs(decode_ms=12.0, draft_ms=2.0, verify_ms=30.0, accept_len=2.4, verify_graph="replay")
    e = analyse(inputs)
    assert e.cause == "verify_costly"
    assert "verify costs 2.5x a decode;" in e.verdict and "eagerly" not in e.verdict
    assert "--attention-mode" not in e.verdict


def test_draft_heavy() -> None:
    e = analyse(DRAFT_HEAVY)
    # cycle = 12 + 10.5 + 1 + 3 = 26.5; speedup = 22 / 26.5; verify 1.05x a decode is fine
    assert e.predicted_speedup == pytest.approx(22 / 26.5)
    assert e.cause == "draft_costly"
    assert "drafting costs 16.0 ms per cycle" in e.verdict and "12.0 ms the 1.20 accepted" in e.verdict


def test_no_verify_cost_can_pay() -> None:
    inputs = EconomicsInputs(decode_ms=10.0, draft_ms=15.0, verify_ms=40.0, accept_len=1.4,
                             verify_graph="eager: batch 9 > largest bucket 8", expected_accept_len=1.2)
    e = analyse(inputs)
    assert e.break_even_verify_ms == pytest.approx(-1.0)
    assert e.cause == "verify_eager"
    assert "runs eagerly (batch 9 > largest bucket 8)" in e.verdict
    assert "even a free verify would not pay" in e.verdict


@pytest.mark.parametrize(
    "kwargs",
    [dict(decode_ms=0.0), dict(accept_len=0.9), dict(verify_ms=-1.0)],
)
def test_impossible_inputs_are_rejected(kwargs: dict[str, float]) -> None:
    base = dict(decode_ms=10.0, draft_ms=1.0, verify_ms=10.0, accept_len=2.0)
    with pytest.raises(ValueError):
        EconomicsInputs(**{**base, **kwargs})


@settings(max_examples=100, deadline=None)
@given(
    d=st.floats(1, 50), draft=st.floats(0, 50), verify=st.floats(0.1, 100),
    a=st.floats(1, 8), e=st.floats(1, 8),
)
def test_verdict_agrees_with_the_speedup(d: float, draft: float, verify: float, a: float, e: float) -> None:
    inputs = EconomicsInputs(decode_ms=d, draft_ms=draft, verify_ms=verify, accept_len=a, expected_accept_len=e)
    out = analyse(inputs)
    assert (out.cause == "pays") == (out.predicted_speedup >= 1.0)
    assert out.verdict.startswith("speculation pays") == (out.cause == "pays")
    # speedup falls as verify grows, and crosses 1 at the break-even point
    assert inputs.speedup(verify_ms=verify + 1) < out.predicted_speedup
    if out.break_even_verify_ms > 0:
        assert inputs.speedup(verify_ms=out.break_even_verify_ms) == pytest.approx(1.0)
