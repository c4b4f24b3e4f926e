"""``torch.compile`` of a layer's elementwise work (RMSNorm, rotary, SwiGLU), composed with our
CUDA-graph capture.

Each piece is compiled on its own with inductor's default mode, which launches plain kernels (no
CUDA graphs of its own): the graph runner's warm-up compiles them, and its capture records the
fused kernels inside the one graph per phase. Matmuls and attention stay cuBLAS / SDPA. Weights are
arguments, so one compiled kernel serves every layer (no per-layer recompiles).

Inductor's caches go to ``<eaglelab cache>/inductor`` (unless ``TORCHINDUCTOR_CACHE_DIR`` is set),
so a second run loads the kernels instead of compiling them. When a piece cannot compile (no
compiler, an unsupported backend) it runs eagerly and the reason is kept, like a graph fallback.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch

from eaglelab.engine.model.layers import Kernels, rms_norm, rotary_qk, swiglu


class CompileLog:
    """Says once that compilation started (before the first piece compiles), then each piece's time."""

    def __init__(self, log: Callable[[str], None] | None) -> None:
        self.log, self.started = log, False

    def start(self) -> None:
        if self.log is not None and not self.started:
            self.started = True
            self.log("compiling the layers' RMSNorm/rotary/SwiGLU with torch.compile (once; cached on disk) ...")

    def __call__(self, message: str) -> None:
        if self.log is not None:
            self.log(message)


class CompiledOrEager:
    """A compiled callable that falls back to its eager original, once and for good, saying why."""

    def __init__(self, name: str, fn: Callable, log: Callable[[str], None] | CompileLog | None = None) -> None:
        self.name, self.eager = name, fn
        self.log = log if isinstance(log, CompileLog) else CompileLog(log)
        self.compiled = torch.compile(fn, dynamic=None)
        self.reason: str | None = None
        self.compile_seconds = 0.0
        self._ready = False

    def __call__(self, *args):
        if self.reason is not None:
            return self.eager(*args)
        if self._ready:
            return self.compiled(*args)
        self.log.start()
        t0 = time.perf_counter()
        try:  # the first call compiles (or loads from the on-disk cache)
            out = self.compiled(*args)
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eagerly, and say why
            self.reason = f"eager: {self.name} did not compile ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
            self.log(self.reason)
            return self.eager(*args)
        self.compile_seconds += time.perf_counter() - t0
        self._ready = True
        self.log(f"  compiled {self.name} in {self.compile_seconds:.1f} s")
        return out


def inductor_cache_dir(root: Path) -> Path:
    """Where inductor keeps compiled kernels: ``$TORCHINDUCTOR_CACHE_DIR`` if set, else ``root/inductor``.

    Inductor reads this environment variable only (it has no per-call option), so it is set here,
    once, before the first compile.
    """
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return Path(env)
    path = root / "inductor"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def compiled_kernels(cache_root: Path, log: Callable[[str], None] | None = None) -> Kernels:
    """The compiled :class:`Kernels` (compiled lazily, on first use)."""
    inductor_cache_dir(cache_root)
    said = CompileLog(log)
    return Kernels(
        rms_norm=CompiledOrEager("rms_norm", rms_norm, said),
        rotary=CompiledOrEager("rotary", rotary_qk, said),
        swiglu=CompiledOrEager("swiglu", swiglu, said),
        compiled=True,
    )


def compile_report(kernels: Kernels) -> tuple[float, list[str]]:
    """Seconds spent compiling so far, and the reasons of the pieces that run eagerly."""
    parts = [k for k in (kernels.rms_norm, kernels.rotary, kernels.swiglu) if isinstance(k, CompiledOrEager)]
    return sum(p.compile_seconds for p in parts), [p.reason for p in parts if p.reason]
