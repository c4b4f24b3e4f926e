"""What ``eaglelab bench --tp N`` measures on top of the single-GPU bench: where the all-reduces go.

Three measurements, each made the same way on every rank (every rank runs every call):

- **All-reduce share of a step** (:func:`allreduce_share`): a 1-token decode and a verify of the
  speculative tree's width, each timed (host clock, synchronised, median) once with the collectives
  and once with every collective replaced by a no-op of the same shape (``TPGroup.collectives_off``;
  graphs captured again inside it hold no collective), on the same ranks, eager and from CUDA graphs.
  A graph replay cannot time its single collectives; the difference of the two steps is their share
  (transfer plus the waits for the slower rank).
- **Per-layer cost in eager runs** (:func:`allreduce_sites`): the all-reduce probe's CUDA-event (GPU)
  or wall-clock (gloo) times of every collective of an observed run, paired across ranks
  (``probes/allreduce.py``: the minimum over ranks estimates the transfer, max - min the wait).
- **Arrival skew** (:func:`arrival_skew`): each rank's wall clock on entering each collective (one
  host, one clock), paired across ranks by call order: max - min per call, grouped by where the call
  sits in a forward (the first collective of a forward, the other layers', the logits all-gather),
  with the rank that arrived last. On a GPU this is the host's arrival (kernel launches are
  asynchronous): it shows host work that one rank does and the others do not. A graph replay runs its
  collectives with no host in between, so there the host-side point is the replay's launch
  ("graph replay launch"); the engine syncs the host once per cycle (its stop check), so a rank
  that launches late makes the other wait at the graph's first collective.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from eaglelab.bench.micro import MicroBench
from eaglelab.bench.timing import time_call


@dataclass(frozen=True)
class ShareRow:
    """One step timed with and without its collectives (median ms of synchronised calls)."""

    batch: int
    step: str  # "decode" (1 token) | "verify" (the tree's width)
    tokens: int
    graphs: bool
    with_ms: float
    without_ms: float  # every collective a no-op
    collectives: int  # collectives in one step
    share: float  # (with - without) / with: the step's time spent in all-reduce (and its waits)


@dataclass(frozen=True)
class SkewGroup:
    """Arrival skew of one kind of collective over a run (ms, wall clock across ranks).

    The skew at call i (max - min of the ranks' entry times) is what the ranks carried out of call
    i - 1 (the spread of their exit times: ``carried_ms``) plus the difference in the host work each
    rank did in between (max - min of entry i - exit i-1: ``host_work_ms``), give or take their
    overlap; the first call of a run has no predecessor (carried 0)."""

    where: str  # "first of forward" | "layers" | "logits all-gather" | "graph replay launch"
    calls: int
    mean_ms: float
    median_ms: float
    max_ms: float
    carried_ms: float  # mean spread of the previous collective's exit times
    host_work_ms: float  # mean spread of the host time between the previous collective and this one
    last_rank: dict[int, int]  # rank -> calls at which it arrived last


def _count_collectives(tp, fn: Callable[[], Any]) -> int:
    tp.arrivals = []
    try:
        fn()
        return len(tp.arrivals)
    finally:
        tp.arrivals = None


@torch.inference_mode()
def allreduce_share(target, tp, batch_sizes: tuple[int, ...], verify_tokens: int, context: int = 256,
                    warmup: int = 3, iters: int = 20, log=lambda m: None) -> list[ShareRow]:
    """Decode and verify steps with and without collectives, eager and (on CUDA) from graphs."""
    dev = next(target.parameters()).device
    modes = (False, True) if dev.type == "cuda" else (False,)
    widths = (max(2, verify_tokens),)
    timed: dict[tuple[bool, bool, int, str], float] = {}
    counts: dict[tuple[int, str], int] = {}
    for noop in (False, True):
        with tp.collectives_off() if noop else contextlib.nullcontext():
            mb = MicroBench(target, batch_sizes, widths, context, graphs=dev.type == "cuda")
            for b in batch_sizes:
                for g in modes:
                    calls = {"decode": mb.decode_fn(b, g), "verify": mb.verify_fn(b, widths[0], "decode", g)}
                    for step, fn in calls.items():
                        timed[(noop, g, b, step)] = time_call(fn, dev, warmup, iters)
                        if not noop and not g:
                            counts[(b, step)] = _count_collectives(tp, fn)
            del mb  # its cache and graph pool go back before the next set is built
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    rows = []
    for b in batch_sizes:
        for g in modes:
            for step, n in (("decode", 1), ("verify", widths[0])):
                w, wo = timed[(False, g, b, step)], timed[(True, g, b, step)]
                rows.append(ShareRow(b, step, n, g, w, wo, counts[(b, step)], (w - wo) / w if w > 0 else 0.0))
        log(f"  all-reduce share batch {b:>3}: " + ", ".join(
            f"{r.step}{'/graph' if r.graphs else '/eager'} {r.share:.0%}" for r in rows if r.batch == b))
    return rows


def allreduce_sites(events: list[Any]) -> list[dict[str, Any]]:
    """Per (site, phase, in_graph) over every layer: calls, bytes, transfer and wait per call (ms)."""
    from eaglelab.probes.allreduce import summarize

    acc: dict[tuple[str, str, bool], list[float]] = {}
    for s in summarize(events).sites:
        a = acc.setdefault((s.site, s.phase, s.in_graph), [0, 0, 0.0, 0.0])
        a[0] += s.calls
        a[1] = s.nbytes
        a[2] += s.transfer_ms * s.calls
        a[3] += s.skew_ms * s.calls
    return [dict(site=site, phase=phase, in_graph=g, calls=int(c), nbytes=int(nb), transfer_ms=t / c, wait_ms=k / c,
                 total_ms=t + k) for (site, phase, g), (c, nb, t, k) in sorted(acc.items())]


def per_layer(events: list[Any]) -> dict[str, dict[str, list[float]]]:
    """layer -> site -> [transfer ms, wait ms] per call (every phase): the per-layer table."""
    from eaglelab.probes.allreduce import summarize

    return {str(layer): {site: list(v) for site, v in sites.items()}
            for layer, sites in summarize(events).per_layer().items()}


def _where(layer: int, site: str, first_layer: int) -> str:
    if site.startswith("graph"):
        return "graph replay launch"
    if site == "head":
        return "logits all-gather"
    if site == "embed" or (layer == first_layer and site == "attn"):
        return "first of forward"
    return "layers"


def arrival_skew(arrivals_by_rank: list[list[tuple[float, float, int, str]]]) -> list[SkewGroup]:
    """Pair every rank's i-th (enter, exit, layer, site); group the entry spread per call by where
    the call sits in a forward, with what it carried from call i-1 and the host work in between.

    The first collective of a forward is the embedding's when it has one, else layer 0's attention
    all-reduce (the embedding table is replicated)."""
    n = min(len(a) for a in arrivals_by_rank) if arrivals_by_rank else 0
    if n == 0:
        return []
    has_embed = any(site == "embed" for *_, site in arrivals_by_rank[0])
    first_layer = -1 if has_embed else 0
    spread = lambda v: max(v) - min(v)  # noqa: E731
    groups: dict[str, tuple[list[tuple[float, float, float]], Counter]] = {}
    for i in range(n):
        calls = [a[i] for a in arrivals_by_rank]
        enters = [c[0] for c in calls]
        prev = [a[i - 1] for a in arrivals_by_rank] if i else None
        carried = spread([p[1] for p in prev]) if prev else 0.0
        work = spread([c[0] - p[1] for c, p in zip(calls, prev)]) if prev else 0.0
        vals, last = groups.setdefault(_where(calls[0][2], calls[0][3], first_layer), ([], Counter()))
        vals.append((spread(enters), carried, work))
        last[enters.index(max(enters))] += 1
    out = []
    for w in ("first of forward", "layers", "logits all-gather", "graph replay launch"):
        if w in groups:
            v, c = groups[w]
            skews = [x[0] for x in v]
            out.append(SkewGroup(w, len(v), statistics.fmean(skews), statistics.median(skews), max(skews),
                                 statistics.fmean(x[1] for x in v), statistics.fmean(x[2] for x in v),
                                 dict(sorted(c.items()))))
    return out


def skew_verdict(groups: list[SkewGroup], world: int) -> str:
    """Where the skew comes from, read off the groups (not assumed)."""
    if not groups:
        return "no collectives recorded"
    total = sum(g.mean_ms * g.calls for g in groups)
    worst = max(groups, key=lambda g: g.mean_ms * g.calls)
    lasts: Counter = Counter()
    for g in groups:
        lasts.update(g.last_rank)
    rank, times = lasts.most_common(1)[0]
    calls = sum(g.calls for g in groups)
    share = worst.mean_ms * worst.calls / total if total > 0 else 0.0
    who = f"rank {rank} arrives last at {times / calls:.0%} of calls (even would be {1 / world:.0%})"
    cause = ("mostly carried over from the previous collective's uneven exit" if worst.carried_ms >= worst.host_work_ms
             else "mostly uneven host work since the previous collective")
    return (f"{share:.0%} of the summed skew is at the '{worst.where}' collectives "
            f"({worst.mean_ms:.3f} ms mean over {worst.calls}: carried {worst.carried_ms:.3f}, host work "
            f"{worst.host_work_ms:.3f}; {cause}); {who}")


def observed_collectives(tp, events: list[Any], cycles: list[Any]) -> dict[str, Any]:
    """Every rank's probe events, arrivals and phase times of one observed call, gathered (a
    collective on the gloo side group: every rank calls it at the same point), reduced to the
    bench's figures."""
    from dataclasses import asdict

    arrivals, tp.arrivals = tp.arrivals or [], None
    parts = tp.gather_objects((events, arrivals, _phase_totals(cycles)))
    all_events = [e for ev, _, _ in parts for e in ev]
    skew = arrival_skew([arr for _, arr, _ in parts])
    return {
        "sites": allreduce_sites(all_events),
        "per_layer": per_layer(all_events),
        "phase_share": _phase_share([(ev, spent) for ev, _, spent in parts]),
        "arrival_skew": [asdict(g) for g in skew],
        "skew_verdict": skew_verdict(skew, tp.world_size),
    }


def _phase_totals(cycles: list[Any]) -> dict[str, float]:
    spent: dict[str, float] = {}
    for c in cycles:
        for phase, ms in c.phase_ms.items():
            spent[phase] = spent.get(phase, 0.0) + ms
    return spent


def _phase_share(per_rank: list[tuple[list[Any], dict[str, float]]]) -> dict[str, float]:
    """phase -> the share of its time spent inside collectives (eager forwards): each rank's time
    in them over that rank's own time in the phase (same clock), averaged over ranks."""
    shares: dict[str, list[float]] = {}
    for events, spent in per_rank:
        inside: dict[str, float] = {}
        for e in events:
            if not e.in_graph:
                inside[e.phase] = inside.get(e.phase, 0.0) + e.ms
        for p, ms in inside.items():
            if spent.get(p):
                shares.setdefault(p, []).append(ms / spent[p])
    return {p: statistics.fmean(v) for p, v in sorted(shares.items())}


def tp_section(ctx, tp, context: int, log=lambda m: None) -> dict[str, Any]:
    """The report's ``tp`` part: the group, the no-op comparison per batch size, and how the
    embedding and drafter are laid out."""
    from dataclasses import asdict

    cuda = ctx.device.type == "cuda"
    log("all-reduce share: each step with its collectives vs the same step with them as no-ops")
    width = ctx.spec.draft_tokens if ctx.spec.enabled else 8
    share = allreduce_share(ctx.target, tp, ctx.batch_sizes, width, context=context,
                            warmup=3 if cuda else 1, iters=20 if cuda else 3, log=log)
    embed = ctx.target.embed_tokens
    return {
        "world_size": tp.world_size, "backend": tp.backend,
        "embedding": "replicated (lookup without a collective)" if embed.replicated else "vocab-parallel (all-reduce)",
        "drafter": "replicated on every rank, no collectives (same inputs, same draft)",
        "share": [asdict(r) for r in share],
        "how": ("share = (step with collectives - same step with every collective a no-op) / step with collectives; "
                "host-timed synchronised calls, median; skew = wall clock on entering each collective, max - min "
                "over ranks"),
    }


def print_tp(console, section: dict[str, Any], rows: list[Any]) -> None:
    """The TP tables: the share of each step, then per configuration the probe's sites and the skew."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"all-reduce share of a step, {section['world_size']} ranks ({section['backend']})",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 2, 0, 0))
    for col in ("batch", "step", "run", "with ms", "no-op ms", "coll.", "share"):
        t.add_column(col, justify="left" if col in ("step", "run") else "right", no_wrap=True)
    for r in section["share"]:
        t.add_row(str(r["batch"]), f"{r['step']} ({r['tokens']} tok)", "graph" if r["graphs"] else "eager",
                  f"{r['with_ms']:.3f}", f"{r['without_ms']:.3f}", str(r["collectives"]), f"{r['share']:.0%}")
    console.print(t)
    console.print(f"[dim]embedding: {section['embedding']}; drafter: {section['drafter']}[/]")
    s = Table(title="collectives of the observed call (probe: transfer = min over ranks, wait = max - min; "
                    "skew = arrival wall clock, max - min)", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, padding=(0, 2, 0, 0))
    for col in ("config", "batch", "site", "phase", "calls", "transfer ms", "wait ms"):
        s.add_column(col, justify="left" if col in ("config", "site", "phase") else "right", no_wrap=True)
    verdicts = []
    for row in rows:
        ar = getattr(row, "allreduce", None)
        if not ar:
            continue
        for site in ar["sites"]:
            s.add_row(row.config, str(row.batch), site["site"] + (" (graph)" if site["in_graph"] else ""), site["phase"],
                      str(site["calls"]), f"{site['transfer_ms']:.4f}", f"{site['wait_ms']:.4f}")
        s.add_section()
        skew = "; ".join(f"{g['where']} {g['mean_ms']:.3f} ms" for g in ar["arrival_skew"])
        shares = ", ".join(f"{p} {v:.0%}" for p, v in ar["phase_share"].items())
        verdicts.append(f"  {row.config} b{row.batch}: arrival skew (mean) {skew}; {ar['skew_verdict']}"
                        + (f"; eager phase time in collectives: {shares}" if shares else ""))
    console.print(s)
    for v in verdicts:
        console.print(v)
