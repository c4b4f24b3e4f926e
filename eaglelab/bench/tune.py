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
from eaglelab.bench.configs import BenchConfig, tune_config
from eaglelab.bench.micro import micro_measure
from eaglelab.bench.timing import sync
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


def config_for(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> BenchConfig:
    """The bench configuration tune runs: graphs on CUDA (compiled phases with ``settings.compile``)."""
    graphs = ctx.device.type == "cuda"
    return tune_config(spec is not None, graphs, graphs and settings.compile)


def _system(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> H.OurSystem:
    """Our engine as the bench runs it; ``spec`` None = plain decoding."""
    return H.OurSystem(config_for(ctx, settings, spec), replace(ctx, spec=spec) if spec else ctx)


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
    sync(system.ctx.device)
    t0 = time.perf_counter()
    system.engine(col).generate(group, new_tokens)
    sync(system.ctx.device)
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
    rows = micro_measure(ctx.target, (batch,), widths=settings.verify_widths, context=context,
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
    cfg = config_for(ctx, settings, spec)
    generate = lambda g, m: system.engine().generate(g, m)  # noqa: E731
    row, _ = H.measure(generate, None, cfg, work, batch, repeats=1)  # one pass over every group
    s, k, n = config if config is not None else (0, 0, 1)
    return Measured(s, k, n, batch, row.tok_per_s or 0.0, row.mean_accept_len)


# ---- the whole pass, as ``eaglelab tune`` runs it ----------------------------------------------------
Progress = Callable[[str, int, "int | None"], None]  # (what, done, total or None)


@dataclass(frozen=True)
class TuneTarget:
    """The target and drafter a tuning pass measures, with what the report says about them."""

    ctx: H.BenchContext
    notes: tuple[str, ...]
    model: str  # the name the report prints
    draft_path: str  # the drafter directory (for the SGLang / vLLM flags printed)


def load_tune_target(settings: TuneSettings, n_prompts: int, *, model: str, draft: str, device: str, dtype: str,
                     seed: int, serving: str | None = None, questions: str | None = None, max_prompt_tokens: int = 512,
                     compile_asked: bool = False, log: Callable[[str], None] = lambda m: None) -> TuneTarget:
    """Target, drafter (through the session and its drafter registry, as ``run`` loads them) and prompts, as the
    bench loads them. Refuses a drafter that is not an EAGLE-3 tree drafter."""
    import argparse

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.session import add_engine_args, build_session

    if draft in ("ngram", "none"):
        raise EagleLabError("tune measures a tree drafter", field="--draft", found=draft,
                            expected="default | PATH of an EAGLE-3 drafter")
    # The session's own flags, parsed (not a forged Namespace): a flag added there gets its default here too.
    engine_flags = argparse.ArgumentParser(add_help=False)
    add_engine_args(engine_flags)
    ns = engine_flags.parse_args(
        ["--model", model, "--device", device, "--dtype", dtype, "--seed", str(seed),
         "--max-new-tokens", str(settings.new_tokens), "--draft", draft, "--no-cuda-graphs", "--no-compile"]
        + (["--serving", serving] if serving else []))
    s = build_session(ns, log=lambda m: None)
    if s.draft.kind != "eagle3":
        raise EagleLabError("tune measures a tree drafter, and no EAGLE-3 drafter ships for this model",
                            field="--draft", found=draft, hint="pass --draft PATH of an EAGLE-3 drafter")
    target = s.target
    prompts, how = H.tokenize_prompts(H.mtbench_first_turns(n_prompts, questions), target.tokenizer,
                                      target.config.vocab_size, max_prompt_tokens)
    ctx = H.BenchContext(target=target.model, spec=s.spec, make_drafter=s.draft.make, prompts=prompts,
                         max_new_tokens=settings.new_tokens, batch_sizes=settings.batch_sizes, log=log)
    notes = list(s.notes) + [f"prompts: {len(prompts)} MT-bench first turns, {how}; "
                             f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens",
                             f"generation: {settings.new_tokens} tokens per row, EOS ignored, greedy"]
    if compile_asked and not settings.compile:
        notes.append("--compile: ignored on CPU (it compiles the phases of CUDA graphs)")
    elif settings.compile:
        notes.append("phases: CUDA graphs of torch.compile'd phases (the verify micro-measure: uncompiled graphs)")
    return TuneTarget(ctx, tuple(notes), f"{target.name} ({target.config.num_layers} layers)", str(s.draft.path))


def measuring_pass(ctx: H.BenchContext, settings: TuneSettings, model: str, record: str | None,
                   progress: Progress) -> tuple[list, list]:
    """The acceptance run and every cost run, published on a probe bus (and into ``record`` when given).
    -> (its Step events, its PhaseCost events)."""
    from eaglelab.probes.events import Step

    bus, steps, costs = ProbeBus(aggregate=False), [], []
    bus.subscribe(lambda e: steps.append(e) if isinstance(e, Step) else costs.append(e) if isinstance(e, PhaseCost) else None)
    close = record_sink(bus, record)
    try:
        wide = settings.wide
        what = f"acceptance: wide tree, {wide.num_steps} steps, topk {wide.topk}, {wide.draft_tokens} tokens"
        progress(what, 0, None)
        acceptance_run(ctx, settings, bus, model, lambda done, total: progress(what, done, total))
        pairs = [(s, k) for k in settings.topks for s in settings.steps]
        total, done = 2 * len(settings.batch_sizes) + len(pairs), 0
        progress("phase costs", 0, total)
        prefill = {}
        for b in settings.batch_sizes:
            prefill[b] = plain_costs(ctx, settings, b, bus.publish)
            progress("phase costs", done + 1, total)
            verify_costs(ctx, settings, b, bus.publish)
            done += 2
            progress("phase costs", done, total)
        for s, k in pairs:
            draft_costs(ctx, settings, s, k, bus.publish, prefill)
            done += 1
            progress("phase costs", done, total)
    finally:
        close()
    return steps, costs


def record_sink(bus: ProbeBus, path: str | None) -> Callable[[], None]:
    """Subscribe a record writer for ``path`` (when given) -> its closer."""
    if not path:
        return lambda: None
    from eaglelab.probes.record import RecordWriter

    writer = RecordWriter(path)
    bus.subscribe(writer)
    return writer.close


def confirm(ctx: H.BenchContext, settings: TuneSettings, report: dict, progress: Progress) -> list[dict]:
    """Run the best predictions and plain decoding for real; predicted end to end against measured."""
    from eaglelab.bench.tune_predict import costs_from_report
    from eaglelab.probes.tuning import Prediction, plain_end_to_end_tok_per_s

    out = []
    jobs = [(b, p) for b in settings.batch_sizes for p in [None] + report["predictions"][str(b)][: settings.confirm]]
    progress("confirming: real runs", 0, len(jobs))
    for b, p in jobs:
        costs = report["costs"][str(b)]
        config = None if p is None else (p["steps"], p["topk"], p["draft_tokens"])
        got = confirm_run(ctx, settings, config, b)
        if p is None:
            pred_tps, pred_a = plain_end_to_end_tok_per_s(costs_from_report(costs), settings.new_tokens), None
        else:
            pred = Prediction(**{k: p[k] for k in Prediction.__dataclass_fields__})
            pred_tps = pred.end_to_end_tok_per_s(settings.new_tokens, costs["prefill_ms"] + costs["begin_ms"])
            pred_a = pred.accept_len
        out.append(dict(batch=b, steps=got.steps, topk=got.topk, draft_tokens=got.draft_tokens,
                        predicted_tok_per_s=pred_tps, measured_tok_per_s=got.tok_per_s,
                        predicted_accept_len=pred_a, measured_accept_len=got.accept_len))
        progress("confirming: real runs", len(out), len(jobs))
    return out


def settings_dict(settings: TuneSettings, prompts: int) -> dict:
    """The settings as the report's JSON holds them."""
    from dataclasses import asdict

    d = asdict(settings)
    d.update(prompts=prompts, wide_tree=settings.wide.to_dict())
    return d
