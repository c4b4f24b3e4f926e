"""``torch.compile`` composed with our CUDA-graph capture.

Two ways, both with inductor's default mode (plain kernels, no CUDA graphs of its own):

- **whole phases** (under CUDA graphs): the graph runner compiles each phase it captures (decode,
  verify, draft, draft_extend, accept: the whole decoder stack and the sampling, tree and cache work
  around it) once per (phase, batch bucket), with static shapes and without graph breaks. Its warm-up
  compiles; its capture records inductor's fused kernels inside the one graph per phase. The KV cache
  is written in place (the cache's per-layer views compile to in-place scatters, not copies).
- **elementwise pieces** (eager runs): RMSNorm, rotary and SwiGLU, each compiled on its own; weights
  are arguments, so one compiled kernel serves every layer.

Inductor's caches go to ``<eaglelab cache>/inductor`` (unless ``TORCHINDUCTOR_CACHE_DIR`` is set),
so a second run loads the kernels instead of compiling them. What cannot compile (no compiler, an
operation dynamo cannot trace in one graph) runs eagerly and the reason is kept and logged, like a
graph fallback.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from eaglelab.engine.model.layers import Kernels, rms_norm, rotary_qk, swiglu
from eaglelab.engine.runtime import cycle_ops

# Every (phase, bucket) compiles the same phase function (one code object) with other shapes and
# other captured state: more entries than dynamo's default limit of 8, which would run eagerly.
RECOMPILE_LIMIT = 256

# Whole phases compiled with inductor's combo kernels (independent small kernels of a graph launched as one: a
# layer's two rotary kernels, a draft step's mask beside them). Measured on an H100 (SmolLM2's shape, 5/4/24 + 16,
# batch 1, benchmarks/results/h100_2026-12-06d/H, each way in its own process): a decode 0.812 -> 0.766 ms (with
# --pdl 0.653 -> 0.620), a verify 0.974 -> 0.926 (0.859 -> 0.820), the draft phase 0.251 -> 0.228 (0.221 -> 0.200);
# plain 1,183 -> 1,235 tok/s (with --pdl 1,455 -> 1,512). The same tokens as without, with and without --pdl
# (inductor's PDL wait in a combined kernel: COMBO_WITH_PDL), in a GPU test on that H100.
COMBO_KERNELS = True
COMBO_WITH_PDL = True


class CompileLog:
    """Says once that compilation started (before the first piece compiles), then each piece's time."""

    def __init__(self, log: Callable[[str], None] | None,
                 what: str = "the layers' RMSNorm/rotary/SwiGLU") -> None:
        self.log, self.what, self.started = log, what, False

    def start(self) -> None:
        if self.log is not None and not self.started:
            self.started = True
            self.log(f"compiling {self.what} with torch.compile (once; cached on disk) ...")

    def __call__(self, message: str) -> None:
        if self.log is not None:
            self.log(message)


class CompiledOrEager:
    """A compiled callable that falls back to its eager original, once and for good, saying why.

    ``options`` go to ``torch.compile`` (for a whole phase: ``fullgraph=True, dynamic=False``).
    """

    def __init__(self, name: str, fn: Callable, log: Callable[[str], None] | CompileLog | None = None,
                 **options: Any) -> None:
        self.name, self.eager = name, fn
        self.log = log if isinstance(log, CompileLog) else CompileLog(log)
        self.compiled = torch.compile(fn, **({"dynamic": None} | options))
        self.reason: str | None = None
        self.compile_seconds = 0.0
        self._ready = False

    @property
    def tried(self) -> bool:
        """Its first call has happened: it compiled, or failed to and runs eagerly."""
        return self._ready or self.reason is not None

    def __call__(self, *args, **kwargs):
        if self.reason is not None:
            return self.eager(*args, **kwargs)
        # Raised for the call and restored after, by hand: ``config.patch`` costs more than the compiled
        # call itself, and an eager --compile run makes this call for every layer's pieces.
        config = torch._dynamo.config
        limit, config.recompile_limit = config.recompile_limit, RECOMPILE_LIMIT
        try:
            if self._ready:
                return self.compiled(*args, **kwargs)
            return self._first_call(args, kwargs)
        finally:
            config.recompile_limit = limit

    def _first_call(self, args: tuple, kwargs: dict):
        self.log.start()
        t0 = time.perf_counter()
        try:  # the first call compiles (or loads from the on-disk cache)
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eagerly, and say why
            self.reason = f"eager: {self.name} did not compile ({type(exc).__name__}: {_first_line(exc)})"
            self.log(self.reason)
            return self.eager(*args, **kwargs)
        self.compile_seconds += time.perf_counter() - t0
        self._ready = True
        self.log(f"  compiled {self.name} in {self.compile_seconds:.1f} s")
        missing = cycle_ops.untold_reason()
        if missing is not None:  # on CUDA: compiled phases do the cycle's bookkeeping without its kernels (slower)
            self.log(f"  {missing}: compiled phases run the reference bookkeeping instead")
        return out


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:100] if lines else ""


@dataclass
class PhaseCompiler:
    """Compiles whole phases for the CUDA-graph runner: ``compiler(label, fn)`` -> a callable that
    compiles on first use (static shapes, one graph, no graph breaks) or runs ``fn`` eagerly, saying
    why. Keeps every phase it made, for :func:`compile_report`."""

    log: CompileLog
    mode: str | None = None  # torch.compile mode; None = inductor's default (no CUDA graphs of its own)
    made: list[CompiledOrEager] = field(default_factory=list)
    backend: str | None = None  # torch.compile backend; None = inductor ("eager": dynamo's trace alone, for tests)
    pdl: bool = False  # inductor generates PDL code (its kernels launch dependently: ``engine/model/pdl.py``)
    combo: bool = False  # inductor's combo kernels (see COMBO_KERNELS)

    def __call__(self, label: str, fn: Callable) -> CompiledOrEager:
        options = phase_options(self.mode, self.pdl, self.combo)
        if self.backend is not None:
            options["backend"] = self.backend
        phase = CompiledOrEager(label, fn, self.log, **options)
        self.made.append(phase)
        return phase


def phase_options(mode: str | None, pdl: bool = False, combo: bool = False) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments for a whole phase: one graph, static shapes, and ``mode``; where inductor
    needs options of its own (``pdl``: its kernels compiled with PDL code, ``engine/model/pdl.py``; ``combo``: its
    combo kernels) the mode is spelled as its options, since torch.compile takes one or the other."""
    options: dict[str, Any] = {"fullgraph": True, "dynamic": False}
    inductor = ({"triton.enable_pdl": True} if pdl else {}) | ({"combo_kernels": True} if combo else {})
    if inductor:
        from torch._inductor import list_mode_options

        options["options"] = (dict(list_mode_options(mode)) if mode is not None else {}) | inductor
    elif mode is not None:
        options["mode"] = mode
    return options


def _compiled_parts(kernels: Kernels) -> list[CompiledOrEager]:
    """``kernels``' compiled callables: the pieces, and the phases its :class:`PhaseCompiler` made so far."""
    parts = [k for k in (kernels.rms_norm, kernels.rotary, kernels.swiglu) if isinstance(k, CompiledOrEager)]
    if isinstance(kernels.compile_phase, PhaseCompiler):
        parts += kernels.compile_phase.made
    return parts


def compiles_tried(kernels: Kernels) -> int | None:
    """How many of ``kernels``' compiled callables (pieces and phases) have made their first call, i.e. compiled
    or tried to; None when ``kernels`` compile through something else (what it did cannot be told)."""
    if kernels.compile_phase is not None and not isinstance(kernels.compile_phase, PhaseCompiler):
        return None
    return sum(p.tried for p in _compiled_parts(kernels))


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


def compiled_kernels(cache_root: Path, log: Callable[[str], None] | None = None, mode: str | None = None,
                     pdl: bool = False, combo: bool | None = None) -> Kernels:
    """The compiled :class:`Kernels` (compiled lazily, on first use): whole phases under CUDA graphs
    (``mode`` as torch.compile takes it; ``pdl``: their kernels launch dependently, ``engine/model/pdl.py``; the
    caller checked ``pdl.refusal``; ``combo``: inductor's combo kernels, None: :data:`COMBO_KERNELS`, under ``pdl``
    only with :data:`COMBO_WITH_PDL`), the elementwise pieces in eager runs."""
    inductor_cache_dir(cache_root)
    said = CompileLog(log)
    combo = COMBO_KERNELS and (not pdl or COMBO_WITH_PDL) if combo is None else combo
    phases = PhaseCompiler(CompileLog(log, "each phase (decoder stack + sampling) per batch bucket"), mode, pdl=pdl,
                           combo=combo)
    return Kernels(
        rms_norm=CompiledOrEager("rms_norm", rms_norm, said),
        rotary=CompiledOrEager("rotary", rotary_qk, said),
        swiglu=CompiledOrEager("swiglu", swiglu, said),
        compiled=True,
        compile_phase=phases,
        pdl=pdl,
    )


def kernel_setup_seconds(kernels: Kernels) -> float:
    """Seconds the GEMV has spent tuning and the decode attention checking, so far (both shared by every runner
    that holds them)."""
    return sum(k.setup_seconds for k in (kernels.gemv, kernels.attention) if k is not None)


def compile_report(kernels: Kernels) -> tuple[float, list[str]]:
    """Seconds spent compiling (and tuning the GEMV, checking the decode attention) so far, and the reasons
    of the pieces and phases that run eagerly (and of a GEMV or decode attention asked for and off)."""
    parts = _compiled_parts(kernels)
    seconds, reasons = sum(p.compile_seconds for p in parts), [p.reason for p in parts if p.reason]
    reasons += [k.reason for k in (kernels.gemv, kernels.attention) if k is not None and k.reason]
    return seconds + kernel_setup_seconds(kernels), reasons
