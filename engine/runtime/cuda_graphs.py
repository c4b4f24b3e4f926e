"""The CUDA-graph runner: captured graphs per batch-size bucket, eager fallbacks that say why.

Same interface as :class:`eaglelab.engine.runtime.runner.EagerRunner`. Per bucket ``b`` (1, 2, 4, ... 32)
it captures, depending on the speculative settings:

    decode        the target's 1-token step                         tokens [b, 1]
    verify        the tree verify in attention mode ``decode``       tokens [b, N] for each N captured
    draft         one drafter step over the frontier                 tokens [b, topk]
    draft_extend  the drafter's catch-up on the accepted tokens       tokens [b, num_steps + 1]

A call with B real rows replays the smallest bucket ``b >= B``: its inputs are copied into the
graph's static buffers (rows B..b-1 are pad rows: token 0 at position 0, written to slot 0 of
their own cache row, seeing only that slot; no real row ever reads a pad row's cache row), the
graph replays, and the first B rows of its static outputs are copied out. The prompt's prefill
(and the drafter's extend over the prompt) is captured too, per batch bucket and padded width
(:func:`prefill_bucket`: 16, 32, 64, ... up to ``prefill_tokens`` tokens), never compiled: a prompt
runs once per request, and one compile per width and bucket (tens of seconds each) would cost more
set-up than it could save. Anything else runs
eagerly and the runner records why ("eager: <reason>"): a longer prompt, attention mode
``prefill`` (its extend forward sizes itself per call), a batch above the largest bucket, a shape
not captured, graphs off, no CUDA.

Static buffers. Graphs bind device addresses, so the runner owns the KV caches: one target cache
of ``max(buckets)`` rows x ``max_len`` slots (bucket b uses its first b rows) that the engine takes
through :meth:`CudaGraphRunner.make_cache`, and one drafter cache of the shape
:class:`~eaglelab.engine.runtime.drafters.Eagle3Drafter` allocates for it (``max_len + steps * topk + 2``
slots). The proposer allocates its own cache per run and hands it to every ``draft`` call; the
runner runs all of those calls (eager ones too, so the state stays in one place) on its own static
drafter cache instead, whenever that cache has the proposer's shape. Nothing outside
``runner.draft`` reads the drafter cache, so results are the same. The loop's per-row state
(lengths, root, emitted tokens, counts, done flags: :meth:`CudaGraphRunner.make_state`) lives in
static buffers of ``max(buckets)`` rows too, which the phases that emit tokens update in place, in
the graph: nothing is copied in or out for it.

All graphs share one memory pool; the largest bucket is captured first. Capture runs warm-up
iterations on a side stream with host-sync detection on (a forward that synchronises with the host
cannot be captured: it falls back with the reason), then captures on that stream. Capture time
and pool growth per graph are kept in :attr:`CudaGraphRunner.capture_stats` and sent to the
observer through ``on_graph_captured``. Replay decisions use host-side shapes only: no host sync.
With ``Kernels.pdl`` the warm-up and the capture run with dependent launches on (``engine/model/pdl.py``): the
graphs record our kernels' launches as programmatic edges, each kernel starting while the one before finishes.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Hashable

import torch

from eaglelab.engine.runtime.compile import compiles_tried, kernel_setup_seconds
from eaglelab.engine.runtime.contracts import Drafter, PhaseParts
from eaglelab.engine.model.pdl import dependent_launches
from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels, prepare_fused
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.runtime.observer import GraphCaptureStats, Observer
from eaglelab.engine.runtime.reasons import (
    EAGER_EXTEND,
    EAGER_HOST_DRAFTER,
    EAGER_NO_CUDA,
    EAGER_NO_FORWARD,
    EAGER_OFF,
    EAGER_PREFILL,
    REPLAY,
)
from eaglelab.engine.runtime.runner import FORWARD_PHASES
from eaglelab.engine.runtime.spec_config import SpecConfig

DEFAULT_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
# Prompts are padded to a power of two >= 16 and their prefill captured per (batch bucket, width) up to
# this many tokens (bucket rows x width); beyond it a prefill is compute-bound (launches do not matter)
# and its graph's activations would be large: it runs eagerly.
PREFILL_TOKENS = 4096
# ... except for a small target, whose prefill stays launch-bound far longer: SmolLM2-135M's eager prefill of 32
# MT-bench prompts (up to 402 tokens) cost 36-52 ms on an H200 (2026-12-04), a quarter of each of those requests,
# and 7.5 ms captured. Below SMALL_TARGET_PARAMS its prefills are captured up to SMALL_PREFILL_TOKENS (32 rows x 512).
SMALL_TARGET_PARAMS = 1_000_000_000
SMALL_PREFILL_TOKENS = 16384
# An MoE target's captured prefill runs every routed expert on every token (its sorted per-expert path
# syncs with the host, so a graph takes the dense one): only short prompts are worth capturing there.
MOE_PREFILL_TOKENS = 256
MIN_PREFILL_WIDTH = 16


def default_prefill_tokens(params: int, moe: bool) -> int:
    """The largest prefill (bucket rows x padded width) a runner captures for a target of ``params`` parameters (on
    this rank): :data:`SMALL_PREFILL_TOKENS` below :data:`SMALL_TARGET_PARAMS`, else :data:`PREFILL_TOKENS`; an MoE
    target's at most :data:`MOE_PREFILL_TOKENS`."""
    if moe:
        return MOE_PREFILL_TOKENS
    return SMALL_PREFILL_TOKENS if params < SMALL_TARGET_PARAMS else PREFILL_TOKENS


def prefill_bucket(prompt_len: int) -> int:
    """The padded prompt width: the smallest power of two >= ``prompt_len`` (at least 16)."""
    return max(MIN_PREFILL_WIDTH, 1 << (prompt_len - 1).bit_length())


def bucket_for(batch: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket >= ``batch`` (None when ``batch`` is above them all)."""
    fits = [b for b in buckets if b >= batch]
    return min(fits) if fits else None


def draft_cache_len(max_len: int, spec: SpecConfig) -> int:
    """Slots of the drafter cache :class:`Eagle3Drafter` allocates over a target cache of ``max_len``."""
    return max_len + spec.draft_slots


@dataclass(frozen=True)
class GraphPlan:
    """What a runner captures (derived from the spec; the micro-benchmark widens ``verify_tokens``)."""

    buckets: tuple[int, ...]
    max_len: int
    decode: bool  # the target's 1-token step (plain decoding)
    verify_tokens: tuple[int, ...]  # widths N of decode-mode verify graphs
    draft_width: int  # tokens per drafter step (topk); 0 = no drafter graphs
    extend_width: int  # tokens per draft-extend (the deepest path and its bonus: max_depth + 1)

    @classmethod
    def for_spec(cls, spec: SpecConfig, has_drafter_net: bool, max_len: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> "GraphPlan":
        verify = (spec.tree_nodes,) if spec.enabled and spec.attention_mode == "decode" else ()
        drafts = spec.enabled and has_drafter_net
        return cls(
            buckets=tuple(sorted(set(buckets))), max_len=max_len, decode=not spec.enabled,
            verify_tokens=verify, draft_width=spec.topk if drafts else 0,
            extend_width=spec.max_depth + 1 if drafts else 0,
        )


class _Graph:
    """One captured graph: static inputs, static outputs, and the CUDAGraph replaying over them."""

    def __init__(self, inputs: dict[str, torch.Tensor], outputs: tuple, graph,
                 on_replay: Callable[[], None] | None = None, keep: tuple = ()) -> None:
        self.inputs, self.outputs, self.graph = inputs, outputs, graph
        self.on_replay = on_replay  # TP: hands the all-reduce events captured in the graph to the probe
        # The captured callables: the graph reads what they close over (an engine's EOS ids, the loop
        # state's buffers) at fixed addresses, so it must outlive the engine that captured it.
        self.keep = keep

    def run(self, values: dict[str, torch.Tensor], batch: int) -> tuple:
        """Copy ``values`` (first ``batch`` rows) in, reset the pad rows, replay, copy rows out."""
        for name, buf in self.inputs.items():
            buf[:batch].copy_(values[name])
            if batch < buf.shape[0]:
                _pad_rows(name, buf[batch:])
        self.graph.replay()
        if self.on_replay is not None:
            self.on_replay()
        return tuple(None if o is None else o[:batch].clone() for o in self.outputs)


def _static_copy(inputs: dict[str, torch.Tensor], b: int) -> dict[str, torch.Tensor]:
    """Static input buffers of ``b`` rows holding ``inputs`` (then pad rows): warm-ups see real data."""
    out = {}
    for name, v in inputs.items():
        buf = torch.empty((b, *v.shape[1:]), dtype=v.dtype, device=v.device)
        buf[: v.shape[0]].copy_(v)
        if v.shape[0] < b:
            _pad_rows(name, buf[v.shape[0]:])
        out[name] = buf
    return out


def _pad_rows(name: str, rows: torch.Tensor) -> None:
    """Harmless pad inputs: token 0 at position/slot 0, attending to slot 0 only, zero features;
    in the loop's state, rows already done (they emit nothing and never move)."""
    rows.zero_()
    if name == "mask":
        rows[..., 0] = True
    if name == "done":
        rows.fill_(True)


class CudaGraphRunner:
    """Replays captured CUDA graphs where it can, runs eagerly (saying why) where it cannot."""

    def __init__(
        self,
        target: Transformer,
        drafter=None,
        *,
        spec: SpecConfig = SpecConfig(),
        taps: tuple[int, ...] = (),
        max_len: int = 2048,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        plan: GraphPlan | None = None,
        enabled: bool = True,
        warmup: int = 2,
        kernels: Kernels = EAGER_KERNELS,
        prefill_tokens: int | None = None,
    ) -> None:
        """``drafter`` is the drafter network (an Eagle3Network) or None; ``taps`` the aux taps the
        engine passes to verify; ``max_len`` the static cache's slots (a run needing more runs eagerly);
        ``prefill_tokens`` the largest prefill captured (bucket rows x padded width; 0: never; None: by the target's
        size, :func:`default_prefill_tokens`; an MoE target's never above :data:`MOE_PREFILL_TOKENS`).
        """
        self.target, self.drafter, self.spec, self.taps = target, drafter, spec, tuple(taps)
        param = next(target.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.plan = plan or GraphPlan.for_spec(spec, drafter is not None, max_len, buckets)
        # --compile: each captured phase is compiled whole (per bucket); inside it the layers run their
        # eager pieces and inductor fuses across them. Eager fallbacks run the eager pieces too.
        self.compile_phase = kernels.compile_phase
        self.warmup = warmup
        moe = target.config.moe is not None
        if prefill_tokens is None:
            prefill_tokens = default_prefill_tokens(sum(p.numel() for p in target.parameters()), moe)
        self.prefill_tokens = min(prefill_tokens, MOE_PREFILL_TOKENS) if moe else prefill_tokens
        self.kernels = kernels.eager_pieces() if self.compile_phase is not None else kernels
        # A prompt phase captured uncompiled (no --compile-prefill) runs the compiled pieces instead: compiled once
        # for every width, they fuse each RMSNorm, rotary and SwiGLU into one or two kernels, and an eager prefill of
        # SmolLM2 launches ~2,000 kernels, each a few us in a graph (a lone prompt's prefill cost ~3.4 ms).
        self.prompt_kernels = replace(kernels, compile_phase=None) if self.compile_phase is not None else kernels
        self._asked = kernels  # the set asked for: its pieces and phases are what a capture may build
        self._builds = _builds_kernels(kernels)  # of the set asked for: its eager pieces are not ``compiled``
        self.disabled_reason = None if enabled else EAGER_OFF
        if enabled and self.device.type != "cuda":
            self.disabled_reason = EAGER_NO_CUDA
        self.cache: KVCache | None = None  # the static target cache
        self.draft_cache: KVCache | None = None  # the static drafter cache
        self.capture_stats: list[GraphCaptureStats] = []
        self.fallbacks: Counter[tuple[str, str]] = Counter()  # (phase, reason) -> calls
        self._graphs: dict[tuple[str, int, int], _Graph] = {}
        self._state: dict[tuple, torch.Tensor] = {}  # (name, shape[1:], dtype) -> the loop state's static buffer
        self._failed: dict[tuple[str, int, int], str] = {}
        self._parts: dict[tuple, Callable[..., tuple]] = {}  # (phase, part, bucket, fn) -> compiled part
        self._captured = False
        self._pool = None
        self._status: dict[str, str] = {}
        self._foreign = "eager: cache not the graph runner's"
        self._observer: Observer | None = None
        # time spent building fused weights and capturing (compiles included), summed, less the kernels' own
        # set-up (tuning, checks), which :attr:`setup_seconds` adds wherever it happened; kept out of tok/s
        self._setup = prepare_fused(target, drafter, gemv=self.kernels.gemv)

    @property
    def setup_seconds(self) -> float:
        """Set-up so far, kept out of tok/s: fused weights, captures (compiles included), and the GEMV's tuning and
        the decode attention's checks, inside a capture or in an eager phase (a prompt's drafter extend)."""
        return self._setup + kernel_setup_seconds(self.kernels)

    @classmethod
    def for_engine(cls, target: Transformer, spec: SpecConfig, drafter: Drafter | None = None, **kw) -> "CudaGraphRunner":
        """A runner for an Engine given its drafter (an Eagle3Drafter, an NgramDrafter or None)."""
        use = drafter if spec.enabled else None
        net = use.net if use is not None else None
        taps = use.target_taps if use is not None else ()
        return cls(target, net, spec=spec, taps=taps, enabled=spec.cuda_graphs, **kw)

    # ---- static buffers and capture ------------------------------------------------------------
    @property
    def max_batch(self) -> int:
        return max(self.plan.buckets)

    def padded_batch(self, batch: int) -> int:
        """The rows a phase of ``batch`` rows runs on: its batch bucket (pad rows are written like the others:
        the phases of a batch of one write rows 0..bucket-1 of the static caches)."""
        return bucket_for(batch, self.plan.buckets) or batch

    def make_cache(self, batch: int, max_len: int, observer: Observer | None = None) -> KVCache | None:
        """The static target cache for a run of ``batch`` rows needing ``max_len`` slots; None (the
        engine then allocates its own, and the run is eager) when graphs are off or the run does not
        fit. Graphs are captured lazily, on the first call that needs them (a batch-1 run captures
        bucket 1 only); each capture's stats go to ``observer``.
        """
        if self.disabled_reason is not None:
            return None
        if batch > self.max_batch:
            self._foreign = f"eager: batch {batch} above the largest bucket {self.max_batch}"
            return None
        if max_len > self.plan.max_len:
            self._foreign = f"eager: run needs {max_len} cache slots > graph capacity {self.plan.max_len}"
            return None
        self._observer = observer
        if self.cache is None:
            self._allocate_caches()
        return self.cache

    def make_draft_cache(self, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                         history: bool = False) -> KVCache:
        """The static drafter cache when it has this shape (phase graphs bind it), else a new one."""
        own = self.draft_cache
        if own is not None and batch <= own.batch_size and own.max_len == max_len and own.k.shape[2] == kv_heads \
                and own.k.shape[4] == head_dim and own.k.dtype == dtype and (own.tokens is not None) == history:
            return own
        return KVCache(1, batch, kv_heads, max_len, head_dim, dtype=dtype, device=self.device, history=history)

    @torch.inference_mode()
    def capture(self) -> list[GraphCaptureStats]:
        """Allocate the static caches and capture every planned graph (once). Returns the stats."""
        if self._captured or self.disabled_reason is not None:
            return self.capture_stats
        self._captured = True
        if self.cache is None:
            self._allocate_caches()
        for b in sorted(self.plan.buckets, reverse=True):  # largest first: it sizes the shared pool
            for name, width in self._planned():
                if (name, b, width) not in self._graphs and (name, b, width) not in self._failed:
                    self._capture_one(name, b, width)
        return self.capture_stats

    def _planned(self) -> list[tuple[str, int]]:
        p = self.plan
        out = [("decode", 1)] if p.decode else []
        out += [("verify", n) for n in p.verify_tokens]
        if p.draft_width and self.drafter is not None:
            out += [("draft", p.draft_width), ("draft_extend", p.extend_width)]
        return out

    def _allocate_caches(self) -> None:
        B = self.max_batch
        self.cache = self.target.make_cache(B, self.plan.max_len, dtype=self.dtype, device=self.device)
        if self.drafter is not None:
            dc = self.drafter.config
            self.draft_cache = KVCache(1, B, dc.num_kv_heads, draft_cache_len(self.plan.max_len, self.spec),
                                       dc.head_dim, dtype=self.drafter.fc.weight.dtype, device=self.device,
                                       history=self.spec.lookup_tokens > 0)

    def _static_inputs(self, name: str, b: int, T: int) -> dict[str, torch.Tensor]:
        dev = self.device
        S = self.cache.max_len if name in ("decode", "verify") else self.draft_cache.max_len  # type: ignore[union-attr]
        ins = {"tokens": torch.zeros(b, T, dtype=torch.long, device=dev)}  # [b, T]
        if name != "decode":
            ins["positions"] = torch.zeros(b, T, dtype=torch.long, device=dev)  # [b, T]
        ins["slots"] = torch.zeros(b, T, dtype=torch.long, device=dev)  # [b, T]
        ins["mask"] = torch.zeros(b, T, S, dtype=torch.bool, device=dev)  # [b, T, S]
        ins["mask"][..., 0] = True
        if name.startswith("draft"):
            H = self.drafter.config.hidden_size
            ins["feats"] = torch.zeros(b, T, H, dtype=self.drafter.fc.weight.dtype, device=dev)  # [b, T, H]
        return ins

    def _forward_fn(self, name: str, ins: dict[str, torch.Tensor]) -> Callable[[], tuple]:
        k = self.kernels
        if name == "decode":
            return lambda: (self.target(ins["tokens"], ins["slots"], self.cache, ins["slots"], ins["mask"], kernels=k)[0],)
        if name == "verify":
            return lambda: self.target(ins["tokens"], ins["positions"], self.cache, ins["slots"], ins["mask"], self.taps,
                                       kernels=k)
        return lambda: self.drafter(ins["tokens"], ins["feats"], ins["positions"], self.draft_cache, ins["slots"],
                                    ins["mask"], kernels=k)

    def _capture_one(self, name: str, b: int, T: int) -> None:
        ins = self._static_inputs(name, b, T)
        cache = self.cache if name in ("decode", "verify") else self.draft_cache
        eager = self._forward_fn(name, ins)
        run = self._compiled(f"{name} [b={b}, T={T}]", eager)
        self._capture((name, b, T), name, b, ins, run, (cache,), None if run is eager else eager)

    def _compiled_phase(self, name: str, b: int, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        """A phase compiled for bucket ``b``: whole, or part by part (:class:`PhaseParts`; a part already
        compiled for this bucket, by another graph of the same phase, is reused)."""
        if not isinstance(fn, PhaseParts) or self.compile_phase is None:
            return self._compiled(f"{name} [b={b}]", fn)

        def part(key: str, f: Callable[..., tuple]) -> Callable[..., tuple]:
            if (name, key, b, f) not in self._parts:
                self._parts[(name, key, b, f)] = self._compiled(f"{name}.{key} [b={b}]", f)
            return self._parts[(name, key, b, f)]
        return fn.with_parts(part)

    def _compiled(self, label: str, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        """``fn`` compiled whole (static shapes) under --compile, else ``fn`` itself."""
        return fn if self.compile_phase is None else self.compile_phase(label, fn)

    def _capture(self, key: tuple, name: str, b: int, ins: dict[str, torch.Tensor], fn: Callable[[], tuple],
                 caches: tuple[KVCache | None, ...], eager: Callable[[], tuple] | None = None,
                 state: tuple[torch.Tensor, ...] = ()) -> None:
        """Capture ``fn`` (reading the static inputs ``ins``) under ``key``; a failure is kept as a reason.
        ``eager`` is ``fn``'s uncompiled original when ``fn`` is compiled (see :meth:`_record`).

        Warm-up runs write into ``caches`` (rows < b) and ``state`` (the loop state's rows < b): those
        are saved before and restored after, so a capture in the middle of a run (lazy capture) leaves
        the run's state as it was.
        """
        mem0, t0, kernels0 = self._reserved(), time.perf_counter(), kernel_setup_seconds(self.kernels)
        built0 = self._built()
        tp = self.target.tp
        saved = [(c, c.k[:, :b].clone(), None if c.v is None else c.v[:, :b].clone())  # MLA caches hold no V
                 for c in caches if c is not None]
        kept = [(t, t.clone()) for t in state]
        try:
            # Under TP, all-reduces captured here get CUDA events captured with them (timed per replay).
            with tp.capture(key) if tp is not None else contextlib.nullcontext():
                graph, outputs = self._record(fn, eager)
        except RuntimeError as exc:
            self._failed[key] = f"eager: capture failed ({str(exc).splitlines()[0][:120]})"
            return
        finally:
            for c, k, v in saved:
                c.k[:, :b].copy_(k)
                if v is not None:
                    c.v[:, :b].copy_(v)
            for t, old in kept:
                t.copy_(old)
            if self._builds and (built0 is None or self._built() != built0):
                # a compile (or the Triton kernels' tuning) leaves hundreds of thousands of Python objects behind:
                # collected here (set-up time) they are old, and no collection inside the generation loop walks
                # them (one full collection costs ~0.1-1 s: several whole requests of a small model). A capture
                # that built nothing (a prompt width's eager prefill, after the compiles) leaves a few objects:
                # a full collection there would walk the whole heap again (~1 s each on a cold bench) for nothing
                gc.collect()
            if tp is not None:  # ranks finish a capture at different times: meet here (set-up time), not
                tp.check(f"capture of {name} graph")  # at the next replay's first collective (skew)
            self._setup += time.perf_counter() - t0 - (kernel_setup_seconds(self.kernels) - kernels0)
        on_replay = (lambda: tp.replayed(key)) if tp is not None else None
        self._graphs[key] = _Graph(ins, tuple(outputs), graph, on_replay, keep=(fn, eager))
        stats = GraphCaptureStats(
            name=name, batch_size=b, seconds=time.perf_counter() - t0, memory_bytes=max(0, self._reserved() - mem0),
        )
        self.capture_stats.append(stats)
        if self._observer is not None:
            self._observer.on_graph_captured(stats)

    def _built(self) -> tuple[float, int] | None:
        """What kernel building has happened so far: the Triton kernels' set-up seconds, and how many compiled
        callables made their first call; None when the compiler cannot tell (then every capture counts as built)."""
        tried = compiles_tried(self._asked)  # its compiled pieces (an uncompiled prompt's) and phases
        return None if tried is None else (kernel_setup_seconds(self.kernels), tried)

    def _reserved(self) -> int:
        """Device memory reserved by the caching allocator (graph pools included), after a sync."""
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_reserved(self.device)

    def _record(self, fn: Callable[[], tuple], eager: Callable[[], tuple] | None = None):
        """Warm ``fn`` up on a side stream, then capture it into the shared pool. -> (graph, outputs).

        A compiled ``fn`` first runs ``eager`` (lazy state such as fused weights is built outside the
        compiler), then compiles (or loads) on its first call, before sync detection: compilers may sync.
        """
        dev = self.device
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        try:
            with torch.cuda.stream(stream), dependent_launches(self._asked.pdl):
                if eager is not None:
                    eager()
                if eager is not None or self._builds:
                    fn()  # compiles (or loads) the kernels (an uncompiled prompt's compiled pieces too), tunes the
                    # GEMV, checks the decode attention: all may sync, so before sync detection
                _warm_up(fn, self.warmup)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # No garbage collection inside the capture: one there may free a graph of another runner (an earlier
            # engine's, in a reference cycle), and that graph's reset is illegal while a stream captures: it ends
            # this capture with an error and the phase falls back to eager for good (seen on the H200, 2026-12-04)
            collecting = gc.isenabled()
            gc.disable()
            try:
                with torch.cuda.graph(graph, pool=self._pool, stream=stream), dependent_launches(self._asked.pdl):
                    outputs = fn()
            finally:
                if collecting:
                    gc.enable()
        finally:
            torch.cuda.synchronize(dev)
        return graph, outputs

    # ---- replay or fall back -------------------------------------------------------------------
    def _why_eager(self, name: str, batch: int, T: int, cache: KVCache, own: KVCache | None) -> str | None:
        if self.disabled_reason is not None:
            return self.disabled_reason
        if batch > self.max_batch:
            return f"eager: batch {batch} above the largest bucket {self.max_batch}"
        if own is None or cache is not own:
            return self._foreign
        key = (name, bucket_for(batch, self.plan.buckets), T)
        if key in self._failed:
            return self._failed[key]
        if key not in self._graphs and (name, T) in self._planned():
            self._capture_one(name, key[1], T)  # lazily: only the buckets a run needs
            return self._failed.get(key)
        if key not in self._graphs:
            return f"eager: {name} shape [B, {T}] not captured"
        return None

    def _run(self, name: str, phase: str, cache: KVCache, own: KVCache | None, values: dict, eager: Callable[[], tuple]):
        batch, T = values["tokens"].shape
        reason = self._why_eager(name, batch, T, cache, own)
        self._status[phase] = reason or REPLAY
        if reason is not None:
            self.fallbacks[(phase, reason)] += 1
            return eager()
        return self._graphs[(name, bucket_for(batch, self.plan.buckets), T)].run(values, batch)

    def _why_eager_phase(self, batch: int, caches: tuple[KVCache, ...]) -> str | None:
        if self.disabled_reason is not None:
            return self.disabled_reason
        if batch > self.max_batch:
            return f"eager: batch {batch} above the largest bucket {self.max_batch}"
        if self.cache is None or any(c is not self.cache and c is not self.draft_cache for c in caches):
            return self._foreign
        return None

    def phase(self, name: str, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
              caches: tuple[KVCache, ...] = (), variant: Hashable = None,
              state: dict[str, torch.Tensor] | None = None, eager: str | None = None,
              compile: bool = True) -> tuple:
        """A whole phase ``fn(**inputs, **state) -> tuple of [B, ...] tensors`` as ONE graph per batch bucket.

        ``fn`` may only read ``inputs`` (batch-major tensors, copied into the graph's buffers) and fixed
        state, and write ``caches`` (this runner's static caches) and ``state`` (from :meth:`make_state`:
        bound, updated in place by the replay, never copied); ``variant`` names what else ``fn`` depends
        on (sampling settings, tree shape). Captured on first use (per batch bucket and per-row input
        shapes), replayed after; eager, with the reason, where it cannot replay or ``eager`` says so.
        Under --compile it is compiled before capture unless ``compile`` is False.
        """
        state = state or {}
        batch = next(iter({**inputs, **state}.values())).shape[0]
        reason = eager or self._why_eager_phase(batch, caches) or self._why_eager_state(state)
        key: tuple = ()
        if reason is None:
            b = bucket_for(batch, self.plan.buckets)
            assert b is not None
            key = ("phase", name, b, variant, _shapes(inputs), _shapes(state))
            if key not in self._graphs and key not in self._failed:
                ins = _static_copy(inputs, b)
                bound = {k: self._state[_state_key(k, v)][:b] for k, v in state.items()}
                run = self._compiled_phase(name, b, fn) if compile else fn
                self._capture(key, name, b, ins, lambda: tuple(run(**ins, **bound)), caches,
                              None if run is fn else lambda: tuple(fn(**ins, **bound)), tuple(bound.values()))
            reason = self._failed.get(key)
        self._status[name] = reason or REPLAY
        if reason is not None:
            self.fallbacks[(name, reason)] += 1
            return tuple(fn(**inputs, **state))
        return self._graphs[key].run(inputs, batch)

    def make_state(self, values: dict[str, torch.Tensor], cache: KVCache) -> dict[str, torch.Tensor]:
        """The loop's per-row state (each [B, ...]) in static buffers of ``max_batch`` rows that the
        phases' graphs bind: views of their first B rows holding ``values``; the rows after are pad
        rows (zeros, "done" True: they emit nothing and never move). ``values`` themselves when the run
        is not on the static ``cache`` (:meth:`make_cache` said no: graphs off, the batch above the
        largest bucket, or the run longer than the static cache): its phases run eagerly, and a buffer
        sized by such a run (``out`` is as wide as its cache) would be kept, and captured, once per size."""
        batch = next(iter(values.values())).shape[0]
        if cache is not self.cache:
            return values
        out = {}
        for name, v in values.items():
            key = _state_key(name, v)
            if key not in self._state:
                self._state[key] = torch.empty((self.max_batch, *v.shape[1:]), dtype=v.dtype, device=v.device)
            buf = self._state[key]
            buf[:batch].copy_(v)
            _pad_rows(name, buf[batch:])
            out[name] = buf[:batch]
        return out

    def _why_eager_state(self, state: dict[str, torch.Tensor]) -> str | None:
        for name, v in state.items():
            buf = self._state.get(_state_key(name, v))
            if buf is None or v.data_ptr() != buf.data_ptr():
                return "eager: loop state not the graph runner's"
        return None

    def _eager_status(self, phase: str, reason: str) -> None:
        self._status[phase] = reason
        self.fallbacks[(phase, reason)] += 1

    # ---- the runner interface ------------------------------------------------------------------
    def prefill_width(self, batch: int, prompt_len: int, cache: KVCache) -> tuple[int, str | None]:
        """Pad to :func:`prefill_bucket` and replay a graph per (batch bucket, width), on this runner's
        static caches, up to ``prefill_tokens`` tokens; else the prompt's own width, eagerly, and why."""
        reason = self._why_eager_phase(batch, (cache,))
        if reason is not None:
            return prompt_len, reason
        width = prefill_bucket(prompt_len)
        if bucket_for(batch, self.plan.buckets) * width > self.prefill_tokens or width > cache.max_len:
            return prompt_len, EAGER_PREFILL
        return width, None

    def decode(self, cache: KVCache, tokens, slots, mask):
        """One token per row at slot = position. -> hidden [B, 1, H]."""
        values = {"tokens": tokens, "slots": slots, "mask": mask}
        eager = lambda: (self.target(tokens, slots, cache, slots, mask)[0],)  # noqa: E731
        return self._run("decode", "decode", cache, self.cache, values, eager)[0]

    def verify(self, cache: KVCache, tokens, positions, slots, mask, taps):
        """Fixed-shape tree verify over the whole cache (attention mode ``decode``)."""
        values = {"tokens": tokens, "positions": positions, "slots": slots, "mask": mask}
        eager = lambda: self.target(tokens, positions, cache, slots, mask, taps)  # noqa: E731
        if tuple(taps) != self.taps:
            self._eager_status("verify", f"eager: taps {tuple(taps)} differ from the captured {self.taps}")
            return eager()
        hidden, aux = self._run("verify", "verify", cache, self.cache, values, eager)
        return hidden, aux

    def verify_extend(self, cache: KVCache, tokens, positions, slots, mask, taps, kv_len: int):
        """Extend-style verify over the used prefix only (attention mode ``prefill``); never captured."""
        self._eager_status("verify", self.disabled_reason or EAGER_EXTEND)
        return self.target(tokens, positions, cache, slots, mask, taps, kv_len=kv_len)

    def draft(self, name: str, cache: KVCache, tokens, feats, positions, slots, mask):
        """A drafter forward (``name``: "draft" or "draft_extend"), on the static drafter cache
        whenever it has the proposer's cache's shape. -> (hidden, draft logits)."""
        own = self._own_draft_cache(cache, tokens.shape[0])
        use = own if own is not None else cache
        values = {"tokens": tokens, "feats": feats, "positions": positions, "slots": slots, "mask": mask}
        eager = lambda: self.drafter(tokens, feats, positions, use, slots, mask)  # noqa: E731
        hidden, logits = self._run(name, name, use, own, values, eager)
        return hidden, logits

    def _own_draft_cache(self, cache: KVCache, batch: int) -> KVCache | None:
        """The static drafter cache when it can stand in for ``cache`` (same slots, enough rows)."""
        own = self.draft_cache
        if own is None or batch > own.batch_size or cache.max_len != own.max_len:
            return None
        if cache.k.shape[2:] != own.k.shape[2:] or cache.k.dtype != own.k.dtype:
            return None
        return own

    def graph_status(self, kind: str, attention_mode: str, batch: int) -> dict[str, str]:
        """Per phase of the cycle just run: "replay" or "eager: <reason>" (the last call of each phase;
        every phase of a cycle runs each cycle, so reading does not reset it)."""
        out = {}
        for phase in FORWARD_PHASES[kind]:
            default = EAGER_HOST_DRAFTER if phase.startswith("draft") and self.drafter is None else EAGER_NO_FORWARD
            out[phase] = self._status.get(phase, self.disabled_reason or default)
        return out


def _shapes(tensors: dict[str, torch.Tensor]) -> tuple:
    """What a phase's graph depends on of its tensors: names, per-row shapes, dtypes."""
    return tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in tensors.items())


def _state_key(name: str, v: torch.Tensor) -> tuple:
    return (name, tuple(v.shape[1:]), v.dtype)


def _warm_up(fn: Callable[[], tuple], iterations: int) -> None:
    """Run ``fn`` with host-sync detection on: a forward that syncs raises here, not mid-capture."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # torch warns that the mode is a prototype: nothing a user can act on
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(iterations):
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _builds_kernels(kernels: Kernels) -> bool:
    """Whether a phase's first call compiles, tunes or checks kernels (torch.compile, the Triton GEMV or decode
    attention), which happens on the capture's warm-up."""
    return kernels.compiled or kernels.gemv is not None or kernels.attention is not None
