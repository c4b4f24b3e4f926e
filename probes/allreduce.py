"""The all-reduce probe: per layer and site, bytes, transfer time and arrival skew across ranks.

How each time is measured (``engine/core/tp_group.py`` times every collective of the forward through
``TPGroup.all_reduce`` / ``all_gather`` while an observer is attached):

- CPU (gloo): the wall clock around the call; gloo collectives block the host until done.
- GPU, eager: a pair of CUDA events around the NCCL call on the compute stream, read once per cycle
  after the engine's own end-of-cycle synchronisation (no extra host sync per collective).
- GPU, inside CUDA graphs: the event pair is captured into the graph with the collective (external
  event-record nodes, ``torch.cuda.Event(external=True)``), so every replay records them; they are
  read after the replay, with the same once-per-cycle read (``in_graph=True``). The graph runner
  marks captures and replays with ``TPGroup.capture(key)`` / ``TPGroup.replayed(key)``.

A rank's time in a collective is the wait for the last rank to arrive plus the transfer itself.
The last rank to arrive barely waits, so for each call the minimum over ranks estimates the
transfer, and max - min over ranks is the arrival skew: how unevenly the ranks reach that point
(load imbalance, launch jitter, a slow GPU). Every rank issues the same collectives in the same
order, so call i of rank 0 is call i of every rank; :func:`summarize` pairs them that way.

Every rank collects its own events (:class:`AllReduceProbe`, a bus subscriber); at the end of a run
:meth:`AllReduceProbe.gather` brings all ranks' events to every rank over the gloo side group and
rank 0 publishes the other ranks' events on its bus (the run record then holds all of them, each
with its ``rank``). This module imports no torch: the TUI can call :func:`summarize` on a record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Callable

from eaglelab.probes.events import AllReduce


@dataclass(frozen=True)
class SiteStats:
    """One (layer, site, phase, in_graph) over a run, all ranks combined."""

    layer: int  # decoder layer; -1 the embedding, num_layers the LM head
    site: str  # "attn" | "mlp" | "moe" | "embed" | "head"
    phase: str
    in_graph: bool
    calls: int  # calls seen on every rank
    nbytes: int  # bytes per call (of the reduced / gathered tensor)
    transfer_ms: float  # mean over calls of the minimum over ranks
    skew_ms: float  # mean over calls of (max - min) over ranks
    max_ms: float  # mean over calls of the maximum over ranks (the rank that waited longest)
    ranks: int

    @property
    def bus_gbps(self) -> float | None:
        """Bytes per call over the transfer estimate, GB/s (None when no time was measured)."""
        return self.nbytes / self.transfer_ms / 1e6 if self.transfer_ms > 0 else None


@dataclass(frozen=True)
class Summary:
    """What :func:`summarize` found: per-site figures and how well the ranks' calls lined up."""

    sites: tuple[SiteStats, ...]
    ranks: tuple[int, ...]
    matched_calls: int  # calls paired across all ranks
    unmatched_calls: int  # calls of some rank with no partner (a truncated record, a mismatch)

    def per_layer(self, phase: str | None = None) -> dict[int, dict[str, tuple[float, float]]]:
        """layer -> site -> (transfer ms, skew ms) per call, over ``phase`` (None: all phases)."""
        acc: dict[tuple[int, str], list[float]] = {}
        for s in self.sites:
            if phase is None or s.phase == phase:
                a = acc.setdefault((s.layer, s.site), [0.0, 0.0, 0.0])
                a[0] += s.transfer_ms * s.calls
                a[1] += s.skew_ms * s.calls
                a[2] += s.calls
        out: dict[int, dict[str, tuple[float, float]]] = {}
        for (layer, site), (t, k, n) in sorted(acc.items()):
            out.setdefault(layer, {})[site] = (t / n, k / n)
        return out

    def calls_per_layer(self, phase: str | None = None) -> dict[int, int]:
        """layer -> number of collective calls (all sites), over ``phase``."""
        out: dict[int, int] = {}
        for s in self.sites:
            if phase is None or s.phase == phase:
                out[s.layer] = out.get(s.layer, 0) + s.calls
        return out

    def totals(self) -> tuple[float, float]:
        """(transfer ms, skew ms) summed over every call of the run."""
        return (sum(s.transfer_ms * s.calls for s in self.sites), sum(s.skew_ms * s.calls for s in self.sites))


def summarize(events: Iterable[Any]) -> Summary:
    """Pair the calls of every rank by order and reduce them per (layer, site, phase, in_graph).

    ``events``: :class:`~eaglelab.probes.events.AllReduce` events or engine ``AllReduceStats`` of
    one run, any mix of ranks, each rank's in the order it made them. Calls whose (layer, site,
    phase) differ across ranks at the same position are counted as unmatched, not averaged.
    """
    by_rank: dict[int, list[Any]] = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(e)
    if not by_rank:
        return Summary((), (), 0, 0)
    ranks = tuple(sorted(by_rank))
    n = min(len(v) for v in by_rank.values())
    acc: dict[tuple[int, str, str, bool], list[float]] = {}
    matched = 0
    for i in range(n):
        calls = [by_rank[r][i] for r in ranks]
        first = calls[0]
        if any((c.layer, c.site, c.phase) != (first.layer, first.site, first.phase) for c in calls):
            continue
        ms = [c.ms for c in calls]
        a = acc.setdefault((first.layer, first.site, first.phase, first.in_graph), [0, 0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += first.nbytes
        a[2] += min(ms)
        a[3] += max(ms) - min(ms)
        a[4] += max(ms)
        matched += 1
    total = sum(len(v) for v in by_rank.values())
    sites = tuple(
        SiteStats(layer, site, phase, in_graph, int(c), int(b // c), t / c, k / c, m / c, len(ranks))
        for (layer, site, phase, in_graph), (c, b, t, k, m) in sorted(acc.items())
    )
    return Summary(sites, ranks, matched, total - matched * len(ranks))


class AllReduceProbe:
    """Collects this rank's all-reduce events from a bus; gathers every rank's at the end of a run.

    ::

        probe = AllReduceProbe()
        bus.subscribe(probe)            # on every rank
        engine.generate(...)
        events = probe.gather(tp)       # on every rank (a collective)
        if tp.rank == 0:
            probe.publish_peers(bus, events, own_rank=0)
            summarize(events)
    """

    def __init__(self) -> None:
        self.events: list[AllReduce] = []

    def __call__(self, event: Any) -> None:
        """Bus subscriber entry point: keep all-reduce events."""
        if isinstance(event, AllReduce):
            self.events.append(event)

    def gather(self, tp: Any) -> list[AllReduce]:
        """Every rank's events (rank order, each rank's call order), on every rank.

        ``tp`` is the engine's ``TPGroup``; every rank of the group must call this.
        """
        parts: Sequence[list[AllReduce]] = tp.gather_objects(self.events)
        return [e for part in parts for e in part]

    def publish_peers(self, publish: Callable[[AllReduce], None] | Any, events: Iterable[AllReduce], own_rank: int) -> int:
        """Hand the events of ranks other than ``own_rank`` to ``publish`` (a bus or a callable).

        This rank's own events went out live already. Returns how many were published.
        """
        send = getattr(publish, "publish", publish)
        count = 0
        for e in events:
            if e.rank != own_rank:
                send(e)
                count += 1
        return count
