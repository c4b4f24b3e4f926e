"""The probe bus: the engine's observer, turning its stats into events for any number of sinks.

::

    bus = ProbeBus()
    bus.subscribe(RecordWriter("runs/a.jsonl"))      # any callable taking an event
    engine.generate(..., observer=bus)
    bus.totals.mean_accept_len, bus.totals.tokens_per_s

With no subscriber the bus builds no event object: it only updates its running totals
(:class:`RunTotals`, plain counters) from the stats the engine handed in, and even that can be
switched off with ``ProbeBus(aggregate=False)``. A subscriber that raises propagates: a sink that
cannot write is an error to see, not to swallow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from eaglelab.engine.runtime.observer import (
    AllReduceStats,
    CycleStats,
    GraphCaptureStats,
    RunInfo,
    RunSummary,
)
from eaglelab.probes.acceptance import AcceptanceStats
from eaglelab.probes.events import (
    AllReduce,
    Event,
    GraphCaptured,
    RunFinished,
    RunStarted,
    Step,
    WarningEvent,
)

Subscriber = Callable[[Event], None]

# The phase whose graph status decides whether a step "ran on CUDA graphs" (as SGLang's
# "cuda graph" field reports the verify graph for speculative decoding).
MAIN_PHASE: dict[str, str] = {"decode": "decode", "spec": "verify"}


def _without_setup(stats: CycleStats | Step) -> dict[str, float]:
    """A cycle's phase times less the set-up made inside it (a lazy capture, a compile, a kernel's tuning: kept out of
    every mean, as out of tok/s). A cycle of one phase (a prompt's prefill) loses the set-up from it; a cycle of
    several cannot say which phase held it, so none of its phases count."""
    setup = getattr(stats, "setup_ms", 0.0)
    if setup <= 0.0:
        return stats.phase_ms
    if len(stats.phase_ms) == 1:
        return {phase: max(ms - setup, 0.0) for phase, ms in stats.phase_ms.items()}
    return {}


@dataclass
class RunTotals:
    """Running totals of one run, fed with engine stats or with events (duck-typed alike).

    A plain-decoding baseline recorded beside the run (a ``run_started`` with ``baseline`` set,
    up to its ``run_finished``) is folded into :attr:`baseline` instead: it lends the run its
    decode cost (:attr:`decode_ms`) and changes none of the run's own figures.
    """

    info: RunInfo | RunStarted | None = None
    finished: RunSummary | RunFinished | None = None
    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)
    cycles_by_kind: dict[str, int] = field(default_factory=dict)
    tokens_by_kind: dict[str, int] = field(default_factory=dict)
    phase_ms_sum: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, phase)
    phase_ms_count: dict[tuple[str, str], int] = field(default_factory=dict)
    graph_replays: dict[str, int] = field(default_factory=dict)  # phase -> count
    graph_eager: dict[str, int] = field(default_factory=dict)  # phase -> count
    eager_reasons: dict[str, int] = field(default_factory=dict)  # "phase: reason" -> count
    steps_on_graph: int = 0  # decode/spec steps whose main phase replayed a graph
    steps_with_graph_info: int = 0  # decode/spec steps that reported their main phase
    busy_ms: float = 0.0  # sum of all phase times
    captures: list[GraphCaptureStats | GraphCaptured] = field(default_factory=list)
    allreduce: dict[tuple[int, str, str], list[float]] = field(default_factory=dict)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    baseline: RunTotals | None = None
    in_baseline: bool = False  # between the baseline's start and its finish

    def observe_run_start(self, info: RunInfo | RunStarted) -> None:
        """Remember what the run is (or open the baseline's totals)."""
        if info.baseline:
            self.baseline, self.in_baseline = RunTotals(info=info), True
            return
        self.info = info

    def observe_cycle(self, stats: CycleStats | Step) -> None:
        """Count one cycle: phases, graph status, tokens, acceptance."""
        if self.in_baseline:
            return self.baseline.observe_cycle(stats)  # type: ignore[union-attr]
        kind = stats.kind
        self.cycles_by_kind[kind] = self.cycles_by_kind.get(kind, 0) + 1
        self.tokens_by_kind[kind] = self.tokens_by_kind.get(kind, 0) + int(sum(stats.accept_len))
        for phase, ms in _without_setup(stats).items():
            key = (kind, phase)
            self.phase_ms_sum[key] = self.phase_ms_sum.get(key, 0.0) + ms
            self.phase_ms_count[key] = self.phase_ms_count.get(key, 0) + 1
            self.busy_ms += ms
        for phase, how in stats.graph.items():
            self._observe_graph(phase, how)
        main = MAIN_PHASE.get(kind)
        if main is not None and main in stats.graph:
            self.steps_with_graph_info += 1
            self.steps_on_graph += stats.graph[main] == "replay"
        self.acceptance.observe_step(stats)

    def _observe_graph(self, phase: str, how: str) -> None:
        if how == "replay":
            self.graph_replays[phase] = self.graph_replays.get(phase, 0) + 1
            return
        self.graph_eager[phase] = self.graph_eager.get(phase, 0) + 1
        reason = how.split(":", 1)[1].strip() if ":" in how else how
        key = f"{phase}: {reason}"
        self.eager_reasons[key] = self.eager_reasons.get(key, 0) + 1

    def observe_graph_captured(self, stats: GraphCaptureStats | GraphCaptured) -> None:
        """Keep one captured graph."""
        if self.in_baseline:
            return self.baseline.observe_graph_captured(stats)  # type: ignore[union-attr]
        self.captures.append(stats)

    def observe_allreduce(self, stats: AllReduceStats | AllReduce) -> None:
        """Add one all-reduce to its (layer, site, phase) totals: [count, ms, bytes]."""
        if self.in_baseline:
            return self.baseline.observe_allreduce(stats)  # type: ignore[union-attr]
        entry = self.allreduce.setdefault((stats.layer, stats.site, stats.phase), [0, 0.0, 0])
        entry[0] += 1
        entry[1] += stats.ms
        entry[2] += stats.nbytes

    def observe_warning(self, source: str, message: str) -> None:
        """Keep one warning."""
        if self.in_baseline:
            return self.baseline.observe_warning(source, message)  # type: ignore[union-attr]
        self.warnings.append((source, message))

    def observe_run_end(self, summary: RunSummary | RunFinished) -> None:
        """Remember the engine's totals (or close the baseline's)."""
        if self.in_baseline:
            self.baseline.observe_run_end(summary)  # type: ignore[union-attr]
            self.in_baseline = False
            return
        self.finished = summary

    def observe_event(self, event: Event) -> bool:
        """Dispatch an event (from a record or a live bus) to the matching ``observe_*``.

        Returns False when the event belonged to a recorded baseline (folded into :attr:`baseline`).
        """
        own = not self.in_baseline and not (isinstance(event, RunStarted) and event.baseline)
        self._dispatch(event)
        return own

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Step):
            self.observe_cycle(event)
        elif isinstance(event, AllReduce):
            self.observe_allreduce(event)
        elif isinstance(event, RunStarted):
            self.observe_run_start(event)
        elif isinstance(event, GraphCaptured):
            self.observe_graph_captured(event)
        elif isinstance(event, WarningEvent):
            self.observe_warning(event.source, event.message)
        elif isinstance(event, RunFinished):
            self.observe_run_end(event)

    # -- derived figures -------------------------------------------------------------------

    def mean_phase_ms(self, phase: str, kind: str | None = None) -> float | None:
        """Mean ms of ``phase`` over the cycles that reported it (of ``kind`` if given)."""
        keys = [k for k in self.phase_ms_sum if k[1] == phase and (kind is None or k[0] == kind)]
        n = sum(self.phase_ms_count[k] for k in keys)
        return sum(self.phase_ms_sum[k] for k in keys) / n if n else None

    @property
    def decode_ms(self) -> float | None:
        """Mean plain decode step: the run's own decode steps, else its recorded baseline's."""
        own = self.mean_phase_ms("decode", kind="decode")
        if own is None and self.baseline is not None:
            return self.baseline.mean_phase_ms("decode", kind="decode")
        return own

    def phases_seen(self) -> list[str]:
        """Phase names that appeared, first-seen order."""
        return list(dict.fromkeys(phase for _, phase in self.phase_ms_sum))

    @property
    def generated_tokens(self) -> int:
        """Tokens generated: the engine's total when the run finished, else counted from cycles."""
        if self.finished is not None:
            return int(self.finished.generated_tokens)
        return int(sum(self.tokens_by_kind.values()))

    @property
    def seconds(self) -> float:
        """Run wall time when finished, else the sum of measured phase times."""
        if self.finished is not None:
            return float(self.finished.seconds)
        return self.busy_ms / 1000.0

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second, None before any time was measured."""
        s = self.seconds
        return self.generated_tokens / s if s > 0 else None

    @property
    def mean_accept_len(self) -> float | None:
        """Mean accepted length of spec cycles (bonus included), else the engine's figure."""
        mean = self.acceptance.mean_accept_len
        if mean is None and self.finished is not None:
            return self.finished.mean_accept_len
        return mean

    @property
    def replay_fraction(self) -> float | None:
        """Share of decode/spec steps whose main phase (decode, or verify) replayed a CUDA graph."""
        if not self.steps_with_graph_info:
            return None
        return self.steps_on_graph / self.steps_with_graph_info

    @property
    def cycles(self) -> int:
        """Decode steps plus speculative cycles."""
        return self.cycles_by_kind.get("decode", 0) + self.cycles_by_kind.get("spec", 0)


class ProbeBus:
    """Implements the engine's ``Observer``; fans events out to subscribers and keeps totals."""

    def __init__(self, *, aggregate: bool = True, clock: Callable[[], float] = time.time) -> None:
        self._subscribers: tuple[Subscriber, ...] = ()
        self._clock = clock
        self.totals: RunTotals | None = RunTotals() if aggregate else None

    # -- subscribers -----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a callable that receives every event; returns a function that removes it."""
        self._subscribers = (*self._subscribers, subscriber)
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Remove a subscriber (no error if absent)."""
        self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

    @property
    def has_subscribers(self) -> bool:
        """Whether any event will be built."""
        return bool(self._subscribers)

    def publish(self, event: Event) -> None:
        """Count an event in the totals and hand it to every subscriber (e.g. replaying a record)."""
        if self.totals is not None:
            self.totals.observe_event(event)
        self._fan_out(event)

    def _fan_out(self, event: Event) -> None:
        for subscriber in self._subscribers:
            subscriber(event)

    # -- the engine's Observer protocol ----------------------------------------------------

    def on_run_start(self, info: RunInfo) -> None:
        """Engine hook: a run begins."""
        if self.totals is not None:
            self.totals.observe_run_start(info)
        if self._subscribers:
            self._fan_out(RunStarted.from_info(info, t=self._clock()))

    def on_cycle(self, stats: CycleStats) -> None:
        """Engine hook: one prefill, decode step or speculative cycle finished."""
        if self.totals is not None:
            self.totals.observe_cycle(stats)
        if self._subscribers:
            self._fan_out(Step.from_stats(stats, t=self._clock()))

    def on_graph_captured(self, stats: GraphCaptureStats) -> None:
        """Engine hook: a CUDA graph was captured."""
        if self.totals is not None:
            self.totals.observe_graph_captured(stats)
        if self._subscribers:
            self._fan_out(GraphCaptured.from_stats(stats, t=self._clock()))

    def on_allreduce(self, stats: AllReduceStats) -> None:
        """Engine hook: one timed all-reduce."""
        if self.totals is not None:
            self.totals.observe_allreduce(stats)
        if self._subscribers:
            self._fan_out(AllReduce.from_stats(stats, t=self._clock()))

    def on_warning(self, source: str, message: str) -> None:
        """Engine hook: something the user should know."""
        if self.totals is not None:
            self.totals.observe_warning(source, message)
        if self._subscribers:
            self._fan_out(WarningEvent(source=source, message=message, t=self._clock()))

    def on_run_end(self, summary: RunSummary) -> None:
        """Engine hook: the run finished."""
        if self.totals is not None:
            self.totals.observe_run_end(summary)
        if self._subscribers:
            self._fan_out(RunFinished.from_summary(summary, t=self._clock()))

    def close(self) -> None:
        """Close every subscriber that has a ``close()`` (record writers, TensorBoard)."""
        for subscriber in self._subscribers:
            close: Any = getattr(subscriber, "close", None)
            if callable(close):
                close()
