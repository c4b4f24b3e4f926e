"""An app that ends quietly on an unhandled error and keeps it, for the command to report.

Textual prints its own traceback (with locals, a screen of frames) and exits 1 when a handler raises. The
``tui`` command instead reports the error as every other command does: a user's mistake (an
:class:`EagleLabError`, an ``OSError`` on a path) as a clear message, a bug of ours as one line and the
file the full traceback was written to.
"""

from __future__ import annotations

from typing import Any

from textual.worker import WorkerFailed


class KeepsCrash:
    """Mixin for a Textual ``App``: the first unhandled error is kept in :attr:`crash` and not printed."""

    crash: BaseException | None = None

    def _handle_exception(self, error: Exception) -> None:  # Textual's hook for an error in any handler
        if self.crash is None:
            self.crash = error.error if isinstance(error, WorkerFailed) else error
        super()._handle_exception(error)  # type: ignore[misc]  # exits, and keeps run_test's re-raise for tests
        renderables: Any = getattr(self, "_exit_renderables", None)
        if isinstance(renderables, list):
            renderables.clear()  # Textual's traceback: the command prints its own report
