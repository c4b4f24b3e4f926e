"""The engine's observer protocol: named hook points and plain stats dataclasses.

The engine never formats anything for humans and imports nothing of eaglelab's other packages.
Whoever wants to watch a run passes an object implementing :class:`Observer` (the probes' bus
does); with ``observer=None`` the engine builds no stats object, records no timing event and adds
no host synchronisation.

Hook points, in the order a speculative run fires them::

    on_run_start(RunInfo)
    on_graph_captured(GraphCaptureStats)          # once per captured graph (CUDA graphs on)
    on_cycle(CycleStats)                          # once per prefill, decode step or spec cycle
    on_allreduce(AllReduceStats)                  # per layer and site, tensor parallel only
    on_warning(source, message)                   # eager fallbacks, clamped settings, ...
    on_run_end(RunSummary)

Phase names (``PHASES``) are shared by the timing dictionaries, the profiler ranges
(``torch.profiler.record_function``) and the probes' events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

PHASES: tuple[str, ...] = ("prefill", "decode", "draft", "verify", "accept", "draft_extend")


@dataclass(frozen=True)
class RunInfo:
    """What a run is: model identity, device, settings. Sent once, first."""

    model: str  # path or preset name
    model_digest: str  # short digest of config + weights identity
    device: str  # e.g. "cuda:0 (NVIDIA H200)" or "cpu"
    dtype: str  # "float32" | "bfloat16" | ...
    batch_size: int
    spec: dict[str, Any]  # SpecConfig as a dict ({"algorithm": "none"} for plain decoding); JSON values
    model_config: dict[str, Any]  # ModelConfig as a dict of JSON values (lists, not tuples: see json_values)
    versions: dict[str, str]  # {"torch": ..., "python": ..., "eaglelab": ...}
    tp_size: int = 1
    baseline: bool = False  # a plain-decoding run recorded beside the speculative run it measures


@dataclass(frozen=True)
class CycleStats:
    """One prefill, one plain decode step, or one speculative cycle (draft, verify, accept, extend).

    ``accept_len[b]`` counts the tokens committed for row b this cycle, the bonus token
    included (SGLang's "accept len"): a plain decode step commits 1, a spec cycle 1..num_draft+1.
    ``accepted_positions[b]`` lists the draft-tree node indices (1-based; 0 is the root, the last
    committed token) that row b accepted, in path order. ``graph[phase]`` is ``"replay"`` or
    ``"eager: <reason>"``. ``accepted_ranks[b]`` gives, for the same nodes, each one's 1-based rank
    among its siblings (1 = the drafter's top choice), and ``path_open[b]`` whether the deepest
    accepted node had drafted children (so the next depth was offered and rejected). Times are milliseconds, measured with CUDA events on GPU and
    ``time.perf_counter`` on CPU.
    """

    index: int
    kind: str  # "prefill" | "decode" | "spec"
    phase_ms: dict[str, float]
    accept_len: tuple[int, ...] = ()
    accepted_positions: tuple[tuple[int, ...], ...] = ()
    num_draft_tokens: int = 0  # tree nodes per row, root included (0 for plain decoding)
    verify_tokens: int = 0  # tokens the target ran in this cycle's verify, summed over rows
    graph: dict[str, str] = field(default_factory=dict)
    active_rows: int = 0  # rows still generating when the cycle began
    accepted_ranks: tuple[tuple[int, ...], ...] = ()
    path_open: tuple[bool, ...] = ()
    setup_ms: float = 0.0  # set-up inside this cycle (a lazy capture, a compile, a kernel's tuning): its phases hold it


@dataclass(frozen=True)
class GraphCaptureStats:
    """One captured CUDA graph."""

    name: str  # "decode" | "draft" | "draft_extend" | "verify"
    batch_size: int  # the bucket
    seconds: float
    memory_bytes: int  # growth of allocated + reserved pool memory during capture


@dataclass(frozen=True)
class AllReduceStats:
    """One all-reduce inside a forward (tensor parallel runs only)."""

    layer: int
    site: str  # "attn" | "mlp" | "moe" | "embed" | "head"
    nbytes: int
    ms: float  # this rank's time in the collective
    rank: int
    world_size: int
    phase: str  # the phase the forward belonged to
    in_graph: bool = False


@dataclass(frozen=True)
class RunSummary:
    """Totals for a finished run."""

    prompt_tokens: int
    generated_tokens: int
    seconds: float  # wall time from the first prefill to the last token, less setup_seconds
    cycles: int  # decode steps (plain) or speculative cycles
    mean_accept_len: float | None = None  # None for plain decoding
    stop_reasons: tuple[str, ...] = ()  # per row: "eos" | "length"
    setup_seconds: float = 0.0  # CUDA-graph capture and compilation during the run (kept out of seconds)


def json_values(value: Any) -> Any:
    """``value`` with every tuple made a list, recursively: what a record reads back (the free-form
    dicts of :class:`RunInfo` hold these, so the engine's stats and the recorded events are equal)."""
    if isinstance(value, dict):
        return {k: json_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_values(v) for v in value]
    return value


@runtime_checkable
class Observer(Protocol):
    """What the engine calls. Every method must be cheap and must not touch the engine's tensors."""

    def on_run_start(self, info: RunInfo) -> None: ...

    def on_cycle(self, stats: CycleStats) -> None: ...

    def on_graph_captured(self, stats: GraphCaptureStats) -> None: ...

    def on_allreduce(self, stats: AllReduceStats) -> None: ...

    def on_warning(self, source: str, message: str) -> None: ...

    def on_run_end(self, summary: RunSummary) -> None: ...


class BaseObserver:
    """An observer that ignores everything; subclass and override what you need."""

    def on_run_start(self, info: RunInfo) -> None:
        pass

    def on_cycle(self, stats: CycleStats) -> None:
        pass

    def on_graph_captured(self, stats: GraphCaptureStats) -> None:
        pass

    def on_allreduce(self, stats: AllReduceStats) -> None:
        pass

    def on_warning(self, source: str, message: str) -> None:
        pass

    def on_run_end(self, summary: RunSummary) -> None:
        pass
