"""A bordered panel that renders a view snapshot at its current width (shared by the panels)."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widgets import Static

from eaglelab.tui.model import RunView


class ViewPanel(Static):
    """Subclasses set ``TITLE`` and implement ``renderable_for(view, width)``; the panel re-renders
    the last view when resized, so bars always fit the space they have."""

    TITLE = ""
    DEFAULT_CSS = """
    ViewPanel { width: 1fr; height: 100%; border: round $secondary; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view: RunView | None = None

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    def on_resize(self, event: events.Resize) -> None:
        if self._view is not None:
            self.show(self._view)

    def show(self, view: RunView) -> None:
        """Render ``view``."""
        self._view = view
        self.update(self.renderable_for(view, self.content_size.width))

    @staticmethod
    def renderable_for(view: RunView, width: int) -> Any:
        raise NotImplementedError
