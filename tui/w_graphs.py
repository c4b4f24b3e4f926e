"""GraphStatus: which phases replayed a CUDA graph and which ran eagerly, with the reasons."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from eaglelab.tui import fmt
from eaglelab.tui.model import GraphRow, RunView


class GraphStatus(Static):
    """Per phase: replays, eager runs and a status word; then why phases ran eagerly; then captures."""

    DEFAULT_CSS = """
    GraphStatus { width: 1fr; height: 100%; border: round $secondary; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.border_title = "CUDA graphs"

    def show(self, view: RunView) -> None:
        """Render the graph table of ``view``."""
        if view.replay_fraction is not None:
            self.border_subtitle = f"{fmt.pct(view.replay_fraction, 0)} of steps on a graph"
        self.update(self.renderable_for(view))

    def renderable_for(self, view: RunView) -> Group | Text:
        """The rich renderable for ``view``."""
        if not view.graphs:
            return Text("no graph status reported yet", style="dim")
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold dim", pad_edge=False)
        for name, justify in (("phase", "left"), ("status", "left"), ("replay", "right"), ("eager", "right")):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for row in view.graphs:
            table.add_row(Text(row.phase), _status(row),  # Text: a phase name from a record is not markup
                          str(row.replays), str(row.eager))
        parts: list[Text | Table] = [table]
        why = [(row.phase, reason, n) for row in view.graphs for reason, n in row.reasons[:2]]
        if why:
            parts.append(Text(""))
            parts.extend(_reason(phase, reason, n) for phase, reason, n in why)
        if view.captures:
            captured = ", ".join(
                f"{c.name} bs{c.batch_size} {c.seconds:.2f}s {fmt.nbytes(c.memory_bytes)}" for c in view.captures
            )
            parts += [Text(""), Text(f"captured: {captured}", style="dim")]
        return Group(*parts)


def _status(row: GraphRow) -> Text:
    if row.eager == 0:
        return Text("replay", style="bold green")
    if row.replays == 0:
        return Text("eager", style="bold red")
    return Text(f"mixed {fmt.pct(row.replay_share, 0)}", style="bold yellow")


def _reason(phase: str, reason: str, count: int) -> Text:
    text = Text()
    text.append(f"{phase} eager: ", style="bold red")
    text.append(f"{reason} ")
    text.append(f"({count})", style="dim")
    return text
