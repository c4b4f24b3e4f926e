"""ZeroSparkline: a multi-row sparkline whose baseline is zero, fitted to the widget's width.

Textual's ``Sparkline`` scales from the data's minimum to its maximum, which turns a few percent
of jitter into full-height swings; a throughput or cycle-time trend reads right only from zero.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual import events
from textual.widgets import Static

from eaglelab.tui import fmt


class ZeroSparkline(Static):
    """Plots the values given to :meth:`plot` (oldest first), averaging them into the width."""

    DEFAULT_CSS = """
    ZeroSparkline { height: 1fr; color: $primary; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.values: tuple[float, ...] = ()

    def plot(self, values: Sequence[float]) -> None:
        """Show ``values``; redraws only when they changed."""
        values = tuple(values)
        if values != self.values:
            self.values = values
            self._draw()

    def on_resize(self, event: events.Resize) -> None:
        self._draw()

    def _draw(self) -> None:
        size = self.content_size
        rows = fmt.sparkline_rows(self.values, size.width, size.height)
        self.update(Text("\n".join(rows)))
