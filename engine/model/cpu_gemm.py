"""A C kernel for the few-row float32 matmuls of a CPU decode and verify: ``y [M, N] = x [M, K] @ W [N, K]^T``
for M <= 256 rows (a decode, a verify of a few tree nodes, and a prompt of up to 256 tokens).

Why: at M = 1 a projection streams every weight once (memory-bound); MKL's GEMM for M = 4 rows, in either
weight layout, prepacked or split into column blocks, ran at ~1.4-1.6x the time of one row on a 2-core
Xeon (``benchmarks/cpu_verify.py``), so a verify of 4 tree nodes cost far more than a decode although it
reads the same bytes. Here the weight is kept packed as ``[ceil(N/64), K, 64]`` (64 output columns per block,
each block one contiguous stream) and each block is multiplied by up to 4 rows of x at a time, the 4 x 4
vector accumulators in registers (AVX-512; with AVX2's 16 registers, a chunk of the block's columns a pass):
one pass over the weight serves every row, so 4 rows cost about what one costs. Each row's sum runs over k in
the same order whatever M is, so a row's result does not depend on the other rows in the call (the decode and
the verify of the same token get the same projections). With more rows it stays as fast as MKL (measured up to
512 rows on the same machine), so a short prompt's prefill takes it too; past ``MAX_ROWS`` the rows of x no
longer fit the cache beside a block and MKL's tiled GEMM runs instead.

The kernel is built once per machine with the system C compiler (``cc -O3 -march=native -fopenmp``; the
shared object is cached under the eaglelab cache, keyed by the source, the flags and the CPU) and loaded
with ctypes. It runs its OpenMP loop on the OpenMP runtime torch has already loaded (the same
``libgomp.so.1``), over ``torch.get_num_threads()`` threads. Without a compiler, or where the built kernel
does not reproduce ``F.linear`` on a check, it is off with the reason and the projections run on MKL.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median_high
from typing import Callable

import torch
import torch.nn.functional as F

MAX_ROWS = 256  # rows (M) the kernel takes; more rows (a long prompt) are a tiled GEMM's job
BLOCK = 64  # output columns per packed block (4 vectors of 16 floats)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

SOURCE = r"""
#include <string.h>
#ifdef __AVX512F__
#define L 16        /* floats per vector register */
#else
#define L 8
#endif
typedef float vf __attribute__((vector_size(4 * L)));
typedef unsigned short vh __attribute__((vector_size(2 * L)));
typedef unsigned int vu __attribute__((vector_size(4 * L)));
#define W 64        /* columns per packed block */
#define V (W / L)   /* vectors per block row */
#define PF 16       /* block rows prefetched ahead */
/* C: vectors of a block row one pass over k serves, so that R rows x C accumulators, C weight vectors and a
   broadcast fit the vector registers. AVX-512's 32 hold a whole block row (4 x 4 + 4); AVX2's 16 hold 8, 4, 2, 2
   of a block row's 8 vectors for R = 1 .. 4, the block then passed over once per chunk of C (each pass reads its
   own cache lines: the weight is still read once). Accumulators that do not fit spill to the stack on every k:
   a 4 x 4 tile of 512-bit vectors on AVX2 took 2.5x MKL's time at 4 rows, 10x at 40 (one SmolLM2 layer). */
#if L == 16
#define CHUNK(R) V
#else
#define CHUNK(R) ((R) == 1 ? 8 : (R) == 2 ? 4 : 2)
#endif

static inline vf load_f32(const float* p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline vf load_bf16(const unsigned short* p) {  /* bf16 bits -> float32, exactly */
  vh h; memcpy(&h, p, sizeof h);
  vu bits = __builtin_convertvector(h, vu) << 16;
  vf v; memcpy(&v, &bits, sizeof v); return v;
}

/* One packed block (K rows of W columns of type T) times R rows of x -> y[r, :n], n <= W: for each chunk of C
   vectors, one pass over k. */
#define BLOCK(NAME, T, LOAD, R)                                                               \
static void NAME##R(const float* x, int K, const T* w, float* y, int ldy, int n) {           \
  enum { C = CHUNK(R) };                                                                      \
  float t[R][W];                                                                              \
  for (int c0 = 0; c0 < V; c0 += C) {                                                         \
    vf acc[R][C];                                                                             \
    for (int r = 0; r < R; ++r) for (int c = 0; c < C; ++c) acc[r][c] = (vf){0};             \
    for (int k = 0; k < K; ++k) {                                                             \
      const T* wk = w + (size_t)k * W + L * c0;                                               \
      for (int b = 0; b < C * L * (int)sizeof(T); b += 64)  /* each cache line of the chunk */ \
        __builtin_prefetch((const char*)(wk + PF * W) + b);                                   \
      vf u[C];                                                                                \
      for (int c = 0; c < C; ++c) u[c] = LOAD(wk + L * c);                                    \
      for (int r = 0; r < R; ++r) {                                                           \
        float s = x[(size_t)r * K + k];                                                       \
        for (int c = 0; c < C; ++c) acc[r][c] += s * u[c];                                    \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < R; ++r) memcpy(&t[r][L * c0], acc[r], sizeof acc[r]);                \
  }                                                                                           \
  for (int r = 0; r < R; ++r) memcpy(y + (size_t)r * ldy, t[r], (size_t)n * sizeof(float));  \
}

#define FEW_ROWS(NAME, T, LOAD)                                                               \
BLOCK(NAME, T, LOAD, 1) BLOCK(NAME, T, LOAD, 2) BLOCK(NAME, T, LOAD, 3) BLOCK(NAME, T, LOAD, 4) \
void few_rows_##NAME(const float* x, int M, int K, const T* w, float* y, int N, int threads) { \
  int blocks = (N + W - 1) / W;                                                               \
  _Pragma("omp parallel for num_threads(threads) schedule(static)")                           \
  for (int j = 0; j < blocks; ++j) {                                                          \
    const T* wj = w + (size_t)j * K * W;                                                      \
    int n = N - j * W < W ? N - j * W : W;                                                    \
    for (int r = 0; r < M; r += 4) {                                                          \
      const float* xr = x + (size_t)r * K;                                                    \
      float* yr = y + (size_t)r * N + (size_t)j * W;                                          \
      switch (M - r < 4 ? M - r : 4) {                                                        \
        case 1: NAME##1(xr, K, wj, yr, N, n); break;                                          \
        case 2: NAME##2(xr, K, wj, yr, N, n); break;                                          \
        case 3: NAME##3(xr, K, wj, yr, N, n); break;                                          \
        default: NAME##4(xr, K, wj, yr, N, n);                                                \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
}

FEW_ROWS(f32, float, load_f32)
FEW_ROWS(bf16, unsigned short, load_bf16)
"""


@dataclass(frozen=True)
class Packed:
    """A weight [N, K] in the kernel's layout: ``data`` [ceil(N/64), K, 64], zero-padded past N; bfloat16 when
    every weight is a bfloat16 value (a bf16 checkpoint run in float32: the same numbers in half the bytes)."""

    data: torch.Tensor
    n: int


def pack(weight: torch.Tensor) -> Packed:
    """weight [N, K] float32 (``nn.Linear``'s layout) -> :class:`Packed`. Example: N = 96, K = 8 -> data
    [2, 8, 64], column 70 of data[1] all zeros; ``data[j, k, c] == weight[64 j + c, k]``."""
    N, K = weight.shape
    blocks = -(-N // BLOCK)
    exact_bf16 = torch.equal(weight.bfloat16().float(), weight)  # lossless in half the bytes
    padded = torch.zeros(blocks * BLOCK, K, dtype=torch.bfloat16 if exact_bf16 else weight.dtype, device=weight.device)
    padded[:N] = weight
    return Packed(padded.t().reshape(K, blocks, BLOCK).permute(1, 0, 2).contiguous(), N)


class CpuGemm:
    """The few-row kernel a CPU forward uses (``Kernels.gemv``): ``gemm(x2 [M, K], packed, bias) -> [M, N]``.

    ``layout``/``pack``: the weight copy :class:`~eaglelab.engine.model.layers.FusedLinear` keeps for it.
    ``reason``: why it is off (None: on); ``setup_seconds``: building or loading it (kept out of tok/s).
    """

    layout = "packed64"

    def __init__(self, cache_root: Path, log: Callable[[str], None] | None = None, compiler: str | None = None) -> None:
        t0 = time.perf_counter()
        self._fns: dict[torch.dtype, Callable] = {}  # the packed weights' dtype -> entry point
        self.reason: str | None = None
        try:
            self._fns = _load(build(cache_root / "kernels", compiler, log))
            self.reason = _self_check(self)
        except KernelBuildError as exc:
            self.reason = f"few-row CPU kernel off ({exc}): MKL instead"
        if self.reason is not None:
            self._fns = {}
            if log is not None:
                log(self.reason)
        self.setup_seconds = time.perf_counter() - t0

    def pack(self, weight: torch.Tensor) -> Packed:
        return pack(weight)

    def refusal(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """Why ``x [..., K] @ weight [N, K]^T`` does not take the kernel (None: it does). Runs before every
        projection: the cheap checks first."""
        if self.reason is not None:
            return self.reason
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return f"dtypes {x.dtype}/{weight.dtype} (the kernel takes float32)"
        if not (x.is_cpu and weight.is_cpu):
            return f"not on the CPU (device {x.device.type})"
        rows = x.numel() // max(x.shape[-1], 1)
        if not 1 <= rows <= MAX_ROWS:
            return f"{rows} rows (the kernel takes 1..{MAX_ROWS})"
        if torch.is_grad_enabled():
            return "gradients on (the kernel has no backward)"
        return None

    def __call__(self, x: torch.Tensor, weight: Packed, bias: torch.Tensor | None,
                 sums_fused: bool = False, readers: int = 1) -> torch.Tensor:
        """x [M, K] float32, weight packed from [N, K] -> [M, N] (+ bias); ``sums_fused`` and ``readers`` change
        nothing here (the C kernel adds its own sums)."""
        x = x.contiguous()
        (M, K), N, data = x.shape, weight.n, weight.data
        assert data.shape[1] == K, f"x has K = {K}, the packed weight {data.shape[1]}"
        fn = self._fns[data.dtype]  # a KeyError here: called while off (self.reason says why)
        if torch.autograd.profiler._is_profiler_enabled:  # profiled: an operator the trace and its views show
            y = torch.ops.eaglelab.cpu_gemm(x, data, N, ctypes.cast(fn, ctypes.c_void_p).value)
        else:  # torch's dispatcher costs more than the ctypes call itself
            y = torch.empty(M, N, dtype=torch.float32)
            fn(x.data_ptr(), M, K, data.data_ptr(), y.data_ptr(), N, torch.get_num_threads())
        return y if bias is None else y.add_(bias)


_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int, ctypes.c_int)


@torch.library.custom_op("eaglelab::cpu_gemm", mutates_args=())
def _profiled_call(x: torch.Tensor, packed: torch.Tensor, n: int, fn: int) -> torch.Tensor:
    """The kernel at address ``fn`` as a torch operator (what a profiled call runs, so the Operator view of a
    trace lists it): x [M, K] float32, packed [blocks, K, 64] -> [M, n]."""
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    _SIGNATURE(fn)(x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), y.data_ptr(), n, torch.get_num_threads())
    return y


class KernelBuildError(RuntimeError):
    """The kernel could not be built or loaded here (the message says why, in one line)."""


def build(out_dir: Path, compiler: str | None = None, log: Callable[[str], None] | None = None) -> Path:
    """The shared object for this machine: cached in ``out_dir`` (keyed by source, flags, compiler and CPU),
    else compiled now with ``compiler`` (default ``$CC``, else ``cc``). Raises KernelBuildError."""
    cc = compiler or os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise KernelBuildError(f"no C compiler: '{cc}' not found")
    key = hashlib.sha256("\0".join([SOURCE, *FLAGS, _compiler_version(cc), _cpu_id()]).encode()).hexdigest()[:16]
    lib = out_dir / f"few_rows_{key}.so"
    if lib.exists():
        return lib
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelBuildError(f"cannot write its cache folder {out_dir} ({exc.strerror or type(exc).__name__})") from None
    if log is not None:
        log(f"building the few-row CPU kernel with {cc} (once per machine) ...")
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = Path(tmp) / "few_rows.c", Path(tmp) / "few_rows.so"
        src.write_text(SOURCE)
        try:
            done = subprocess.run([cc, *FLAGS, str(src), "-o", str(obj)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelBuildError(f"{cc} failed to run: {type(exc).__name__}") from None
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:120])
            raise KernelBuildError(f"{cc} failed: {first.strip()[:160]}")
        try:
            os.replace(obj, lib)  # atomic: a concurrent build writes the same bytes
        except OSError as exc:
            raise KernelBuildError(f"cannot write {lib} ({exc.strerror or type(exc).__name__})") from None
    return lib


def _load(lib: Path) -> dict[torch.dtype, Callable]:
    """The kernel's entry points from ``lib`` (after torch, so its OpenMP runtime is the one already loaded),
    by the dtype of the packed weights they read."""
    try:
        so = ctypes.CDLL(str(lib))
    except OSError as exc:
        raise KernelBuildError(f"cannot load {lib.name}: {str(exc).splitlines()[0][:120]}") from None
    c_int, ptr = ctypes.c_int, ctypes.c_void_p
    fns = {torch.float32: so.few_rows_f32, torch.bfloat16: so.few_rows_bf16}
    for fn in fns.values():
        fn.argtypes = [ptr, c_int, c_int, ptr, ptr, c_int, c_int]
        fn.restype = None
    return fns


def _self_check(gemm: CpuGemm) -> str | None:
    """Run the built kernel, float32 and bfloat16 weights, on every row count and a ragged N against F.linear
    (None: it agrees)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 72, generator=g)  # N not a multiple of the block, K not of the vector
    for weight in (w, w.bfloat16().float()):
        packed = pack(weight)
        with torch.no_grad():
            for m in (1, 2, 3, 4, 5, 9, MAX_ROWS):
                x = torch.randn(m, 72, generator=g)
                err = (gemm(x, packed, None) - F.linear(x, weight)).abs().max().item()
                if not err <= 1e-4:
                    return (f"few-row CPU kernel off ({str(packed.data.dtype).removeprefix('torch.')} weights, M = {m}: "
                            f"max |error| {err:.3g} against F.linear): MKL instead")
    return None


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _cpu_id() -> str:
    """What -march=native compiles for: the CPU's model and flags (Linux), else the platform's name."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags")
    return "\n".join(sorted({ln for ln in info.splitlines() if ln.split(":")[0].strip() in wanted}))


@dataclass(frozen=True)
class Timed:
    """A few rows through a model's projections (one: a plain decode step's matmuls; a verify's rows), timed on the
    kernel and on MKL as the layers run it without the kernel (``x @ W^T`` on a transposed copy): milliseconds,
    medians of the passes."""

    kernel_ms: float
    mkl_ms: float

    @property
    def kernel_faster(self) -> bool:
        return self.kernel_ms < self.mkl_ms


def time_rows(gemm: CpuGemm, weights: list[torch.Tensor], rows: tuple[int, ...] = (1,), passes: int = 5,
              clock: Callable[[], float] = time.perf_counter, max_bytes: int = 64 << 20) -> tuple[Timed, ...]:
    """Time ``x [r, K] @ W^T`` for each row count ``r`` of ``rows`` and every weight ``W [N, K]`` of ``weights`` (a
    model's fused projections, in the order a decode runs them) on the kernel and on MKL, interleaved pass by pass
    after one untimed pass, every row count in each pass over one packing of the weights; each shape is timed once
    and counted as often as it occurs. Both read the weights as the layers keep them (packed, or transposed), so what
    the kernel saves by reading bfloat16-exact weights as bfloat16 counts. A weight of more than ``max_bytes`` is
    timed on its first outputs (both read the weight as one stream, so the time scales with N) and counted in
    proportion: a large model's head costs no second full copy and no seconds here. -> one :class:`Timed` a row count.

    Example: a 30-layer model has 30 weights of each layer shape and one head: 5 shapes timed, not 121."""
    shapes: dict[tuple[int, int], list] = {}
    for w in weights:
        if w.dtype == torch.float32 and w.dim() == 2:
            shapes.setdefault(tuple(w.shape), [w, 0])[1] += 1
    if not shapes:
        return tuple(Timed(0.0, 0.0) for _ in rows)
    g = torch.Generator().manual_seed(0)
    work = []
    for w, n in shapes.values():
        kept = min(w.shape[0], max(BLOCK, max_bytes // (4 * w.shape[1]) // BLOCK * BLOCK))
        part = w[:kept]
        xs = [torch.randn(r, w.shape[1], generator=g) for r in rows]
        work.append((gemm.pack(part), part.t().contiguous(), xs, n * w.shape[0] / kept))
    kernel: list[list[float]] = [[] for _ in rows]
    mkl: list[list[float]] = [[] for _ in rows]
    with torch.no_grad():
        for i in range(passes + 1):
            for c in range(len(rows)):
                k = m = 0.0
                for packed, wt, xs, n in work:
                    t0 = clock()
                    gemm(xs[c], packed, None)
                    t1 = clock()
                    xs[c] @ wt
                    t2 = clock()
                    k, m = k + n * (t1 - t0), m + n * (t2 - t1)
                if i:  # the first pass warms caches and the OpenMP pool
                    kernel[c].append(k * 1e3)
                    mkl[c].append(m * 1e3)
    return tuple(Timed(median_high(k), median_high(m)) for k, m in zip(kernel, mkl))
