"""Messages the TUI's workers send to the app: small dataclasses, posted from worker threads.

Events themselves never travel as messages (a run emits hundreds per second): workers queue them
and the app applies the queue on a 10 Hz timer. Messages carry only what happens once.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from eaglelab.probes.events import Event


@dataclass
class RecordLoaded(Message):
    """A record to replay was read (in a worker thread)."""

    events: list[Event]
    skipped_lines: int
    notes: tuple[str, ...]


@dataclass
class RecordFailed(Message):
    """A record could not be read; ``error`` says why."""

    error: str


@dataclass
class FollowEnded(Message):
    """The worker tailing a record stopped (``reason``: "stopped", or an error message)."""

    reason: str


@dataclass
class RunExited(Message):
    """The ``eaglelab run`` subprocess of ``--live`` exited."""

    returncode: int
