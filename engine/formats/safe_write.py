"""Write an output file whole or not at all, and name a full disk as the user's to fix.

Every file eaglelab writes for the user (samples, vocabulary maps, manifests, drafters, training
checkpoints, distill shards) goes through :func:`write_atomic`: the bytes go to ``NAME.partial`` beside
the target and are renamed over it only when complete, so a full disk, a kill or Ctrl-C never leaves a
truncated file that a resumed run would keep as done. A write that fails because the disk is full
(``ENOSPC`` from the OS, safetensors' "os error 28", or torch's zip writer failing with no room left)
becomes an :class:`~eaglelab.engine.errors.EagleLabError` naming the file, the free space and what to
do, instead of an internal error.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Callable

from eaglelab.engine.errors import EagleLabError

PARTIAL_SUFFIX = ".partial"
_FULL_WORDS = ("no space left", "os error 28", "disk quota exceeded", "os error 122")
_NEARLY_FULL = 1 << 20  # bytes: a write that failed with less than this left ran out of room


def write_atomic(path: str | Path, write: Callable[[Path], object], *, what: str, flag: str | None = "--out") -> Path:
    """``write(tmp)`` then rename ``tmp`` over ``path``; on any failure ``tmp`` is removed and ``path`` is
    left as it was. A full disk raises EagleLabError (``flag``: the option that chose the place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException as exc:
        full = isinstance(exc, Exception) and is_disk_full(exc, path.parent)
        free = free_bytes(path.parent)
        tmp.unlink(missing_ok=True)
        if full:
            raise disk_full_error(path, what, flag, free) from None
        raise
    return path


def is_disk_full(exc: BaseException, directory: str | Path | None = None) -> bool:
    """Whether ``exc`` is a write that ran out of room: ENOSPC / EDQUOT, their words in a library's message,
    or (torch's zip writer says only "unexpected pos") a failed write with under 1 MiB left in ``directory``."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    if any(words in text for words in _FULL_WORDS):
        return True
    if directory is not None and isinstance(exc, (OSError, RuntimeError)):
        free = free_bytes(directory)
        return free is not None and free < _NEARLY_FULL
    return False


def free_bytes(directory: str | Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def disk_full_error(path: Path, what: str, flag: str | None, free: int | None) -> EagleLabError:
    left = "unknown" if free is None else f"{free / 2**20:.1f} MiB"
    where = f"pass another {flag} on a disk with room, or free space there" if flag else "free space on that disk"
    return EagleLabError(f"the disk is full: the {what} could not be written (nothing half-written was kept)",
                         file=path, field=flag, found=f"{left} free on its file system",
                         expected=f"room for the {what}", hint=f"{where}; files written before are kept")


LOCK_NAME = ".eaglelab.lock"


class output_lock:  # noqa: N801 - used as a context manager, like open()
    """One writer per output directory: ``OUT/.eaglelab.lock`` holds the writer's pid while it runs. A second
    command writing into the same directory is refused (two captures interleaved their samples, both exit 0);
    a lock left by a process that no longer runs is taken over."""

    def __init__(self, directory: str | Path, command: str, flag: str = "--out") -> None:
        self.path = Path(directory) / LOCK_NAME
        self.command, self.flag = command, flag

    def __enter__(self) -> "output_lock":
        import os

        self.made = not self.path.parent.exists()  # made here: removed again if the command wrote nothing
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _lock_holder(self.path)
                if holder is not None:
                    raise EagleLabError(
                        "another eaglelab command is writing into this directory", file=self.path.parent,
                        field=self.flag, found=f"{LOCK_NAME} held by process {holder}",
                        expected="one writer at a time", hint=f"wait for process {holder} to end, or pass another {self.flag}")
                self.path.unlink(missing_ok=True)  # its writer is gone: a lock left by a kill
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()} {self.command}\n")
            return self
        raise EagleLabError("cannot take the directory's lock", file=self.path, field=self.flag,
                            hint=f"delete {self.path} if no eaglelab command is running")

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)
        if self.made and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()


def _lock_holder(path: Path) -> int | None:
    """The pid in a lock file when that process still runs; None for a stale or unreadable lock."""
    import os

    from eaglelab.engine.formats.validate import file_kind

    if file_kind(path) != "a regular file":
        return None
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid():
        return pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, another user's
    return pid
