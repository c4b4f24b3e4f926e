"""AllReduceTable: per-layer all-reduce cost of a tensor-parallel run, scrollable."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.widgets import DataTable

from eaglelab.tui import fmt
from eaglelab.tui.model import AllReduceRow, RunView

COLUMNS: tuple[str, ...] = ("layer", "site", "calls", "mean ms", "total ms", "share", "per call", "in graph")


class AllReduceTable(DataTable):
    """One row per (layer, site): calls, mean and total ms, share of all all-reduce time, bytes.

    The share bar is scaled to the costliest row, its percentage is of all all-reduce time.
    """

    DEFAULT_CSS = """
    AllReduceTable { width: 1fr; height: 100%; border: round $secondary; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._shown: tuple[AllReduceRow, ...] | None = None

    def on_mount(self) -> None:
        self.border_title = "all-reduce per layer"
        self.add_columns(*COLUMNS)

    def show(self, view: RunView) -> None:
        """Rebuild the rows when ``view``'s all-reduce figures changed (keeps the cursor row)."""
        self.display = bool(view.allreduce)  # single-GPU runs have none: give the space away
        share = view.allreduce_share
        if not view.allreduce:
            tp = view.header.tp_size if view.header is not None else 1
            self.border_subtitle = f"none reported (tp {tp})"
        else:
            self.border_subtitle = f"{fmt.ms(view.allreduce_ms, 1)} total · {fmt.pct(share)} of measured time"
        if view.allreduce == self._shown:
            return
        self._shown = view.allreduce
        cursor = self.cursor_row
        self.clear()
        total = view.allreduce_ms or 1.0
        peak = max((r.total_ms for r in view.allreduce), default=0.0) or 1.0
        for r in view.allreduce:
            share = Text(fmt.hbar(r.total_ms / peak, 8), style="yellow")
            share.append(f" {fmt.pct(r.total_ms / total)}", style="dim")
            self.add_row(
                r.layer, escape(str(r.site)), r.calls,  # escaped: a site name from a record is not markup
                f"{r.mean_ms:.3f}", f"{r.total_ms:.2f}", share, fmt.nbytes(r.mean_bytes),
                f"{r.in_graph}/{r.calls}",
            )
        if view.allreduce:
            self.move_cursor(row=min(cursor, len(view.allreduce) - 1))
