"""WarningLog: the run's warnings (eager fallbacks, clamped settings) and the TUI's own notes."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from eaglelab.tui.model import RunView


class WarningLog(RichLog):
    """Appends warnings as they arrive; starts over when a new run of the record begins."""

    DEFAULT_CSS = """
    WarningLog { height: 100%; border: round $warning 60%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, wrap=True, markup=False, max_lines=500)
        self._run = 0
        self._written = 0
        self.lines_text: list[str] = []

    def on_mount(self) -> None:
        self.border_title = "warnings"

    def show(self, view: RunView) -> None:
        """Write the warnings of ``view`` not written yet."""
        if view.runs_seen != self._run or view.warnings_total < self._written:
            self._run, self._written = view.runs_seen, 0
        new = min(view.warnings_total - self._written, len(view.warnings))
        for source, message in view.warnings[len(view.warnings) - new :] if new > 0 else ():
            self._line(source, message, "yellow")
        self._written = view.warnings_total

    def note(self, source: str, message: str, style: str = "cyan") -> None:
        """A line from the TUI itself (record notes, the live run's exit)."""
        self._line(source, message, style)

    def reset(self) -> None:
        """Forget everything written (a replay restarts)."""
        self.clear()
        self.lines_text.clear()
        self._run = self._written = 0

    def _line(self, source: str, message: str, style: str) -> None:
        text = Text(f"{source}: ", style=f"bold {style}")
        text.append(message)
        self.write(text)
        self.lines_text.append(text.plain)
