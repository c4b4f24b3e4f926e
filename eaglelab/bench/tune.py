"""The measuring pass behind ``eaglelab tune``, on the bench harness's systems and prompts.

1. **Acceptance**: one run of a wide tree (the grid's largest steps and topk, every candidate
   kept) over the prompts; each cycle's accepted ranks become :class:`~eaglelab.probes.events.Step`
   events on a probe bus (and in the record when one is asked for).
2. **Costs**, per batch size: a plain run (decode and prefill, wall time per step so the engine's
   loop counts), the verify of N tokens for every N (the harness's micro-measure), and one short run
   per (steps, topk) for draft, draft-extend and accept (plus the loop's bookkeeping per cycle).
   Each figure is published as a :class:`~eaglelab.probes.events.PhaseCost` event.
3. **Confirmation**: the harness's ``measure`` on the best predicted configurations and on plain
   decoding, over the same prompts as the acceptance run.

Every run uses the configuration the bench calls spec-decode-graphs on CUDA (decode-mode verify,
CUDA graphs; spec-compile with ``compile``) and spec-decode on CPU, plain-graphs (plain-compile) /
plain-eager for plain decoding. The verify micro-measure runs uncompiled graphs either way.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from eaglelab.bench import harness as H
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.events import PhaseCost
from eaglelab.probes.tuning import max_draft_tokens

Publish = Callable[[object], None]


@dataclass(frozen=True)
class TuneSettings:
    """The grid and the workload of one tuning pass."""

    steps: tuple[int, ...]
    topks: tuple[int, ...]
    draft_tokens: tuple[int, ...]  # N values tried for trees (a chain verifies steps + 1)
    batch_sizes: tuple[int, ...]
    new_tokens: int  # per row, EOS ignored (acceptance run and confirmation alike)
    cost_tokens: int  # per row in each cost run
    confirm: int  # best predicted configurations run for real, per batch size
    compile: bool = False  # CUDA graphs of torch.compile'd phases (as bench's *-compile configs)

    @property
    def wide(self) -> SpecConfig:
        """The measuring tree: deepest and widest of the grid, every candidate kept."""
        s, k = max(self.steps), max(self.topks)
        return SpecConfig("eagle3", num_steps=s, topk=k, num_draft_tokens=max_draft_tokens(s, k) if k > 1 else 0)

    @property
    def verify_widths(self) -> tuple[int, ...]:
        chains = {s + 1 for s in self.steps} if 1 in self.topks else set()
        trees = set(self.draft_tokens) if any(k > 1 for k in self.topks) else set()
        return tuple(sorted(chains | trees))


def _config(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> H.BenchConfig:
    """The bench configuration tune runs: graphs on CUDA (compiled phases with ``settings.compile``)."""
    graphs = ctx.device.type == "cuda"
    compiled = graphs and settings.compile
    if compiled:
        name = "spec-compile" if spec else "plain-compile"
    else:
        name = ("spec-decode" if spec else "plain") + ("-graphs" if graphs else "-eager")
    return H.BenchConfig(name, spec is not None, "decode", graphs, compile=compiled)


def _system(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> H.OurSystem:
    """Our engine as the bench runs it; ``spec`` None = plain decoding."""
    return H.OurSystem(_config(ctx, settings, spec), replace(ctx, spec=spec) if spec else ctx)


def acceptance_run(ctx: H.BenchContext, settings: TuneSettings, bus: ProbeBus, model: str,
                   progress: Callable[[int, int], None]) -> None:
    """The wide tree over every prompt (batches of the largest batch size), observed by ``bus``."""
    system = _system(ctx, settings, settings.wide)
    engine = Engine(ctx.target, drafter=system.drafter, spec=system.spec, observer=bus, runner=system.runner,
                    run_info={"model": model})
    batch = min(max(ctx.batch_sizes), len(ctx.prompts))
    groups = H.groups_for(ctx.prompts, batch)
    for i, group in enumerate(groups):
        engine.generate(group, settings.new_tokens)
        progress(i + 1, len(groups))


class CycleTimer(H.PhaseCollector):
    """A phase collector that also keeps each cycle's wall time: the interval between consecutive
    ``on_cycle`` calls, so the engine's bookkeeping between phases counts and per-call setup does not."""

    def __init__(self) -> None:
        super().__init__()
        self.walls: list[tuple[str, float, float]] = []  # (kind, wall ms, phase ms) per cycle after the first
        self._last: float | None = None

    def on_cycle(self, stats) -> None:
        now = time.perf_counter()
        super().on_cycle(stats)
        if self._last is not None:
            self.walls.append((stats.kind, (now - self._last) * 1e3, sum(stats.phase_ms.values())))
        self._last = now

    def median_wall(self, kind: str) -> float:
        return statistics.median(w for k, w, _ in self.walls if k == kind)

    def median_outside(self, kind: str) -> float:
        """Per-cycle time outside the phases (loop bookkeeping, host syncs)."""
        return statistics.median(max(w - p, 0.0) for k, w, p in self.walls if k == kind)

    def outside_cycles_ms(self, call_ms: float) -> float:
        """The call's time not spent in its timed cycles: prefill, the drafter's first extend, setup."""
        return call_ms - sum(w for _, w, _ in self.walls)


def _observed(system: H.OurSystem, group, new_tokens: int) -> tuple[CycleTimer, float]:
    """One observed call -> (its cycles, wall ms)."""
    col = CycleTimer()
    H._sync(system.ctx.device)
    t0 = time.perf_counter()
    system.engine(col).generate(group, new_tokens)
    H._sync(system.ctx.device)
    return col, (time.perf_counter() - t0) * 1e3


def plain_costs(ctx: H.BenchContext, settings: TuneSettings, batch: int, publish: Publish) -> float:
    """Decode (wall per step, the loop included) and the call's prefill and setup at ``batch``.
    -> that prefill figure (the drafter's extra start-up is measured against it)."""
    system = _system(ctx, settings, None)
    group = H.groups_for(ctx.prompts, batch)[0]
    system.engine().generate(group, 4)  # warm-up
    col, wall = _observed(system, group, settings.cost_tokens)
    prefill = col.outside_cycles_ms(wall)
    publish(PhaseCost("decode", batch, col.median_wall("decode")))
    publish(PhaseCost("prefill", batch, prefill))
    return prefill


def verify_costs(ctx: H.BenchContext, settings: TuneSettings, batch: int, publish: Publish) -> None:
    """One verify of N tokens for every N the grid needs (the micro-measure, graphs on CUDA)."""
    cuda = ctx.device.type == "cuda"
    context = int(statistics.mean(map(len, ctx.prompts))) + settings.new_tokens // 2
    rows = H.micro_measure(ctx.target, (batch,), widths=settings.verify_widths, context=context,
                           warmup=3 if cuda else 1, iters=20 if cuda else 5)
    for m in rows:
        if m.tokens > 1 and m.attention_mode == "decode" and m.graphs == cuda:
            publish(PhaseCost("verify", batch, m.ms, tokens=m.tokens))


def draft_costs(ctx: H.BenchContext, settings: TuneSettings, steps: int, topk: int, publish: Publish,
                prefill_ms: dict[int, float]) -> None:
    """Draft, draft-extend and accept (+ the loop's bookkeeping) of one (steps, topk) at every batch
    size; ``begin`` is the call's start-up beyond plain decoding's ``prefill_ms[batch]``."""
    n = steps + 1 if topk == 1 else min(max_draft_tokens(steps, topk), max(settings.draft_tokens))
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=n if topk > 1 else 0)
    system = _system(ctx, settings, spec)
    for batch in ctx.batch_sizes:
        group = H.groups_for(ctx.prompts, batch)[0]
        system.engine().generate(group, 4)  # warm-up
        col, wall = _observed(system, group, settings.cost_tokens)
        accept = col.median_ms("accept", "spec") + col.median_outside("spec")
        publish(PhaseCost("draft", batch, col.median_ms("draft", "spec"), steps=steps, topk=topk))
        publish(PhaseCost("draft_extend", batch, col.median_ms("draft_extend", "spec"), steps=steps, topk=topk))
        publish(PhaseCost("accept", batch, accept, steps=steps, topk=topk))
        begin = max(col.outside_cycles_ms(wall) - prefill_ms[batch], 0.0)
        publish(PhaseCost("begin", batch, begin, steps=steps, topk=topk))


@dataclass(frozen=True)
class Measured:
    """One real run of the confirmation."""

    steps: int  # 0 for plain decoding
    topk: int
    draft_tokens: int
    batch: int
    tok_per_s: float
    accept_len: float | None


def confirm_run(ctx: H.BenchContext, settings: TuneSettings, config: tuple[int, int, int] | None,
                batch: int) -> Measured:
    """The harness's measurement of one configuration (None = plain decoding) over every prompt group."""
    spec = None
    if config is not None:
        s, k, n = config
        spec = SpecConfig("eagle3", num_steps=s, topk=k, num_draft_tokens=n if k > 1 else 0)
    system = _system(ctx, settings, spec)
    work = replace(ctx, max_new_tokens=settings.new_tokens)
    cfg = _config(ctx, settings, spec)
    generate = lambda g, m: system.engine().generate(g, m)  # noqa: E731
    row, _ = H.measure(generate, None, cfg, work, batch, repeats=1)  # one pass over every group
    s, k, n = config if config is not None else (0, 0, 1)
    return Measured(s, k, n, batch, row.tok_per_s or 0.0, row.mean_accept_len)
