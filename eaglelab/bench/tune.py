"""The measuring pass behind ``eaglelab tune``, on the bench harness's systems and prompts, in the regime ``run``
decodes in on this device (:class:`~eaglelab.bench.configs.Regime`: on CUDA graphs of torch.compile'd phases, the
one-graph cycle, our GEMV and decode attention as ``run`` picks them; on a CPU eager with the session's kernels).

1. **Acceptance**: one run of a wide tree (the candidates' largest steps and topk, every node kept) over the
   prompts; each cycle's accepted ranks become :class:`~eaglelab.probes.events.Step` events on a probe bus (and in
   the record when one is asked for). Acceptance does not depend on the kernels: on CUDA it runs uncompiled graphs.
2. **Costs**, per batch size, in the regime: plain decoding's step, and each candidate's whole cycle, each from
   unobserved calls over **every prompt group the confirmation runs** (after one untimed pass over all of them, so
   every prompt width's graph is captured first), of ``cost_tokens`` and of the confirmation's ``new_tokens``
   tokens: the difference of their wall times over the difference of their steps or cycles (what the prompt costs
   cancels; what the loop does between graph launches counts); the intercept gives the prompt's cost. A cycle is
   counted per row (the average row's cycles): a batch runs until its slowest row is done, so at batch > 1 a
   cycle's cost holds the wait for the stragglers, as the real runs do. Published as
   :class:`~eaglelab.probes.events.PhaseCost` events (``decode``, ``cycle``, ``prefill``, ``begin``).
   With ``screen`` (the default under compile) every candidate is first timed with CUDA graphs but without
   compile (a capture takes a second, a compile ~30 s cold), ranked, and only the best ``max(confirm, 1)`` per batch
   size are compiled and timed again; the others' cycles are their uncompiled ones scaled by the compiled/uncompiled
   ratio those measured (:class:`CostScreen`).
3. **Confirmation**: per batch size the best predicted candidates that were timed compiled and plain decoding run
   for real over every prompt: each first makes one untimed pass over every prompt group (every bucket and prompt
   width captured, compiled and replayed once before the clock), then pass by pass each runs once, interleaved (the
   bench's :class:`~eaglelab.bench.harness.Contender`); :func:`disagreements` names the trees whose passes read
   more than 10% apart. Every tree confirmed also runs beside each lookup branch of ``settings.lookup``
   (:func:`with_branches`): what a branch returns depends on the text, not on the drafter's ranks, so it is
   measured, never predicted, and beside each tree, since the prediction can rank the trees wrongly. What `run`
   takes now at that batch size (``settings.incumbent``: the profile's tree and branch) runs too, whatever its
   prediction (:func:`confirmed_configs`), so the profile a tune writes is no slower than the one it replaces.
   The fastest measured is the batch size's choice, and :func:`tuned_profile` makes the device profile of those
   choices.

Every compiled tree shape costs a compile per batch size the first time (cached on disk after): the candidate set
is small (:func:`default_candidates`), around the device profile's trees, and screened before compiling.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from eaglelab.bench import harness as H
from eaglelab.bench.configs import BenchConfig, Regime, regime_config
from eaglelab.bench.timing import sync
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.events import PhaseCost
from eaglelab.probes.tuning import AcceptanceTable, AcceptLen, max_draft_tokens

Publish = Callable[[object], None]
Candidate = tuple[int, int, int]  # (steps, topk, draft tokens)
# What the confirmation runs: a candidate, or one with a prompt-lookup branch of that many tokens beside it (steps,
# topk, draft tokens, lookup tokens). The model predicts no branch: a branch is measured, never predicted.
Confirmed = Candidate | tuple[int, int, int, int]

# The trees tried around the profile's, per batch size: deep trees pay at one row, narrower ones as the batch
# fills the GPU (a verify of N tokens x B rows stops being free), chains at the largest batches. Six steps at one
# row: a drafter that runs all five steps right in a fifth of MT-bench's cycles takes a sixth (the shipped one,
# float32 on a CPU over the 80 first turns, each with a branch of 16: 4.012 accepted at 6/4/32, 3.876 at 5/4/24);
# whether the step and the wider verify pay for it is the device's to say (a larger target's decode dwarfs them).
CANDIDATES_GPU = {1: ((3, 1, 4), (5, 4, 24), (6, 4, 24), (6, 4, 32)),
                  8: ((3, 1, 4), (3, 2, 6), (4, 4, 12), (5, 4, 16)),
                  32: ((2, 1, 3), (3, 1, 4), (3, 2, 6), (4, 2, 8))}
CANDIDATES_CPU = {1: ((2, 1, 3), (3, 1, 4), (4, 1, 5), (3, 2, 6)), 8: ((1, 1, 2), (2, 1, 3), (3, 1, 4))}
# The lookup branches measured beside each confirmed tree, per batch size (the nearest in the table): at one
# row a verify 16 rows wider costs little on a GPU; a full batch pays for every row. On a CPU every verified row
# costs its share of the projections: no branch unless asked for (--lookup-tokens).
LOOKUP_GPU = {1: (16,), 8: (8,), 32: (8,)}


@dataclass(frozen=True)
class TuneSettings:
    """The candidates and the workload of one tuning pass."""

    candidates: dict[int, tuple[Candidate, ...]]  # batch size -> the trees tried at it
    new_tokens: int  # per row, EOS ignored (acceptance run and confirmation alike)
    cost_tokens: int  # per row in the shorter of each cost's two calls
    confirm: int  # best predicted candidates run for real, per batch size
    regime: Regime = Regime(graphs=False)
    passes: int = 3  # interleaved passes of the confirmation
    screen: bool = False  # rank on graphs without compile first; compile only the best max(confirm, 1) per batch
    lookup: dict[int, tuple[int, ...]] = field(default_factory=dict)  # batch size -> branches beside each confirmed tree
    # batch size -> what `run` takes there now (the device profile's tree and branch): confirmed with the rest
    # whatever its prediction, so a tune writes a profile no slower than the one it replaces, as measured in its run
    incumbent: dict[int, Confirmed] = field(default_factory=dict)

    @property
    def screening(self) -> bool:
        """Whether the candidates are screened uncompiled: asked for, and the regime compiles graphs."""
        return self.screen and self.regime.compile and self.regime.graphs

    @property
    def screen_regime(self) -> Regime:
        """The screening regime: run's, but the phases not compiled (the kernels as run has them)."""
        return replace(self.regime, compile=False)

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
            got.append(_four(in_use(tree_for, b))[:3])
        out[b] = tuple(sorted(set(got)))
    return out


def in_use(tree_for: Callable[[int], Any], batch: int) -> Confirmed:
    """What `run` takes at ``batch`` rows (``tree_for``: the drafter's :meth:`tree_for`, a TreeShape) as the
    confirmation names it: (steps, topk, draft tokens), a chain's draft tokens steps + 1, and its lookup branch
    when it has one."""
    t = tree_for(batch)
    tree = (t.steps, t.topk, t.draft_tokens or t.steps + 1)
    return (*tree, t.lookup_tokens) if t.lookup_tokens else tree


def default_lookup(batch_sizes: tuple[int, ...], cuda: bool) -> dict[int, tuple[int, ...]]:
    """Per batch size, the lookup branches the confirmation measures beside each tree it confirms
    (:data:`LOOKUP_GPU` for the nearest batch size; none on a CPU)."""
    if not cuda:
        return {}
    return {b: LOOKUP_GPU[min(LOOKUP_GPU, key=lambda t: (abs(t - b), t))] for b in batch_sizes}


def with_branches(trees: list[Candidate], branches: tuple[int, ...]) -> list[Confirmed]:
    """The confirmation's trees: ``trees`` as predicted, then each of them beside each branch length (a branch
    rides beside an EAGLE-3 tree of any shape; 0 in ``branches`` is the tree alone, already there). Every tree, not
    only the best predicted: on the H200 a tune predicted 5/4/16 best (2.17x) where 5/4/24 measured faster (2.08x
    against 1.95x), so a branch beside the predicted best alone kept the slower tree.

    Example: ``[(5, 4, 24), (4, 4, 12)]`` with branches ``(16,)`` -> the two, then ``(5, 4, 24, 16)``,
    ``(4, 4, 12, 16)``."""
    extra = [(*t, k) for t in trees for k in branches if k > 0]
    return [*trees, *extra]


def confirmed_configs(trees: list[Candidate], branches: tuple[int, ...],
                      incumbent: Confirmed | None = None) -> list[Confirmed]:
    """What the confirmation runs besides plain decoding: :func:`with_branches`, then ``incumbent`` (what `run`
    takes now) unless it is among them already. The incumbent is compiled then if the screen left it out: a tune
    that never measured it could write a slower profile over it.

    Example: ``[(5, 4, 16), (4, 4, 12)]``, branches ``(16,)``, incumbent ``(5, 4, 24, 16)`` -> the two, each
    beside a branch of 16, then ``(5, 4, 24, 16)``."""
    out = with_branches(trees, branches)
    if incumbent is not None and _four(incumbent) not in {_four(c) for c in out}:
        out.append(incumbent)
    return out


def config_for(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None,
               regime: Regime | None = None) -> BenchConfig:
    """The bench configuration tune runs: plain or speculative decoding in ``regime`` (default
    ``settings.regime``)."""
    return regime_config(spec is not None, regime or settings.regime)


def _four(c: Confirmed) -> tuple[int, int, int, int]:
    """(steps, topk, draft tokens, lookup tokens) of a candidate (no branch: 0) or of one beside a branch."""
    return (*c, 0)[:4]


def _spec(c: Confirmed) -> SpecConfig:
    s, k, n, lookup = _four(c)
    return SpecConfig("eagle3", num_steps=s, topk=k, num_draft_tokens=n if k > 1 else 0, lookup_tokens=lookup)


def _system(ctx: H.BenchContext, settings: TuneSettings, spec: SpecConfig | None, regime: Regime) -> H.OurSystem:
    """Our engine in ``regime``; ``spec`` None = plain decoding."""
    return H.OurSystem(config_for(ctx, settings, spec, regime), replace(ctx, spec=spec) if spec else ctx)


class Systems:
    """One system per candidate (and plain decoding) and regime, made on first use and kept: the cost runs
    capture (and compile) its graphs per batch size, the confirmation replays them. ``used`` keeps each
    (candidate, compiled, batch) run, so the compiled shapes can be counted."""

    def __init__(self, ctx: H.BenchContext, settings: TuneSettings) -> None:
        self.ctx, self.settings, self.made = ctx, settings, {}
        self.used: set[tuple[Confirmed | None, bool, int]] = set()

    def __call__(self, c: Confirmed | None, regime: Regime | None = None) -> H.OurSystem:
        regime = regime or self.settings.regime
        key = (c, regime.compile)
        if key not in self.made:
            self.made[key] = _system(self.ctx, self.settings, _spec(c) if c is not None else None, regime)
        return self.made[key]

    def note(self, c: Confirmed | None, compiled: bool, batch: int) -> None:
        """``c`` ran at ``batch`` rows (compiled or not)."""
        self.used.add((c, compiled, batch))

    @property
    def compiled_shapes(self) -> int:
        """Graph sets compiled: one per (plain decoding or tree, batch size) run compiled."""
        return sum(1 for _, compiled, _ in self.used if compiled)


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


Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter)


def timed_call(system: H.OurSystem, group, new_tokens: int, clock: Clock = time.perf_counter) -> tuple[float, float]:
    """One unobserved call -> (wall ms less any set-up inside it, the average row's cycles: 0 for plain decoding).

    A row's cycles are those it was active in (``accept_lens`` lists the active rows per cycle); the batch runs
    until its slowest row is done, so ms per average-row cycle holds the wait for the stragglers.
    Example: 2 rows needing 10 and 20 cycles run 20 cycles of 1 ms: 20 ms over 15 row-cycles, 1.33 ms each."""
    sync(system.ctx.device)
    t0 = clock()
    res = system.engine().generate(group, new_tokens)
    sync(system.ctx.device)
    rows = max(len(group), 1)
    return (clock() - t0 - res.setup_seconds) * 1e3, sum(len(c) for c in res.accept_lens) / rows


def warm_pass(generate: Callable, groups, new_tokens: int) -> None:
    """One untimed call per prompt group at ``new_tokens``: every prompt width's prefill graph captured, every
    phase compiled (or loaded), the GEMV tuned and each graph replayed once before anything is timed; then the
    garbage a compile leaves is collected, so no collection walks it inside a timed pass."""
    for g in groups:
        generate(g, new_tokens)
    gc.collect()


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


def cost_fit(system: H.OurSystem, groups, short: int, long: int, speculative: bool, repeats: int = 2,
             clock: Clock = time.perf_counter) -> LineFit:
    """A warm pass over every group at ``long`` tokens, then the fastest of ``repeats`` sweeps over every group at
    ``short`` and at ``long`` tokens, fitted: ms per decode step or per average row's cycle, and the prompt's ms
    per group (``fixed``). ``long`` is the confirmation's length, ``groups`` its groups: the fit sees what it
    predicts."""
    warm_pass(lambda g, n: system.engine().generate(g, n), groups, long)

    def best(n: int) -> tuple[float, float]:
        sweeps = []
        for _ in range(repeats):
            calls = [timed_call(system, g, n, clock) for g in groups]
            units = sum(c[1] for c in calls) if speculative else (n - 1) * len(groups)  # plain: token 1 = prefill
            sweeps.append((sum(c[0] for c in calls), units))
        return min(sweeps)

    fit = fit_two(best(short), best(long))
    return LineFit(fit.per, fit.fixed / len(groups))


@dataclass
class CostScreen:
    """What the screening measured at one batch size: uncompiled and compiled cycle ms per candidate timed so,
    plain decoding's step both ways. ``ratio``: compiled over uncompiled cycle ms (median of the compiled ones),
    the factor the others' uncompiled cycles are scaled by."""

    batch: int
    screened: dict[Candidate, float] = field(default_factory=dict)  # candidate -> uncompiled cycle ms
    compiled: dict[Candidate, float] = field(default_factory=dict)  # candidate -> compiled cycle ms
    plain_screened_ms: float | None = None
    plain_ms: float | None = None

    @property
    def ratio(self) -> float:
        got = [self.compiled[c] / self.screened[c] for c in self.compiled if self.screened.get(c)]
        return statistics.median(got) if got else 1.0

    @property
    def plain_ratio(self) -> float | None:
        return self.plain_ms / self.plain_screened_ms if self.plain_ms and self.plain_screened_ms else None

    def cycle_ms(self, c: Candidate) -> float:
        """Compiled where measured so, else uncompiled x :attr:`ratio`."""
        return self.compiled[c] if c in self.compiled else self.screened[c] * self.ratio

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "ratio": self.ratio, "plain_ratio": self.plain_ratio,
                "compiled": [list(c) for c in self.compiled],
                "screened_ms": {"/".join(map(str, c)): v for c, v in self.screened.items()}}


def screen_order(table: AcceptanceTable, screened: dict[Candidate, float], batch: int,
                 accept: AcceptLen | None = None) -> list[Candidate]:
    """Candidates fastest first by the model on their uncompiled cycles: ``batch * E[a] / cycle ms`` (E[a] from
    ``accept`` when given, else from ``table``: :func:`~eaglelab.bench.tune_predict.accept_model`)."""
    from eaglelab.bench.tune_predict import accept_model

    e = accept or accept_model(table, None)
    return sorted(screened, key=lambda c: (-batch * e(*c) / screened[c], c[2], c))


def measure_costs(ctx: H.BenchContext, settings: TuneSettings, systems: Systems, batch: int, publish: Publish,
                  progress: Callable[[], None] = lambda: None, table: AcceptanceTable | None = None,
                  clock: Clock = time.perf_counter, accept: AcceptLen | None = None) -> CostScreen | None:
    """Plain decoding's step and each candidate's whole cycle at ``batch`` rows, in the regime, published.
    Screening (``settings.screening`` and an acceptance ``table``): every candidate uncompiled, the best
    ``max(confirm, 1)`` compiled too (:class:`CostScreen`, returned); else every candidate compiled."""
    groups = H.groups_for(ctx.prompts, batch)
    long = max(settings.new_tokens, settings.cost_tokens + 2)

    def fit(c: Candidate | None, regime: Regime) -> LineFit:
        systems.note(c, regime.compile and regime.graphs, batch)
        got = cost_fit(systems(c, regime), groups, settings.cost_tokens, long, c is not None, clock=clock)
        progress()
        return got

    plain = fit(None, settings.regime)
    publish(PhaseCost("decode", batch, plain.per))
    publish(PhaseCost("prefill", batch, plain.fixed))
    fits: dict[Candidate, LineFit] = {}
    screen = None
    if settings.screening and table is not None:
        screen = CostScreen(batch, plain_ms=plain.per)
        screen.plain_screened_ms = fit(None, settings.screen_regime).per
        for c in settings.candidates[batch]:
            screen.screened[c] = fit(c, settings.screen_regime).per
        for c in screen_order(table, screen.screened, batch, accept)[: max(settings.confirm, 1)]:
            fits[c] = fit(c, settings.regime)
            screen.compiled[c] = fits[c].per
    else:
        for c in settings.candidates[batch]:
            fits[c] = fit(c, settings.regime)
    for c in settings.candidates[batch]:
        ms = screen.cycle_ms(c) if screen is not None else fits[c].per
        publish(PhaseCost("cycle", batch, ms, tokens=c[2], steps=c[0], topk=c[1]))
    begins = [max(f.fixed - plain.fixed, 0.0) for f in fits.values()]  # the drafter's extend over the prompt
    publish(PhaseCost("begin", batch, statistics.median(begins) if begins else 0.0))
    return screen


def cost_runs(settings: TuneSettings, batch: int) -> int:
    """How many cost fits :func:`measure_costs` makes at ``batch`` (for a progress bar's total)."""
    n = len(settings.candidates[batch])
    return 1 + (1 + n + min(max(settings.confirm, 1), n) if settings.screening else n)


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
    lookup_tokens: int = 0  # a prompt-lookup branch beside the tree


def confirm_batch(ctx: H.BenchContext, settings: TuneSettings, systems: Systems, batch: int,
                  configs: list[Confirmed | None], clock: Clock = time.perf_counter) -> list[Measured]:
    """``configs`` (None = plain decoding) at ``batch`` rows over every prompt group: each first one untimed pass
    over every group (:func:`warm_pass`), then ``settings.passes`` timed passes, interleaved pass by pass."""
    work = replace(ctx, max_new_tokens=settings.new_tokens)
    groups = H.groups_for(ctx.prompts, batch)
    live = []
    for c in configs:
        system = systems(c)
        systems.note(c, settings.regime.compile and settings.regime.graphs, batch)
        cfg = config_for(ctx, settings, system.spec if c is not None else None)
        live.append(H.Contender(cfg, batch, lambda g, m, s=system: s.engine().generate(g, m), None, groups))
    for contender in live:  # every bucket and prompt width before any clock: a first use is set-up, not a pass
        warm_pass(contender.generate, groups, settings.new_tokens)
    for _ in range(settings.passes):
        for contender in live:
            contender.run_pass(work, clock)
    out = []
    for c, contender in zip(configs, live):
        row = contender.row()  # no observed pass: the contenders carry no observer
        s, k, n, lookup = _four(c) if c is not None else (0, 0, 1, 0)
        out.append(Measured(s, k, n, batch, row.tok_per_s or 0.0, row.mean_accept_len, row.sweeps_tok_per_s, lookup))
    return out


def pass_ratios(confirmation: list[dict], row: dict) -> list[float]:
    """``row``'s tok/s over plain decoding's in the same pass, per pass (empty for plain decoding itself)."""
    plain = next((r["passes"] for r in confirmation if r["batch"] == row["batch"] and r["steps"] == 0), [])
    return [s / p for s, p in zip(row.get("passes", []), plain) if p] if row["steps"] else []


def disagreements(confirmation: list[dict], tolerance: float = 0.10) -> list[dict]:
    """The confirmed trees whose passes disagree: max / min of their per-pass speedups over plain decoding beyond
    ``1 + tolerance``. -> [{batch, steps, topk, draft_tokens, lookup_tokens, low, high}]."""
    out = []
    for r in confirmation:
        ratios = pass_ratios(confirmation, r)
        if len(ratios) > 1 and min(ratios) > 0 and max(ratios) / min(ratios) - 1 > tolerance:
            out.append(dict(batch=r["batch"], steps=r["steps"], topk=r["topk"], draft_tokens=r["draft_tokens"],
                            lookup_tokens=r.get("lookup_tokens", 0), low=min(ratios), high=max(ratios)))
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
                         eager_kernels=None if cuda else s.eager_kernels(True),
                         plain_kernels=None if cuda else s.eager_kernels(False))
    notes = [n for n in s.notes if not cuda or not n.startswith(("--gemv", "--decode-attn"))]
    notes += [f"prompts: {len(prompts)} MT-bench first turns, {how}; {min(map(len, prompts))}..{max(map(len, prompts))} "
              f"tokens", f"generation: {new_tokens} tokens per row, EOS ignored, greedy"]
    return TuneTarget(ctx, tuple(notes), f"{target.name} ({target.config.num_layers} layers)", str(s.draft.path),
                      s.draft, s.dtype_name)


def measuring_pass(ctx: H.BenchContext, settings: TuneSettings, model: str, record: str | None,
                   progress: Progress, systems: Systems, clock: Clock = time.perf_counter) -> tuple[list, list, dict]:
    """The acceptance run and every cost run, published on a probe bus (and into ``record`` when given).
    -> (its Step events, its PhaseCost events, {"screens": per batch size the screening's figures,
    "seconds": {"acceptance": s, "costs": s}})."""
    from eaglelab.probes.events import Step
    from eaglelab.bench.tune_predict import accept_model
    from eaglelab.probes.path_replay import path_replay
    from eaglelab.probes.tuning import table_from_steps

    bus, steps, costs = ProbeBus(aggregate=False), [], []
    bus.subscribe(lambda e: steps.append(e) if isinstance(e, Step) else costs.append(e) if isinstance(e, PhaseCost) else None)
    close = record_sink(bus, record)
    screens, seconds = {}, {}
    try:
        wide = settings.wide
        what = f"acceptance: wide tree, {wide.num_steps} steps, topk {wide.topk}, {wide.draft_tokens} tokens"
        progress(what, 0, None)
        t0 = clock()
        acceptance_run(ctx, settings, bus, model, lambda done, total: progress(what, done, total))
        seconds["acceptance"], t0 = clock() - t0, clock()
        table = table_from_steps(steps).table()
        replay = path_replay(steps, wide.num_steps, wide.topk, wide.draft_tokens)
        total = sum(cost_runs(settings, b) for b in settings.batch_sizes)
        done = [0]
        what = "costs in run's regime (" + ("uncompiled screen, then the best compiled; " if settings.screening
                                            else "") + "first use of a shape compiles it)"

        def step() -> None:
            done[0] += 1
            progress(what, done[0], total)

        progress(what, 0, total)
        for b in settings.batch_sizes:
            got = measure_costs(ctx, settings, systems, b, bus.publish, step, table, clock, accept_model(table, replay))
            if got is not None:
                screens[str(b)] = got.to_json()
        seconds["costs"] = clock() - t0
    finally:
        close()
    return steps, costs, {"screens": screens, "seconds": seconds}


def record_sink(bus: ProbeBus, path: str | None) -> Callable[[], None]:
    """Subscribe a record writer for ``path`` (when given) -> its closer."""
    if not path:
        return lambda: None
    from eaglelab.probes.record import RecordWriter

    writer = RecordWriter(path)
    bus.subscribe(writer)
    return writer.close


def confirm(ctx: H.BenchContext, settings: TuneSettings, report: dict, progress: Progress,
            systems: Systems, clock: Clock = time.perf_counter,
            on_batch: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Run the best predictions and plain decoding for real, interleaved; predicted end to end against measured.
    ``on_batch`` gets the rows so far after each batch size (the tune saves its profile there, so a tune stopped
    at batch 32 keeps batch 8's winner)."""
    from eaglelab.bench.tune_predict import costs_from_report
    from eaglelab.probes.tuning import Prediction, plain_end_to_end_tok_per_s

    out = []
    progress("confirming: real runs", 0, len(settings.batch_sizes))
    screens = report.get("screens") or {}
    for b in settings.batch_sizes:
        preds = report["predictions"].get(str(b), [])
        if str(b) in screens:  # only trees timed compiled: another would compile now, outside the time budget
            timed = {tuple(c) for c in screens[str(b)]["compiled"]}
            preds = [p for p in preds if (p["steps"], p["topk"], p["draft_tokens"]) in timed]
        preds = preds[: settings.confirm]
        costs = report["costs"][str(b)]
        incumbent = settings.incumbent.get(b)
        trees = confirmed_configs([(p["steps"], p["topk"], p["draft_tokens"]) for p in preds],
                                  settings.lookup.get(b, ()), incumbent)
        predicted = {(p["steps"], p["topk"], p["draft_tokens"], 0): p for p in report["predictions"].get(str(b), [])}
        got = confirm_batch(ctx, settings, systems, b, [None] + trees, clock)
        for c, m in zip([None] + trees, got):
            p = predicted.get(_four(c)) if c is not None else None  # a tree beside a branch: never predicted
            if m.steps == 0:
                pred_tps, pred_a = plain_end_to_end_tok_per_s(costs_from_report(costs), settings.new_tokens), None
            elif p is None:  # measured only
                pred_tps, pred_a = None, None
            else:
                pred = Prediction(**{k: p[k] for k in Prediction.__dataclass_fields__})
                pred_tps = pred.end_to_end_tok_per_s(settings.new_tokens, costs["prefill_ms"] + costs["begin_ms"])
                pred_a = pred.accept_len
            out.append(dict(batch=b, steps=m.steps, topk=m.topk, draft_tokens=m.draft_tokens,
                            lookup_tokens=m.lookup_tokens, predicted_tok_per_s=pred_tps,
                            measured_tok_per_s=m.tok_per_s, passes=list(m.passes),
                            predicted_accept_len=pred_a, measured_accept_len=m.accept_len,
                            incumbent=c is not None and incumbent is not None and _four(c) == _four(incumbent)))
        progress("confirming: real runs", settings.batch_sizes.index(b) + 1, len(settings.batch_sizes))
        if on_batch is not None:
            on_batch(list(out))
    return out


def settings_dict(settings: TuneSettings, prompts: int) -> dict:
    """The settings as the report's JSON holds them."""
    return {"candidates": {str(b): [list(c) for c in cs] for b, cs in settings.candidates.items()},
            "batch_sizes": list(settings.batch_sizes), "new_tokens": settings.new_tokens,
            "cost_tokens": settings.cost_tokens, "confirm": settings.confirm, "passes": settings.passes,
            "screen": settings.screening, "lookup": {str(b): list(ks) for b, ks in settings.lookup.items()},
            "incumbent": {str(b): list(c) for b, c in settings.incumbent.items()},
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
        lookup = w.get("lookup_tokens", 0)
        branch = f" with a lookup branch of {lookup}" if lookup else ""
        buckets.append(BucketChoice(
            b, w["steps"], w["topk"], w["draft_tokens"],
            f"{ratio:.2f}x over plain decoding{branch} ({w['measured_tok_per_s']:,.1f} vs "
            f"{w['plain_tok_per_s']:,.1f} tok/s; {prompts} MT-bench first turns, {settings.new_tokens} tokens, batch "
            f"{b}, {settings.passes} interleaved passes, plain in the same regime; eaglelab tune, {when})",
            lookup_tokens=lookup))
    r = settings.regime
    graphs = r.graphs
    return DeviceProfile(
        device=device, dtype=dtype, drafter_sha256=drafter_sha256, buckets=tuple(buckets),
        compile=r.compile if graphs else False, gemv=r.gemv if graphs else None, decode_attn=r.attn if graphs else False,
        pdl=r.pdl if graphs else None,
        kernels_reason=f"the regime eaglelab tune measured in ({r.label}); the trees were tuned with it, the kernels "
                       "themselves not compared",
        source=f"eaglelab tune on {hw.get('gpu') or hw.get('cpu') or device} (torch {hw.get('torch', '?')}), {when}")
