"""``eaglelab bench --profile``: where a decode step's and a speculative cycle's device time goes, kernel by kernel.

One plain decode step (the engine's decode phase: the target's forward of one token per row over
the graph runner's static cache, half full, the logits and the greedy pick) is launched ``steps``
times outside any CUDA graph under ``torch.profiler``, once with the eager layers and once compiled
whole as the ``*-compile`` configurations compile it (run after them, the compile is a cache hit). Kernel times do not depend on the launch path, so the
table says which kernels a replayed step spends its time in; the host-timed step beside it does
include the launches (a graph replay does not).

Under ``--tp N`` every rank runs every step (the step holds collectives); rank 0 alone is profiled.
Each kernel's time is its own device time summed over the profiled steps, divided by ``steps``;
the categories (matmul, attention, collective, compiled/fused, other) are read off kernel names.
On CPU the rows are the operators' self CPU times instead.

When a speculative configuration ran, the phases of a speculative cycle (draft, verify, accept,
draft_extend, advance) are profiled the same way, per batch size and kernel set (the configurations'
Triton GEMV / decode attention where they ask for them): a speculative run over the graph runners'
static cache shape is stopped at each phase of its first cycle, and that phase's function (the very
one the graph runner captures, compiled whole as the ``spec-compile*`` configurations compile it) runs
``steps`` times on the cycle's real inputs: on copies of the inputs and of the loop state, the caches it
writes saved before and restored after. The run then goes on as if it had not been stopped (its tokens
are those of an unprofiled run). Each phase's summed kernel time per cycle stands beside the phase time
the bench measured for the matching configuration (a graph replay there). Beside the verify, a plain decode
step of the same kernel set (compiled alike) runs over the verify's cache at its context, and a table puts the
two side by side kernel by kernel: where a verify costs more than a decode, the first speed goal of a cycle.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from eaglelab.bench.timing import sync, time_call
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.runtime.runner import EagerRunner

Compiler = Callable[[str, Callable], Callable]  # (label, fn) -> fn compiled whole (PhaseCompiler)

# name fragments -> category, first match wins (lower case)
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "c10d")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("matmul", ("gemm", "gemv", "xmma", "cutlass", "cublas", "nvjet", "matmul", "aten::mm", "aten::addmm", "aten::bmm",
                "splitk", "aten::linear")),
    ("compiled", ("triton",)),
)
# inductor's generated kernels (pointwise, reductions, foreach), named after every op they fuse: a name such as
# triton_poi_fused_gemv_mul_silu_... is the SwiGLU beside a GEMV, not a matmul, so the prefix decides first;
# its GEMM templates (triton_tem_*) are matmuls
_INDUCTOR = ("triton_poi", "triton_per", "triton_red", "triton_for")


def category(name: str) -> str:
    """The category of a kernel (or CPU operator) name."""
    low = name.lower()
    if low.startswith("triton_tem"):
        return "matmul"
    if low.startswith(_INDUCTOR):
        return "compiled"
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


@dataclass(frozen=True)
class KernelRow:
    """One kernel (by name) over the profiled steps."""

    name: str
    category: str
    calls_per_step: float
    us_per_step: float
    share: float  # of the step's summed kernel time


@dataclass(frozen=True)
class StepProfile:
    """One decode step at one batch size with one kernel set."""

    batch: int
    layers: str  # "eager" | "compiled"
    status: str  # "ran" | "eager: <why the compile fell back>"
    steps: int
    step_ms: float  # host-timed median of a synchronised launched step (launch overhead included)
    device_us: float  # summed kernel (CPU: operator self) time per step
    launches: float  # kernels (CPU: operators) per step, all of them
    by_category: dict[str, float]  # category -> us per step
    weight_gbps: float | None  # this rank's decode weight bytes / the matmul time per step
    kernels: list[KernelRow]  # the costliest ``top``
    phase: str = "decode"  # decode | draft | verify | accept | draft_extend | advance (a step = one cycle's phase)
    configs: tuple[str, ...] = ()  # the speculative configurations whose kernel set this is (a phase)
    detail: str = ""  # what one call does ("6 steps, top-4, 16 tokens")
    measured_ms: float | None = None  # the bench's phase time of ``measured_by`` at this batch (median cycle)
    measured_by: str = ""  # "<config>: replay" | "<config>: eager ..." (accept: accept + advance, as timed)


def _decode_phase(target, cache, lengths: torch.Tensor, kernels=None) -> tuple[Callable, dict[str, torch.Tensor]]:
    """The engine's plain decode phase (greedy) over ``cache`` -> (fn, its inputs): one token per row at
    slot = position = ``lengths`` [B], then the loop's bookkeeping, on ``kernels`` (None: the engine's default
    set). The very function the CUDA-graph runner compiles for the *-compile configurations, over a cache of the
    runner's shape, so its compile is the same graph (inductor's on-disk cache then serves the second). The rows
    are marked done, so every profiled step is the same step (same slot, same kernels: nothing in the phase
    depends on it)."""
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.loop_state import loop_state
    from eaglelab.engine.runtime.sampling import SamplingParams

    root = torch.full_like(lengths, 7)  # [B]: any token (the rows emit nothing)
    engine = Engine(target) if kernels is None else Engine(target, runner=EagerRunner(target, None, kernels=kernels))
    return engine._decode_fn(cache, SamplingParams()), loop_state(lengths.clone(), root, cache.max_len, 0, done=True)


def _filled_cache(target, rows: int, max_len: int, context: int):
    """A cache of ``rows`` x ``max_len`` slots (the graph runner's static shape) holding ``context`` tokens."""
    dev, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    cache = target.make_cache(rows, max_len, dtype=dtype, device=dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (rows, context), generator=g).to(dev)
    pos = torch.arange(context, device=dev).expand(rows, -1)
    target(ids, pos, cache, pos, prefix_mask(pos, max_len))
    return cache


def _device_times(prof, cuda: bool) -> list[tuple[str, int, float]]:
    """(name, calls, self us) of every kernel (CUDA) or operator (CPU) the profiler saw."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.key_averages():
        if cuda:
            if e.device_type != DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None)
            us = e.self_cuda_time_total if us is None else us
        else:
            if e.device_type != DeviceType.CPU:
                continue
            us = e.self_cpu_time_total
        if us > 0:
            out.append((e.key, e.count, float(us)))
    return out


def _summarise(times: list[tuple[str, int, float]], steps: int, top: int) -> tuple[float, dict[str, float], list[KernelRow]]:
    total = sum(us for _, _, us in times) / steps
    cats: dict[str, float] = {}
    for name, _, us in times:
        cats[category(name)] = cats.get(category(name), 0.0) + us / steps
    rows = [KernelRow(name[:160], category(name), n / steps, us / steps, us / steps / total if total else 0.0)
            for name, n, us in sorted(times, key=lambda t: -t[2])[:top]]
    return total, dict(sorted(cats.items(), key=lambda kv: -kv[1])), rows


@torch.inference_mode()
def profile_decode(target, tp, batch_sizes: tuple[int, ...], max_len: int, compiler: Compiler | None,
                   weight_bytes: int, steps: int = 10, warmup: int = 3, top: int = 30,
                   log=lambda m: None) -> list[StepProfile]:
    """Profile the decode phase per batch size, eager layers and (with ``compiler``) compiled whole,
    over a cache of ``max(batch_sizes)`` x ``max_len`` slots half full.

    Every rank calls this with the same arguments (the steps hold collectives); the profiler runs on
    rank 0 only, the others run the same steps unprofiled. ``weight_bytes``: what one step reads of
    this rank's weights (for the matmul bandwidth figure)."""
    dev = next(target.parameters()).device
    rank0 = tp is None or tp.rank == 0
    context = max_len // 2
    cache = _filled_cache(target, max(batch_sizes), max_len, context)
    out = []
    for layers in ("eager", "compiled") if compiler is not None else ("eager",):
        for b in batch_sizes:
            phase, ins = _decode_phase(target, cache, torch.full((b,), context, dtype=torch.long, device=dev))
            run, status = phase, "ran"
            phase(**ins)  # lazy state (fused weights) is built eagerly, before any compile
            if layers == "compiled":
                run = compiler(f"profiled decode [b={b}]", phase)
                run(**ins)  # compiles (or loads)
                status = getattr(run, "reason", None) or "ran"
            got = _measure(lambda: run(**ins), dev, steps, warmup, top, rank0)
            if got is None:
                continue
            mm = got["by_category"].get("matmul", 0.0)
            gbps = weight_bytes / (mm * 1e-6) / 1e9 if mm > 0 and b == 1 else None
            out.append(StepProfile(b, layers, status, steps, weight_gbps=gbps, **got))
            log(_said(out[-1]))
    return out


def _measure(fn: Callable[[], Any], dev: torch.device, steps: int, warmup: int, top: int,
             rank0: bool) -> dict[str, Any] | None:
    """``fn`` warmed up, timed on the host, then run ``steps`` times under the profiler (rank 0; other
    ranks run it as often, unprofiled: it may hold collectives). -> StepProfile's measured fields
    (None off rank 0)."""
    for _ in range(warmup):
        fn()
    step_ms = time_call(fn, dev, 0, max(3, steps))
    if not rank0:
        _unprofiled(fn, dev, steps)
        return None
    times = _profiled(fn, dev, steps, dev.type == "cuda")
    total, cats, rows = _summarise(times, steps, top)
    return dict(step_ms=step_ms, device_us=total, launches=sum(n for _, n, _ in times) / steps, by_category=cats,
                kernels=rows)


def _said(p: StepProfile) -> str:
    cats = ", ".join(f"{k} {v:.0f}" for k, v in p.by_category.items())
    return (f"  profile {p.phase} b={p.batch} {p.layers}: {p.launches:.0f} kernels, {p.device_us:.0f} us of kernels "
            f"per call ({cats}); launched call {p.step_ms:.2f} ms")


# ---- the phases of a speculative cycle ----------------------------------------------------------------
# phase -> the BenchRow field holding its measured time (the engine times advance as part of accept)
MEASURED_FIELD = {"draft": "draft_ms", "verify": "verify_ms", "accept": "accept_ms", "draft_extend": "extend_ms"}


@dataclass(frozen=True)
class SpecKernelSet:
    """The speculative configurations that share one kernel set (they differ in graphs or compile only)."""

    configs: tuple[str, ...]
    kernels: Any  # Kernels: the eager layers' set (with the configs' Triton GEMV / decode attention)
    compiler: Compiler | None  # the compiled configs' PhaseCompiler (None: none of them compiles, or CPU)
    compiled_kernels: Any = None  # Kernels inside a compiled phase (the compiled set's eager pieces)


class PhaseProbe(EagerRunner):
    """An eager runner over a static cache of ``max_len`` slots (the graph runners' shape) that hands
    each compiled phase of the first speculative cycle, the first time it comes, to ``probe`` (with its
    function, inputs, the caches it writes and the loop state), then runs it as any eager runner does."""

    def __init__(self, target, drafter, max_len: int, kernels, probe: Callable[..., None]) -> None:
        super().__init__(target, drafter, kernels=kernels)
        self.max_len, self.probe = max_len, probe
        self.seen: list[str] = []

    def make_cache(self, batch: int, max_len: int, observer=None):
        assert max_len <= self.max_len, f"the profiled run needs {max_len} slots > {self.max_len}"
        p = next(self.target.parameters())
        return self.target.make_cache(batch, self.max_len, dtype=p.dtype, device=p.device)

    def phase(self, name, fn, inputs, caches=(), variant=None, state=None, eager=None, compile=True) -> tuple:
        if compile and name not in self.seen:  # compile=False: the prefill and the drafter's prompt extend
            self.seen.append(name)
            self.probe(name, fn, inputs, caches, state or {})
        return super().phase(name, fn, inputs, caches, variant, state, eager, compile)


@contextlib.contextmanager
def _restored(caches: tuple) -> Iterator[None]:
    """Every K/V buffer of ``caches`` as it was before the block (the profiled calls write slots)."""
    saved = [(c, c.k.clone(), None if c.v is None else c.v.clone()) for c in caches]
    try:
        yield
    finally:
        for c, k, v in saved:
            c.k.copy_(k)
            if v is not None:
                c.v.copy_(v)


def _phase_detail(name: str, spec) -> str:
    lookup = f", a lookup branch of {spec.lookup_tokens}" if spec.lookup_tokens else ""
    return {"draft": f"{spec.num_steps} steps, top-{spec.topk}, {spec.draft_tokens} tokens{lookup}",
            "verify": f"{spec.tree_nodes} tokens", "accept": "greedy" + ("" if spec.chain else ", KV compaction"),
            "draft_extend": f"{spec.max_depth + 1} tokens", "advance": "emit, positions"}.get(name, "")


@dataclass
class PhaseMeasure:
    """The probe of a :class:`PhaseProbe`: profiles one phase function on the cycle's real inputs (eager, or
    compiled whole by ``compiler``) and keeps its :class:`StepProfile` (rank 0) in ``found``. The function
    runs on copies of its inputs and of the loop state, and the caches it writes are restored after: the
    run goes on as if it had not been stopped."""

    batch: int
    steps: int
    warmup: int
    top: int
    rank0: bool
    compiler: Compiler | None = None  # None: the eager layers
    configs: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)
    log: Callable[[str], None] = lambda m: None
    found: list[StepProfile] = field(default_factory=list)
    target: Any = None  # with ``decode_kernels``: a plain decode step is profiled beside the verify (see __call__)
    decode_kernels: Any = None

    def __call__(self, name: str, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor], caches: tuple,
                 state: dict[str, torch.Tensor]) -> None:
        self._profile(name, fn, inputs, caches, state)
        if name == "verify" and self.target is not None and caches:
            self._decode_beside(caches[0], inputs)

    def _decode_beside(self, cache, inputs: dict[str, torch.Tensor]) -> None:
        """A plain decode step of the same kernel set over the verify's cache at the verify's context (each row at
        slot = position = its cached length), compiled alike: the verify's kernels then stand beside a decode's of
        the same GEMV, attention and compile, as the speed goal compares them. The cache is restored after, as for
        any profiled phase."""
        fn, state = _decode_phase(self.target, cache, inputs["lengths"], self.decode_kernels)
        self._profile("decode", fn, {}, (cache,), state)

    def _profile(self, name: str, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor], caches: tuple,
                 state: dict[str, torch.Tensor]) -> None:
        ins, st = {k: v.clone() for k, v in inputs.items()}, {k: v.clone() for k, v in state.items()}
        dev = next(iter({**inputs, **state}.values())).device
        with _restored(caches):
            fn(**ins, **st)  # lazy state (fused weights) is built eagerly, before any compile
            run, status = fn, "ran"
            if self.compiler is not None:
                run = self.compiler(f"profiled {name} [b={self.batch}]", fn)
                run(**ins, **st)  # compiles (or loads)
                status = getattr(run, "reason", None) or "ran"
            got = _measure(lambda: run(**ins, **st), dev, self.steps, self.warmup, self.top, self.rank0)
        if got is not None:
            layers = "eager" if self.compiler is None else "compiled"
            self.found.append(StepProfile(self.batch, layers, status, self.steps, weight_gbps=None, phase=name,
                                          configs=self.configs, detail=self.details.get(name, ""), **got))
            self.log(_said(self.found[-1]))


@torch.inference_mode()
def profile_spec_phases(ctx, kset: SpecKernelSet, compiled: bool, batch: int, steps: int = 10, warmup: int = 3,
                        top: int = 30, max_new: int = 2, log=lambda m: None) -> tuple[list[StepProfile], list[list[int]]]:
    """One speculative run of ``batch`` rows (the first prompt group, greedy, ``max_new`` tokens per row)
    whose first cycle's phases are profiled as they come, with the eager layers of ``kset`` or
    (``compiled``) compiled whole by its compiler. -> (a profile per phase on rank 0, the run's tokens)."""
    from eaglelab.bench.harness import CONFIGS, engine_spec, groups_for
    from eaglelab.engine.runtime.generate import Engine

    # decode-mode verify, a phase (a graph) each: profiled one by one (a one-graph cycle runs the same functions)
    spec = engine_spec(replace(CONFIGS["spec-decode"], one_graph=False), ctx)
    drafter = ctx.make_drafter(spec)
    details = {name: _phase_detail(name, spec) for name in ("draft", "verify", "accept", "draft_extend", "advance")}
    details["decode"] = "1 token, plain, the verify's context"
    kernels = kset.compiled_kernels if compiled else kset.kernels
    probe = PhaseMeasure(batch, steps, warmup, top, ctx.tp is None or ctx.tp.rank == 0,
                         kset.compiler if compiled else None, kset.configs, details, log, target=ctx.target,
                         decode_kernels=kernels)
    runner = PhaseProbe(ctx.target, drafter.net, ctx.max_len, kernels, probe)
    res = Engine(ctx.target, eos_token_ids=(), drafter=drafter, spec=spec, runner=runner).generate(
        groups_for(ctx.prompts, batch)[0], max_new)
    # the cycle's phases in their order, then the decode step profiled beside the verify
    return sorted(probe.found, key=lambda p: p.phase == "decode"), res.tokens


def with_measured(profiles: list[StepProfile], rows: list, kset: SpecKernelSet, compiled: bool) -> list[StepProfile]:
    """Each phase profile with the bench's measured time of that phase at its batch: the compiled profile
    beside the set's compiled configuration, the eager one beside its graph configuration (else eager)."""
    by = {(r.config, r.batch): r for r in rows if r.skipped is None}
    out = []
    for p in profiles:
        field_ = MEASURED_FIELD.get(p.phase)
        ran = [by[(c, p.batch)] for c in kset.configs if (c, p.batch) in by]
        ran = [r for r in ran if ("compile" in r.config) == compiled] or ran
        ran.sort(key=lambda r: r.graph.get(p.phase) != "replay")  # a replayed one first
        row = next((r for r in ran if field_ and getattr(r, field_) is not None), None)
        if row is None:
            out.append(p)
            continue
        what = "accept + advance, " if p.phase == "accept" else ""
        out.append(replace(p, measured_ms=getattr(row, field_), measured_by=f"{what}{row.config}: {_status(row, p.phase)}"))
    return out


def _status(row, phase: str) -> str:
    """A row's graph status of ``phase``; accept, which graph_status does not list, replays with verify."""
    return row.graph.get(phase) or row.graph.get("verify", "?")


def spec_kernel_sets(ctx, rows: list) -> list[SpecKernelSet]:
    """The kernel sets of the speculative configurations that ran (decode-mode verify or not: the profile
    verifies in decode mode, a phase), one per (GEMV, decode attention) choice; on CUDA the set's compiler
    when one of its configurations compiles. On CPU the eager layers are the spec-decode config's own."""
    from eaglelab.bench.configs import CONFIGS
    from eaglelab.engine.model.layers import EAGER_KERNELS

    ran = list(dict.fromkeys(r.config for r in rows if r.skipped is None and CONFIGS[r.config].speculative))
    cuda = ctx.device.type == "cuda"
    groups: dict[tuple[bool, bool], list[str]] = {}
    for name in ran:
        groups.setdefault((CONFIGS[name].gemv, CONFIGS[name].attn), []).append(name)
    sets = []
    for (gemv, attn), names in groups.items():
        eager = ctx.kernels(False, gemv, attn) if cuda else (ctx.eager_kernels or EAGER_KERNELS)
        compiles = cuda and any(CONFIGS[n].compile for n in names)
        whole = ctx.kernels(True, gemv, attn) if compiles else None
        sets.append(SpecKernelSet(tuple(names), eager, whole.compile_phase if whole else None,
                                  whole.eager_pieces() if whole else None))
    return sets


def _profiled(fn, dev, steps: int, cuda: bool) -> list[tuple[str, int, float]]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(dev)
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(dev)
    return _device_times(prof, cuda)


def _unprofiled(fn, dev, steps: int) -> list:
    for _ in range(steps):
        fn()
    sync(dev)
    return []


def profile_section(profiles: list[StepProfile]) -> list[dict[str, Any]]:
    return [asdict(p) for p in profiles]


def print_profile(console, profiles: list[dict[str, Any]], cuda: bool, top: int = 15) -> None:
    """Per profiled decode step: the categories, then the costliest kernels; then per speculative kernel
    set a line per phase (kernels and their time per cycle beside the bench's phase time), and each
    phase's costliest kernels."""
    decode = [p for p in profiles if p.get("phase", "decode") == "decode" and not p.get("configs")]
    for p in decode:
        bw = f"; matmuls read this rank's weights at {p['weight_gbps']:.0f} GB/s" if p["weight_gbps"] else ""
        console.print(_kernel_table(p, cuda, top, f"decode step b={p['batch']}, {p['layers']} layers ({p['status']})",
                                    "step", f"{bw}; launched step {p['step_ms']:.2f} ms"))
    spec = [p for p in profiles if p.get("configs")]
    for configs in dict.fromkeys(tuple(p["configs"]) for p in spec):
        mine = [p for p in spec if tuple(p["configs"]) == configs]
        console.print(f"[bold]speculative cycle, phase by phase[/] (kernel set of {', '.join(configs)}; per cycle, "
                      f"the phase launched outside any graph; the bench's time of the phase beside it; a plain "
                      f"decode step of the same kernels last)")
        for p in mine:
            console.print("  " + phase_line(p, cuda))
        for p in mine:
            title = f"{p['phase']} b={p['batch']}, {p['layers']} layers ({p['status']}): {p['detail']}"
            bench = f"; bench {p['measured_ms'] * 1e3:.0f} us ({p['measured_by']})" if p.get("measured_ms") else ""
            console.print(_kernel_table(p, cuda, min(top, 10), title, "cycle", f"; launched {p['step_ms']:.2f} ms{bench}"))
        for verify, decode in verify_decode_pairs(mine):
            console.print(_over_table(verify, decode, cuda))


def verify_decode_pairs(profiles: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(verify, decode) profiles of one kernel set with the same batch size and layers (eager or compiled)."""
    decode = {(p["batch"], p["layers"]): p for p in profiles if p["phase"] == "decode"}
    return [(p, decode[(p["batch"], p["layers"])]) for p in profiles
            if p["phase"] == "verify" and (p["batch"], p["layers"]) in decode]


def verify_over_decode(verify: dict[str, Any], decode: dict[str, Any]) -> list[tuple[str, float, float, float, float]]:
    """Where a verify costs more than a decode step of the same kernels: rows (what, decode calls, decode us,
    verify calls, verify us) per call of each phase. First every kernel either profile lists by name, grouped:
    the compiler's generated kernels (``triton_*``, named after the ops they fuse, which differ between the two
    graphs) as one row per kind (pointwise, persistent and looped reductions), any other kernel by its name;
    then a row per category and the total, whose calls are the launches (the named rows are each profile's
    costliest, the category and total rows every kernel).

    Example: a decode of 10 gemv_kernel calls (20 us) and a verify of 10 (30 us) give the row ("gemv_kernel",
    10, 20, 10, 30), then the rows "all matmul" (every matmul kernel of each) and "total"."""
    def named(p: dict[str, Any]) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for k in p["kernels"]:
            key = _kernel_kind(k["name"])
            n, us = out.get(key, (0.0, 0.0))
            out[key] = (n + k["calls_per_step"], us + k["us_per_step"])
        return out

    d, v = named(decode), named(verify)
    keys = sorted(set(d) | set(v), key=lambda k: -(v.get(k, (0, 0))[1] - d.get(k, (0, 0))[1]))
    rows = [(k, *d.get(k, (0.0, 0.0)), *v.get(k, (0.0, 0.0))) for k in keys]
    cats = dict.fromkeys([*verify["by_category"], *decode["by_category"]])
    rows += [(f"all {c}", float("nan"), decode["by_category"].get(c, 0.0), float("nan"), verify["by_category"].get(c, 0.0))
             for c in cats]
    rows.append(("total", decode["launches"], decode["device_us"], verify["launches"], verify["device_us"]))
    return rows


def _kernel_kind(name: str) -> str:
    """A kernel's row in :func:`verify_over_decode`: inductor's generated kernels by kind, others by name."""
    for prefix, kind in (("triton_poi", "inductor pointwise (triton_poi_*)"),
                         ("triton_per", "inductor persistent reduction (triton_per_*)"),
                         ("triton_red", "inductor looped reduction (triton_red_*)")):
        if name.startswith(prefix):
            return kind
    return name


def _over_table(verify: dict[str, Any], decode: dict[str, Any], cuda: bool):
    from rich import box
    from rich.table import Table

    what, per = ("kernel", "kernels") if cuda else ("operator (self CPU)", "operators")
    ratio = verify["device_us"] / decode["device_us"] if decode["device_us"] else float("nan")
    launched = verify["step_ms"] / decode["step_ms"] if decode["step_ms"] else float("nan")
    t = Table(title=f"verify ({verify['detail']}) against a decode step of the same kernels, b={verify['batch']}, "
                    f"{verify['layers']} layers: {verify['device_us']:.0f} against {decode['device_us']:.0f} us of "
                    f"{per} ({ratio:.2f}x), launched {verify['step_ms']:.2f} against {decode['step_ms']:.2f} ms "
                    f"({launched:.2f}x)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 2, 0, 0))
    for col in ("verify - decode us", "decode us", "verify us", "calls", what):
        t.add_column(col, justify="left" if col == what else "right", no_wrap=col != what)
    for name, dn, dus, vn, vus in verify_over_decode(verify, decode):
        calls = "" if math.isnan(dn) else f"{dn:.0f} / {vn:.0f}"  # a category row: its calls are not counted
        t.add_row(f"{vus - dus:+.1f}", f"{dus:.1f}", f"{vus:.1f}", calls, name[:110])
    return t


def phase_line(p: dict[str, Any], cuda: bool) -> str:
    """One phase in a sentence: "draft b=1 compiled (6 steps, top-4, 16 tokens): 143 kernels, 95 us of
    kernels vs 610 us replayed (spec-compile: replay)"."""
    many = "kernels" if cuda else "operators"
    what = "us of kernels" if cuda else "us of operator self time"
    line = (f"{p['phase']} b={p['batch']} {p['layers']} ({p['detail']}): {p['launches']:.0f} {many}, "
            f"{p['device_us']:.0f} {what}")
    if p["status"] != "ran":
        line += f" [{p['status']}]"
    if p.get("measured_ms") is not None:
        how = "replayed" if ": replay" in p["measured_by"] else "measured"
        line += f" vs {p['measured_ms'] * 1e3:.0f} us {how} ({p['measured_by']})"
    return line + f"; launched {p['step_ms'] * 1e3:.0f} us"


def _kernel_table(p: dict[str, Any], cuda: bool, top: int, head: str, per: str, tail: str):
    from rich import box
    from rich.table import Table

    what, many = ("kernel", "kernels") if cuda else ("operator (self CPU)", "operators")
    cats = ", ".join(f"{k} {v:.0f} us" for k, v in p["by_category"].items())
    t = Table(title=f"{head}: {p['launches']:.0f} {many}, {p['device_us']:.0f} us of their time per {per} ({cats}){tail}",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 2, 0, 0))
    for col in (f"us/{per}", "share", f"calls/{per}", "category", what):
        t.add_column(col, justify="left" if col in ("category", what) else "right", no_wrap=col != what)
    for k in p["kernels"][:top]:
        t.add_row(f"{k['us_per_step']:.1f}", f"{k['share']:.0%}", f"{k['calls_per_step']:.0f}", k["category"],
                  k["name"][:110])
    return t
