"""Where a bench run's wall time went: the process's start-up (Python, imports), loading the model, setting up the
graphs (torch.compile per graph set, the Triton kernels' tuning, CUDA-graph capture), warm-up, the timed passes,
the HF peer, and the rest, so the figure can be read from a log and a user sees what a run costs.

Parts are measured with the host clock as they pass (:class:`WallClock`); the graph set-up inside the warm-ups and
passes is read afterwards from what the runners and compilers kept (:func:`breakdown`).

Example, the H200 with empty compile, Triton and GEMV-tuner caches (benchmarks/results/h200_2026-12-03b/D):
``where the time went: 193.5 s since the process started = start-up 3.7 + load 1.1 + graphs 163.4 (compile 129.4:
plain-compile-gemv-attn b1 27.7, ...; kernel tuning 24.6; capture 9.4) + warm-up 7.9 + timed passes 2.4 + HF 14.4
(load 5.3) + other 0.7``.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), None where the OS does not say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
    return max(uptime - started, 0.0)


@dataclass
class WallClock:
    """Seconds spent per named part of a run, added as they pass; ``clock`` is the time source."""

    clock: Callable[[], float] = time.perf_counter
    spent: dict[str, float] = field(default_factory=dict)
    compiled: dict[str, float] = field(default_factory=dict)  # graph set ("config bN") -> compile seconds
    started: float = field(init=False)
    before: float | None = field(default_factory=process_age)  # the process's age when the run began

    def __post_init__(self) -> None:
        self.started = self.clock()

    def add(self, part: str, seconds: float) -> None:
        self.spent[part] = self.spent.get(part, 0.0) + seconds

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block under ``name`` (added to what the part already holds)."""
        t0 = self.clock()
        try:
            yield
        finally:
            self.add(name, self.clock() - t0)

    def elapsed(self) -> float:
        return self.clock() - self.started


# The parts :func:`breakdown` reports, in order; "graphs" and "warm-up" are carved out of what the warm-ups and
# passes of our configurations took, "other" is what no part holds (the report, freeing memory between batches).
PARTS = ("start-up", "load", "graphs", "warm-up", "timed passes", "HF", "profile", "micro", "other")


def breakdown(wall: WallClock, captures: dict[str, list[dict[str, Any]]], compiled: float,
              kernel_seconds: float) -> dict[str, Any]:
    """The run's wall time in :data:`PARTS` (seconds; they add up to ``seconds``), with the compile per graph set.

    ``captures``: per configuration its graph captures (each with ``seconds``, a compile inside included);
    ``compiled``: seconds every phase compile took (inside those captures); ``kernel_seconds``: the Triton GEMV's
    tuning and the decode attention's checks. ``wall`` holds the rest: the warm-ups and passes of our
    configurations, and their timed generation alone ("timed": a pass's lazy captures left out, as tok/s leaves
    them out)."""
    ours = wall.spent.get("warm-up", 0.0) + wall.spent.get("passes", 0.0)
    timed_seconds = wall.spent.get("timed", 0.0)
    captured = sum(c["seconds"] for cs in captures.values() for c in cs)
    graphs = min(captured, ours)
    parts = {
        "start-up": wall.before or 0.0,
        "load": wall.spent.get("load", 0.0),
        "graphs": graphs,
        "warm-up": max(ours - graphs - timed_seconds, 0.0),
        "timed passes": min(timed_seconds, ours),
        "HF": sum(v for k, v in wall.spent.items() if k.startswith("hf ")),
        "profile": wall.spent.get("profile", 0.0),
        "micro": wall.spent.get("micro", 0.0),
    }
    total = (wall.before or 0.0) + wall.elapsed()
    parts["other"] = max(total - sum(parts.values()), 0.0)
    return {
        "seconds": sum(parts.values()), "since_process_start": wall.before is not None, "parts": parts,
        "compile": compiled, "compile_sets": dict(wall.compiled), "kernel_tuning": kernel_seconds,
        "capture": max(graphs - compiled - kernel_seconds, 0.0), "hf_load": wall.spent.get("hf load", 0.0),
    }


def describe(w: dict[str, Any]) -> str:
    """One line: ``where the time went: T s = part s + ...``, the graphs' and HF's inner parts in brackets."""
    def s(v: float) -> str:
        return f"{v:.1f}"

    shown = []
    for name in PARTS:
        v = w["parts"].get(name, 0.0)
        if name in ("graphs", "profile", "micro", "other") and v < 0.05:  # none here (no CUDA graphs on a CPU)
            continue
        text = f"{name} {s(v)}"
        if name == "graphs" and v > 0:
            sets = ", ".join(f"{k} {s(x)}" for k, x in w["compile_sets"].items())
            text += (f" (compile {s(w['compile'])}" + (f": {sets}" if sets else "")
                     + f"; kernel tuning {s(w['kernel_tuning'])}; capture {s(w['capture'])})")
        elif name == "HF" and v > 0:
            text += f" (load {s(w['hf_load'])})"
        shown.append(text)
    since = "since the process started" if w["since_process_start"] else "since bench began"
    return f"where the time went: {s(w['seconds'])} s {since} = " + " + ".join(shown)
