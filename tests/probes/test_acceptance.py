"""AcceptanceStats: mean accept length, accept rate, per-position rates and histogram by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.observer import CycleStats
from eaglelab.probes.acceptance import AcceptanceStats
from eaglelab.probes.events import Step


def _spec(accept: tuple[int, ...], n: int = 4) -> Step:
    return Step(index=0, kind="spec", phase_ms={}, accept_len=accept, num_draft_tokens=n)


def test_worked_example_from_the_docstring() -> None:
    stats = AcceptanceStats()
    stats.observe_step(_spec((3,)))
    stats.observe_step(_spec((1,)))
    assert stats.mean_accept_len == pytest.approx(2.0)
    assert stats.accept_rate == pytest.approx(2 / 6)
    assert stats.legacy_sglang_accept_rate == pytest.approx(4 / 8)
    assert stats.per_position_rate() == pytest.approx((0.5, 0.5, 0.0))
    assert stats.histogram == {3: 1, 1: 1}
    assert stats.histogram_fractions() == {1: 0.5, 3: 0.5}


def test_rows_batch_and_inactive_rows_are_skipped() -> None:
    stats = AcceptanceStats()
    # Two rows, one finished (0); chain of 5 draft steps (n = 6).
    stats.observe_step(_spec((6, 0), n=6))
    stats.observe_step(_spec((2, 4), n=6))
    assert stats.row_cycles == 3
    assert stats.mean_accept_len == pytest.approx(12 / 3)
    assert stats.accept_rate == pytest.approx((5 + 1 + 3) / 15)
    # depth d reached by a-1 >= d: a = 6, 2, 4 -> depths 5, 1, 3
    assert stats.per_position_rate() == pytest.approx((1.0, 2 / 3, 2 / 3, 1 / 3, 1 / 3))
    assert stats.per_position_rate(depths=7)[5:] == (0.0, 0.0)


def test_plain_decode_and_prefill_cycles_do_not_count() -> None:
    stats = AcceptanceStats()
    stats.observe_step(Step(index=0, kind="prefill", phase_ms={}, accept_len=(1,)))
    stats.observe_step(Step(index=1, kind="decode", phase_ms={}, accept_len=(1,)))
    assert stats.mean_accept_len is None
    assert stats.accept_rate is None
    assert stats.per_position_rate() == ()


def test_engine_cycle_stats_are_accepted_too() -> None:
    stats = AcceptanceStats()
    stats.observe_step(CycleStats(index=3, kind="spec", phase_ms={}, accept_len=(4,), num_draft_tokens=8))
    assert stats.mean_accept_len == 4.0
    assert stats.accept_rate == pytest.approx(3 / 7)
    assert stats.max_offered_depth == 7


def test_architecture_figure_47_percent() -> None:
    """5 draft steps at ~47% per drafted token: mean a - 1 = 2.35 -> accept len 3.35."""
    stats = AcceptanceStats()
    for a in (3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 3):
        stats.observe_step(_spec((a,), n=6))
    assert stats.mean_accept_len == pytest.approx(3.45)
    assert stats.accept_rate == pytest.approx(2.45 / 5)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=4), min_size=1, max_size=30))
def test_invariants_hold_for_any_cycles(cycles: list[list[int]]) -> None:
    stats = AcceptanceStats()
    for rows in cycles:
        stats.observe_step(_spec(tuple(rows), n=8))
    active = [a for rows in cycles for a in rows if a > 0]
    rates = stats.per_position_rate()
    assert all(x >= y for x, y in zip(rates, rates[1:]))
    assert sum(stats.histogram.values()) == len(active)
    if active:
        assert stats.mean_accept_len == pytest.approx(sum(active) / len(active))
        # mean accept length = 1 + sum of per-position rates
        assert stats.mean_accept_len == pytest.approx(1 + sum(rates))
        assert stats.accept_rate == pytest.approx((sum(active) - len(active)) / (7 * len(active)))
    else:
        assert stats.mean_accept_len is None
