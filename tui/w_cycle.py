"""CycleBreakdown: where a speculative cycle's time goes (draft / verify / accept / draft_extend)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from eaglelab.tui import fmt
from eaglelab.tui.model import RunView
from eaglelab.tui.w_panel import ViewPanel

PHASE_STYLES: dict[str, str] = {
    "draft": "magenta", "verify": "yellow", "accept": "green", "draft_extend": "blue", "decode": "cyan",
}
# Verify in decode attention mode (graph-captured) costs about one plain decode; well above that
# is the failure eaglelab exists to catch (an eager extend verify: ~2.4 decodes).
SLOW_VERIFY_RATIO = 1.5
_GAPS = 4 * 2  # five columns, one cell of padding either side of each inner edge


class CycleBreakdown(ViewPanel):
    """A table of mean and recent ms per phase with share bars, a stacked bar, and verify vs decode."""

    TITLE = "cycle breakdown (mean per cycle)"

    @staticmethod
    def renderable_for(view: RunView, width: int) -> Group | Text:
        """The rich renderable for ``view`` in ``width`` cells."""
        if not view.phases:
            return Text("no decode steps or cycles yet", style="dim")
        cells = [(row.phase, fmt.ms(row.mean_ms), fmt.ms(row.recent_ms), fmt.pct(row.share, 0)) for row in view.phases]
        text_width = sum(max(len(c[i]) for c in cells + [("phase", "mean", "recent", "")]) for i in range(4))
        bar_width = max(6, width - text_width - _GAPS)
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold dim", pad_edge=False)
        for name, justify in (("phase", "left"), ("mean", "right"), ("recent", "right"), ("share", "left"), ("", "right")):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for row, (phase, mean, recent, share) in zip(view.phases, cells):
            style = PHASE_STYLES.get(row.phase, "white")
            table.add_row(
                Text(phase, style=style), mean, recent,
                Text(fmt.hbar(row.share, bar_width), style=style), Text(share, style="dim"),
            )
        return Group(table, _stacked(view, max(width, 10)), _footer(view))


def _stacked(view: RunView, width: int) -> Text:
    """One bar ``width`` cells wide, split by phase share."""
    text = Text()
    used = 0
    for i, row in enumerate(view.phases):
        cells = width - used if i == len(view.phases) - 1 else round(row.share * width)
        text.append("▀" * max(cells, 0), style=PHASE_STYLES.get(row.phase, "white"))
        used += cells
    return text


def _footer(view: RunView) -> Text:
    text = Text(f"cycle {fmt.ms(view.cycle_ms)}", style="bold")
    if view.prefill_ms is not None:
        text.append(f" · prefill {fmt.ms(view.prefill_ms, 1)}", style="dim")
    ratio = view.verify_over_decode
    if ratio is None:
        return text
    slow = ratio > SLOW_VERIFY_RATIO
    text.append(f"\nverify = {ratio:.2f}× a plain decode ({fmt.ms(view.decode_ms)})", style="bold red" if slow else "green")
    if slow:
        text.append("\nan eager extend verify? try --attention-mode decode --cuda-graphs", style="red")
    return text
