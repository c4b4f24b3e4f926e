"""Where a server's figures come from: polling its ``/metrics``, or following its log.

Like :mod:`eaglelab.tui.feeds`, nothing here touches Textual: :meth:`run` blocks (the app runs it
in a thread worker) and queues :class:`ServerUpdate` objects; :meth:`drain` takes them. A
problem (the server down, an answer that is not a metrics page, an unreadable log) is kept in
:attr:`problem` for the status line and the loop carries on; it never raises out of :meth:`run`.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Callable

from eaglelab.probes.server_log import ServerLogWatch
from eaglelab.probes.server_metrics import MetricsError, MetricsWatch, ServerUnreachable, fetch_metrics
from eaglelab.probes.server_readings import ServerUpdate

Clock = Callable[[], float]


class _Queue:
    """Updates queued by a worker thread, taken by the app's timer."""

    def __init__(self) -> None:
        self._queue: deque[ServerUpdate] = deque()
        self.problem: str | None = None  # what is wrong now; None when the last attempt worked
        self.notes: deque[str] = deque()  # each new problem, and other news, for the warnings log
        self.last_ok: float | None = None  # clock time of the last good answer
        self.received = 0

    def drain(self, limit: int = 10_000) -> list[ServerUpdate]:
        """Take up to ``limit`` queued updates, oldest first."""
        out: list[ServerUpdate] = []
        while self._queue and len(out) < limit:
            out.append(self._queue.popleft())
        return out

    def _fail(self, problem: str) -> None:
        if problem != self.problem:
            self.notes.append(problem)
        self.problem = problem

    def _put(self, update: ServerUpdate) -> None:
        self._queue.append(update)
        self.received += 1


class MetricsPoller(_Queue):
    """GETs ``url`` (a ``/metrics`` page) every ``interval_s`` and turns the pages into updates."""

    def __init__(self, url: str, *, interval_s: float = 1.0, timeout_s: float = 3.0, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.polls = 0
        self.watch = MetricsWatch()

    def poll_once(self) -> None:
        """One GET; queues an update or records the problem."""
        self.polls += 1
        try:
            text = fetch_metrics(self.url, timeout_s=self.timeout_s)
            update = self.watch.observe(text, self.clock())
        except ServerUnreachable as exc:
            self._fail(f"server down: {exc}")
            return
        except MetricsError as exc:
            self._fail(f"not a metrics page: {exc}")
            return
        except Exception as exc:  # an answer this reader did not foresee: shown, and the watch goes on
            self._fail(f"could not read the answer ({type(exc).__name__}: {exc}); please report it")
            return
        self.problem = None
        self.last_ok = self.clock()
        self._put(update)

    def run(self, stop: Callable[[], bool]) -> None:
        """Poll until ``stop()`` is true (checked before each poll and while waiting)."""
        while not stop():
            self.poll_once()
            deadline = time.monotonic() + self.interval_s
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.05, self.interval_s))


class LogFollower(_Queue):
    """Reads a vLLM or SGLang log from its start through :class:`ServerLogWatch`, then tails it.

    Waits for the file to appear; a line is read once its newline arrived. A file that shrinks or
    is replaced (log rotation) is read again from its start, and :attr:`notes` says so.
    """

    def __init__(
        self, path: str | Path, *, follow: bool = True, poll_s: float = 0.2, clock: Clock = time.monotonic
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.follow = follow
        self.poll_s = poll_s
        self.clock = clock
        self.watch = ServerLogWatch()
        self._position = 0
        self._inode: int | None = None
        self._buffer = b""

    def read_new(self) -> None:
        """Read what was appended since the last call and queue its updates."""
        try:
            stat = self.path.stat()
            if self._inode is not None and (stat.st_ino != self._inode or stat.st_size < self._position):
                self.notes.append(f"{self.path} was truncated or replaced: reading it again from the start")
                self._position, self._buffer = 0, b""
            self._inode = stat.st_ino
            with open(self.path, "rb") as f:
                f.seek(self._position)
                chunk = f.read(8 << 20)
        except FileNotFoundError:
            self._fail(f"waiting for {self.path} to appear")
            return
        except OSError as exc:
            self._fail(f"cannot read {self.path}: {exc.strerror or exc}")
            return
        self.problem = None
        self.last_ok = self.clock()
        self._position += len(chunk)
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        for line in lines:
            update = self.watch.feed(line.decode("utf-8", errors="replace"), self.clock())
            if update is not None:
                self._put(update)

    def run(self, stop: Callable[[], bool]) -> None:
        """Follow the file until ``stop()`` is true (without ``follow``: until its end was read)."""
        while not stop():
            size = self._position
            self.read_new()
            if not self.follow and self.problem is None and self._position == size:
                return
            deadline = time.monotonic() + self.poll_s
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.05, self.poll_s))

