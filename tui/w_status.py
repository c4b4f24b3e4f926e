"""RunStatus: what the run is (model, device, spec) and where its events come from."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from eaglelab.tui.model import RunView


class RunStatus(Static):
    """Three lines: model and device; speculation settings; source, progress and run state."""

    DEFAULT_CSS = """
    RunStatus { height: 3; padding: 0 1; background: $boost; }
    """

    def show(self, view: RunView, source: str) -> None:
        """Render ``view``'s header and the ``source`` line (e.g. ``replay 40% · PAUSED``)."""
        text = Text()
        h = view.header
        if h is None:
            text.append("waiting for a run_started event …", style="dim")
            text.append("\n\n")
        else:
            text.append(h.model, style="bold")
            text.append(f" · {h.device} · {h.dtype} · batch {h.batch_size} · tp {h.tp_size}\n", style="dim")
            text.append(h.spec_label + "\n")
        text.append(source, style="italic")
        text.append(f" · {view.events} events")
        if view.runs_seen > 1:
            text.append(f" · run {view.runs_seen} of this record")
        if view.finished:
            reasons = ", ".join(sorted(set(view.stop_reasons))) or "?"
            text.append(f" · finished in {view.run_seconds:.2f} s ({reasons})", style="green")
        self.update(text)
