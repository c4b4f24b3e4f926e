"""MetricCard: one headline number, a line of detail and a zero-based sparkline of its history."""

from __future__ import annotations

from typing import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from eaglelab.tui.w_sparkline import ZeroSparkline


class MetricCard(Vertical):
    """A bordered card: ``title`` on the border, a bold value, a dim detail line, a sparkline."""

    DEFAULT_CSS = """
    MetricCard { width: 1fr; height: 100%; border: round $primary; padding: 0 1; }
    MetricCard > .metric--value { text-style: bold; color: $text; }
    MetricCard > .metric--detail { color: $text-muted; }
    """

    def __init__(self, title: str, *, sparkline: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
        self._with_sparkline = sparkline
        self.value_text = ""
        self.detail_text = ""

    def compose(self) -> ComposeResult:
        yield Static("—", classes="metric--value")
        yield Static("", classes="metric--detail")
        if self._with_sparkline:
            yield ZeroSparkline()

    def update_metric(self, value: str, detail: str, history: Sequence[float] = ()) -> None:
        """Show ``value`` and ``detail``; plot ``history`` (oldest first) when the card has a sparkline."""
        if value != self.value_text:
            self.query_one(".metric--value", Static).update(value)
            self.value_text = value
        if detail != self.detail_text:
            self.query_one(".metric--detail", Static).update(detail)
            self.detail_text = detail
        if self._with_sparkline:
            self.query_one(ZeroSparkline).plot(history)
