"""The measuring pass behind ``eaglelab tune``, on the bench harness's systems and prompts, in the regime ``run``
decodes in on this device (:class:`~eaglelab.bench.configs.Regime`: on CUDA graphs of torch.compile'd phases, the
one-graph cycle, our GEMV and decode attention as ``run`` picks them; on a CPU eager with the session's kernels).

1. **Acceptance**: one run of a wide tree (the candidates' largest steps and topk, every node kept) over the
   prompts; each cycle's accepted ranks become :class:`~eaglelab.probes.events.Step` events on a probe bus (and in
   the record when one is asked for). Acceptance does not depend on the kernels: on CUDA it runs uncompiled graphs.
2. **Costs**, per batch size, in the regime: plain decoding's step, and each candidate's whole cycle, each from two
   unobserved calls of ``cost_tokens`` and ``2 * cost_tokens`` tokens (the difference of their wall times over the
   difference of their steps or cycles: what the prompt costs cancels; what the loop does between graph launches
   counts); the calls' intercepts give the prompt's cost. Published as
   :class:`~eaglelab.probes.events.PhaseCost` events (``decode``, ``cycle``, ``prefill``, ``begin``).
3. **Confirmation**: per batch size the best predicted candidates and plain decoding run for real over every
   prompt, interleaved pass by pass (the bench's :class:`~eaglelab.bench.harness.Contender`); the fastest measured
   is the batch size's choice, and :func:`tuned_profile` makes the device profile of those choices.

Every compiled tree shape costs a compile per batch size the first time (cached on disk after): the candidate set
is small (:func:`default_candidates`), around the device profile's trees.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from eaglelab.bench import harness as H
from eaglelab.bench.configs import BenchConfig, Regime, regime_config
from eaglelab.bench.timing import sync
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.events import PhaseCost
from eaglelab.probes.tuning import max_draft_tokens

Publish = Callable[[object], None]
Candidate = tuple[int, int, int]  # (steps, topk, draft tokens)

# The trees tried around the profile's, per batch size: deep trees pay at one row, narrower ones as the batch
# fills the GPU (a verify of N tokens x B rows stops being free), chains at the largest batches.
CANDIDATES_GPU = {1: ((3, 1, 4), (4, 4, 12), (5, 4, 16), (5, 4, 24)), 8: ((3, 1, 4), (3, 2, 6), (4, 4, 12), (5, 4, 16)),
                  32: ((2, 1, 3), (3, 1, 4), (3, 2, 6), (4, 2, 8))}
CANDIDATES_CPU = {1: ((2, 1, 3), (3, 1, 4), (4, 1, 5), (3, 2, 6)), 8: ((1, 1, 2), (2, 1, 3), (3, 1, 4))}


@dataclass(frozen=True)
class TuneSettings:
    """The candidates and the workload of one tuning pass."""

    candidates: dict[int, tuple[Candidate, ...]]  # batch size -> the trees tried at it
    new_tokens: int  # per row, EOS ignored (acceptance run and confirmation alike)
    cost_tokens: int  # per row in the shorter of each cost's two calls
    confirm: int  # best predicted candidates run for real, per batch size
    regime: Regime = Regime(graphs=False)
    passes: int = 2  # interleaved passes of the confirmation

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.candidates))

    @property
    def all_candidates(self) -> tuple[Candidate, ...]:
        return tuple(sorted({c for cs in self.candidates.values() for c in cs}))

    @property
    def wide(self) -> SpecConfig:
        """The measuring tree: deepest and widest of the candidates, every node kept."""
        s = max(c[0] for c in self.all_candidates)
        k = max(c[1] for c in self.all_candidates)
        return SpecConfig("eagle3", num_steps=s, topk=k, num_draft_tokens=max_draft_tokens(s, k) if k > 1 else 0)


def default_candidates(batch_sizes: tuple[int, ...], cuda: bool, tree_for: Callable[[int], Any] | None) -> dict[int, tuple[Candidate, ...]]:
    """Per batch size: the table's trees for the nearest batch size in it (:data:`CANDIDATES_GPU` /
    :data:`CANDIDATES_CPU`) and the tree the device profile gives now (``tree_for``), so a tune can only confirm or
    beat it."""
    table = CANDIDATES_GPU if cuda else CANDIDATES_CPU
    out = {}
    for b in batch_sizes:
        near = min(table, key=lambda t: (abs(t - b), t))
        got = list(table[near])
        if tree_for is not None:
            t = tree_for(b)
            got.append((t.steps, t.topk, t.draft_tokens or t.steps + 1))
        out[b] = tuple(sorted(set(got)))
    return out


def config_for(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> BenchConfig:
    """The bench configuration tune runs: plain or speculative decoding in ``settings.regime``."""
    return regime_config(spec is not None, settings.regime)


def _spec(c: Candidate) -> SpecConfig:
    s, k, n = c
    return SpecConfig("eagle3", num_steps=s, topk=k, num_draft_tokens=n if k > 1 else 0)


def _system(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None) -> H.OurSystem:
    """Our engine in the regime; ``spec`` None = plain decoding."""
    return H.OurSystem(config_for(ctx, settings, spec), replace(ctx, spec=spec) if spec else ctx)


class Systems:
    """One system per candidate (and plain decoding), made on first use and kept: the cost runs capture and
    compile its graphs per batch size, the confirmation replays them."""

    def __init__(self, ctx: H.BenchContext, settings: TuneSettings) -> None:
        self.ctx, self.settings, self.made = ctx, settings, {}

    def __call__(self, c: Candidate | None) -> H.OurSystem:
        if c not in self.made:
            self.made[c] = _system(self.ctx, self.settings, _spec(c) if c is not None else None)
        return self.made[c]


def acceptance_run(ctx: H.BenchContext, settings: TuneSettings, bus: ProbeBus, model: str,
                   progress: Callable[[int, int], None]) -> None:
    """The wide tree over every prompt (batches of the largest batch size), observed by ``bus``; uncompiled graphs
    on CUDA (acceptance is the drafter's and the target's, not the kernels'), eager on a CPU."""
    plain = Regime(graphs=settings.regime.graphs)
    system = H.OurSystem(regime_config(True, plain), replace(ctx, spec=settings.wide))
    engine = Engine(ctx.target, drafter=system.drafter, spec=system.spec, observer=bus, runner=system.runner,
                    run_info={"model": model})
    batch = min(max(ctx.batch_sizes), len(ctx.prompts))
    groups = H.groups_for(ctx.prompts, batch)
    for i, group in enumerate(groups):
        engine.generate(group, settings.new_tokens)
        progress(i + 1, len(groups))


def timed_call(system: H.OurSystem, group, new_tokens: int) -> tuple[float, int]:
    """One unobserved call -> (wall ms less any set-up inside it, speculative cycles run: 0 for plain decoding)."""
    sync(system.ctx.device)
    t0 = time.perf_counter()
    res = system.engine().generate(group, new_tokens)
    sync(system.ctx.device)
    return (time.perf_counter() - t0 - res.setup_seconds) * 1e3, len(res.accept_lens)


@dataclass(frozen=True)
class LineFit:
    """A call's wall ms as ``fixed + per * units`` (units: decode steps or cycles), from two call lengths."""

    per: float
    fixed: float


def fit_two(short: tuple[float, int], long: tuple[float, int]) -> LineFit:
    """The line through (units, ms) of a short and a long call.

    Example: 40 ms for 10 steps and 70 ms for 20: 3 ms a step, 10 ms fixed (the prompt). Where the long call
    took no longer than the short one (noise on a busy machine), the long call's time per unit, nothing fixed."""
    (ms1, u1), (ms2, u2) = short, long
    per = (ms2 - ms1) / (u2 - u1) if u2 > u1 else 0.0
    if per <= 0:  # no slope (a call stopped early, or noise larger than the difference): all of it per unit
        return LineFit(ms2 / max(u2, 1), 0.0)
    return LineFit(per, max(ms1 - per * u1, 0.0))


def cost_fit(system: H.OurSystem, group, tokens: int, speculative: bool, repeats: int = 2) -> LineFit:
    """A warm-up, then the fastest of ``repeats`` calls of ``tokens`` and of ``2 * tokens`` tokens, fitted."""
    system.engine().generate(group, min(8, tokens))  # capture, compile (set-up: never timed)

    def best(n: int) -> tuple[float, int]:
        calls = [timed_call(system, group, n) for _ in range(repeats)]
        ms = min(c[0] for c in calls)
        units = calls[0][1] if speculative else n - 1  # plain: the first token comes from the prefill
        return ms, units

    return fit_two(best(tokens), best(2 * tokens))


def measure_costs(ctx: H.BenchContext, settings: TuneSettings, systems: Systems, batch: int, publish: Publish,
                  progress: Callable[[], None] = lambda: None) -> None:
    """Plain decoding's step and each candidate's whole cycle at ``batch`` rows, in the regime, published."""
    group = H.groups_for(ctx.prompts, batch)[0]
    plain = cost_fit(systems(None), group, settings.cost_tokens, speculative=False)
    publish(PhaseCost("decode", batch, plain.per))
    publish(PhaseCost("prefill", batch, plain.fixed))
    progress()
    begins = []
    for c in settings.candidates[batch]:
        fit = cost_fit(systems(c), group, settings.cost_tokens, speculative=True)
        publish(PhaseCost("cycle", batch, fit.per, tokens=c[2], steps=c[0], topk=c[1]))
        begins.append(max(fit.fixed - plain.fixed, 0.0))  # the drafter's extend over the prompt, beyond the prefill
        progress()
    publish(PhaseCost("begin", batch, statistics.median(begins)))


@dataclass(frozen=True)
class Measured:
    """One real run of the confirmation."""

    steps: int  # 0 for plain decoding
    topk: int
    draft_tokens: int
    batch: int
    tok_per_s: float
    accept_len: float | None
    passes: tuple[float, ...] = ()  # tok/s per interleaved pass


def confirm_batch(ctx: H.BenchContext, settings: TuneSettings, systems: Systems, batch: int,
                  configs: list[Candidate | None]) -> list[Measured]:
    """``configs`` (None = plain decoding) at ``batch`` rows over every prompt group, interleaved pass by pass."""
    work = replace(ctx, max_new_tokens=settings.new_tokens)
    groups = H.groups_for(ctx.prompts, batch)
    live = []
    for c in configs:
        system = systems(c)
        cfg = config_for(ctx, settings, system.spec if c is not None else None)
        live.append(H.Contender(cfg, batch, lambda g, m, s=system: s.engine().generate(g, m), None, groups))
        live[-1].warm_up(settings.new_tokens)
    for _ in range(settings.passes):
        for contender in live:
            contender.run_pass(work)
    out = []
    for c, contender in zip(configs, live):
        row = contender.row(work)
        s, k, n = c if c is not None else (0, 0, 1)
        out.append(Measured(s, k, n, batch, row.tok_per_s or 0.0, row.mean_accept_len, row.sweeps_tok_per_s))
    return out


# ---- the whole pass, as ``eaglelab tune`` runs it ----------------------------------------------------
Progress = Callable[[str, int, "int | None"], None]  # (what, done, total or None)


@dataclass(frozen=True)
class TuneTarget:
    """The target and drafter a tuning pass measures, with what the report says about them."""

    ctx: H.BenchContext
    notes: tuple[str, ...]
    model: str  # the name the report prints
    draft_path: str  # the drafter directory (for the SGLang / vLLM flags printed, and the profile's digest)
    draft: Any = None  # the DraftChoice: its device profile and trees now
    dtype: str = ""


def load_tune_target(n_prompts: int, new_tokens: int, *, model: str, draft: str, device: str, dtype: str,
                     seed: int, cuda: bool, gemv: bool | None = None, serving: str | None = None,
                     questions: str | None = None, max_prompt_tokens: int = 512,
                     log: Callable[[str], None] = lambda m: None) -> TuneTarget:
    """Target, drafter (through the session and its drafter registry, as ``run`` loads them) and prompts, as the
    bench loads them; on a CPU the session's kernels as ``run`` has them (the few-row C kernel when speculating,
    MKL for plain decoding; ``gemv`` as --gemv); on CUDA tune's configurations build theirs. Refuses a drafter that
    is not an EAGLE-3 tree drafter (tune does not apply to it)."""
    import argparse

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.session import add_engine_args, build_session

    if draft in ("ngram", "none"):
        raise EagleLabError("tune does not apply: it tunes the tree of an EAGLE-3 drafter", field="--draft",
                            found=draft, expected="default | PATH of an EAGLE-3 drafter")
    kernels = ["--no-gemv", "--no-decode-attn"] if cuda else [] if gemv is None else ["--gemv" if gemv else "--no-gemv"]
    # The session's own flags, parsed (not a forged Namespace): a flag added there gets its default here too.
    engine_flags = argparse.ArgumentParser(add_help=False)
    add_engine_args(engine_flags)
    ns = engine_flags.parse_args(
        ["--model", model, "--device", device, "--dtype", dtype, "--seed", str(seed), "--max-new-tokens",
         str(new_tokens), "--draft", draft, "--no-cuda-graphs", "--no-compile", *kernels]
        + (["--serving", serving] if serving else []))
    s = build_session(ns, log=lambda m: None)
    if s.draft.kind != "eagle3":
        raise EagleLabError("tune does not apply: it tunes the tree of an EAGLE-3 drafter, and this model has none "
                            "shipped", field="--draft", found=draft, hint="pass --draft PATH of an EAGLE-3 drafter")
    target = s.target
    prompts, how = H.tokenize_prompts(H.mtbench_first_turns(n_prompts, questions), target.tokenizer,
                                      target.config.vocab_size, max_prompt_tokens)
    ctx = H.BenchContext(target=target.model, spec=s.spec, make_drafter=s.draft.make, prompts=prompts,
                         max_new_tokens=new_tokens, batch_sizes=(1,), log=log,
                         eager_kernels=None if cuda else s.kernels,
                         plain_kernels=None if cuda or s.plain_on_mkl else s.kernels)
    notes = [n for n in s.notes if not cuda or not n.startswith(("--gemv", "--decode-attn"))]
    notes += [f"prompts: {len(prompts)} MT-bench first turns, {how}; {min(map(len, prompts))}..{max(map(len, prompts))} "
              f"tokens", f"generation: {new_tokens} tokens per row, EOS ignored, greedy"]
    return TuneTarget(ctx, tuple(notes), f"{target.name} ({target.config.num_layers} layers)", str(s.draft.path),
                      s.draft, s.dtype_name)


def measuring_pass(ctx: H.BenchContext, settings: TuneSettings, model: str, record: str | None,
                   progress: Progress, systems: Systems) -> tuple[list, list]:
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
        total = sum(1 + len(cs) for cs in settings.candidates.values())
        done = [0]

        def step() -> None:
            done[0] += 1
            progress("costs in run's regime (first use of a shape compiles it)", done[0], total)

        progress("costs in run's regime (first use of a shape compiles it)", 0, total)
        for b in settings.batch_sizes:
            measure_costs(ctx, settings, systems, b, bus.publish, step)
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


def confirm(ctx: H.BenchContext, settings: TuneSettings, report: dict, progress: Progress,
            systems: Systems) -> list[dict]:
    """Run the best predictions and plain decoding for real, interleaved; predicted end to end against measured."""
    from eaglelab.bench.tune_predict import costs_from_report
    from eaglelab.probes.tuning import Prediction, plain_end_to_end_tok_per_s

    out = []
    progress("confirming: real runs", 0, len(settings.batch_sizes))
    for b in settings.batch_sizes:
        preds = report["predictions"].get(str(b), [])[: settings.confirm]
        costs = report["costs"][str(b)]
        got = confirm_batch(ctx, settings, systems, b, [None] + [(p["steps"], p["topk"], p["draft_tokens"]) for p in preds])
        for p, m in zip([None] + preds, got):
            if p is None:
                pred_tps, pred_a = plain_end_to_end_tok_per_s(costs_from_report(costs), settings.new_tokens), None
            else:
                pred = Prediction(**{k: p[k] for k in Prediction.__dataclass_fields__})
                pred_tps = pred.end_to_end_tok_per_s(settings.new_tokens, costs["prefill_ms"] + costs["begin_ms"])
                pred_a = pred.accept_len
            out.append(dict(batch=b, steps=m.steps, topk=m.topk, draft_tokens=m.draft_tokens,
                            predicted_tok_per_s=pred_tps, measured_tok_per_s=m.tok_per_s, passes=list(m.passes),
                            predicted_accept_len=pred_a, measured_accept_len=m.accept_len))
        progress("confirming: real runs", settings.batch_sizes.index(b) + 1, len(settings.batch_sizes))
    return out


def settings_dict(settings: TuneSettings, prompts: int) -> dict:
    """The settings as the report's JSON holds them."""
    return {"candidates": {str(b): [list(c) for c in cs] for b, cs in settings.candidates.items()},
            "batch_sizes": list(settings.batch_sizes), "new_tokens": settings.new_tokens,
            "cost_tokens": settings.cost_tokens, "confirm": settings.confirm, "passes": settings.passes,
            "regime": settings.regime.label, "prompts": prompts, "wide_tree": settings.wide.to_dict()}


# ---- the profile -----------------------------------------------------------------------------------
def winners(confirmation: list[dict]) -> dict[int, dict]:
    """Per batch size, the speculative configuration measured fastest (not predicted), with plain's figure."""
    out = {}
    for b in sorted({r["batch"] for r in confirmation}):
        rows = [r for r in confirmation if r["batch"] == b]
        plain = next((r for r in rows if r["steps"] == 0), None)
        spec = [r for r in rows if r["steps"] > 0]
        if plain is not None and spec:
            best = max(spec, key=lambda r: r["measured_tok_per_s"])
            out[b] = dict(best, plain_tok_per_s=plain["measured_tok_per_s"])
    return out


def tuned_profile(report: dict, settings: TuneSettings, device: str, dtype: str, drafter_sha256: str,
                  when: str) -> Any:
    """The :class:`~eaglelab.profiles.DeviceProfile` of a tune's confirmed winners: a bucket per batch size tuned
    (up to it: the next takes larger ones), the measured figure as its reason; the kernels it measured with."""
    from eaglelab.profiles import BucketChoice, DeviceProfile

    won = winners(report["confirmation"])
    hw = report["hardware"]
    prompts = report["settings"]["prompts"]
    buckets = []
    for b, w in won.items():
        ratio = w["measured_tok_per_s"] / w["plain_tok_per_s"] if w["plain_tok_per_s"] else 0.0
        buckets.append(BucketChoice(
            b, w["steps"], w["topk"], w["draft_tokens"],
            f"{ratio:.2f}x over plain decoding ({w['measured_tok_per_s']:,.1f} vs {w['plain_tok_per_s']:,.1f} tok/s; "
            f"{prompts} MT-bench first turns, {settings.new_tokens} tokens, batch {b}, {settings.passes} interleaved "
            f"passes, plain in the same regime; eaglelab tune, {when})"))
    r = settings.regime
    graphs = r.graphs
    return DeviceProfile(
        device=device, dtype=dtype, drafter_sha256=drafter_sha256, buckets=tuple(buckets),
        compile=r.compile if graphs else False, gemv=r.gemv if graphs else None, decode_attn=r.attn if graphs else False,
        kernels_reason=f"the regime eaglelab tune measured in ({r.label}); the trees were tuned with it, the kernels "
                       "themselves not compared",
        source=f"eaglelab tune on {hw.get('gpu') or hw.get('cpu') or device} (torch {hw.get('torch', '?')}), {when}")
