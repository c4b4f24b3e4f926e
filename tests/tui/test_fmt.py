"""Text helpers of the TUI: bars and the zero-based sparkline."""

from __future__ import annotations

from eaglelab.tui.fmt import hbar, nbytes, pct, sparkline_rows


def test_hbar_fills_in_eighths_and_keeps_its_width():
    assert hbar(0.5, 4) == "██  "
    assert hbar(1 / 32, 4) == "▏   "  # one eighth of one cell of four
    assert hbar(2.0, 3) == "███" and hbar(-1.0, 3) == "   "
    assert all(len(hbar(f / 17, 9)) == 9 for f in range(18))


def test_sparkline_is_zero_based_and_fits_the_width():
    """[0, 4, 8] on 2 rows: 0, half (one full lower cell), full (both cells)."""
    assert sparkline_rows([0, 4, 8], 3, 2) == ["  █", " ██"]
    assert sparkline_rows([100, 80], 2, 1) == ["█▆"]  # 20% less is a little shorter, not empty
    assert sparkline_rows(list(range(100)), 4, 1) == ["▁▃▆█"]  # bucket means 12, 37, 62, 87
    assert sparkline_rows([], 3, 2) == ["   ", "   "]


def test_number_formats():
    assert pct(0.387) == "38.7%" and pct(None) == "—"
    assert nbytes(500) == "500 B" and nbytes(3 << 20) == "3.0 MiB"
