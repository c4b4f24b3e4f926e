"""How the CLI ends a command that failed: a clear message, no traceback, a known exit code.

Exit codes: 2 for a user's mistake (a bad flag, a file that cannot be used: :class:`EagleLabError`,
an ``OSError`` on a path the user gave, or running out of memory: a batch or length the device cannot
hold, said with the flags that shrink it), 130 for Ctrl-C, and :data:`INTERNAL_ERROR_EXIT` for
anything else, which is eaglelab's bug: a short "internal error" report with the command, the
versions and where to report it (``--debug`` or ``EAGLELAB_DEBUG=1`` shows the traceback instead).
A command given ``--json`` gets its error as one JSON object on stdout as well.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

USER_ERROR_EXIT = 2
INTERNAL_ERROR_EXIT = 3
INTERRUPTED_EXIT = 130


def run_guarded(func: Callable[[Any], int | None], args: Any, argv: list[str] | None = None) -> int:
    """Run a command function; every way it can fail ends in a message and an exit code, never a traceback
    (unless ``args.debug``)."""
    from eaglelab.engine.errors import EagleLabError

    debug = bool(getattr(args, "debug", False)) or os.environ.get("EAGLELAB_DEBUG") == "1"
    try:
        return int(func(args) or 0)
    except EagleLabError as exc:
        return _user_error(args, str(exc), exc)
    except KeyboardInterrupt:
        _stderr().print("[yellow]interrupted[/]")
        return INTERRUPTED_EXIT
    except OSError as exc:  # a path the user gave: missing, a directory, not writable, disk full ...
        what = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        where = f"{exc.filename}: " if exc.filename else ""
        if _disk_full(exc):
            what += f"\n  what to do: {DISK_FULL_HINT}"
        return _user_error(args, f"{where}{what}", exc)
    except Exception as exc:  # noqa: BLE001 - anything else is our bug: report it, do not hide it
        if is_out_of_memory(exc):  # a size the device cannot hold: the user's to shrink
            return _user_error(args, out_of_memory_message(exc, args), exc)
        if _disk_full(exc):  # a library's write that ran out of room (safetensors, torch's zip writer)
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:200]
            return _user_error(args, f"the disk is full ({first})\n  what to do: {DISK_FULL_HINT}", exc)
        if debug:
            raise
        return _internal_error(args, exc, argv)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM (``timeout``, a job scheduler) ends the command as Ctrl-C does: a KeyboardInterrupt, so what
    handles an interrupt (a partial report's last line, exit 130) runs instead of a silent kill. The main thread
    only (elsewhere Python cannot set a handler: a no-op)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def say_partial(console: Any, measured: str, *files: Any) -> None:
    """The one line an interrupted command prints when its partial report is on disk: what it holds, and where."""
    console.print(f"[yellow]interrupted: what was measured ({measured}) is in {' and '.join(map(str, files))} "
                  "(\"partial\": true)[/]", soft_wrap=True)


DISK_FULL_HINT = "free space on that disk, or write to another (--out / --checkpoint-dir); files written before are kept"


def _disk_full(exc: BaseException) -> bool:
    from eaglelab.engine.formats.safe_write import is_disk_full

    return is_disk_full(exc)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: ``torch.OutOfMemoryError`` (a device's memory), a
    ``MemoryError``, or the ``RuntimeError`` torch raises when a CPU allocation fails."""
    torch = sys.modules.get("torch")  # an OutOfMemoryError can only come from a torch already imported
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def out_of_memory_message(exc: BaseException, args: Any) -> str:
    """What ran out (the first line of the allocator's message) and what to do: the size flags this command
    has, then another device."""
    what = "device memory" if type(exc).__name__ == "OutOfMemoryError" else "host (CPU) memory"
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:200]
    flags = [flag for flag in _SIZE_FLAGS if hasattr(args, flag[2:].replace("-", "_"))]
    shrink = f"a smaller {' / '.join(flags)}, or " if flags else "smaller inputs, or "
    other = "another --device (one with more free memory)" if hasattr(args, "device") else "a device with more free memory"
    return f"out of {what} ({first})\n  what to do: {shrink}{other}; close other programs using the memory"


_SIZE_FLAGS = ("--batch-size", "--batch-sizes", "--micro-batch-sizes", "--max-new-tokens", "--max-prompt-tokens",
               "--max-length")


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _user_error(args: Any, message: str, exc: BaseException) -> int:
    from rich.markup import escape

    if getattr(args, "json", False):
        print(json.dumps(error_object(message, exc, USER_ERROR_EXIT)))
    _stderr().print(f"[bold red]error:[/] {escape(message)}")
    return USER_ERROR_EXIT


def error_object(message: str, exc: BaseException | None, exit_code: int) -> dict[str, Any]:
    """The JSON object a ``--json`` command prints when it fails."""
    file = getattr(exc, "file", None) or getattr(exc, "filename", None)
    return {"verdict": "error", "exit_code": exit_code, "error": message, "file": str(file) if file else None,
            "field": getattr(exc, "field", None)}


def internal_error_report(exc: BaseException, argv: list[str] | None = None) -> str:
    """The plain-text report of an unexpected exception: what failed, the command, versions, where to report."""
    frame = _last_frame(exc)
    command = " ".join(["eaglelab", *(sys.argv[1:] if argv is None else argv)])
    lines = [
        f"internal error: {type(exc).__name__}: {str(exc)[:500]}",
        f"  command:  {command[:500]}",
        f"  where:    {frame}",
        f"  versions: {versions()}",
        f"  this is a bug in eaglelab, not in your input: please report it to {where_to_report()} with these lines",
        "  (run the same command with --debug, or EAGLELAB_DEBUG=1, to see the full traceback)",
    ]
    return "\n".join(lines)


def _internal_error(args: Any, exc: BaseException, argv: list[str] | None) -> int:
    from rich.markup import escape

    report = internal_error_report(exc, argv)
    if getattr(args, "json", False):
        print(json.dumps(error_object(report.splitlines()[0], exc, INTERNAL_ERROR_EXIT)))
    _stderr().print(f"[bold red]{escape(report)}[/]")
    return INTERNAL_ERROR_EXIT


def _last_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    if tb is None:
        return "unknown"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"


def versions() -> str:
    """eaglelab, Python, torch (when loaded), platform: one line."""
    from eaglelab import __version__

    parts = [f"eaglelab {__version__}", f"python {platform.python_version()}"]
    torch = sys.modules.get("torch")
    if torch is not None:
        parts.append(f"torch {getattr(torch, '__version__', '?')}")
    parts.append(f"{platform.system()} {platform.machine()}")
    return ", ".join(parts)


def where_to_report() -> str:
    """The issue tracker named in the installed package's metadata, else a plain description."""
    from importlib import metadata

    try:
        urls = metadata.metadata("eaglelab").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("issues", "bug tracker", "tracker", "bugs"):
            return url.strip()
    return "the eaglelab issue tracker"
