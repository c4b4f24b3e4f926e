"""RankTable: a server's figures per rank (vLLM engine, SGLang TP/DP rank)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from eaglelab.tui import fmt
from eaglelab.tui.server_model import ServerView


class RankTable(Static):
    """One row per rank: accepted length (mean and latest), accept rate, tok/s, CUDA graphs, running."""

    DEFAULT_CSS = """
    RankTable { width: 1fr; height: 100%; border: round $secondary; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.border_title = "per rank"

    def show(self, view: ServerView) -> None:
        """Render the rank rows of ``view``."""
        self.update(self.renderable_for(view))

    @staticmethod
    def renderable_for(view: ServerView) -> Table | Text:
        """The rich renderable for ``view``."""
        if not view.ranks:
            return Text("no rank has reported yet", style="dim")
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold dim", pad_edge=False)
        # accepted length (mean, latest), accept rate, tok/s, share of decode passes on CUDA graphs, running requests
        for name in ("rank", "len", "latest", "rate", "tok/s", "graphs", "running"):
            table.add_column(name, justify="left" if name == "rank" else "right", no_wrap=True)
        for row in view.ranks:
            table.add_row(
                Text(row.rank), fmt.num(row.accept_len),  # Text: a label from the server is not markup
                fmt.num(row.latest_accept_len), fmt.pct(row.accept_rate),
                fmt.num(row.gen_tokens_per_s, 1), fmt.pct(row.cuda_graph_share, 0),
                fmt.num(row.running_reqs, 0),
            )
        return table
