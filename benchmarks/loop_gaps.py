"""Where a request's wall time goes beside its kernels: plain decoding against speculation, batch 1, one process.

The bench's phase costs (verify, draft, extend, accept: each a graph replay timed by events) add up to less than a
speculative cycle's share of the end-to-end time: on the H200 at 5/4/24 with a branch of 16, ~1.28 ms of phases
against ~1.43 ms a cycle end to end, where plain decoding's step (0.81 ms) is ~all of its per-token time. This
script says where the rest goes. Each configuration decodes the same prompts as the bench does (its runner, its
graphs, warmed up first), then once more under ``torch.profiler``; from the trace, per request:

* wall: the request's host time, ``Engine.generate`` to its return (the profiled run's, and the unprofiled median);
* busy: the union of the request's kernel and copy intervals on the device;
* idle: wall - busy, the device waiting (on the host: launches, readbacks, the prompt's set-up), per step or cycle;
* the gaps between device work longer than ``--gap-us``, summed and the largest listed, and the host's blocking
  calls (synchronizations) inside the request.

    python benchmarks/loop_gaps.py --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 \\
        --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16 --lookup-spill --prompts 4 --json gaps.json

What it found on an H100 (``benchmarks/results/h100_2026-12-05d/``): a plain step's idle time is about all between
a graph's kernels; of a cycle's ~307 us idle, ~216 us is between its kernels, ~55 us the prompts, ~35-50 us the loop
(~3%). Under the profiler the host is several times slower, so its late launches overstate what the loop costs;
and variants measured in turn in one process mislead (the collector frozen read 2.01x -> 2.16x that way, 2.24x
against 2.22x in separate bench processes): compare changes with ``eaglelab bench``, one process each.

Any ``eaglelab bench`` flag is taken (the model, the tree, --max-new-tokens, --eos); the configurations are the
headline's (``plain-compile-gemv-attn``, ``spec-compile-gemv-attn``) unless ``--configs`` names others. No figure
here is a speedup: the bench measures those; this says what a cycle's time is made of.

Each configuration also lists the work that sits outside a chain of dependent launches (``--pdl``): every kernel
but inductor's (``triton_*``) and ours that take the ``PDL`` constexpr, i.e. cuBLAS, ATen and copies. Under
``--pdl`` each of them ends the chain twice (it starts only once the kernel before has exited, and the kernel after
it only once it has): the list says where a ``*-pdl`` phase still pays full launch gaps. ``--top`` sets how many
kernels the main table shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

# the calls that wait for the device (a copy from pageable memory, "cudaMemcpy", waits too; cudaMemcpyAsync does not)
BLOCKING = frozenset(("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
                      "cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize"))


def union_us(intervals: list[tuple[float, float]]) -> float:
    """The length covered by ``intervals`` [(start, end)], overlaps counted once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def gaps_us(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[float]:
    """The idle stretches of [lo, hi] that no interval covers, in order."""
    out, end = [], lo
    for a, b in sorted(intervals):
        if a > end:
            out.append(a - end)
        end = max(end, b)
    if hi > end:
        out.append(hi - end)
    return out


def trace_events(prof) -> list[dict]:
    """The profiler's Chrome-trace events (kernels, copies, runtime calls, our record_function ranges)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH = ("cuda_runtime", "cuda_driver")


def request_spans(events: list[dict]) -> list[tuple[float, float]]:
    """The host's ``request`` ranges (the profiler also draws each on the device's timeline: not those)."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("name") == "request" and e.get("cat") == "user_annotation" and "dur" in e)


def gap_causes(events: list[dict], gap_us: float, n: int = 12) -> list[dict]:
    """Each device idle stretch longer than ``gap_us`` inside a request, by its cause: whether the work after it
    was launched after the device went idle ("late": the host was not ahead) or before (the device's own
    latency), the call that launched it, the host's last blocking call that ended in the stretch, and (where the
    trace has Python frames) the eaglelab functions the host was in during the stretch. Summed, largest first."""
    spans = request_spans(events)
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH and "correlation" in e.get("args", {})}
    blocking = sorted((e for e in events if e.get("cat") in LAUNCH and e["name"] in BLOCKING and "dur" in e),
                      key=lambda e: e["ts"] + e["dur"])
    frames = [e for e in events if e.get("cat") == "python_function" and "dur" in e
              and ("eaglelab" in e["name"] or "engine/" in e["name"]) and "loop_gaps" not in e["name"]]
    agg: dict[tuple, list[float]] = {}
    for lo, hi in spans:
        dev = sorted((e for e in events if e.get("cat") in DEVICE and "dur" in e and lo <= e["ts"] < hi),
                     key=lambda e: e["ts"])
        end = None
        for e in dev:
            if end is not None and e["ts"] - end > gap_us:
                launch = launches.get(e.get("args", {}).get("correlation"))
                at = launch["ts"] if launch is not None else e["ts"]
                late = launch is not None and at > end
                waits = [b["name"] for b in blocking if end <= b["ts"] + b["dur"] <= at]
                inside = sorted(((min(f["ts"] + f["dur"], at) - max(f["ts"], end), f["name"]) for f in frames
                                 if f["ts"] < at and f["ts"] + f["dur"] > end), reverse=True)
                window = max(at - end, 1e-9)
                deepest = [name for cover, name in inside if cover >= 0.5 * window][-3:]  # innermost covering half
                key = ("late" if late else "device", launch["name"] if launch else "?", waits[-1] if waits else "-",
                       " < ".join(x.split(": ")[-1] if ": " in x else x for x in deepest) or "-")
                agg.setdefault(key, []).append(e["ts"] - end)
            end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    rows = [{"launched": k[0], "by": k[1], "after_blocking": k[2], "host_in": k[3], "count": len(v),
             "total_us": sum(v), "median_us": statistics.median(v)} for k, v in agg.items()]
    return sorted(rows, key=lambda r: -r["total_us"])[:n]


def per_name(events: list[dict], steps: int, keep=lambda name: True) -> list[dict]:
    """The device work inside the requests whose name ``keep`` accepts, by kernel (or copy) name: time and launches
    per step, unsorted."""
    spans = request_spans(events)
    per: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e and keep(e["name"]) \
                and any(lo <= e["ts"] < hi for lo, hi in spans):
            per.setdefault(e["name"], []).append(e["dur"])
    return [{"name": k[:110], "us_per_step": sum(v) / steps, "calls_per_step": len(v) / steps} for k, v in per.items()]


def top_kernels(events: list[dict], steps: int, n: int = 15) -> list[dict]:
    """The device work inside the requests, by kernel (or copy) name: time and launches per step, largest first."""
    return sorted(per_name(events, steps), key=lambda r: -r["us_per_step"])[:n]


KERNEL_MODULES = ("eaglelab.engine.model.gemv_kernels", "eaglelab.engine.model.decode_attention_kernels",
                  "eaglelab.engine.runtime.cycle_kernels")


def dependent_kernels() -> frozenset[str]:
    """The names of our Triton kernels that launch dependently under ``--pdl`` (those taking the ``PDL``
    constexpr), read off the kernel modules; empty without Triton."""
    import importlib

    names = set()
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # no Triton: no kernel of ours runs
            continue
        names |= {k for k, v in vars(module).items() if "PDL" in getattr(v, "arg_names", ())}
    return frozenset(names)


def outside_chain(events: list[dict], steps: int, ours: frozenset[str]) -> list[dict]:
    """The device work inside the requests that cannot launch dependently (not inductor's ``triton_*`` kernels nor
    ``ours``): time and launches per step, by name, most launches first (every one)."""
    rows = per_name(events, steps, lambda name: not name.startswith("triton_") and name not in ours)
    return sorted(rows, key=lambda r: -r["calls_per_step"])


def request_figures(events: list[dict], gap_us: float) -> list[dict]:
    """Per request (a ``request`` range on the host): wall, device busy, idle, its gaps and blocking calls."""
    spans = request_spans(events)
    device = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e]
    out = []
    for lo, hi in spans:
        inside = [(max(a, lo), min(b, hi)) for a, b in device if b > lo and a < hi]
        kernels = sum(1 for a, b in device if lo <= a < hi)
        gaps = gaps_us(inside, lo, hi)
        calls = [e for e in runtime if lo <= e["ts"] < hi]
        blocking = [e for e in calls if e["name"] in BLOCKING]
        out.append({
            "wall_us": hi - lo, "busy_us": union_us(inside), "kernels": kernels,
            "graph_launches": sum(1 for e in calls if e["name"] == "cudaGraphLaunch"),
            "gaps_over_us": sum(g for g in gaps if g > gap_us), "gaps_over": sum(1 for g in gaps if g > gap_us),
            "largest_gaps_us": sorted(gaps, reverse=True)[:5],
            "blocking_calls": len(blocking), "blocking_us": sum(e["dur"] for e in blocking),
        })
    return out


def traced(c, groups, max_new: int, device: torch.device, with_stack: bool = False) -> tuple[list, list[dict]]:
    """``groups`` decoded by contender ``c`` under the profiler, each a ``request`` range. -> (results, events)."""
    from eaglelab.bench.timing import sync

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    results = []
    with torch.profiler.profile(activities=activities, with_stack=with_stack) as prof:
        for group in groups:
            sync(device)
            with torch.profiler.record_function("request"):
                results.append(c.generate(group, max_new))
                sync(device)
    return results, trace_events(prof)


def measure_config(c, ctx, mine) -> dict:
    """One configuration: unprofiled passes (wall time), a profiled pass (busy, gaps, kernels) and a few requests
    traced with Python frames (the gaps' causes)."""
    from eaglelab.bench.timing import sync

    walls, made = [], []
    for _ in range(mine.timed):
        for group in c.groups:
            sync(ctx.device)
            t0 = time.perf_counter()
            made.append(c.generate(group, ctx.max_new_tokens))
            sync(ctx.device)
            walls.append((time.perf_counter() - t0) * 1e6)
    results, events = traced(c, c.groups, ctx.max_new_tokens, ctx.device)
    _, stacked = traced(c, c.groups[: mine.stack_requests], ctx.max_new_tokens, ctx.device, with_stack=True)
    rows = []
    for fig, r in zip(request_figures(events, mine.gap_us), results):
        st = _steps(r)
        rows.append(fig | {"tokens": r.generated_tokens, "steps": st, "wall_per_step_us": fig["wall_us"] / st,
                           "busy_per_step_us": fig["busy_us"] / st,
                           "idle_per_step_us": (fig["wall_us"] - fig["busy_us"]) / st})
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    summary = {"wall_per_step_us": med("wall_per_step_us"), "busy_per_step_us": med("busy_per_step_us"),
               "idle_per_step_us": med("idle_per_step_us"),
               "unprofiled_wall_per_step_us": statistics.median(w / _steps(r) for w, r in zip(walls, made)),
               "unprofiled_tok_per_s": sum(r.generated_tokens for r in made) / sum(walls) * 1e6,
               "tokens_per_step": statistics.median(r["tokens"] / r["steps"] for r in rows),
               "kernels_per_step": med("kernels") / med("steps"),
               "blocking_calls": med("blocking_calls"), "blocking_us": med("blocking_us"),
               "gaps_over_per_step_us": statistics.median(r["gaps_over_us"] / r["steps"] for r in rows)}
    steps = sum(r["steps"] for r in rows)
    return {"summary": summary, "requests": rows, "top_kernels": top_kernels(events, steps, mine.top),
            "outside_chain": outside_chain(events, steps, dependent_kernels()),
            "gap_causes": gap_causes(events, mine.gap_us), "gap_causes_with_stack": gap_causes(stacked, mine.gap_us)}


def print_config(name: str, unit: str, got: dict, gap_us: float, stack_requests: int) -> None:
    s = got["summary"]
    print(f"{name}: per {unit} (median of {len(got['requests'])} requests): wall {s['wall_per_step_us']:.1f} us "
          f"(unprofiled {s['unprofiled_wall_per_step_us']:.1f}), device busy {s['busy_per_step_us']:.1f}, idle "
          f"{s['idle_per_step_us']:.1f} ({s['gaps_over_per_step_us']:.1f} in gaps > {gap_us:g} us); "
          f"{s['tokens_per_step']:.2f} tokens, {s['kernels_per_step']:.0f} kernels; per request "
          f"{s['blocking_calls']:.0f} blocking calls, {s['blocking_us']:.0f} us in them")
    for k in got["top_kernels"]:
        print(f"  {k['us_per_step']:8.1f} us/{unit} {k['calls_per_step']:6.1f} calls  {k['name']}")
    out = got["outside_chain"]
    print(f"  outside a chain of dependent launches (cuBLAS, ATen, copies): {sum(k['calls_per_step'] for k in out):.1f} "
          f"launches, {sum(k['us_per_step'] for k in out):.1f} us per {unit}")
    for k in out:
        print(f"  {k['us_per_step']:8.1f} us/{unit} {k['calls_per_step']:6.1f} calls  {k['name']}")
    for title, causes in (("gaps by cause (the timed trace)", got["gap_causes"]),
                          (f"gaps by cause, Python frames traced ({stack_requests} requests, slower)",
                           got["gap_causes_with_stack"])):
        print(f"  {title}:")
        for g in causes:
            print(f"    {g['total_us']:9.0f} us {g['count']:5d}x (median {g['median_us']:.0f}) {g['launched']}, "
                  f"by {g['by']}, after {g['after_blocking']}; host in {g['host_in']}")
    for r in got["requests"]:
        print(f"  request: {r['steps']} {unit}s, {r['tokens']} tokens, wall {r['wall_us']:.0f} us, busy "
              f"{r['busy_us']:.0f}, {r['graph_launches']} graph launches, largest gaps "
              + ", ".join(f"{g:.0f}" for g in r["largest_gaps_us"]) + " us")


def main(argv: list[str] | None = None) -> int:
    from eaglelab.bench import harness as H
    from eaglelab.bench.configs import CONFIGS
    from eaglelab.bench.setup import setup_bench
    from eaglelab.cli import build_parser

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--gap-us", type=float, default=3.0, help="device idle stretches longer than this are listed")
    own.add_argument("--timed", type=int, default=3, help="unprofiled passes over the prompts (their median wall)")
    own.add_argument("--json", dest="out_json", default=None)
    own.add_argument("--stack-requests", type=int, default=2, help="requests traced again with Python frames")
    own.add_argument("--top", type=int, default=15, help="kernels listed per configuration, by time")
    mine, rest = own.parse_known_args(argv)
    args = build_parser().parse_args(["bench", *rest])
    if args.batch_sizes is None:
        args.batch_sizes = "1"
    names = (args.configs or "plain-compile-gemv-attn,spec-compile-gemv-attn").split(",")
    s = setup_bench(args, log=print)
    ctx = s.ctx
    if ctx.device.type != "cuda":  # a dry run of the plumbing: no device events, so busy reads 0
        print("loop_gaps: not on CUDA: no device work is traced, every busy figure reads 0 (a dry run)")
    batch = ctx.batch_sizes[0]
    systems: dict = {}
    report = {"hardware": H.hardware(ctx.device, next(ctx.target.parameters()).dtype), "batch": batch,
              "max_new_tokens": ctx.max_new_tokens, "prompts": len(ctx.prompts), "notes": list(s.notes), "configs": {}}
    for name in names:
        cfg = CONFIGS[name]
        c = H.contender(cfg, ctx, batch, systems)
        c.warm_up(ctx.max_new_tokens)
        for group in c.groups:  # every prompt width captured (and compiled) before anything is timed
            c.generate(group, ctx.max_new_tokens)
        report["configs"][name] = got = measure_config(c, ctx, mine)
        print_config(name, "cycle" if cfg.speculative else "step", got, mine.gap_us, mine.stack_requests)
    if len(names) == 2:  # unprofiled tok/s, the second configuration over the first
        a, b = (report["configs"][n]["summary"]["unprofiled_tok_per_s"] for n in names)
        report["ratio"] = b / a
        print(f"{names[1]} over {names[0]}, unprofiled: {b / a:.3f}x ({b:.1f} / {a:.1f} tok/s; host wall time, "
              "prompts included)")
    if mine.out_json:
        Path(mine.out_json).write_text(json.dumps(report, indent=1))
    return 0


def _steps(res) -> int:
    """A request's decode steps or speculative cycles (the engine counts them; at least 1)."""
    return max(int(res.cycles), 1)


if __name__ == "__main__":
    raise SystemExit(main())
