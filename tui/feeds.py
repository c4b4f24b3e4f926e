"""Where the TUI's events come from: a record played back, a record being written, a live run.

None of these touch Textual: the app runs the blocking parts (:meth:`FollowFeed.run`,
:meth:`LiveRun.pump_output`) in thread workers and drains what they queued on its timer.
"""

from __future__ import annotations

import codecs
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Sequence

from eaglelab.probes.events import Event
from eaglelab.probes.record import follow_record


class ReplayFeed:
    """Plays events back at ``speed`` times their recorded pace; ``speed <= 0`` plays all at once.

    Pauses in the record longer than ``max_gap_s`` are shortened to it, so a run that idled does
    not stall the replay. Events without usable times (all ``t`` equal) come out at once.
    """

    def __init__(self, events: Sequence[Event], *, speed: float = 0.0, max_gap_s: float = 1.0) -> None:
        self.events = list(events)
        self.speed = speed
        self._offsets = _offsets([e.t for e in self.events], max_gap_s)
        self.restart()

    def restart(self) -> None:
        """Start again from the first event."""
        self._position = 0
        self._clock = 0.0

    @property
    def done(self) -> bool:
        """Whether every event was handed out."""
        return self._position >= len(self.events)

    @property
    def progress(self) -> float:
        """Fraction of events handed out (1.0 for an empty record)."""
        return self._position / len(self.events) if self.events else 1.0

    def advance(self, dt: float, limit: int = 50_000) -> list[Event]:
        """The events due after ``dt`` more wall seconds of playback (at most ``limit``)."""
        self._clock += dt * self.speed
        end = self._position
        stop = min(len(self.events), self._position + limit)
        while end < stop and (self.speed <= 0 or self._offsets[end] <= self._clock):
            end += 1
        out = self.events[self._position : end]
        self._position = end
        return out


def _offsets(times: list[float], max_gap_s: float) -> list[float]:
    """Playback second of each event: recorded gaps, each clamped to 0..max_gap_s."""
    out: list[float] = []
    at = 0.0
    for i, t in enumerate(times):
        if i:
            at += min(max(t - times[i - 1], 0.0), max_gap_s)
        out.append(at)
    return out


class FollowFeed:
    """Tails a record as it is written; :meth:`run` blocks (run it in a thread), :meth:`drain` does not."""

    def __init__(self, path: str | Path, *, poll_s: float = 0.1) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._queue: deque[Event] = deque()
        self.received = 0

    def run(self, stop: Callable[[], bool]) -> None:
        """Queue events from the record until ``stop()`` is true (checked whenever no news arrived)."""
        for event in follow_record(self.path, poll_s=self.poll_s, stop=stop):
            self._queue.append(event)
            self.received += 1

    def drain(self, limit: int = 50_000) -> list[Event]:
        """Take up to ``limit`` queued events, oldest first."""
        out: list[Event] = []
        while self._queue and len(out) < limit:
            out.append(self._queue.popleft())
        return out

    @property
    def pending(self) -> int:
        """Events queued but not yet drained."""
        return len(self._queue)


class LiveRun:
    """A run in a subprocess writing a record that the TUI follows, its output kept for display.

    ``LiveRun.eaglelab_run(["hello", "--steps", "3"])`` runs ``python -m eaglelab run hello
    --steps 3 --record <tmp>`` (or the ``--record`` the arguments already name). The process
    never blocks the UI: its output is read in a thread and its record tailed by a :class:`FollowFeed`.
    """

    def __init__(self, argv: Sequence[str], record: str | Path) -> None:
        self.argv = list(argv)
        self.record = Path(record)
        self.process: subprocess.Popen[bytes] | None = None
        self._output: deque[str] = deque()
        self._lock = threading.Lock()

    @classmethod
    def eaglelab_run(cls, run_args: Sequence[str], tmp_dir: str | Path | None = None) -> "LiveRun":
        """An ``eaglelab run`` with ``run_args``; adds ``--record`` to a temp file unless given."""
        run_args = list(run_args)
        record = _record_arg(run_args)
        if record is None:
            folder = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.mkdtemp(prefix="eaglelab-tui-"))
            record = str(folder / "live.jsonl")
            run_args += ["--record", record]
        return cls([sys.executable, "-m", "eaglelab", "run", *run_args], record)

    def start(self) -> None:
        """Start the process (stdout and stderr merged into one pipe)."""
        assert self.process is None, "a LiveRun starts once"
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def pump_output(self) -> int:
        """Read the process output until it ends (blocking; run in a thread); returns its exit code."""
        assert self.process is not None and self.process.stdout is not None, "start() first"
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stream = self.process.stdout
        while chunk := stream.read1(4096):  # type: ignore[attr-defined]
            self._push(decoder.decode(chunk))
        self._push(decoder.decode(b"", final=True))
        return self.process.wait()

    def _push(self, text: str) -> None:
        if text:
            with self._lock:
                self._output.append(text)

    def drain_output(self) -> str:
        """Output that arrived since the last call."""
        with self._lock:
            text = "".join(self._output)
            self._output.clear()
        return text

    @property
    def returncode(self) -> int | None:
        """The exit code once the process ended, else None."""
        return None if self.process is None else self.process.poll()

    def stop(self, timeout_s: float = 3.0) -> None:
        """Terminate the process if it still runs (kill it after ``timeout_s``)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _record_arg(args: list[str]) -> str | None:
    """The value of ``--record FILE`` / ``--record=FILE`` in ``args``, if any."""
    for i, arg in enumerate(args):
        if arg == "--record" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--record="):
            return arg.split("=", 1)[1]
    return None
