"""The benchmark behind ``eaglelab bench``: plain, speculative and peer decoding side by side.

Everything runs in one process on the same prompts and batch sizes:

    plain-eager          plain greedy decoding, every forward eager
    plain-graphs         plain greedy decoding, the 1-token decode replayed from CUDA graphs
    spec-prefill         speculative, verify in attention mode prefill (eager extend), no graphs
    spec-prefill-graphs  the same with the drafter's forwards captured (verify stays eager: the
                         configuration of an SGLang deployment that ran slower than plain decoding)
    spec-decode          speculative, verify in attention mode decode, no graphs
    spec-decode-graphs   the same, the whole cycle replayed as one CUDA graph (spec-phases-gemv-attn: a
                         graph per phase, five launches a cycle, every kernel of spec-compile-gemv-attn)
    hf                   HF transformers ``generate`` (greedy, eager), the peer

Generation length is fixed (EOS ignored, ``max_new_tokens`` per row) so every configuration
produces the same number of tokens; with ``eos_token_ids`` (``bench --eos``) a row ends at the model's end of
sequence instead, as a served request does (tok/s then counts the tokens each configuration made). Per batch size,
the configurations interleave (:func:`run_batch`): each makes one short warm-up call, then pass by pass every
configuration times one pass over every prompt (in groups of that batch size; tok/s end to end, prefill included;
the HF peer, slow, times its first group in the first pass only), so a change of load on the machine falls on every
configuration alike; a configuration's speedup is the median over passes of its tok/s over the baseline's in the
same pass, the spread of those ratios kept. Then
(unless the run is the headline alone) one observed pass per configuration for per-phase times (CUDA events,
medians over cycles), per-request times (the prompt's phases) and graph status.
Speedups are over our graph-captured plain decoding at the same batch size (plain-eager where
graphs cannot run). The configurations are one table (``configs.py``); the micro-measure is ``micro.py``,
the headline and the JSON report ``report.py``, the loading from flags ``setup.py``, a whole run ``suite.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import torch

from eaglelab.bench.configs import CONFIGS, BenchConfig
from eaglelab.bench.timing import sync
from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.runtime.observer import BaseObserver, CycleStats
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.serving import refill_rows
from eaglelab.engine.runtime.spec_config import SpecConfig

SCHEMA = "eaglelab.bench/1"


@dataclass(frozen=True)
class BenchRow:
    """One (configuration, batch size) measurement. Times in ms; None where not applicable."""

    config: str
    batch: int
    tok_per_s: float | None = None
    tokens: int = 0
    seconds: float = 0.0
    sweeps_tok_per_s: tuple[float, ...] = ()
    mean_accept_len: float | None = None
    # the first pass, per prompt group (at batch 1: per prompt): one text falling into a loop shows here
    group_tok_per_s: tuple[float, ...] = ()
    group_accept_len: tuple[float | None, ...] = ()
    group_speedups: tuple[float, ...] = ()  # each group's tok/s over the baseline's on the same group
    group_tokens: tuple[int, ...] = ()  # the first pass's tokens per group
    # the speedup's 95% interval over the prompt groups (a paired bootstrap, :func:`speedup_interval`): what another
    # draw of as many prompts would read, where the passes' spread is only the clock's
    speedup_interval: tuple[float, float] | None = None
    decode_ms: float | None = None
    verify_ms: float | None = None
    draft_ms: float | None = None
    extend_ms: float | None = None
    accept_ms: float | None = None
    # per request (median over the prompt groups of the observed pass): the prompt's forward, and for a
    # speculative config the drafter's extend over the prompt; with the cycles, what a request costs
    prefill_ms: float | None = None
    begin_ms: float | None = None
    verify_over_decode: float | None = None  # verify ms / baseline's 1-token decode ms
    speedup: float | None = None  # the median pass's tok/s over the baseline's in the same pass, at this batch
    pass_speedups: tuple[float, ...] = ()  # per timed pass, tok/s over the baseline's in that pass (interleaved)
    same_tokens_as_plain_eager: float | None = None  # share of rows identical to plain-eager's
    graph: dict[str, str] = field(default_factory=dict)  # phase -> most common "replay" | "eager: why"
    skipped: str | None = None
    gemv: str | None = None  # configs asking for the Triton GEMV: "on", or why it went off during the run
    decode_attn: str | None = None  # configs asking for the Triton decode attention: "on", or why it went off
    allreduce: dict[str, Any] | None = None  # --tp: the observed call's collectives (eaglelab/bench/tp.py)
    # *-compile configs: each phase compile of this config that fell back to eager (the phase then ran its
    # eager layers, inside its graph: still "R"), with its reason; under --tp from every rank ("rank r: ...")
    compile_fallbacks: tuple[str, ...] = ()
    # the first pass's prompt forwards: how many, and prompts per forward (--continuous: a refill each; else a group)
    prefills: int | None = None
    prompts_per_prefill: float | None = None
    # the first pass's rows x cycles (decode steps, or speculative cycles) that made tokens: a row is idle once its
    # request ended, until a refill (--continuous) or until the live rows fit a smaller bucket and move onto it
    # (batches); None: not our engine
    busy_rows: float | None = None
    row_slots: int | None = None  # the rows x cycles busy_rows is a share of
    # the first pass's time in prompt forwards (the observed median prompt and drafter's extend x prefills), a share
    prefill_share: float | None = None


@dataclass
class BenchContext:
    """What every measurement shares: the target, how to make drafters, the settings."""

    target: Any  # Transformer
    spec: SpecConfig  # speculative settings (algorithm, steps, topk, draft tokens)
    make_drafter: Callable[[SpecConfig], Any] | None  # spec -> a fresh drafter (None: no speculation)
    prompts: list[list[int]]
    max_new_tokens: int
    batch_sizes: tuple[int, ...]
    repeats: int = 3
    peer: Callable[[], Any] | None = None  # builds the HF peer: -> generate(groups, max_new) callable
    peer_skip: str | None = None
    log: Callable[[str], None] = lambda m: None
    compiled: Any = None  # the compiled Kernels, built on the first config that asks
    compiled_pdl: Any = None  # the compiled Kernels whose phases launch dependently (``*-pdl`` configs)
    tp: Any = None  # TPGroup under --tp: every rank runs every call; the observed call also times collectives
    compile_mode: str | None = None  # torch.compile mode (None: inductor's default)
    compile_prefill: bool = False  # the compiled configs compile the prompt's phases too (bench --compile-prefill)
    gemv: Any = None  # the Triton GEMV (TritonGemv), built on the first config that asks; its tunings shared
    gemv_pdl: Any = None  # the same for the ``*-pdl`` configs: tuned in chains of dependent launches, its own choices
    profile: Any = None  # the device profile (eaglelab.profiles): its GEMV tilings, where measured on this setup
    attention: Any = None  # the Triton decode attention (TritonDecodeAttention), built on the first config that asks
    eager_kernels: Any = None  # the eager spec configs' kernels (on CPU the session's: the few-row C kernel); None: eager
    plain_kernels: Any = None  # the eager plain configs' (on CPU MKL by default, as a --draft none run)
    tree_for: Callable[[int], Any] | None = None  # batch -> the tree run drafts at it (DraftChoice.tree_for); None: spec's
    observe: bool = True  # after the timed passes, one observed pass per configuration for the phase costs
    continuous: bool = False  # serve the prompts through each batch size's rows (continuous batching), not batches
    refill_rows: int | None = None  # served: the free rows a refill waits for (None: the engine's default, B // 4)
    eos_token_ids: tuple[int, ...] = ()  # --eos: a row ends at one of these (none: every row max_new_tokens long)

    def groups(self, batch: int) -> list[list[list[int]]]:
        """What one pass generates, call by call: with ``continuous`` every prompt in one call served through
        ``batch`` rows (:meth:`max_batch`), else the prompts in batches of ``batch`` (:func:`groups_for`)."""
        return [list(self.prompts)] if self.continuous else groups_for(self.prompts, batch)

    def max_batch(self, batch: int) -> int | None:
        """``Engine.generate``'s ``max_batch`` at ``batch`` rows: the rows served with ``continuous``, else None."""
        return batch if self.continuous else None

    def refill_at(self, batch: int) -> int | None:
        """``Engine.generate``'s ``refill_rows`` at ``batch`` rows served: --refill-rows (at most the batch), else the
        engine's default; None in batches."""
        if not self.continuous:
            return None
        return refill_rows(batch) if self.refill_rows is None else min(self.refill_rows, batch)

    def kernels(self, compile_: bool, gemv: bool = False, attn: bool = False, pdl: bool = False):
        """The layers' kernels for a config: compiled ones (built once, shared; with ``pdl`` a set of their own,
        whose phases launch dependently) or the eager ones, with the Triton GEMV and the Triton decode attention
        when asked."""
        base = replace(EAGER_KERNELS, pdl=pdl)
        if compile_:
            kept = "compiled_pdl" if pdl else "compiled"
            if getattr(self, kept) is None:
                from eaglelab.engine.formats.assets import cache_dir
                from eaglelab.engine.runtime.compile import compiled_kernels

                setattr(self, kept, compiled_kernels(cache_dir(), self.log, self.compile_mode, pdl=pdl))
            base = getattr(self, kept)
        base = replace(base, gemv=self.triton_gemv(pdl)) if gemv else base
        return replace(base, attention=self.decode_attention()) if attn else base

    def triton_gemv(self, pdl: bool = False):
        """The shared Triton GEMV of plain launches, or with ``pdl`` of dependent ones (each tunes its own shapes;
        its ``reason`` says why it is off, if it is)."""
        if self.gemv_of(pdl) is None:
            from eaglelab.engine.model.gemv import TritonGemv

            from eaglelab.gemv_cache import prepare

            gemv = TritonGemv(self.log, pdl=pdl)
            setattr(self, "gemv_pdl" if pdl else "gemv", gemv)
            prepare(gemv, self.profile, self.device, next(self.target.parameters()).dtype, self.log)
        return self.gemv_of(pdl)

    def gemv_of(self, pdl: bool):
        """The Triton GEMV of that launch regime built so far (None: no config asked for it)."""
        return self.gemv_pdl if pdl else self.gemv

    def gemvs(self) -> list[Any]:
        """The Triton GEMVs this bench built (plain launches first)."""
        return [g for g in (self.gemv, self.gemv_pdl) if g is not None]

    def decode_attention(self):
        """The shared Triton decode attention (its ``reason`` says why it is off, if it is)."""
        if self.attention is None:
            from eaglelab.engine.model.decode_attention import TritonDecodeAttention

            self.attention = TritonDecodeAttention(self.log)
        return self.attention

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def spec_at(self, batch: int | None) -> SpecConfig:
        """The speculative settings at ``batch`` rows: the tree ``tree_for`` gives (the device profile's bucket
        for that batch, as ``run`` would draft it), else ``spec``'s."""
        if batch is None or self.tree_for is None or self.spec is None:
            return self.spec
        t = self.tree_for(batch)
        return replace(self.spec, num_steps=t.steps, topk=t.topk, num_draft_tokens=t.draft_tokens,
                       lookup_tokens=t.lookup_tokens)

    @property
    def max_len(self) -> int:
        """Static cache slots that hold every prompt plus the generation (rounded up to 64)."""
        need = max(map(len, self.prompts)) + self.max_new_tokens + 2 * max(self.spec.tree_nodes, 1) + 2
        return -(-need // 64) * 64


# ---- phase collection ------------------------------------------------------------------------------
class PhaseCollector(BaseObserver):
    """Keeps each cycle's phase times and graph status, and the capture stats of a run."""

    def __init__(self) -> None:
        self.cycles: list[CycleStats] = []
        self.allreduces: list[Any] = []  # AllReduceStats (TP runs)

    def on_cycle(self, stats: CycleStats) -> None:
        self.cycles.append(stats)

    def on_allreduce(self, stats) -> None:
        self.allreduces.append(stats)

    def median_ms(self, phase: str, kind: str) -> float | None:
        vals = [c.phase_ms[phase] for c in self.cycles if c.kind == kind and phase in c.phase_ms]
        return statistics.median(vals) if vals else None

    def graph_summary(self) -> dict[str, str]:
        """Per phase, the most common status over the decode/spec cycles."""
        counts: dict[str, Counter] = {}
        for c in self.cycles:
            if c.kind != "prefill":
                for phase, status in c.graph.items():
                    counts.setdefault(phase, Counter())[status] += 1
        return {p: cnt.most_common(1)[0][0] for p, cnt in counts.items()}


# ---- end-to-end ------------------------------------------------------------------------------------
def groups_for(prompts: list[list[int]], batch: int) -> list[list[list[int]]]:
    """All prompts in batches of ``batch`` (the last batch filled by wrapping around)."""
    n = len(prompts)
    return [[prompts[(g * batch + i) % n] for i in range(batch)] for g in range(math.ceil(n / batch))]


class Sweep(NamedTuple):
    """One pass over every prompt group (:func:`sweep`)."""

    tokens: int
    seconds: float
    accepts: list[int]  # every live row's accepted length, cycle by cycle (speculative only)
    outputs: list[list[int]]  # per row
    per_group: list[tuple[float, float | None, int]]  # per group: tok/s, mean accepted length (or None), tokens
    prefills: list[int]  # prompts per prompt forward (the engine's ``prefill_rows``; none from the HF peer)
    busy_rows: float | None  # rows x cycles that made tokens, a share (:func:`busy_row_cycles`; None: the HF peer)
    row_slots: int = 0  # the rows x cycles that share is of (0: the HF peer)


def busy_row_cycles(res: Any) -> int | None:
    """Rows x cycles of a result that made tokens: each live row's cycle (speculative: ``accept_lens`` lists the
    live rows of each cycle) or decode step (plain: every token but the first of a request, which its prompt's
    forward makes). None for a result without cycles (the HF peer's)."""
    if not hasattr(res, "cycles"):
        return None
    if res.accept_lens:
        return sum(len(cycle) for cycle in res.accept_lens)
    return sum(max(len(t) - 1, 0) for t in res.tokens)


def sweep(generate: Callable, groups, max_new: int, device, clock: Callable[[], float] = time.perf_counter) -> Sweep:
    """Generate every group (:attr:`Sweep.busy_rows` over the rows x steps each call ran, ``row_cycles``). Graph
    capture and compilation inside a call (``setup_seconds``) are not generation time, as in ``eaglelab run``.
    ``clock`` reads seconds (a test's fake clock)."""
    sync(device)
    t0 = clock()
    tokens, accepts, outputs, setup, per_group, prefills = 0, [], [], 0.0, [], []
    busy, slots = 0, 0
    for g in groups:
        g0 = clock()
        res = generate(g, max_new)
        sync(device)
        own_setup = getattr(res, "setup_seconds", 0.0)  # the HF peer's result has none
        setup += own_setup
        n = sum(len(t) for t in res.tokens)
        tokens += n
        acc = [a for cyc in getattr(res, "accept_lens", []) for a in cyc]
        accepts += acc
        outputs += res.tokens
        prefills += getattr(res, "prefill_rows", [])
        seconds = clock() - g0 - own_setup
        per_group.append((n / seconds if seconds > 0 else 0.0, sum(acc) / len(acc) if acc else None, n))
        live = busy_row_cycles(res)
        if live is not None:
            busy += live
            slots += res.row_cycles  # each step's rows as the engine ran them (a shed batch's: fewer)
    return Sweep(tokens, clock() - t0 - setup, accepts, outputs, per_group, prefills, busy / slots if slots else None,
                 slots)


def engine_spec(cfg: BenchConfig, ctx: BenchContext, batch: int | None = None) -> SpecConfig:
    """The engine's settings for ``cfg`` (speculative: the tree for ``batch`` rows, :meth:`BenchContext.spec_at`)."""
    compile_prefill = cfg.compile and ctx.compile_prefill
    if not cfg.speculative:
        return SpecConfig(cuda_graphs=cfg.graphs, compile=cfg.compile, compile_prefill=compile_prefill)
    s = ctx.spec_at(batch)
    return SpecConfig(s.algorithm, num_steps=s.num_steps, topk=s.topk, num_draft_tokens=s.num_draft_tokens,
                      attention_mode=cfg.attention_mode, cuda_graphs=cfg.graphs, compile=cfg.compile,
                      one_graph_cycle=cfg.one_graph, compile_prefill=compile_prefill, lookup_tokens=s.lookup_tokens,
                      lookup_spill=s.lookup_spill)


class FixedCacheEagerRunner(EagerRunner):
    """Eager forwards over a KV cache of the graph runners' fixed length (not the engine's
    exact-fit one), so eager and graph-captured runs compute over the same shapes: the same
    kernels, hence in bf16 the same rounding, and the same allocation policy."""

    def __init__(self, target, drafter, max_len: int, kernels: Kernels = EAGER_KERNELS) -> None:
        super().__init__(target, drafter, kernels=kernels)
        self.max_len = max_len

    def make_cache(self, batch: int, max_len: int, observer=None) -> KVCache | None:
        if max_len > self.max_len:
            return None
        p = next(self.target.parameters())
        return self.target.make_cache(batch, self.max_len, dtype=p.dtype, device=p.device)


class OurSystem:
    """Our engine in one configuration and tree: one runner (graphs captured once) for every batch size it serves."""

    def __init__(self, cfg: BenchConfig, ctx: BenchContext, batch: int | None = None) -> None:
        self.spec = engine_spec(cfg, ctx, batch)
        self.ctx, self.shed = ctx, cfg.shed
        self.drafter = ctx.make_drafter(self.spec) if cfg.speculative and ctx.make_drafter else None
        net = self.drafter.net if self.drafter is not None else None
        if cfg.graphs:
            # buckets of every power of two (captured lazily, only those a run uses), as a server's: a batch that
            # sheds its ended rows runs the live ones on the smallest bucket that holds them (engine/runtime/shrink.py),
            # and continuous batching prefills the prompts that start together in as few padded rows as fit
            top = max(ctx.batch_sizes)
            buckets = tuple(sorted({1 << i for i in range(top.bit_length())} | set(ctx.batch_sizes)))
            kernels = ctx.kernels(cfg.compile, cfg.gemv, cfg.attn, cfg.pdl)
            self.runner = CudaGraphRunner.for_engine(ctx.target, self.spec, self.drafter, max_len=ctx.max_len,
                                                     buckets=buckets, kernels=kernels)
        else:
            kernels = ctx.eager_kernels if cfg.speculative else ctx.plain_kernels
            self.runner = FixedCacheEagerRunner(ctx.target, net, ctx.max_len, kernels or EAGER_KERNELS)

    def engine(self, observer=None) -> Engine:
        return Engine(self.ctx.target, eos_token_ids=self.ctx.eos_token_ids, drafter=self.drafter, spec=self.spec,
                      observer=observer, runner=self.runner, shed_rows=self.shed)

    def capture_stats(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in getattr(self.runner, "capture_stats", [])]


@dataclass
class Contender:
    """One configuration at one batch size while the passes interleave: what it generates with, and what its
    timed passes measured so far (each pass over every prompt group)."""

    cfg: BenchConfig
    batch: int
    generate: Callable  # (group, max_new) -> a result with .tokens (and .accept_lens, .setup_seconds)
    observed: Callable | None  # observer -> generate, for the phase costs (None: not observed, the HF peer)
    groups: list[list[list[int]]]
    passes: list[tuple[float, int, float]] = field(default_factory=list)  # (tok/s, tokens, seconds) per pass
    accepts: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)  # the first pass's rows
    per_group: list[tuple[float, float | None, int]] = field(default_factory=list)  # the first pass's, per group
    compile_fallbacks: tuple[str, ...] = ()
    prefills: list[int] = field(default_factory=list)  # the first pass's prompts per prompt forward
    busy_rows: float | None = None  # the first pass's (Sweep.busy_rows)
    row_slots: int = 0  # the first pass's (Sweep.row_slots)

    def warm_up(self, max_new: int) -> None:
        """One short call: allocator, kernels, lazy capture and compile (its set-up is never timed)."""
        self.generate(self.groups[0], min(8, max_new))

    def run_pass(self, ctx: BenchContext, clock: Callable[[], float] = time.perf_counter) -> None:
        """One timed pass over every prompt group (timed on ``clock``)."""
        got = sweep(self.generate, self.groups, ctx.max_new_tokens, ctx.device, clock)
        self.passes.append((got.tokens / got.seconds if got.seconds > 0 else 0.0, got.tokens, got.seconds))
        self.accepts += got.accepts
        if len(self.passes) == 1:
            self.outputs, self.per_group, self.prefills, self.busy_rows = (got.outputs, got.per_group, got.prefills,
                                                                           got.busy_rows)
            self.row_slots = got.row_slots

    def row(self) -> BenchRow:
        """The row of what the timed passes measured (:meth:`observe` adds the phase times)."""
        calls = self.passes
        return BenchRow(
            config=self.cfg.name, batch=self.batch, tok_per_s=statistics.median(c[0] for c in calls),
            tokens=calls[0][1], seconds=calls[0][2], sweeps_tok_per_s=tuple(c[0] for c in calls),
            mean_accept_len=sum(self.accepts) / len(self.accepts) if self.accepts else None,
            group_tok_per_s=tuple(g[0] for g in self.per_group),
            group_accept_len=tuple(g[1] for g in self.per_group), group_tokens=tuple(g[2] for g in self.per_group),
            compile_fallbacks=self.compile_fallbacks,
            prefills=len(self.prefills) or None,
            prompts_per_prefill=sum(self.prefills) / len(self.prefills) if self.prefills else None,
            busy_rows=self.busy_rows, row_slots=self.row_slots or None)

    def observe(self, row: BenchRow, ctx: BenchContext) -> BenchRow:
        """``row`` with (``ctx.observe``) one observed pass like the timed ones: the phase times per cycle, and
        per request (the prompt's phases)."""
        if self.observed is None or not ctx.observe:
            return row
        got = observe_phases(self.observed, self.groups, ctx)
        share = prefill_share(len(self.prefills), got.get("prefill_ms"), got.get("begin_ms"), row.seconds)
        return replace(row, **got, prefill_share=share)


def prefill_share(prefills: int, prefill_ms: float | None, begin_ms: float | None, seconds: float) -> float | None:
    """The share of a pass's ``seconds`` its ``prefills`` prompt forwards took, each at the observed median prompt
    (and drafter's extend over it); None without them."""
    if not prefills or prefill_ms is None or seconds <= 0:
        return None
    return prefills * (prefill_ms + (begin_ms or 0.0)) / (seconds * 1e3)


def observe_phases(observed: Callable, groups, ctx: BenchContext) -> dict[str, Any]:
    """One observed pass over every group (prompts differ in width, so do their prefills; a cycle's verify and
    attention cost grow with the context, so as long as the timed passes) -> the row's phase fields."""
    col = PhaseCollector()
    if ctx.tp is not None:
        ctx.tp.arrivals = []
    for g in groups:
        observed(col)(g, ctx.max_new_tokens)
    got = dict(decode_ms=col.median_ms("decode", "decode"), verify_ms=col.median_ms("verify", "spec"),
               draft_ms=col.median_ms("draft", "spec"), extend_ms=col.median_ms("draft_extend", "spec"),
               accept_ms=col.median_ms("accept", "spec"), prefill_ms=col.median_ms("prefill", "prefill"),
               begin_ms=col.median_ms("draft_extend", "prefill"), graph=col.graph_summary())
    if ctx.tp is not None:
        from eaglelab.bench.tp import observed_collectives

        got["allreduce"] = observed_collectives(ctx.tp, col.allreduces, col.cycles)
    return got


def measure(generate: Callable, observed: Callable | None, cfg: BenchConfig, ctx: BenchContext, batch: int,
            repeats: int, first_group_only: bool = False) -> tuple[BenchRow, list[list[int]]]:
    """One configuration alone: warm up, time ``repeats`` passes, each over every prompt group (the prompts in
    batches of ``batch``; ``first_group_only``: the first group alone, as the slow HF peer runs), then the observed
    pass. -> (row, the first pass's outputs). The bench interleaves configurations instead (:func:`run_batch`)."""
    groups = ctx.groups(batch)
    c = Contender(cfg, batch, generate, observed, groups[:1] if first_group_only else groups)
    c.warm_up(ctx.max_new_tokens)
    for _ in range(repeats):
        c.run_pass(ctx)
    return c.observe(c.row(), ctx), c.outputs


def contender(cfg: BenchConfig, ctx: BenchContext, batch: int, systems: dict[Any, Any]) -> Contender:
    """``cfg`` at ``batch`` rows, its system taken from (or put into) ``systems``: ours keyed by configuration and
    tree (a runner serves every batch size of one tree, its graphs captured per bucket), the HF peer loaded once."""
    groups = groups_for(ctx.prompts, batch)  # the HF peer takes batches, also when ours are served continuously
    if cfg.peer:
        if "hf" not in systems:
            systems["hf"] = ctx.peer()  # type: ignore[misc]
        return Contender(cfg, batch, systems["hf"], None, groups[:1])  # slow: the first group, in the first pass
    spec = engine_spec(cfg, ctx, batch)
    key = (cfg.name, spec.num_steps, spec.topk, spec.draft_tokens) if cfg.speculative else cfg.name
    if key not in systems:
        systems[key] = OurSystem(cfg, ctx, batch)
    system = systems[key]
    rows, refill = ctx.max_batch(batch), ctx.refill_at(batch)
    return Contender(cfg, batch, lambda g, m: system.engine().generate(g, m, max_batch=rows, refill_rows=refill),
                     lambda obs: (lambda g, m: system.engine(obs).generate(g, m, max_batch=rows, refill_rows=refill)),
                     ctx.groups(batch))


def run_batch(cfgs: list[BenchConfig], ctx: BenchContext, batch: int, systems: dict[Any, Any],
              wall: Any = None, timed: Callable[[list[BenchRow], dict[str, list[list[int]]]], None] | None = None,
              ) -> tuple[list[BenchRow], dict[str, list[list[int]]]]:
    """Every configuration at ``batch`` rows, interleaved: each warmed up, then pass by pass every configuration
    once (so a change of load on the machine falls on all of them alike, and a pass's ratios compare like with
    like), then each observed. Configurations that cannot run here get a skipped row. ``wall``: a
    :class:`~eaglelab.bench.walltime.WallClock` told where the time goes (None: not kept). ``timed`` gets the rows
    and outputs once the timed passes are in, before the observed passes (a run cut there keeps its figures).
    -> (rows, outputs)."""
    part = wall.part if wall is not None else (lambda name: contextlib.nullcontext())
    rows, live = [], []
    for cfg in cfgs:
        skip = _skip_reason(cfg, ctx)
        if skip is not None:
            rows.append(BenchRow(cfg.name, batch, skipped=skip))
            continue
        # the tree it drafts, so a run that stops early still says it
        tree = f"; tree: {ctx.spec_at(batch).tree_label}" if cfg.speculative and ctx.spec is not None else ""
        ctx.log(f"{cfg.name}, batch {batch}: {cfg.description}{tree}")
        with part("hf load" if cfg.peer else "warm-up"):
            c = contender(cfg, ctx, batch, systems)
        made = {id(p) for p in compiled_phases(ctx)}
        with part("hf warm-up" if cfg.peer else "warm-up"):
            c.warm_up(ctx.max_new_tokens)  # graphs are captured (and phases compiled) here, lazily
        new = [p for p in compiled_phases(ctx) if id(p) not in made]
        c.compile_fallbacks = compile_fallbacks(ctx, new)
        if wall is not None and new:
            wall.compiled[f"{cfg.name} b{batch}"] = sum(p.compile_seconds for p in new)
        live.append(c)
    for p in range(ctx.repeats):
        ran = [c for c in live if not (c.cfg.peer and p > 0)]  # the HF peer: one pass
        for c in ran:
            with part("hf pass" if c.cfg.peer else "passes"):
                c.run_pass(ctx)
            if wall is not None and not c.cfg.peer:
                wall.add("timed", c.passes[-1][2])  # generation alone: the pass's lazy captures left out
        ctx.log(f"  batch {batch:>3}, pass {p + 1}/{ctx.repeats}: "
                + ", ".join(f"{c.cfg.name} {c.passes[-1][0]:.1f}" for c in ran) + " tok/s")
    order = {cfg.name: i for i, cfg in enumerate(cfgs)}
    outputs = {c.cfg.name: c.outputs for c in live}
    passes = [c.row() for c in live]
    if timed is not None and ctx.observe and live:
        timed(sorted(rows + passes, key=lambda r: order[r.config]), outputs)
    rows += [c.observe(row, ctx) for c, row in zip(live, passes)]
    for c in live:
        if c.cfg.gemv or c.cfg.attn:
            i = next(i for i, r in enumerate(rows) if r.config == c.cfg.name and r.skipped is None)
            rows[i] = replace(rows[i], gemv=(ctx.triton_gemv().reason or "on") if c.cfg.gemv else None,
                              decode_attn=(ctx.decode_attention().reason or "on") if c.cfg.attn else None)
    return sorted(rows, key=lambda r: order[r.config]), outputs


def compiled_phases(ctx: BenchContext) -> list[Any]:
    """Every phase compile made so far (CompiledOrEager), in order (the dependently launched set's after)."""
    return [p for k in (ctx.compiled, ctx.compiled_pdl) if k is not None for p in k.compile_phase.made]


def compile_fallbacks(ctx: BenchContext, phases: list[Any]) -> tuple[str, ...]:
    """The reasons of the phases that did not compile; under TP every rank's (a collective on the
    side group: every rank calls this at the same point), so a failure on rank 1 is not silent."""
    mine = [p.reason for p in phases if p.reason]
    if ctx.tp is None:
        return tuple(mine)
    return tuple(f"rank {r}: {m}" for r, reasons in enumerate(ctx.tp.gather_objects(mine)) for m in reasons)


def _skip_reason(cfg: BenchConfig, ctx: BenchContext) -> str | None:
    if cfg.graphs and ctx.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if cfg.speculative and ctx.make_drafter is None:
        return "no drafter (--draft none)"
    if cfg.peer and ctx.peer is None:
        return ctx.peer_skip or "no peer"
    if cfg.pdl:  # launches that cannot be dependent would measure the config it extends again, under its name
        from eaglelab.engine.model.pdl import refusal

        if (why := refusal(ctx.device)) is not None:
            return why
    dtype = next(ctx.target.parameters()).dtype
    if cfg.gemv:  # a GEMV that would take no call measures the config it extends again, under its name
        from eaglelab.engine.model.gemv import dtype_refusal

        if (why := ctx.triton_gemv().reason or dtype_refusal(dtype)) is not None:
            return why
    if cfg.attn:  # likewise a decode attention that would take no call
        from eaglelab.engine.model import decode_attention

        return ctx.decode_attention().reason or decode_attention.dtype_refusal(dtype)
    return None


def baseline_name(rows: list[BenchRow], prefer: str | None = None) -> str | None:
    """``prefer`` when it ran (the bench passes plain decoding as ``run`` decodes on this device), else our
    graph-captured plain decoding, else plain-eager, else the plain configuration with the most turned on that ran
    (``CONFIGS`` lists them in that order): a run of ``plain-compile-gemv-attn`` beside ``spec-compile-gemv-attn``
    reads its speedups against it. None: no plain configuration ran."""
    ran = {r.config for r in rows if r.skipped is None}
    for name in (prefer, "plain-graphs", "plain-eager"):
        if name in ran:
            return name
    plain = [name for name, cfg in CONFIGS.items() if not cfg.speculative and not cfg.peer and name in ran]
    return plain[-1] if plain else None


def finish_rows(rows: list[BenchRow], outputs: dict[str, dict[int, list[list[int]]]],
                prefer: str | None = None) -> list[BenchRow]:
    """Fill speedup (per pass against the baseline's same pass, the median kept), verify/decode and token
    agreement against the baseline (:func:`baseline_name`) at each batch size."""
    base = baseline_name(rows, prefer)
    by = {(r.config, r.batch): r for r in rows}
    done = []
    for r in rows:
        if r.skipped is not None:
            done.append(r)
            continue
        ref = by.get((base, r.batch)) if base else None
        same = ref is not None and len(ref.sweeps_tok_per_s) == len(r.sweeps_tok_per_s)  # not the HF peer's one pass
        passes = tuple(a / b for a, b in zip(r.sweeps_tok_per_s, ref.sweeps_tok_per_s) if b) if same else ()
        speed = (statistics.median(passes) if passes
                 else r.tok_per_s / ref.tok_per_s if ref and ref.tok_per_s and r.tok_per_s is not None else None)
        ratio = r.verify_ms / ref.decode_ms if ref and ref.decode_ms and r.verify_ms is not None else None
        groups, interval = (), None
        if ref and len(ref.group_tok_per_s) == len(r.group_tok_per_s) and all(ref.group_tok_per_s):
            groups = tuple(t / b for t, b in zip(r.group_tok_per_s, ref.group_tok_per_s))
            interval = speedup_interval(r, ref)
        done.append(replace(r, speedup=speed, pass_speedups=passes, verify_over_decode=ratio, group_speedups=groups,
                            speedup_interval=interval,
                            same_tokens_as_plain_eager=_agreement(outputs, r.config, r.batch)))
    return done


INTERVAL_GROUPS = 5  # fewer prompt groups give no interval
RESAMPLES = 2000


def speedup_interval(row: BenchRow, ref: BenchRow) -> tuple[float, float] | None:
    """:func:`paired_interval` of ``row``'s speedup over ``ref``, from each row's prompt groups (first pass). None
    with fewer than :data:`INTERVAL_GROUPS` groups, groups that do not pair up, or without each group's tokens.

    The passes' min..max says how steady the clock was over the same texts; this says how much the figure leans on
    which prompts were drawn: on 10 MT-bench prompts of 128 tokens one text that falls into repetition moves it ~10%.
    """
    return paired_interval(row.group_tokens, row.group_tok_per_s, ref.group_tokens, ref.group_tok_per_s)


def paired_interval(tokens: Sequence[int], tok_per_s: Sequence[float], ref_tokens: Sequence[int],
                    ref_tok_per_s: Sequence[float], resamples: int = RESAMPLES,
                    seed: int = 0) -> tuple[float, float] | None:
    """The 95% interval of a speedup across prompt groups, by a paired bootstrap: draw as many groups as ran, with
    replacement, the same draw on both sides; a draw's speedup is its tokens over its seconds on each side (a group's
    seconds: its tokens over its tok/s), as the headline's is over all groups; the 2.5th and 97.5th percentiles of
    ``resamples`` draws (seeded: the same groups give the same interval). None with fewer than
    :data:`INTERVAL_GROUPS` groups, sides of unlike lengths, or a group without tokens or speed."""
    n = len(tok_per_s)
    if n < INTERVAL_GROUPS or not len(tokens) == len(ref_tokens) == len(ref_tok_per_s) == n:
        return None
    if not all(tok_per_s) or not all(ref_tok_per_s):
        return None
    tok = torch.tensor([list(tokens), list(ref_tokens)], dtype=torch.float64)  # [2, n]
    sec = tok / torch.tensor([list(tok_per_s), list(ref_tok_per_s)], dtype=torch.float64)
    draw = torch.randint(0, n, (resamples, n), generator=torch.Generator().manual_seed(seed))  # [resamples, n]
    rate = tok[:, draw].sum(-1) / sec[:, draw].sum(-1)  # [2, resamples]: tok/s of each draw, each side
    lo, hi = torch.quantile(rate[0] / rate[1], torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return lo, hi


def _agreement(outputs, config: str, batch: int) -> float | None:
    ref = outputs.get("plain-eager", {}).get(batch)
    got = outputs.get(config, {}).get(batch)
    if not ref or not got or config == "hf":
        return None
    return sum(a == b for a, b in zip(ref, got)) / len(ref)


# ---- hardware, JSON --------------------------------------------------------------------------------
def hardware(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """What the figures were measured on."""
    import platform

    info: dict[str, Any] = {"device": str(device), "dtype": str(dtype).replace("torch.", ""),
                            "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    gpu_memory_gib=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1))
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def write_json(path: str | Path, report: dict[str, Any]) -> None:
    """Write the report (plain JSON; dataclasses already turned into dicts) whole or not at all: a run stopped while
    it rewrites its partial report keeps the one written before."""
    from eaglelab.engine.formats.safe_write import write_atomic

    text = json.dumps(report, indent=1, default=str) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text), what="the bench report", flag="--json")


# ---- prompts ---------------------------------------------------------------------------------------
def mtbench_first_turns(n: int, questions_file: str | Path | None = None) -> list[str]:
    """First turns of ``n`` MT-bench questions, spread evenly over the 80 (so every category shows)."""
    return [turn for turn, _ in mtbench_questions(n, questions_file)]


def mtbench_questions(n: int, questions_file: str | Path | None = None) -> list[tuple[str, str]]:
    """(first turn, category) of ``n`` MT-bench questions, spread evenly over the file ("?": no category)."""
    from eaglelab.engine.formats.assets import MTBENCH_QUESTIONS, asset_path
    from eaglelab.engine.errors import EagleLabError

    path = Path(questions_file) if questions_file else asset_path(MTBENCH_QUESTIONS)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EagleLabError(f"cannot read the MT-bench questions ({type(exc).__name__}: {exc})", file=path,
                            hint="pass --questions FILE (an MT-bench question.jsonl), or leave it out for the asset") from None
    questions = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                q = json.loads(line)
                questions.append((q["turns"][0], str(q.get("category", "?"))))
            except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
                raise EagleLabError("not an MT-bench question line", file=path, field=f"line {i + 1}",
                                    expected='{"question_id": ..., "turns": ["...", ...]}') from None
    if not questions:
        raise EagleLabError("no questions", file=path)
    n = max(1, min(n, len(questions)))
    return [questions[i * len(questions) // n] for i in range(n)]


def tokenize_prompts(texts: list[str], tokenizer, vocab_size: int, max_tokens: int) -> tuple[list[list[int]], str]:
    """Token ids per prompt (chat template when a tokenizer is given, else UTF-8 bytes), each cut to
    its first ``max_tokens``. -> (ids, how they were made)."""
    if tokenizer is not None and tokenizer.vocab_size <= vocab_size:
        ids = [tokenizer.chat_ids(t) for t in texts]
        how = "chat template + tokenizer"
    else:
        ids = [[b % vocab_size for b in t.encode("utf-8")] for t in texts]
        how = "UTF-8 bytes as token ids (no tokenizer for this vocabulary)"
    return [p[:max_tokens] for p in ids], how


# ---- the HF transformers peer ----------------------------------------------------------------------
@dataclass
class PeerResult:
    tokens: list[list[int]]
    accept_lens: list = field(default_factory=list)


def _dtype_kw(dtype: torch.dtype) -> dict[str, Any]:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_hf_peer(source: str | Path | dict, device: torch.device, dtype: torch.dtype):
    """An HF ``AutoModelForCausalLM``: from a model directory, or random weights from a config dict."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(source, dict):
        d = dict(source)
        cfg = AutoConfig.for_model(d.pop("model_type", "llama"), **d)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, **_dtype_kw(dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source), **_dtype_kw(dtype)).to(device)
    return model.eval()


def until_eos(row: list[int], eos_token_ids: tuple[int, ...]) -> list[int]:
    """``row`` up to and with its first end-of-sequence token (HF pads a row that ended early)."""
    for i, t in enumerate(row):
        if t in eos_token_ids:
            return row[: i + 1]
    return row


def hf_generate_fn(model, device: torch.device, eos_token_ids: tuple[int, ...] = ()
                   ) -> Callable[[list[list[int]], int], PeerResult]:
    """Greedy ``model.generate`` over a left-padded batch, exactly ``max_new`` tokens per row (``eos_token_ids``:
    at most ``max_new``, a row ending at its first end-of-sequence token, kept, as our engine counts it)."""
    stop = {"eos_token_id": list(eos_token_ids)} if eos_token_ids else {}

    @torch.inference_mode()
    def generate(group: list[list[int]], max_new: int) -> PeerResult:
        T = max(len(p) for p in group)
        ids = torch.zeros(len(group), T, dtype=torch.long)
        attn = torch.zeros(len(group), T, dtype=torch.long)
        for b, p in enumerate(group):
            ids[b, T - len(p):] = torch.tensor(p)
            attn[b, T - len(p):] = 1
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=max_new,
                             min_new_tokens=0 if stop else max_new, do_sample=False, pad_token_id=0, **stop)
        return PeerResult([until_eos(row[T:].tolist(), eos_token_ids) for row in out])

    return generate
