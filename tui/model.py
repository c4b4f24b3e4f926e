"""The TUI's view model: a pure-Python reducer from run events to what the screen shows.

::

    model = RunModel()
    model.apply_all(read_record("run.jsonl").events)
    view = model.view()          # a frozen RunView: numbers only, no formatting
    view.accept_rate, view.recent_tokens_per_s, view.accept_histogram

No Textual and no torch here: the reducer is tested on synthetic events alone. The run totals
(acceptance, phase means, graph counts) come from :class:`eaglelab.probes.bus.RunTotals`, the same
figures ``eaglelab report`` prints; this module adds what only a live screen needs: rolling
windows, per-step histories for sparklines, and per-layer all-reduce rows.

A ``run_started`` arriving after a run's steps starts a new run (a record appended to twice):
the view then shows the latest run only and counts it in :attr:`RunView.runs_seen`. A plain
baseline recorded beside a speculative run (``eaglelab run --record``, ``baseline`` set) is no
new run: it only gives the "verify x decode" figure its decode cost (:attr:`RunView.decode_ms`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from eaglelab.engine.runtime.observer import PHASES
from eaglelab.probes.bus import RunTotals
from eaglelab.probes.events import (
    AllReduce,
    Event,
    RunFinished,
    RunStarted,
    Step,
    WarningEvent,
)

# Phases of a speculative cycle, in the order they run; a plain decode step has only "decode".
SPEC_PHASES: tuple[str, ...] = ("draft", "verify", "accept", "draft_extend")


@dataclass(frozen=True)
class RunHeader:
    """What the run is, from its ``run_started`` event."""

    model: str
    device: str
    dtype: str
    batch_size: int
    tp_size: int
    algorithm: str
    spec: dict[str, Any]

    @property
    def speculative(self) -> bool:
        """Whether the run drafts (any algorithm but ``none``)."""
        return self.algorithm not in ("", "none")

    @property
    def spec_label(self) -> str:
        """A one-line description, e.g. ``eagle3 steps 3 topk 1 draft 4, verify decode, graphs on``."""
        if not self.speculative:
            return "plain decoding"
        s = self.spec
        graphs = "graphs on" if s.get("cuda_graphs") else "graphs off"
        return (
            f"{self.algorithm} steps {s.get('num_steps', '?')} topk {s.get('topk', '?')} "
            f"draft {s.get('num_draft_tokens', '?')}, verify {s.get('attention_mode', '?')}, {graphs}"
        )


@dataclass(frozen=True)
class PhaseRow:
    """One phase of the cycle: mean over the run, mean over the recent window, share of a cycle."""

    phase: str
    mean_ms: float
    recent_ms: float
    share: float  # mean_ms over the sum of the shown phases' means


@dataclass(frozen=True)
class GraphRow:
    """CUDA-graph use of one phase: how many steps replayed a graph, how many ran eagerly and why."""

    phase: str
    replays: int
    eager: int
    reasons: tuple[tuple[str, int], ...]  # (reason, count), most frequent first

    @property
    def replay_share(self) -> float:
        """Replays over all steps that reported this phase."""
        total = self.replays + self.eager
        return self.replays / total if total else 0.0


@dataclass(frozen=True)
class CaptureRow:
    """One captured CUDA graph."""

    name: str
    batch_size: int
    seconds: float
    memory_bytes: int


@dataclass(frozen=True)
class AllReduceRow:
    """All-reduces of one (layer, site), summed over phases and ranks."""

    layer: int
    site: str
    calls: int
    total_ms: float
    nbytes: int  # summed over calls
    in_graph: int  # calls that ran inside a captured graph

    @property
    def mean_ms(self) -> float:
        """Mean ms per call."""
        return self.total_ms / self.calls if self.calls else 0.0

    @property
    def mean_bytes(self) -> float:
        """Mean bytes per call."""
        return self.nbytes / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class RunView:
    """Everything the screen shows, as numbers; a snapshot that widgets render."""

    header: RunHeader | None = None
    events: int = 0
    runs_seen: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    spec_cycles: int = 0
    generated_tokens: int = 0
    tokens_per_s: float | None = None
    recent_tokens_per_s: float | None = None
    tokens_per_s_history: tuple[float, ...] = ()
    mean_accept_len: float | None = None
    recent_accept_len: float | None = None
    accept_rate: float | None = None
    legacy_accept_rate: float | None = None
    accept_len_history: tuple[float, ...] = ()  # mean accept length of each spec cycle
    accept_len_trend: tuple[float, ...] = ()  # the recent-window mean after each spec cycle
    accept_histogram: tuple[tuple[int, int], ...] = ()  # (accept length, row-cycles), 1..max
    per_position: tuple[float, ...] = ()
    phases: tuple[PhaseRow, ...] = ()
    cycle_ms: float | None = None  # mean speculative cycle (or plain decode step)
    cycle_ms_history: tuple[float, ...] = ()  # ms of each decode step / spec cycle
    decode_ms: float | None = None  # mean plain decode step: the run's own, else its recorded baseline's
    prefill_ms: float | None = None
    graphs: tuple[GraphRow, ...] = ()
    replay_fraction: float | None = None
    captures: tuple[CaptureRow, ...] = ()
    allreduce: tuple[AllReduceRow, ...] = ()
    allreduce_ms: float = 0.0  # all all-reduce time
    busy_ms: float = 0.0  # all measured phase time
    warnings: tuple[tuple[str, str], ...] = ()  # the latest ``max_warnings``
    warnings_total: int = 0  # warnings of this run, including those no longer kept
    finished: bool = False
    run_seconds: float | None = None
    stop_reasons: tuple[str, ...] = ()

    @property
    def verify_over_decode(self) -> float | None:
        """Mean verify ms over mean plain decode ms (about 1 when verify is as cheap as a decode)."""
        verify = next((p.mean_ms for p in self.phases if p.phase == "verify"), None)
        if verify is None or not self.decode_ms:
            return None
        return verify / self.decode_ms

    @property
    def allreduce_share(self) -> float | None:
        """All-reduce time over all measured phase time; None without all-reduce events."""
        if not self.allreduce or self.busy_ms <= 0:
            return None
        return self.allreduce_ms / self.busy_ms


@dataclass
class _Window:
    """The last ``size`` decode/spec steps: tokens, phase times, mean accept length."""

    size: int
    tokens: deque[int] = field(default_factory=deque)
    ms: deque[float] = field(default_factory=deque)
    phases: deque[dict[str, float]] = field(default_factory=deque)
    accept: deque[float] = field(default_factory=deque)  # spec cycles only

    def push(self, step: Step, accept_len: float | None) -> None:
        for q, item in ((self.tokens, step.tokens), (self.ms, step.cycle_ms), (self.phases, step.phase_ms)):
            q.append(item)  # type: ignore[attr-defined]
            if len(q) > self.size:
                q.popleft()
        if accept_len is not None:
            self.accept.append(accept_len)
            if len(self.accept) > self.size:
                self.accept.popleft()

    def tokens_per_s(self) -> float | None:
        ms = sum(self.ms)
        return 1000.0 * sum(self.tokens) / ms if ms > 0 else None

    def phase_ms(self, phase: str) -> float:
        values = [p[phase] for p in self.phases if phase in p]
        return sum(values) / len(values) if values else 0.0

    def accept_len(self) -> float | None:
        return sum(self.accept) / len(self.accept) if self.accept else None


class RunModel:
    """Folds events into running state; :meth:`view` takes a frozen snapshot.

    ``window`` is how many recent decode/spec steps the "recent" figures average over;
    ``history`` how many points the sparkline histories keep; ``max_warnings`` how many warnings.
    """

    def __init__(self, *, window: int = 32, history: int = 240, max_warnings: int = 200) -> None:
        assert window >= 1 and history >= 1, f"window {window} and history {history} must be >= 1"
        self.window = window
        self.history = history
        self.max_warnings = max_warnings
        self.events = 0
        self.runs_seen = 0
        self._reset_run()

    def _reset_run(self) -> None:
        self.totals = RunTotals()
        self._recent = _Window(self.window)
        self._tok_history: deque[float] = deque(maxlen=self.history)
        self._accept_history: deque[float] = deque(maxlen=self.history)
        self._accept_trend: deque[float] = deque(maxlen=self.history)
        self._cycle_history: deque[float] = deque(maxlen=self.history)
        # Per rank: (layer, site) -> [calls, ms, bytes, in_graph]. A TP record holds every rank's
        # events; the panel shows the lowest rank's, so calls are not counted once per rank.
        self._allreduce_by_rank: dict[int, dict[tuple[int, str], list[float]]] = {}
        self._steps_seen = 0
        self._warnings_total = 0

    def apply(self, event: Event) -> None:
        """Fold one event into the state."""
        self.events += 1
        if isinstance(event, RunStarted) and not event.baseline:
            if self._steps_seen or self.totals.finished is not None:
                self._reset_run()
            self.runs_seen += 1
        if not self.totals.observe_event(event):
            return  # the plain baseline recorded beside the run: only its decode cost is shown
        if isinstance(event, Step):
            self._observe_step(event)
        elif isinstance(event, AllReduce):
            per_rank = self._allreduce_by_rank.setdefault(int(event.rank), {})
            entry = per_rank.setdefault((event.layer, event.site), [0, 0.0, 0, 0])
            entry[0] += 1
            entry[1] += event.ms
            entry[2] += event.nbytes
            entry[3] += bool(event.in_graph)
        elif isinstance(event, WarningEvent):
            self._warnings_total += 1
        if len(self.totals.warnings) > self.max_warnings:
            del self.totals.warnings[: len(self.totals.warnings) - self.max_warnings]

    def apply_all(self, events: Iterable[Event]) -> int:
        """Fold many events; returns how many."""
        n = 0
        for event in events:
            self.apply(event)
            n += 1
        return n

    def _observe_step(self, step: Step) -> None:
        self._steps_seen += 1
        if step.kind not in ("decode", "spec"):
            return
        rows = [a for a in step.accept_len if a > 0]
        accept = sum(rows) / len(rows) if step.kind == "spec" and rows else None
        self._recent.push(step, accept)
        self._cycle_history.append(step.cycle_ms)
        rate = self._recent.tokens_per_s()
        if rate is not None:
            self._tok_history.append(rate)
        if accept is not None:
            self._accept_history.append(accept)
            self._accept_trend.append(self._recent.accept_len() or 0.0)

    # -- the snapshot ----------------------------------------------------------------------

    def view(self) -> RunView:
        """A frozen snapshot of everything the screen shows."""
        t = self.totals
        header = _header(t.info) if isinstance(t.info, RunStarted) else None
        finished = t.finished if isinstance(t.finished, RunFinished) else None
        return RunView(
            header=header,
            events=self.events,
            runs_seen=self.runs_seen,
            prefill_steps=t.cycles_by_kind.get("prefill", 0),
            decode_steps=t.cycles_by_kind.get("decode", 0),
            spec_cycles=t.cycles_by_kind.get("spec", 0),
            generated_tokens=t.generated_tokens,
            tokens_per_s=t.tokens_per_s,
            recent_tokens_per_s=self._recent.tokens_per_s(),
            tokens_per_s_history=tuple(self._tok_history),
            mean_accept_len=t.acceptance.mean_accept_len,
            recent_accept_len=self._recent.accept_len(),
            accept_rate=t.acceptance.accept_rate,
            legacy_accept_rate=t.acceptance.legacy_sglang_accept_rate,
            accept_len_history=tuple(self._accept_history),
            accept_len_trend=tuple(self._accept_trend),
            accept_histogram=self._histogram(header),
            per_position=t.acceptance.per_position_rate(),
            phases=self._phase_rows(),
            cycle_ms=self._cycle_ms(),
            cycle_ms_history=tuple(self._cycle_history),
            decode_ms=t.decode_ms,
            prefill_ms=t.mean_phase_ms("prefill", kind="prefill"),
            graphs=self._graph_rows(),
            replay_fraction=t.replay_fraction,
            captures=tuple(CaptureRow(c.name, c.batch_size, c.seconds, c.memory_bytes) for c in t.captures),
            allreduce=self._allreduce_rows(),
            allreduce_ms=float(sum(v[1] for v in self._allreduce.values())),
            busy_ms=t.busy_ms,
            warnings=tuple(t.warnings),
            warnings_total=self._warnings_total,
            finished=finished is not None,
            run_seconds=finished.seconds if finished is not None else None,
            stop_reasons=finished.stop_reasons if finished is not None else (),
        )

    def _histogram(self, header: RunHeader | None) -> tuple[tuple[int, int], ...]:
        hist = self.totals.acceptance.histogram
        if not hist:
            return ()
        longest = max(hist)
        if header is not None and header.speculative and isinstance(header.spec.get("num_steps"), int):
            lookup = header.spec.get("lookup_tokens")  # a lookup branch reaches deeper than the drafter's steps
            longest = max(longest, max(header.spec["num_steps"], lookup if isinstance(lookup, int) else 0) + 1)
        return tuple((a, hist.get(a, 0)) for a in range(1, longest + 1))

    def _shown_kind(self) -> str | None:
        """Spec cycles when there are any, else plain decode steps."""
        kinds = self.totals.cycles_by_kind
        return "spec" if kinds.get("spec") else "decode" if kinds.get("decode") else None

    def _phase_rows(self) -> tuple[PhaseRow, ...]:
        kind = self._shown_kind()
        if kind is None:
            return ()
        names = SPEC_PHASES if kind == "spec" else ("decode",)
        means = {p: self.totals.mean_phase_ms(p, kind=kind) for p in names}
        seen = {p: m for p, m in means.items() if m is not None}
        total = sum(seen.values())
        return tuple(
            PhaseRow(p, m, self._recent.phase_ms(p), m / total if total > 0 else 0.0) for p, m in seen.items()
        )

    def _cycle_ms(self) -> float | None:
        kind = self._shown_kind()
        if kind is None:
            return None
        total = sum(v for (k, _), v in self.totals.phase_ms_sum.items() if k == kind)
        return total / self.totals.cycles_by_kind[kind]

    def _graph_rows(self) -> tuple[GraphRow, ...]:
        t = self.totals
        seen = set(t.graph_replays) | set(t.graph_eager)
        phases = sorted(seen, key=lambda p: (PHASES.index(p) if p in PHASES else len(PHASES), p))
        rows = []
        for phase in phases:
            prefix = f"{phase}: "
            reasons = [(k[len(prefix):], n) for k, n in t.eager_reasons.items() if k.startswith(prefix)]
            reasons.sort(key=lambda r: (-r[1], r[0]))
            rows.append(GraphRow(phase, t.graph_replays.get(phase, 0), t.graph_eager.get(phase, 0), tuple(reasons)))
        return tuple(rows)

    @property
    def _allreduce(self) -> dict[tuple[int, str], list[float]]:
        """The lowest rank's all-reduce table (every rank makes the same calls)."""
        if not self._allreduce_by_rank:
            return {}
        return self._allreduce_by_rank[min(self._allreduce_by_rank)]

    def _allreduce_rows(self) -> tuple[AllReduceRow, ...]:
        return tuple(
            AllReduceRow(layer, site, int(v[0]), float(v[1]), int(v[2]), int(v[3]))
            for (layer, site), v in sorted(self._allreduce.items())
        )


def _header(info: RunStarted) -> RunHeader:
    spec = dict(info.spec)
    return RunHeader(
        model=info.model,
        device=info.device,
        dtype=info.dtype,
        batch_size=info.batch_size,
        tp_size=info.tp_size,
        algorithm=str(spec.get("algorithm", "none")),
        spec=spec,
    )


def reduce_events(events: Iterable[Event], **kwargs: int) -> RunView:
    """Fold ``events`` into a fresh :class:`RunModel` and return its view (``kwargs`` go to the model)."""
    model = RunModel(**kwargs)
    model.apply_all(events)
    return model.view()


__all__ = [
    "SPEC_PHASES",
    "AllReduceRow",
    "CaptureRow",
    "GraphRow",
    "PhaseRow",
    "RunHeader",
    "RunModel",
    "RunView",
    "reduce_events",
]
