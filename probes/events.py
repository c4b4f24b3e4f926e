"""Events: what the probes make of the engine's stats, one frozen dataclass per kind.

The schema is defined once: each event class extends the engine's stats dataclass it records
(:class:`RunStarted` is a :class:`RunInfo`, :class:`Step` a :class:`CycleStats`, ...) and adds only
the wall-clock time ``t``, so a field added to the engine's stats reaches every record.

Events are the interchange format: the run record stores one per line (``to_json``), the TUI,
TensorBoard and the console summary consume them. Every event class has a ``type`` name
(a class attribute, written as the ``"type"`` key) and a wall-clock time ``t`` (``time.time()``).

Compatibility rules (``SCHEMA_VERSION``): a later version may add event types and add fields with
defaults; it never renames or removes a field. Readers therefore ignore unknown fields and skip
unknown types (``from_json`` returns ``None`` for them) instead of failing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Union

from eaglelab.engine.runtime.observer import (
    AllReduceStats,
    CycleStats,
    GraphCaptureStats,
    RunInfo,
    RunSummary,
)
from eaglelab.engine.runtime.reasons import (  # the graph statuses and warnings events carry
    EAGER_EXTEND,
    EAGER_HOST_DRAFTER,
    EAGER_NO_CUDA,
    EAGER_NO_FORWARD,
    EAGER_NO_RUNNER,
    EAGER_OFF,
    EAGER_PREFILL,
    EXPECTED_EAGER,
    REPLAY,
    SOURCE_RUNNER,
    eager_warning,
)

SCHEMA_VERSION: int = 1

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "RunStarted",
    "Step",
    "GraphCaptured",
    "AllReduce",
    "WarningEvent",
    "RunFinished",
    "PhaseCost",
    "EVENT_TYPES",
    "EventDecodeError",
    "to_json",
    "from_json",
    "REPLAY",
    "EAGER_OFF",
    "EAGER_NO_CUDA",
    "EAGER_NO_RUNNER",
    "EAGER_PREFILL",
    "EAGER_EXTEND",
    "EAGER_HOST_DRAFTER",
    "EAGER_NO_FORWARD",
    "EXPECTED_EAGER",
    "SOURCE_RUNNER",
    "eager_warning",
]


def _owned(value: Any) -> Any:
    """A frozen event's own copy of an engine value: dicts copied, sequences as (nested) tuples."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return tuple(_owned(v) for v in value)
    return value


def _from_engine(cls: type, stats: Any, t: float | None) -> Any:
    """An event from the engine stats it extends: every field copied (``t``: now when not given)."""
    kwargs = {f.name: _owned(getattr(stats, f.name)) for f in dataclasses.fields(stats)}
    return cls(**kwargs, t=time.time() if t is None else t)


class EventDecodeError(ValueError):
    """A JSON object names a known event type but its fields cannot make that event."""


@dataclass(frozen=True)
class RunStarted(RunInfo):
    """A run began: the engine's :class:`RunInfo` (its fields are defined there, once) and ``t``."""

    type: ClassVar[str] = "run_started"
    t: float = 0.0

    @classmethod
    def from_info(cls, info: RunInfo, t: float | None = None) -> "RunStarted":
        """Build from the engine's :class:`RunInfo`."""
        return _from_engine(cls, info, t)


@dataclass(frozen=True)
class Step(CycleStats):
    """One prefill, plain decode step or speculative cycle: the engine's :class:`CycleStats` and ``t``.

    ``phase_ms`` keys are among ``PHASES``; ``accept_len[b]`` counts the tokens row b committed
    this cycle, bonus included; ``graph[phase]`` is ``"replay"`` or ``"eager: <reason>"``.
    """

    type: ClassVar[str] = "step"
    t: float = 0.0

    @classmethod
    def from_stats(cls, stats: CycleStats, t: float | None = None) -> "Step":
        """Build from the engine's :class:`CycleStats`."""
        return _from_engine(cls, stats, t)

    @property
    def cycle_ms(self) -> float:
        """Sum of this step's phase times."""
        return float(sum(self.phase_ms.values()))

    @property
    def tokens(self) -> int:
        """Tokens committed this step over all rows."""
        return int(sum(self.accept_len))


@dataclass(frozen=True)
class GraphCaptured(GraphCaptureStats):
    """A CUDA graph was captured (one per name and batch-size bucket): :class:`GraphCaptureStats` and ``t``."""

    type: ClassVar[str] = "graph_captured"
    t: float = 0.0

    @classmethod
    def from_stats(cls, stats: GraphCaptureStats, t: float | None = None) -> "GraphCaptured":
        """Build from the engine's :class:`GraphCaptureStats`."""
        return _from_engine(cls, stats, t)


@dataclass(frozen=True)
class AllReduce(AllReduceStats):
    """One timed all-reduce inside a forward (tensor-parallel runs): :class:`AllReduceStats` and ``t``."""

    type: ClassVar[str] = "allreduce"
    t: float = 0.0

    @classmethod
    def from_stats(cls, stats: AllReduceStats, t: float | None = None) -> "AllReduce":
        """Build from the engine's :class:`AllReduceStats`."""
        return _from_engine(cls, stats, t)


@dataclass(frozen=True)
class WarningEvent:
    """Something the engine or a probe wants the user to know (eager fallback, clamped setting):
    the two arguments of the engine's ``on_warning(source, message)`` and ``t``."""

    type: ClassVar[str] = "warning"
    source: str
    message: str
    t: float = 0.0


@dataclass(frozen=True)
class RunFinished(RunSummary):
    """A run ended: the engine's :class:`RunSummary` and ``t``."""

    type: ClassVar[str] = "run_finished"
    t: float = 0.0

    @classmethod
    def from_summary(cls, summary: RunSummary, t: float | None = None) -> "RunFinished":
        """Build from the engine's :class:`RunSummary`."""
        return _from_engine(cls, summary, t)

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per wall second, or None when no time elapsed."""
        return self.generated_tokens / self.seconds if self.seconds > 0 else None


@dataclass(frozen=True)
class PhaseCost:
    """One measured phase cost at a batch size (written by ``eaglelab tune``, read by ``tune --from``).

    ``phase``: ``decode`` (one plain step, loop included), ``verify`` (of ``tokens`` per row),
    ``draft`` / ``draft_extend`` / ``accept`` (one cycle with ``steps`` and ``topk``; ``accept``
    includes the engine's per-cycle bookkeeping), ``prefill`` or ``begin`` (the drafter's extend
    over the prompt). Milliseconds, medians over the measured calls or cycles.
    """

    type: ClassVar[str] = "phase_cost"
    phase: str
    batch: int
    ms: float
    tokens: int = 0
    steps: int = 0
    topk: int = 0
    t: float = 0.0


Event = Union[RunStarted, Step, GraphCaptured, AllReduce, WarningEvent, RunFinished, PhaseCost]

EVENT_TYPES: dict[str, type] = {
    cls.type: cls for cls in (RunStarted, Step, GraphCaptured, AllReduce, WarningEvent, RunFinished, PhaseCost)
}


def to_json(event: Event) -> dict[str, Any]:
    """A JSON-ready dict: ``{"type": ..., <fields>}``; tuples become lists."""
    out: dict[str, Any] = {"type": event.type}
    for f in dataclasses.fields(event):
        out[f.name] = _plain(getattr(event, f.name))
    return out


def from_json(obj: dict[str, Any]) -> Event | None:
    """Rebuild an event from :func:`to_json` output.

    Unknown fields are ignored; an unknown or missing ``type`` gives ``None``. A known type whose
    fields are missing or of the wrong kind raises :class:`EventDecodeError`.
    """
    if not isinstance(obj, dict):
        raise EventDecodeError(f"an event is a JSON object, got {type(obj).__name__}")
    cls = EVENT_TYPES.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        return None
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            continue  # a required one missing fails below
        convert = _CONVERTERS.get(str(f.type))
        if convert is None:
            raise AssertionError(f"no JSON converter for {cls.__name__}.{f.name}: {f.type}")
        try:
            kwargs[f.name] = convert(obj[f.name])
        except (TypeError, ValueError) as exc:
            raise EventDecodeError(f"{cls.type}.{f.name}: {exc}") from exc
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise EventDecodeError(f"{cls.type}: {exc}") from exc


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise ValueError(f"expected an integer, got {v!r}")
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true/false, got {v!r}")
    return v


def _opt_float(v: Any) -> float | None:
    return None if v is None else _float(v)


def _seq(v: Any) -> list[Any]:
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected a list, got {v!r}")
    return list(v)


def _dict(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"expected an object, got {v!r}")
    return dict(v)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "int": _int,
    "float": _float,
    "str": _str,
    "bool": _bool,
    "float | None": _opt_float,
    "dict[str, Any]": _dict,
    "dict[str, str]": lambda v: {str(k): _str(x) for k, x in _dict(v).items()},
    "dict[str, float]": lambda v: {str(k): _float(x) for k, x in _dict(v).items()},
    "tuple[int, ...]": lambda v: tuple(_int(x) for x in _seq(v)),
    "tuple[str, ...]": lambda v: tuple(_str(x) for x in _seq(v)),
    "tuple[bool, ...]": lambda v: tuple(_bool(x) for x in _seq(v)),
    "tuple[tuple[int, ...], ...]": lambda v: tuple(tuple(_int(x) for x in _seq(r)) for r in _seq(v)),
}
