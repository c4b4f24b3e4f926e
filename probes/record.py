"""The run record: a JSONL file, one event per line, the interchange format of eaglelab.

Layout::

    {"type": "header", "format": "eaglelab-record", "schema_version": 1, "created": ..., "eaglelab": "0.1.0"}
    {"type": "run_started", ...}
    {"type": "step", ...}
    ...

The writer appends and flushes after every line, so a crash loses at most the line being written.
The reader never fails on content: a truncated last line, garbage, an unknown event type, or an
event it cannot build are skipped and counted; unknown fields are ignored (``events.from_json``).
A header from a later schema version is read the same way and noted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.events import (
    SCHEMA_VERSION,
    Event,
    EventDecodeError,
    RunFinished,
    from_json,
    to_json,
)
from eaglelab.probes.file_kind import file_kind, is_special

RECORD_FORMAT = "eaglelab-record"
HEADER_TYPE = "header"


def header_line(created: float | None = None) -> dict[str, Any]:
    """The first line of every record."""
    from eaglelab import __version__

    return {
        "type": HEADER_TYPE,
        "format": RECORD_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "created": time.time() if created is None else created,
        "eaglelab": __version__,
    }


WRITE_MODES = ("append", "new", "replace")


def is_record_file(path: str | Path) -> bool:
    """Does the file start with an eaglelab record header? (Reads its first line only, at most 64 KiB.)"""
    with open(path, "rb") as f:
        first = f.readline(1 << 16)
    try:
        obj = loads_bounded(first.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == HEADER_TYPE and obj.get("format") == RECORD_FORMAT


def check_record_output(path: str | Path, *, mode: str = "new") -> None:
    """Refuse to write a record where it would damage what the user has: into a file that is not a
    record (any mode), or into an existing record in mode ``"new"``. Call it before the work starts."""
    assert mode in WRITE_MODES, f"unknown record write mode {mode!r}"
    path = Path(path)
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return
    if is_special(path):  # a FIFO is never opened: reading its first line would block until a writer came
        raise EagleLabError(f"is {file_kind(path)}", file=path, field="--record", expected="a .jsonl file",
                            hint="name a file, e.g. --record run.jsonl")
    if not is_record_file(path):
        raise EagleLabError("is not an eaglelab run record: refusing to write into it", file=path, field="--record",
                            found="a file without the record header", hint="name a new file, e.g. --record run.jsonl")
    if mode == "new":
        raise EagleLabError("already holds a run: a second run would mix with it in one report", file=path,
                            field="--record", hint="name a new file, or pass --force to replace this record")


class RecordWriter:
    """Writes events to a JSONL record; usable as a bus subscriber and as a context manager.

    ``mode``: ``"append"`` (default) adds to an existing record, ``"new"`` refuses an existing one,
    ``"replace"`` starts it over; all three refuse a file that is not a record
    (:func:`check_record_output`). A new (or empty) file gets a header line first. Appending to a
    file whose last line was cut off by a crash starts on a fresh line, so the old fragment stays
    one skipped line.
    """

    def __init__(self, path: str | Path, *, mode: str = "append") -> None:
        self.path = Path(path)
        self._broken = False
        check_record_output(self.path, mode=mode)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if mode == "replace":
            self.path.write_bytes(b"")
        needs_newline = _ends_without_newline(self.path)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")
        if self._file.tell() == 0:
            self._write_obj(header_line())
        self.lines_written = 0

    def __call__(self, event: Event) -> None:
        """Bus subscriber entry point: write the event."""
        self.write(event)

    def write(self, event: Event) -> None:
        """Append one event as one line and flush."""
        self._write_obj(to_json(event))
        self.lines_written += 1

    def _write_obj(self, obj: dict[str, Any]) -> None:
        assert self._file is not None, f"record {self.path} was closed"
        try:
            self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as exc:  # a full disk, a file-size limit, a device gone: the lines so far stay readable
            self._broken = True
            raise EagleLabError(
                "cannot write the run record", file=self.path, field="--record",
                found=exc.strerror or type(exc).__name__,
                hint="free space on that disk or name a record elsewhere; the lines written so far can be read",
            ) from exc

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:  # the flush of the line whose write already failed, and was reported
                if not self._broken:
                    raise

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_without_newline(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


@dataclass(frozen=True)
class RecordReadResult:
    """What :func:`read_record` found."""

    events: list[Event]
    skipped_lines: int  # lines that gave no event (garbage, truncated, unknown type, broken event)
    schema_version: int | str | None  # from the first header; None when there was none
    unknown_types: dict[str, int] = field(default_factory=dict)  # counted among skipped_lines
    notes: tuple[str, ...] = ()

    @property
    def newer_than_reader(self) -> bool:
        """The header names a schema major version above this reader's."""
        major = schema_major(self.schema_version)
        return major is not None and major > SCHEMA_VERSION


def schema_major(version: int | str | None) -> int | None:
    """The major part of a schema version (``1``, ``"1"``, ``"1.2"`` -> 1); None if unreadable."""
    if isinstance(version, bool) or version is None:
        return None
    if isinstance(version, int):
        return version
    if isinstance(version, float):
        return int(version)
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass
class _LineDecoder:
    """Turns record lines into events, counting what it skips."""

    skipped: int = 0
    schema_version: int | str | None = None
    unknown_types: dict[str, int] = field(default_factory=dict)

    def decode(self, text: str) -> Event | None:
        """The event on this line, or None (header, blank, or skipped and counted)."""
        text = text.strip()
        if not text:
            return None
        try:
            obj = loads_bounded(text)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            self.skipped += 1
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):  # not an event (a list, a number type ...)
            self.skipped += 1
            return None
        if obj.get("type") == HEADER_TYPE:
            if self.schema_version is None:
                self.schema_version = obj.get("schema_version")
            return None
        try:
            event = from_json(obj)
        except EventDecodeError:
            self.skipped += 1
            return None
        if event is None:
            self.skipped += 1
            name = str(obj.get("type"))
            self.unknown_types[name] = self.unknown_types.get(name, 0) + 1
        return event


MAX_JSON_INT = 1 << 53  # beyond this an integer in a record is damage (and would overflow counters)
# Beyond this a number in a record is damage too: no time (ms, s since 1970), count or rate of a run
# comes near it, and sums of numbers below it stay finite (1e400 parsed as infinity, 1e308 + 1e308 too).
MAX_JSON_NUMBER = float(1 << 53)


def loads_bounded(text: str) -> Any:
    """``json.loads`` for record lines: ``NaN``, ``Infinity``, and numbers past :data:`MAX_JSON_NUMBER`
    raise ValueError (so does deep nesting: RecursionError, which callers catch with it)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_bounded_float)


def _refuse_constant(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON: a line holding one is skipped."""
    raise ValueError(f"{name} is not a JSON number")


def _bounded_float(text: str) -> float:
    value = float(text)
    if not abs(value) <= MAX_JSON_NUMBER:  # also false for the infinity 1e400 parses to
        raise ValueError(f"number {text[:20]} out of range")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_JSON_INT:
        raise ValueError(f"integer {text[:20]}... out of range")
    return value


def read_record(path: str | Path) -> RecordReadResult:
    """Read a whole record; raises :class:`EagleLabError` only if the file cannot be opened."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EagleLabError(
            "cannot read the run record",
            file=path,
            found=exc.strerror or type(exc).__name__,
            hint="pass the JSONL file written by `eaglelab run --record FILE`",
        ) from exc
    decoder = _LineDecoder()
    events: list[Event] = []
    for line in raw.split(b"\n"):  # not str.splitlines: JSON text may hold \x0b, \x1c, \u2028 ...
        event = decoder.decode(line.decode("utf-8", errors="replace"))
        if event is not None:
            events.append(event)
    notes: list[str] = []
    result = RecordReadResult(events, decoder.skipped, decoder.schema_version, dict(decoder.unknown_types))
    if decoder.schema_version is None:
        notes.append("no header line: not written by eaglelab, or its first line was lost")
    elif result.newer_than_reader:
        notes.append(
            f"written with schema version {decoder.schema_version}, this reader knows {SCHEMA_VERSION}: "
            "unknown events and fields were skipped"
        )
    if result.unknown_types:
        names = ", ".join(sorted(result.unknown_types))
        notes.append(f"skipped event types this version does not know: {names}")
    return RecordReadResult(events, decoder.skipped, decoder.schema_version, result.unknown_types, tuple(notes))


def follow_record(
    path: str | Path,
    *,
    poll_s: float = 0.25,
    from_start: bool = True,
    stop: Callable[[], bool] | None = None,
    idle_timeout_s: float | None = None,
    until_finished: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Event]:
    """Yield events as a record grows (``tail -f``), polling every ``poll_s`` seconds.

    Waits for the file to appear. A line is decoded only once its newline arrived, so a line
    being written is never read half. If the file shrinks (rewritten), reading restarts at its
    beginning. Ends when ``stop()`` returns true, when nothing new arrived for
    ``idle_timeout_s`` seconds, or (``until_finished``) after a ``run_finished`` event.
    """
    path = Path(path)
    decoder = _LineDecoder()
    buffer = b""
    position: int | None = None if from_start else -1
    last_news = clock()

    def should_end() -> bool:
        if stop is not None and stop():
            return True
        return idle_timeout_s is not None and clock() - last_news >= idle_timeout_s

    while True:
        chunk, position, restarted = _read_new(path, position)
        if restarted:
            buffer = b""
        if chunk:
            last_news = clock()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = decoder.decode(line.decode("utf-8", errors="replace"))
                if event is not None:
                    yield event
                    if until_finished and isinstance(event, RunFinished):
                        return
            continue
        if should_end():
            return
        sleep(poll_s)


def _read_new(path: Path, position: int | None) -> tuple[bytes, int | None, bool]:
    """Bytes appended since ``position`` (None: from the start; -1: from the current end).

    Returns (bytes, new position, whether reading restarted because the file shrank).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return b"", position, False
    if position == -1:
        return b"", size, False
    restarted = position is not None and size < position
    start = 0 if position is None or restarted else position
    if size == start:
        return b"", start, restarted
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(size - start)
    return data, start + len(data), restarted
