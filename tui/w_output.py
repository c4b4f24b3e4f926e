"""RunOutput: the text a live ``eaglelab run`` prints (its streamed reply and its log lines)."""

from __future__ import annotations

from textual.widgets import Log


class RunOutput(Log):
    """A scrolling log fed with chunks of the subprocess output."""

    DEFAULT_CSS = """
    RunOutput { height: 100%; border: round $accent 60%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=2000, auto_scroll=True)
        self.received = ""

    def on_mount(self) -> None:
        self.border_title = "run output"

    def append(self, text: str) -> None:
        """Add a chunk (it need not end a line); ``received`` keeps the last 64 KiB of text."""
        self.received = (self.received + text)[-65536:]
        self.write(text)
