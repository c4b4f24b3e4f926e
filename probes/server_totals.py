"""Running totals over a server's updates: what ``report`` prints and the TUI shows, computed once.

Averages are weighted by the drafts (verifies) each reading covers when the source says (vLLM's
counters), else each reading counts once (SGLang's interval gauges, log lines). Throughput is the
whole server's: the figure an update gives for it, else the sum of each rank's latest figure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from eaglelab.probes.server_readings import ServerReading, ServerUpdate, histogram_from_reach


@dataclass
class RunningMean:
    """A weighted mean of the figures present (None, or a weight of 0, is skipped), summed in the order they came."""

    total: float = 0.0
    weight: float = 0.0

    def add(self, value: float | None, weight: float = 1.0) -> None:
        if value is not None and weight > 0:
            self.total += value * weight
            self.weight += weight

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass(frozen=True)
class RankRow:
    """One rank's figures: means over the watch and the latest reading's."""

    rank: str
    accept_len: float | None
    accept_rate: float | None
    latest_accept_len: float | None
    gen_tokens_per_s: float | None  # the latest figure
    cuda_graph_share: float | None  # over the watch
    running_reqs: float | None


@dataclass
class _RankTotals:
    accept_len: RunningMean = field(default_factory=RunningMean)
    accept_rate: RunningMean = field(default_factory=RunningMean)
    latest: ServerReading | None = None
    latest_accept_len: float | None = None
    latest_tokens_per_s: float | None = None
    graph_passes: float = 0.0
    eager_passes: float = 0.0


@dataclass
class ServerTotals:
    """Fold :class:`ServerUpdate` objects; read the properties and :meth:`rank_rows`."""

    engine: str | None = None
    model: str | None = None
    updates: int = 0
    readings: int = 0
    statuses: list[str] = field(default_factory=list)  # each different status line, in order
    last_status: str | None = None  # the latest update's (None: nothing to say)
    resets: int = 0
    recent_tokens_per_s: float | None = None  # the latest throughput figure
    recent_accept_len: float | None = None  # the latest update's accepted length
    graph_modes: Counter = field(default_factory=Counter)  # runtime mode -> passes
    _ranks: dict[str, _RankTotals] = field(default_factory=dict)
    _accept: RunningMean = field(default_factory=RunningMean)
    _throughput: RunningMean = field(default_factory=RunningMean)
    _rate: RunningMean = field(default_factory=RunningMean)
    _reach: list[float] = field(default_factory=list)  # drafts that reached depth d, weighted
    _reach_drafts: float = 0.0

    def observe(self, update: ServerUpdate) -> None:
        """Fold one update (a poll, a log line)."""
        self.updates += 1
        if update.reset:
            self._start_over()
        self.engine = update.engine
        self.model = update.model or self.model
        self.last_status = update.status
        if update.status and (not self.statuses or self.statuses[-1] != update.status):
            self.statuses.append(update.status)
        for reading in update.readings:
            self._observe_reading(reading)
        accepted = _weighted([(r.accept_len, _weight(r)) for r in update.readings])
        if accepted is not None:
            self.recent_accept_len = accepted
        rate = update.gen_tokens_per_s
        if rate is None and any(r.gen_tokens_per_s is not None for r in update.readings):
            rate = self._summed_rate()
        if rate is not None:
            self.recent_tokens_per_s = rate
            self._throughput.add(rate, 1.0)

    def _summed_rate(self) -> float:
        """The server's throughput from its ranks' latest figures: summed over data-parallel groups, not
        over the TP (or PP) ranks of one group, which all report the same batches (SGLang with metrics on
        every scheduler: two TP ranks at 82 tok/s are 82 tok/s, not 164). The highest figure of a group
        stands for it, so one rank that has not spoken yet does not pull it down."""
        groups: dict[str, float] = {}
        for name, t in self._ranks.items():
            if t.latest_tokens_per_s is not None:
                group = dp_group(name)
                groups[group] = max(groups.get(group, t.latest_tokens_per_s), t.latest_tokens_per_s)
        return sum(groups.values())

    def _start_over(self) -> None:
        """A restarted server: its figures begin again (the statuses stay)."""
        self.resets += 1
        self.recent_tokens_per_s = self.recent_accept_len = None
        self._throughput = RunningMean()
        self.graph_modes.clear()
        self._ranks.clear()
        self._accept, self._rate = RunningMean(), RunningMean()
        self._reach, self._reach_drafts = [], 0.0

    def _observe_reading(self, r: ServerReading) -> None:
        self.readings += 1
        totals = self._ranks.setdefault(r.rank, _RankTotals())
        w = _weight(r)
        for mean in (totals.accept_len, self._accept):
            mean.add(r.accept_len, w)
        rate_w = r.draft_tokens if r.draft_tokens is not None else 1.0
        for mean in (totals.accept_rate, self._rate):
            mean.add(r.accept_rate, rate_w)
        if r.accept_len is not None:
            totals.latest_accept_len = r.accept_len
        if r.gen_tokens_per_s is not None:
            totals.latest_tokens_per_s = r.gen_tokens_per_s
        totals.latest = r
        totals.graph_passes += r.cuda_graph_passes or 0.0
        totals.eager_passes += r.eager_passes or 0.0
        if r.graph_mode is not None:
            self.graph_modes[r.graph_mode] += (r.cuda_graph_passes or 0.0) + (r.eager_passes or 0.0)
        if r.per_position:
            if len(self._reach) < len(r.per_position):
                self._reach.extend([0.0] * (len(r.per_position) - len(self._reach)))
            for d, share in enumerate(r.per_position):
                self._reach[d] += share * w
            self._reach_drafts += w

    # -- figures -------------------------------------------------------------------------------

    @property
    def accept_len(self) -> float | None:
        """Mean accepted length (bonus included) over everything observed."""
        return self._accept.value

    @property
    def accept_rate(self) -> float | None:
        """Accepted over offered draft tokens."""
        return self._rate.value

    @property
    def per_position(self) -> tuple[float, ...]:
        """Share of drafts whose accepted run reached depth 1, 2, ..."""
        if self._reach_drafts <= 0:
            return ()
        return tuple(r / self._reach_drafts for r in self._reach)

    @property
    def histogram(self) -> tuple[tuple[int, float], ...]:
        """(accepted length, drafts) for lengths 1 .. depth + 1, from the per-position figures."""
        if self._reach_drafts <= 0:
            return ()
        counts = histogram_from_reach(self._reach_drafts, tuple(self._reach))
        return tuple((a, n) for a, n in enumerate(counts, start=1))

    @property
    def tokens_per_s(self) -> float | None:
        """Mean of the throughput figures seen (one per poll or statistics line)."""
        return self._throughput.value

    @property
    def graph_passes(self) -> tuple[float, float]:
        """(decode passes on a CUDA graph, passes without) over all ranks."""
        return (sum(t.graph_passes for t in self._ranks.values()), sum(t.eager_passes for t in self._ranks.values()))

    @property
    def cuda_graph_share(self) -> float | None:
        """Share of decode passes that replayed a CUDA graph; None if the server did not say."""
        on, off = self.graph_passes
        return on / (on + off) if on + off > 0 else None

    def rank_rows(self) -> tuple[RankRow, ...]:
        """One row per rank, in name order."""
        rows = []
        for name, t in sorted(self._ranks.items()):
            passes = t.graph_passes + t.eager_passes
            rows.append(RankRow(
                rank=name, accept_len=t.accept_len.value, accept_rate=t.accept_rate.value,
                latest_accept_len=t.latest_accept_len, gen_tokens_per_s=t.latest_tokens_per_s,
                cuda_graph_share=t.graph_passes / passes if passes > 0 else None,
                running_reqs=t.latest.running_reqs if t.latest is not None else None,
            ))
        return tuple(rows)


def dp_group(rank: str) -> str:
    """The data-parallel group of a rank name: ``"DP1 TP3"`` -> ``"DP1"``, ``"TP1"`` -> ``""`` (one group),
    ``"engine 1"`` -> ``"engine 1"`` (a vLLM engine is its own group)."""
    return " ".join(part for part in rank.split() if not part.startswith(("TP", "PP")))


def _weight(r: ServerReading) -> float:
    return r.drafts if r.drafts is not None else 1.0


def _weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    mean = RunningMean()
    for value, w in pairs:
        mean.add(value, w)
    return mean.value
