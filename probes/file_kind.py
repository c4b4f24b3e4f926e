"""What a path is, in words, for messages about a file that cannot be read as one.

A FIFO, a device or a socket passed where a log or record is expected must be named as what it is
("a FIFO (named pipe)"), not "missing", and never opened: opening a FIFO blocks until a writer
comes, and its size never grows, so a follower would wait for ever.
"""

from __future__ import annotations

import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(path: str | Path) -> str:
    """``"a regular file"``, ``"missing"``, or what else the path is (``"a FIFO (named pipe)"`` ...)."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # a path through a file, a loop of links, no permission to look
        return f"unreadable ({exc.strerror or type(exc).__name__})"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def is_special(path: str | Path) -> bool:
    """Whether ``path`` exists and is not a regular file (a directory, FIFO, device, socket ...)."""
    return file_kind(path) not in ("a regular file", "missing")
