"""``eaglelab bench --profile``: where one decode step's device time goes, kernel by kernel.

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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from eaglelab.bench.harness import _sync, _time_call
from eaglelab.engine.model.layers import prefix_mask

Compiler = Callable[[str, Callable], Callable]  # (label, fn) -> fn compiled whole (PhaseCompiler)

# name fragments -> category, first match wins (lower case)
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "c10d")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("matmul", ("gemm", "gemv", "xmma", "cutlass", "cublas", "matmul", "aten::mm", "aten::addmm", "aten::bmm",
                "splitk", "aten::linear")),
    ("compiled", ("triton",)),
)


def category(name: str) -> str:
    """The category of a kernel (or CPU operator) name."""
    low = name.lower()
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


def _decode_phase(target, cache, batch: int, context: int) -> tuple[Callable, dict[str, torch.Tensor]]:
    """The engine's plain decode phase (greedy) over ``cache`` -> (fn, its inputs): one token per row at
    slot = position = ``context``, then the loop's bookkeeping. The very function the CUDA-graph runner
    compiles for the *-compile configurations, over a cache of the runner's shape, so its compile is
    the same graph (inductor's on-disk cache then serves the second). The rows are marked done, so every
    profiled step is the same step (same slot, same kernels: nothing in the phase depends on it)."""
    from eaglelab.engine.runtime.generate import Engine, loop_state
    from eaglelab.engine.runtime.sampling import SamplingParams

    dev = cache.k.device
    root = torch.full((batch,), 7, dtype=torch.long, device=dev)  # [B]
    lengths = torch.full((batch,), context, dtype=torch.long, device=dev)  # [B]
    return Engine(target)._decode_fn(cache, SamplingParams()), loop_state(lengths, root, cache.max_len, 0, done=True)


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
    cuda, rank0 = dev.type == "cuda", tp is None or tp.rank == 0
    context = max_len // 2
    cache = _filled_cache(target, max(batch_sizes), max_len, context)
    out = []
    for layers in ("eager", "compiled") if compiler is not None else ("eager",):
        for b in batch_sizes:
            phase, ins = _decode_phase(target, cache, b, context)
            run, status = phase, "ran"
            phase(**ins)  # lazy state (fused weights) is built eagerly, before any compile
            if layers == "compiled":
                run = compiler(f"profiled decode [b={b}]", phase)
                run(**ins)  # compiles (or loads)
                status = getattr(run, "reason", None) or "ran"
            fn = lambda: run(**ins)  # noqa: E731
            for _ in range(warmup):
                fn()
            step_ms = _time_call(fn, dev, 0, max(3, steps))
            times = _profiled(fn, dev, steps, cuda) if rank0 else _unprofiled(fn, dev, steps)
            if not rank0:
                continue
            total, cats, rows = _summarise(times, steps, top)
            mm = cats.get("matmul", 0.0)
            gbps = weight_bytes / (mm * 1e-6) / 1e9 if mm > 0 and b == 1 else None
            launches = sum(n for _, n, _ in times) / steps
            out.append(StepProfile(b, layers, status, steps, step_ms, total, launches, cats, gbps, rows))
            log(f"  profile decode b={b} {layers}: {launches:.0f} kernels, {total:.0f} us of kernels per step "
                f"({', '.join(f'{k} {v:.0f}' for k, v in cats.items())}); launched step {step_ms:.2f} ms")
    return out


def _profiled(fn, dev, steps: int, cuda: bool) -> list[tuple[str, int, float]]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(dev)
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        _sync(dev)
    return _device_times(prof, cuda)


def _unprofiled(fn, dev, steps: int) -> list:
    for _ in range(steps):
        fn()
    _sync(dev)
    return []


def profile_section(profiles: list[StepProfile]) -> list[dict[str, Any]]:
    return [asdict(p) for p in profiles]


def print_profile(console, profiles: list[dict[str, Any]], cuda: bool, top: int = 15) -> None:
    """Per profiled step: the categories, then the costliest kernels."""
    from rich import box
    from rich.table import Table

    what, many = ("kernel", "kernels") if cuda else ("operator (self CPU)", "operators")
    for p in profiles:
        cats = ", ".join(f"{k} {v:.0f} us" for k, v in p["by_category"].items())
        bw = f"; matmuls read this rank's weights at {p['weight_gbps']:.0f} GB/s" if p["weight_gbps"] else ""
        t = Table(title=f"decode step b={p['batch']}, {p['layers']} layers ({p['status']}): {p['launches']:.0f} {many}, "
                        f"{p['device_us']:.0f} us of their time per step ({cats}){bw}; launched step {p['step_ms']:.2f} ms",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 2, 0, 0))
        for col in ("us/step", "share", "calls/step", "category", what):
            t.add_column(col, justify="left" if col in ("category", what) else "right", no_wrap=col != what)
        for k in p["kernels"][:top]:
            t.add_row(f"{k['us_per_step']:.1f}", f"{k['share']:.0%}", f"{k['calls_per_step']:.0f}", k["category"],
                      k["name"][:110])
        console.print(t)
