"""User-facing errors. Each names the file and field, what was found, what was expected, what to do.

The CLI catches :class:`EagleLabError` and prints its message without a traceback; internal
invariants use ``assert`` with a message instead.
"""

from __future__ import annotations

from pathlib import Path


class EagleLabError(Exception):
    """A problem with the user's input (a file, a flag, a checkpoint), explained."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        field: str | None = None,
        found: object = None,
        expected: object = None,
        hint: str | None = None,
    ) -> None:
        self.file = str(file) if file is not None else None
        self.field = field
        self.found = found
        self.expected = expected
        self.hint = hint
        parts = []
        where = " ".join(p for p in (self.file, f"field '{field}'" if field else None) if p)
        parts.append(f"{where}: {message}" if where else message)
        if found is not None:
            parts.append(f"found: {found}")
        if expected is not None:
            parts.append(f"expected: {expected}")
        if hint:
            parts.append(f"what to do: {hint}")
        super().__init__("\n  ".join(parts))


class ConfigError(EagleLabError):
    """A config.json (model or drafter) that cannot be used."""


class CheckpointError(EagleLabError):
    """Weights that are missing, truncated or of the wrong shape."""
