"""How the CLI reports a user's mistake: a clear message, no traceback, a non-zero exit."""

from __future__ import annotations

import sys
from typing import Any, Callable


def run_guarded(func: Callable[[Any], int | None], args: Any) -> int:
    """Run a command function; turn user errors into a message on stderr and exit code 2."""
    from rich.console import Console

    from eaglelab.engine.errors import EagleLabError

    try:
        rc = func(args)
    except EagleLabError as exc:
        from rich.markup import escape

        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130
    except OSError as exc:  # a path the user gave: missing, a directory, not writable, ...
        from rich.markup import escape

        what = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc.filename))}: {escape(what)}", highlight=False)
        return 2
    return int(rc or 0)
