"""A whole ``eaglelab bench`` run as a library call: the configurations (interleaved pass by pass, one batch size
after another), then ``--profile``, then the micro-measure, a partial report written after each piece (a run cut
short keeps what it measured), and how busy the machine was at the start and the end.
:func:`run_bench` returns the data; ``eaglelab/cmd_bench.py`` prints it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from eaglelab.bench import harness as B
from eaglelab.bench.configs import CONFIGS, TP_CONFIGS, BenchConfig, pick_configs, regime_config
from eaglelab.bench.report import bench_report
from eaglelab.bench.setup import BenchSetup, headline_only, setup_bench
from eaglelab.bench.timing import machine_load
from eaglelab.bench.walltime import WallClock, breakdown


@dataclass
class BenchResult:
    """What a bench run measured: the report (as ``--json`` writes it) and the pieces it was made of."""

    report: dict[str, Any]
    rows: list[B.BenchRow]
    micro: list[Any]  # MicroRow
    outputs: dict[str, Any]  # config -> batch -> the rows' tokens
    setup: BenchSetup
    profiles: list[dict[str, Any]] | None = None  # --profile
    tp_section: dict[str, Any] | None = None  # --tp
    captures: dict[str, Any] = field(default_factory=dict)
    loads: dict[str, Any] = field(default_factory=dict)  # "start" / "end" -> timing.MachineLoad (None: no figure)
    wall: WallClock | None = None  # where the run's time went (the report's "walltime")


def configs_for(args: argparse.Namespace, tp: Any = None, regime: Any = None) -> list[BenchConfig]:
    """The configurations this run measures: --configs; else the headline (plain and speculative decoding as
    ``run`` decodes on this device, ``regime``, and the HF peer); with --full every configuration but the Triton
    ones, and the headline's; under --tp its default."""
    measures_else = bool(getattr(args, "profile", False) or getattr(args, "tp", None) is not None
                         or micro_on(args) or getattr(args, "micro_only", False))
    if args.configs is None and tp is None and regime is not None:
        ours = [regime_config(False, regime), regime_config(True, regime)]
        if headline_only(args):
            return [*ours, CONFIGS["hf"]]
        full = [CONFIGS[n] for n in pick_configs(None)]
        return full[:-1] + [c for c in ours if c not in full] + full[-1:]  # the HF peer last
    return [CONFIGS[n] for n in pick_configs(args.configs, TP_CONFIGS if tp is not None else None, measures_else)]


def micro_on(args: argparse.Namespace) -> bool:
    """--micro as asked, else on with the full sweep or named configurations, off for the headline alone."""
    asked = getattr(args, "micro", None)
    return asked if asked is not None else not headline_only(args)


def own_load(device: Any) -> float:
    """What this run puts on the run queue: its compute threads on a CPU, the one host thread on CUDA."""
    import torch

    return float(torch.get_num_threads()) if device.type == "cpu" else 1.0


def run_bench(args: argparse.Namespace, tp: Any = None, log: Callable[[str], None] = lambda m: None,
              write: Callable[[dict[str, Any]], None] | None = None) -> BenchResult:
    """Measure what the flags ask on this rank (``tp``: its group, or None). ``write`` gets a partial report after
    each configuration and profile (None: nothing written)."""
    import torch

    wall = WallClock()
    torch.manual_seed(args.seed)
    start = machine_load(0.0)  # before anything of ours runs
    check_profile(args, configs_for(args, tp))
    with wall.part("load"):
        setup = setup_bench(args, log, tp)
    configs = configs_for(args, tp, setup.regime)
    ctx = setup.ctx
    hbm = args.hbm_tbps if args.hbm_tbps is not None else setup.hbm_tbps
    res = BenchResult({}, [], [], {}, setup, loads={"start": start}, wall=wall)
    prefer = regime_config(False, setup.regime).name if setup.regime is not None else None
    if tp is not None:  # first: the figure, kept even if a later configuration runs out of time
        from eaglelab.bench.tp import tp_section

        res.tp_section = tp_section(ctx, tp, args.micro_context, log)

    def report(rows, micro) -> dict[str, Any]:
        """The report of what is measured so far, the --tp section and the profile included."""
        got = bench_report(setup, rows, micro, res.captures, hbm, args.micro_context, args.scale_model,
                           baseline=prefer, loads=res.loads, configs=configs, headline_only=headline_only(args))
        return {**got, **({"tp": res.tp_section} if res.tp_section is not None else {}),
                **({"profile": res.profiles} if res.profiles is not None else {})}

    def partial(rows) -> None:
        if write is not None:
            write({**report(rows, []), "partial": True})

    if not args.micro_only and configs:
        systems: dict[Any, Any] = {}
        for b in ctx.batch_sizes:
            def timed(got, outs, b=b):  # the passes' figures on disk before the observed passes
                seen = {name: {**res.outputs.get(name, {}), b: o} for name, o in outs.items()}
                partial(B.finish_rows(res.rows + got, {**res.outputs, **seen}, prefer))

            got, outs = B.run_batch(configs, ctx, b, systems, wall=wall, timed=timed)
            res.rows += got
            for name, o in outs.items():
                res.outputs.setdefault(name, {})[b] = o
            res.captures = capture_stats(systems)
            partial(B.finish_rows(res.rows, res.outputs, prefer))
        del systems
        release(ctx.device)
        res.rows = B.finish_rows(res.rows, res.outputs, prefer)
    if args.profile:  # after the configurations: plain-compile's decode compiles are then cache hits
        def keep(found: list[dict[str, Any]]) -> None:  # each profile as it is measured: a cut run keeps them
            res.profiles = found
            partial(res.rows)

        with wall.part("profile"):
            keep(profile_all(setup, tp, log, res.rows, keep))
    if micro_on(args) or args.micro_only:
        from eaglelab.bench.micro import micro_measure

        log("micro-measure: 1-token decode vs verify of N tokens")
        cuda = ctx.device.type == "cuda"
        with wall.part("micro"):
            res.micro = micro_measure(ctx.target, setup.micro_batch_sizes, context=args.micro_context, log=log,
                                      iters=20 if cuda else 3, warmup=3 if cuda else 1)
    res.loads["end"] = machine_load(own_load(ctx.device))
    res.report = report(res.rows, res.micro)
    res.report["walltime"] = wall_breakdown(ctx, wall, res.captures)
    return res


def wall_breakdown(ctx: B.BenchContext, wall: WallClock, captures: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Where the run's time went (:func:`eaglelab.bench.walltime.breakdown`), from what the compiler and the Triton
    kernels kept of their own time."""
    compiled = sum(p.compile_seconds for p in B.compiled_phases(ctx))
    kernels = sum(k.setup_seconds for k in (*ctx.gemvs(), ctx.attention) if k is not None)
    return breakdown(wall, captures, compiled, kernels)


def capture_stats(systems: dict[Any, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per configuration, the graph captures of its systems (one per tree it drafted)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, system in systems.items():
        if isinstance(system, B.OurSystem):
            out.setdefault(key[0] if isinstance(key, tuple) else key, []).extend(system.capture_stats())
    return out


def profile_all(setup: BenchSetup, tp: Any, log: Callable[[str], None], rows: list[B.BenchRow],
                keep: Callable[[list[dict[str, Any]]], None] = lambda found: None) -> list[dict[str, Any]]:
    """``--profile``: one decode step per batch size under torch.profiler, eager layers and, on CUDA,
    compiled whole as the *-compile configurations compile a phase (on CPU those do not run); then, per
    kernel set of the speculative configurations that ran, each phase of a speculative cycle alike.
    ``keep`` gets the profiles measured so far after each batch of them (the partial report)."""
    from eaglelab.bench.profile import profile_decode, profile_section, profile_spec_phases, spec_kernel_sets, with_measured

    ctx = setup.ctx
    cuda = ctx.device.type == "cuda"
    steps, warmup = (10, 3) if cuda else (2, 1)
    compiler = ctx.kernels(True).compile_phase if cuda else None
    log("profile: one decode step per batch size, kernel by kernel" + (" (rank 0)" if tp is not None else ""))
    found = profile_decode(ctx.target, tp, ctx.batch_sizes, ctx.max_len, compiler, setup.weight_bytes,
                           steps=steps, warmup=warmup, log=log)
    keep(profile_section(found))
    for kset in spec_kernel_sets(ctx, rows):
        log(f"profile: the phases of a speculative cycle, kernel set of {', '.join(kset.configs)}")
        for compiled in (False, True) if kset.compiler is not None else (False,):
            for b in ctx.batch_sizes:
                phases, _ = profile_spec_phases(ctx, kset, compiled, b, steps=steps, warmup=warmup, log=log)
                found += with_measured(phases, rows, kset, compiled)
                keep(profile_section(found))
            release(ctx.device)
    release(ctx.device)
    return profile_section(found)


def release(device: Any) -> None:
    """Give the finished configuration's graphs, pools and caches back before the next one."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_profile(args: argparse.Namespace, configs: list[str]) -> None:
    """--profile profiles the decode step and the phases of the speculative configurations that run: refuse
    the combinations where what it was asked to profile cannot run (before the model builds)."""
    from eaglelab.engine.errors import EagleLabError

    if not getattr(args, "profile", False):
        return
    if args.micro_only:
        raise EagleLabError("--micro-only measures only the micro-measure: nothing would be profiled with it",
                            field="--profile", found="--profile --micro-only",
                            hint="drop --micro-only (--configs none profiles the decode step alone)")
    spec = [c.name for c in configs if c.speculative]
    if spec and args.configs and args.draft == "none":
        raise EagleLabError("the speculative phases need a drafter to profile", field="--draft", found="none",
                            expected="default, ngram or a drafter directory, with " + ", ".join(spec),
                            hint="name a drafter, or drop the speculative configurations from --configs")
