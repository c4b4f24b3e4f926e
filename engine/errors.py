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


def read_json_object(path: str | Path) -> dict:
    """A user's JSON file that must hold an object; any problem is a ConfigError naming the file."""
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc.msg} at line {exc.lineno})", file=path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read it ({exc})", file=path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", file=path, found=type(data).__name__)
    return data
