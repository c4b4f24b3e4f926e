"""Phase timing for the observer: CUDA events on GPU, ``perf_counter`` on CPU, profiler ranges.

A disabled clock costs one attribute check per phase: no event, no range, no host sync.
An enabled clock records events around each phase (the engine times around graph replays); the engine
takes a cycle's marks at its end (:meth:`PhaseClock.take`) and reads them (:meth:`PhaseClock.elapsed`)
one cycle later, when they have long completed. A phase made of parts (the one-graph cycle) times its
parts from inside with :class:`PartMarks`, whose events a captured graph records at each replay.

Under tensor parallelism the same clock tags each all-reduce with the phase running and hands the
group's CUDA-event timings to the observer at each ``take``; :func:`observe_allreduce` connects
the group to an observer. The engine builds both (see ``Engine.__init__``); nothing swaps them.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch

from eaglelab.engine.runtime.observer import AllReduceStats, Observer
from eaglelab.engine.core.tp_group import TPGroup


class PhaseClock:
    """Times named phases within one cycle (and, with ``tp``, names the phase of its all-reduces)."""

    def __init__(self, device: torch.device, enabled: bool, profile_ranges: bool = True,
                 tp: TPGroup | None = None) -> None:
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self.profile_ranges = enabled and profile_ranges
        self.tp = tp if enabled else None
        self._open: list[tuple[str, object, object]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with self.tp.in_phase(name) if self.tp is not None else contextlib.nullcontext():
            with self.range(name), _mark(name, self.cuda, self._open):  # outside any graph: replays are timed around
                yield

    def range(self, name: str) -> contextlib.AbstractContextManager:
        """A profiler range named ``name`` (``eaglelab trace``) when this clock draws them, else nothing."""
        return torch.profiler.record_function(name) if self.profile_ranges else contextlib.nullcontext()

    def add(self, marks: list[tuple[str, object, object]]) -> None:
        """Marks taken elsewhere (:meth:`PartMarks.take`), as if this clock had timed them."""
        if self.enabled:
            self._open.extend(marks)

    def take(self) -> list[tuple[str, object, object]]:
        """The phase marks since the last take, unread (CUDA events may still be pending; read them
        with :meth:`elapsed` later). Under TP the all-reduce timings are handed over now: a graph
        replayed next cycle re-records their events."""
        marks, self._open = self._open, []
        if self.tp is not None:
            self.tp.flush_timings()
        return marks

    def elapsed(self, marks: list[tuple[str, object, object]]) -> dict[str, float]:
        """Milliseconds per phase of ``marks`` (from :meth:`take`), repeated phases summed."""
        out: dict[str, float] = {}
        if self.cuda and marks:
            marks[-1][2].synchronize()  # type: ignore[union-attr]
        for name, a, b in marks:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3  # type: ignore[union-attr,operator]
            out[name] = out.get(name, 0.0) + ms
        return out


class PartMarks:
    """Times the parts of one phase from inside its function, which may be captured into a CUDA graph.

    Each call starts afresh (:meth:`start`) and marks its parts; :meth:`take` gives the last call's marks.
    The parts follow one another (work between two parts counts in the second). On CUDA a part's end event
    is the next part's start: n parts record n + 1 events (a captured event is a node of the graph, and each
    costs the replay a few microseconds). Made during a capture they are external events, which the graph
    records at every replay: after a replay, :meth:`take` gives the capture's pairs, now holding that
    replay's times. They are read a cycle later, so a graph timed this way must not replay again before:
    the engine alternates two such graphs (two :class:`PartMarks`). On CPU a mark is two ``perf_counter``
    readings (the parts run synchronously). Run eagerly, each part is also a profiler range (``eaglelab trace``);
    a replayed graph is one launch, its parts' kernels under it. Disabled, a mark costs one attribute check.
    """

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self._marks: list[tuple[str, object, object]] = []
        # every event recorded during a capture, kept for as long as these marks: a graph records its captured
        # events at each replay, and one destroyed under it (its Python object collected once a later call's marks
        # replaced it) is a write to freed memory (a crash at the replay, on an H100: SIGSEGV)
        self._captured: list[torch.cuda.Event] = []

    def start(self) -> None:
        self._marks = []

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        capturing = self.cuda and torch.cuda.is_current_stream_capturing()  # a replay has no host ranges
        with contextlib.nullcontext() if capturing else torch.profiler.record_function(name):
            if not self.cuda:
                with _mark(name, False, self._marks):
                    yield
                return
            start = self._marks[-1][2] if self._marks else _recorded_event(capturing)  # the last part's end
            yield
            self._marks.append((name, start, _recorded_event(capturing)))
            if capturing:
                self._captured += [start, self._marks[-1][2]]

    def take(self) -> list[tuple[str, object, object]]:
        """The last call's marks (a replayed graph's: its capture's events); for :meth:`PhaseClock.add`."""
        return list(self._marks)


def _recorded_event(external: bool) -> torch.cuda.Event:
    """A timing event recorded on the current stream (``external`` during a capture: each replay records it)."""
    event = torch.cuda.Event(enable_timing=True, external=True) if external else torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@contextlib.contextmanager
def _mark(name: str, cuda: bool, marks: list[tuple[str, object, object]]) -> Iterator[None]:
    """Append ``(name, start, end)`` for the block to ``marks``: CUDA timing events on the current stream, else
    ``perf_counter`` readings."""
    if cuda:
        start = _recorded_event(False)
        yield
        marks.append((name, start, _recorded_event(False)))
    else:
        t0 = time.perf_counter()
        yield
        marks.append((name, t0, time.perf_counter()))


def observe_allreduce(tp: TPGroup, observer: Observer | None) -> None:
    """Time every all-reduce of ``tp`` and send it to ``observer.on_allreduce``; ``None`` turns timing off."""
    if observer is None:
        tp.hook = None
        return

    def hook(layer: int, site: str, nbytes: int, ms: float, phase: str, in_graph: bool) -> None:
        observer.on_allreduce(AllReduceStats(layer, site, nbytes, ms, tp.rank, tp.world_size, phase, in_graph))

    tp.hook = hook
