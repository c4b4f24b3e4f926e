"""AcceptHistogram: how many tokens each verify committed, and how deep acceptance reached."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from eaglelab.tui import fmt
from eaglelab.tui.model import RunView
from eaglelab.tui.w_panel import ViewPanel


class AcceptHistogram(ViewPanel):
    """Bars of row-cycles per accept length (bonus included), then per-depth acceptance."""

    TITLE = "accept length per verify (bonus token included)"

    @staticmethod
    def renderable_for(view: RunView, width: int) -> Group | Text:
        """The rich renderable for ``view`` in ``width`` cells."""
        if not view.accept_histogram:
            return Text("no speculative cycles yet", style="dim")
        total = sum(n for _, n in view.accept_histogram)
        peak = max(n for _, n in view.accept_histogram)
        width = max(8, width - 18)
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", style="bold")
        table.add_column()
        table.add_column(justify="right")
        table.add_column(justify="right", style="dim")
        for a, n in view.accept_histogram:
            bar = fmt.hbar(n / peak if peak else 0.0, width)
            table.add_row(str(a), Text(bar, style="cyan"), str(n), fmt.pct(n / total if total else None, 0))
        depth = Text("reached depth  ", style="dim")
        for d, rate in enumerate(view.per_position, start=1):
            depth.append(f"{d}: ", style="dim")
            depth.append(f"{fmt.pct(rate, 0)}  ")
        return Group(table, Text(""), depth)
