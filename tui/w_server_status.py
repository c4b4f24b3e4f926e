"""ServerStatus: which server is watched, how, and whether it is answering."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from eaglelab.tui.server_model import ServerView

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class ServerStatus(Static):
    """Three lines: server and model; the source and its pace; the current problem or "ok"."""

    DEFAULT_CSS = """
    ServerStatus { height: 3; padding: 0 1; background: $boost; }
    """

    def show(self, view: ServerView, source: str, problem: str | None) -> None:
        """Render ``view`` with the ``source`` line and the feed's current ``problem`` (None: fine)."""
        text = Text()
        if view.engine is None:
            text.append("no answer from the server yet …", style="dim")
        else:
            text.append(f"{ENGINE_NAMES.get(view.engine, view.engine)} server", style="bold")
            ranks = f" · {len(view.ranks)} rank(s)" if view.ranks else ""
            text.append(f" · {view.model or 'model ?'}{ranks}", style="dim")
            if view.graph_modes:
                modes = ", ".join(f"{mode} {passes:.0f}" for mode, passes in view.graph_modes)
                text.append(f" · CUDA-graph runtime modes: {modes}")
        text.append("\n" + source, style="italic")
        text.append(f" · {view.updates} update(s)")
        if view.resets:
            text.append(f" · {view.resets} restart(s) seen", style="yellow")
        text.append("\n")
        if problem is not None:
            text.append(problem, style="bold red")
        elif view.status:
            text.append(view.status, style="yellow")
        else:
            text.append("ok", style="green")
        self.update(text)
