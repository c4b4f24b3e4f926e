"""A Triton matrix-vector kernel for the decode's skinny matmuls: ``y [M, N] = x [M, K] @ W [N, K]^T (+ b)``
for a few rows (M <= 256, :data:`MAX_ROWS`: a decode at batch <= 256, a verify of a batch's trees, a short prompt),
bf16/fp16 in and out, float32 accumulation, W row-major as ``nn.Linear`` stores it.

At M = 1 a decode step reads every weight once and does two flops per weight byte pair: its speed is the memory
bandwidth, and cuBLAS/inductor's GEMMs, tiled for large M, leave part of it unused. Here each program streams a
block of ``block_n`` weight rows over K (optionally a 1/``split_k`` share of K, the float32 shares then added by the
block's last program in the same launch, in a fixed order: results do not vary run to run), multiplying by the x
rows it keeps in registers: M = 1 as a multiply-and-row-sum, M > 1 as a tensor-core dot of the rows padded to 16, 32
or 64 (past 64 rows, blocks of 64 rows, a program each), or (tilings of fewer than 16 weight rows) the same
multiply-and-sum for every row on the CUDA cores, which keeps a decode's many small programs. A few tilings are
timed once per (N, K, M bucket) on the first eager call and the fastest is kept, or F.linear where cuBLAS beats
every tiling (:class:`TritonGemv`); compiled and captured calls reuse that choice. Past 16 rows a GEMM starts to
pay, so there the tuner is the judge: a bucket of 32 to 256 rows where no tiling runs keeps F.linear for that shape
only.

Inside a compiled phase a split tiling's shares need not be added by the kernel: a call whose output only
compiled elementwise code reads (``sums_fused``: a projection followed by a norm, a residual add, the rotary, the
SwiGLU) takes ``torch.ops.eaglelab.gemv_shares``, which writes the float32 shares [S, M, N] and ends there, and adds
them in Python (:func:`add_shares`), which inductor folds into the kernel that reads the output: no ticket, no
last program's pass over the shares, no extra launch (:data:`SHARES`). Eager calls, and calls whose output leaves
the compiled code (the heads' logits), add them in the kernel as before; so does a tiling of more shares than
inductor folds into each of several readers (q/k/v, gate/up: :func:`reader_adds`).

The kernel is a PyTorch custom op (``torch.ops.eaglelab.gemv``, with a shape-only fake implementation)
so it composes with ``torch.compile(fullgraph=True)`` and CUDA-graph capture. Triton is optional: it is
imported on first use only (``gemv_kernels.py``; the tiling arithmetic both use is ``gemv_tiling.py``), and without it (or without CUDA) the kernel is
unavailable with a reason.
"""

from __future__ import annotations

import functools
import importlib.metadata
import time
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from eaglelab.engine.model.gemv_tiling import KERNEL_ROWS, GemvConfig, fits_registers, splits
from eaglelab.engine.model.pdl import dependent_launches
from eaglelab.engine.model.triton_ops import DTYPES, capturing, first_line, time_in_turn, unavailable
from eaglelab.engine.model.triton_ops import dtype_refusal as kernel_dtype_refusal

# The rows a call may have to take the GEMV (at most KERNEL_ROWS; the tuner still keeps cuBLAS per shape where it is
# faster). The whole range since it was measured against cuBLAS past 64 rows on one H100 (SmolLM2's shape, random
# weights, bench's phase costs): a verify at batch 8 (4/4/12 + 8, 160 rows) 1.144 -> 1.085 ms, at batch 32 (2/1/3,
# 96 rows) 1.130 -> 1.070 ms, decodes unchanged; on the real model the figures at batch 8 and 32 read the same
# (1.58x and 1.58x, 1.32x and 1.31x, within their intervals): benchmarks/results/h100_2026-12-07.
# benchmarks/ab_constants.py --gemv-max-rows 64 gives cuBLAS every call past 64 rows again.
MAX_ROWS = KERNEL_ROWS
FEW = 16  # up to this many rows every shape takes the kernel unless F.linear is faster; past it, see MANY_ROWS


# Candidates timed per (N, K, M bucket). M = 1 multiplies and row-sums (any block_n); M > 1 uses a
# tensor-core dot of 16, 32 or 64 padded rows (block_n, block_k >= 16), or with block_n < 16 the CUDA cores.
# Split-K helps where N / block_n is too few programs to keep every SM streaming (its shares are added in the same
# launch, by the last program of each block); stages > 1 keep more loads in flight per program (cp.async).
ONE_ROW = (
    GemvConfig(16, 256, 1, 4, 3), GemvConfig(16, 256, 1, 4, 1), GemvConfig(16, 512, 1, 4, 2),
    GemvConfig(32, 256, 1, 4, 3), GemvConfig(8, 512, 1, 4, 3), GemvConfig(64, 128, 1, 4, 3),
    GemvConfig(32, 512, 1, 8, 1), GemvConfig(8, 256, 2, 2, 4), GemvConfig(16, 256, 2, 4, 3),
    GemvConfig(16, 512, 4, 4, 1), GemvConfig(32, 256, 4, 4, 3),
)
# Blocks of fewer than 16 weight rows take the CUDA-core path at M > 1 (no dot: products summed as for one row, in
# [rows, block_n, block_k] float32 registers, at most 128 a thread): as many programs as a decode's GEMV. On the
# H200 at 4 rows they won SmolLM2's qkv and o (2.8-3.0 us), and down until split-K took one launch (then 4.0 us).
FEW_ROWS = (
    GemvConfig(32, 128, 1, 4, 4), GemvConfig(32, 256, 1, 4, 3), GemvConfig(16, 256, 1, 4, 3),
    GemvConfig(64, 128, 1, 4, 3), GemvConfig(64, 256, 1, 8, 3), GemvConfig(16, 512, 1, 4, 2),
    GemvConfig(16, 128, 2, 4, 4), GemvConfig(32, 256, 2, 4, 3), GemvConfig(16, 256, 4, 4, 3),
    GemvConfig(8, 64, 1, 4, 3), GemvConfig(4, 128, 1, 4, 3), GemvConfig(16, 128, 4, 4, 3),
    GemvConfig(16, 64, 3, 4, 3),
    # one-row-like K steps of 512 at 2-8 rows (fewer rows' sums fit the registers; candidates() drops it past them),
    # and K in 6 shares of one step each: on an H100 (h100_2026-12-06e/J) down 4.5 -> 3.8 us at 2 rows, 4.5 -> 4.2 at 4
    GemvConfig(4, 512, 1, 4, 2), GemvConfig(16, 256, 6, 4, 1),
)
# 17..256 rows (a verify of a wide tree or of a batch's trees, a short prompt): x tiles of 32-64 rows beside the
# weight's, so shorter K steps (the tiles of every stage share the SM's shared memory) and more warps for the larger
# dot. At 24 rows on the H200 the dot's tilings and cuBLAS cost 1.5-1.9x a one-row GEMV of the same weights (SmolLM2's
# down: 5.0 us against 2.7), with 36-60 programs for its 576-960 columns, each reading all of x; the CUDA-core tilings
# cost 7-9 us there (h200_2026-12-01j). Hence the dot split along K in 2-4 shares: 4x the programs, a quarter of x
# each (down at 24 rows: 4.4 us, h200_2026-12-01k), and longer K steps (256-512), so a program waits on fewer loads in
# turn: timed on SmolLM2's shapes at 24 rows (h200_2026-12-01l/A) they were no shape's pick, kept for the tuner
# elsewhere.
MANY_ROWS = (
    GemvConfig(32, 128, 1, 4, 3), GemvConfig(64, 64, 1, 4, 3), GemvConfig(32, 64, 1, 4, 4),
    GemvConfig(64, 128, 1, 8, 2), GemvConfig(16, 128, 1, 4, 3), GemvConfig(32, 128, 2, 4, 3),
    GemvConfig(64, 64, 2, 8, 3), GemvConfig(16, 128, 4, 4, 3), GemvConfig(16, 64, 3, 4, 3),
    GemvConfig(16, 128, 2, 4, 3), GemvConfig(16, 64, 4, 4, 2), GemvConfig(16, 256, 1, 4, 3),
    GemvConfig(16, 512, 1, 4, 2), GemvConfig(16, 256, 2, 4, 3),
    GemvConfig(16, 256, 6, 4, 1),  # K in 6 one-step shares: down at 24 rows 4.8 -> 4.5 us (H100, h100_2026-12-06e/J)
)
# Split tilings of a call whose output compiled elementwise code reads (``sums_fused``) write their K shares and
# leave the adding to that code (:func:`add_shares`) while compiling, as far as :func:`reader_adds` allows; the tuner
# then times such a tiling's kernel alone, as the compiled phase runs it. False: every split's shares are added in
# the kernel (tickets), as before.
SHARES = True
LINEAR = GemvConfig(0, 0, 0, 0, 0)  # the tuner's choice where F.linear (cuBLAS) beat every tiling
DEPENDENT = "dependent (PDL)"  # tuning_environment's "launches" where choices were timed in dependent launches
SHARES_READ = "shares added by the reader"  # its "split_k" where split tilings were timed as shares (SHARES)
TUNE_BYTES = 128 * 2**20  # tuning reads this many bytes of weight copies in turn: more than the L2 cache holds


@functools.cache
def reuse_reads() -> int:
    """Inductor's ``realize_reads_threshold`` (4 in torch 2.11-2.13): a pointwise value that more than one kernel
    reads is computed into a buffer of its own, by a kernel of its own, once it reads more than this many inputs."""
    from torch._inductor import config  # the compiler's settings (imported by torch.compile anyway)

    return int(config.realize_reads_threshold)


def reader_adds(cfg: GemvConfig, k: int, readers: int | None, bias: bool) -> bool:
    """Whether the compiled code that reads a call's output adds the tiling ``cfg``'s K shares (:data:`SHARES`) for
    a weight of K ``k``, the tuner timing it as its shares' kernel alone. ``readers``: how many projections the
    output is split among (q/k/v 3, gate/up 2, o and down 1), None where no compiled code adds shares (``sums_fused``
    off). One reader folds any number of shares into its kernel. Several read the same sum, which inductor folds
    into each only while it reads at most :func:`reuse_reads` inputs (the shares, and the bias); past that it adds
    them in a kernel of its own (on an H200, five shares for q/k/v cost a 24-node verify 30 kernels and 39 us more,
    h200_2026-12-06g/S), so such a tiling adds its shares in its launch, and is timed so."""
    if not SHARES or readers is None or cfg.split_k <= 1:
        return False
    return readers <= 1 or splits(k, cfg)[1] + int(bias) <= reuse_reads()


def row_bucket(rows: int) -> int:
    """The tuning bucket of M rows: the next power of two (1, 2, 4, ..., 256)."""
    return 1 << max(rows - 1, 0).bit_length()


def candidates(rows: int) -> tuple[GemvConfig, ...]:
    """The tilings the tuner times at ``rows`` rows: those of its range whose sums fit the registers there
    (:func:`~.gemv_tiling.fits_registers`)."""
    if rows == 1:
        return ONE_ROW
    return tuple(c for c in (FEW_ROWS if rows <= FEW else MANY_ROWS) if fits_registers(c, rows))


def default_config(n: int, k: int, rows: int) -> GemvConfig:
    """The untuned choice (a call compiled or captured before any eager call tuned its shape)."""
    return candidates(rows)[0]


def tuning_environment(device: torch.device, dtype: torch.dtype | str) -> dict[str, str]:
    """What a tuner's choice depends on beyond the shape: the GPU, the dtype (or its name), torch's and Triton's
    versions (a tiling timed under others may no longer be the fastest). Triton's version is read from its package,
    not imported. (A tuner of dependent launches adds its launches: :meth:`TritonGemv.environment`.)"""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "absent"
    return {"gpu": gpu, "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "triton": triton}


def environment_mismatch(measured_on: Mapping[str, str], here: Mapping[str, str]) -> str | None:
    """How ``measured_on`` differs from ``here`` (:func:`tuning_environment`), e.g. ``torch 2.11.0+cu130 (here
    2.13.0)``; None when they are the same."""
    # no launches recorded: plain ones; no split_k: shares added by the kernel (:meth:`TritonGemv.environment`)
    absent = {"launches": "plain", "split_k": "shares added in the kernel"}
    differ = []
    for k in dict.fromkeys([*here, *measured_on]):
        was, now = measured_on.get(k, absent.get(k, "not recorded")), here.get(k, absent.get(k, "not known"))
        if was != now:
            differ.append(f"{k} {was} (here {now})")
    return "; ".join(differ) or None


def triton_unavailable() -> str | None:
    """Why the kernel cannot run here (None: it can): Triton not importable, or the op not registered."""
    return unavailable("Triton GEMV", load_op)


def dtype_refusal(dtype: torch.dtype) -> str | None:
    """Why a model whose weights are ``dtype`` has no call taken (its activations share the dtype; None: it can)."""
    return kernel_dtype_refusal(dtype, "the GEMV")


def refusal(x: torch.Tensor, weight: torch.Tensor, unavailable: str | None = None) -> str | None:
    """Why ``x [..., K] @ weight [N, K]^T`` does not take the GEMV (None: it does)."""
    if unavailable is not None:
        return unavailable
    if torch.is_grad_enabled():
        return "gradients on (the GEMV has no backward)"
    rows = x.numel() // max(x.shape[-1], 1)
    if not 1 <= rows <= MAX_ROWS:
        return f"{rows} rows (the GEMV takes 1..{MAX_ROWS})"
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        return f"dtypes {x.dtype}/{weight.dtype} (the GEMV takes bfloat16 or float16, alike)"
    if weight.dim() != 2 or weight.stride(1) != 1:
        return "weight not row-major [N, K]"
    if x.device.type != "cuda":
        return f"not CUDA (device {x.device.type})"
    return None


class TritonGemv:
    """The GEMV a forward uses (``Kernels.gemv``): ``gemv(x2 [M, K], weight [N, K], bias) -> [M, N]``.

    Tunes each (N, K, M bucket) on its first eager call (each tiling timed in a CUDA graph of ``reps``
    calls, and F.linear alike: where cuBLAS is faster the shape keeps it (:data:`LINEAR`); host syncs,
    once per shape; compiled and captured calls reuse the choice, or take :func:`default_config` before
    any eager call).
    If the kernel fails there, it is switched off for good and ``reason`` says why: callers then take
    ``F.linear``. ``setup_seconds`` is the tuning time (kept out of tok/s like a compile).

    Choices measured before on the same setup (a device profile's, through :meth:`adopt`) take the place of the
    timing: such a shape's tiling is only checked against F.linear on its first eager call (one run, no timing).

    ``pdl``: the GEMV of phases that launch dependently (``pdl.py``). Its candidates are timed in a chain of
    dependent launches, each call overlapping the one before, as inside such a phase; F.linear (cuBLAS) cannot take
    part and is timed as always. A shape where cuBLAS is a few tenths of a microsecond faster alone then keeps our
    kernel, which does not break the phase's chain (on an H100 every SmolLM2 shape did, and the phases cost the same
    as with cuBLAS in them: ``benchmarks/results/h100_2026-12-06``). Its choices are its own (:meth:`environment`
    says so): a process with both regimes holds one tuner for each.
    """

    def __init__(self, log: Callable[[str], None] | None = None, reps: int = 20, pdl: bool = False) -> None:
        self.log, self.reps, self.pdl = log, reps, pdl
        self.reason = triton_unavailable()
        self.chosen: dict[tuple[int, int, int], GemvConfig] = {}
        self.preset: dict[tuple[int, int, int], GemvConfig] = {}  # adopted, not yet checked (:meth:`adopt`)
        self.setup_seconds = 0.0
        self._said = False
        self.on_tuned: Callable[[], None] | None = None  # called after a shape is tuned (a cache keeps the choice)

    layout = None  # reads the weight [N, K] as nn.Linear keeps it

    def environment(self, device: torch.device, dtype: torch.dtype | str) -> dict[str, str]:
        """What this tuner's choices depend on: :func:`tuning_environment`, and ``launches`` for a tuner of
        dependent launches (timed in a chain, where our kernel overlaps the one before and cuBLAS cannot, the choices
        differ; absent for plain launches, as in every choice recorded before PDL)."""
        env = tuning_environment(device, dtype)
        env = env | {"launches": DEPENDENT} if self.pdl else env
        return env | {"split_k": SHARES_READ} if SHARES else env

    def refusal(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """Why this call does not take the GEMV (None: it does)."""
        return refusal(x, weight, self.reason)

    def adopt(self, chosen: Mapping[tuple[int, int, int], Sequence[int]], measured_on: Mapping[str, str],
              here: Mapping[str, str], source: str = "a device profile") -> str | None:
        """Take the tilings ``chosen`` per (N, K, M bucket) (5 ints as :class:`GemvConfig`, zeros for F.linear) in
        place of timing those shapes, when they were measured on this very setup: ``measured_on == here``
        (:func:`tuning_environment`). Otherwise nothing is taken, every shape is tuned as usual, and the return
        value (also logged) says why. None: taken."""
        mismatch = environment_mismatch(measured_on, here)
        if mismatch is not None:
            why = f"GEMV tilings from {source} not used, measured with {mismatch}: each shape is tuned here"
            if self.log is not None:
                self.log(why)
            return why
        self.preset.update({tuple(key): GemvConfig(*cfg) for key, cfg in chosen.items()})
        if self.log is not None:
            self.log(f"GEMV tilings for {len(chosen)} shapes from {source} (measured on this GPU, dtype, torch and "
                     "Triton): each checked against F.linear on first use, not timed; other shapes are tuned")
        return None

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight as it is (no copy of its own: ``layout`` None)."""
        return weight

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 sums_fused: bool = False, readers: int = 1) -> torch.Tensor:
        """x [M, K], weight [N, K] -> [M, N] in x's dtype. ``sums_fused``: only compiled elementwise code reads the
        output, so while compiling a split tiling's shares are added there (:data:`SHARES`; for an output split
        among ``readers`` projections, only as many shares as :func:`reader_adds` allows), and the tuner times split
        tilings that way (a shape is tuned on its first call, as that call reads it)."""
        if self.reason is not None:  # off for good (no Triton, or the kernel failed here)
            return F.linear(x, weight, bias)
        x = x if x.stride(-1) == 1 else x.contiguous()  # rows may be strided (a slice), elements not
        (M, K), N = x.shape, weight.shape[0]
        key = (N, K, row_bucket(M))
        cfg = self.chosen.get(key)
        fused = readers if sums_fused else None  # split tilings may leave their shares to the compiled reader
        if cfg is None and not torch.compiler.is_compiling() and not capturing(x):
            cfg = self._take_preset(key, x, weight, bias, fused)
            if cfg is None:
                cfg = self._tune(key, x, weight, bias, fused)
                if cfg is not None and self.on_tuned is not None:
                    self.on_tuned()
            if cfg is None:
                return F.linear(x, weight, bias)
        cfg = cfg or default_config(N, K, M)
        if cfg.block_n == 0:  # LINEAR: cuBLAS was faster for this shape
            return F.linear(x, weight, bias)
        if torch.compiler.is_compiling() and reader_adds(cfg, K, fused, bias is not None):
            return run_shares(x, weight, bias, cfg)
        return run_op(x, weight, bias, cfg)

    def _take_preset(self, key, x, weight, bias, readers: int | None = None) -> GemvConfig | None:
        """The adopted tiling for ``key`` if it agrees with F.linear on these tensors and will run as it was timed
        (None: none adopted, or it failed or disagreed here, or it was timed as shares the compiled reader adds and
        this call's readers would not add them, which the log says; the caller then tunes the shape)."""
        cfg = self.preset.pop(key, None)
        if cfg is None:
            return None
        if cfg == LINEAR:  # cuBLAS: nothing of ours to check
            self.chosen[key] = cfg
            return cfg
        t0 = time.perf_counter()
        shares = reader_adds(cfg, x.shape[1], readers, bias is not None)
        try:
            ref = F.linear(x, weight, bias).float()  # [M, N]
            why = disagreement(x, weight, bias, cfg, ref, tolerance(ref), shares)
            if why is None and readers is not None and not shares and SHARES and cfg.split_k > 1:
                # timed as shares the reader adds (SHARES_READ); this call's readers would not fold them
                why = (f"timed as {splits(x.shape[1], cfg)[1]} shares added by the reader; here {readers} projections "
                       f"read them, and past {reuse_reads()} reads the compiler adds them in a kernel of its own")
        except Exception as exc:  # noqa: BLE001 - a preset that does not compile here is tuned instead, and said
            why = f"{type(exc).__name__}: {first_line(exc)}"
        self.setup_seconds += time.perf_counter() - t0
        if why is None:
            self.chosen[key] = cfg
            return cfg
        if self.log is not None:
            self.log(f"  GEMV [{key[1]} -> {key[0]}] M<={key[2]}: the adopted {describe(cfg)} failed here ({why}); "
                     "tuning")
        return None

    def _tune(self, key, x, weight, bias, readers: int | None = None) -> GemvConfig | None:
        """Check every candidate against ``F.linear`` on these very tensors, time those that agree and F.linear,
        keep the fastest (:data:`LINEAR` if F.linear). None: no tiling ran or agreed (``reason`` says why: the
        kernel is off for good), except past :data:`FEW` rows, where that shape alone keeps F.linear. ``readers``
        (``sums_fused`` calls): a split tiling whose shares the compiled reader adds (:func:`reader_adds`) is checked
        with them added by :func:`add_shares` and timed as its shares' kernel alone, as a compiled phase runs it (the
        adding folded into the next kernel)."""
        t0 = time.perf_counter()
        if self.log is not None and not self._said:
            self._said = True
            chain = ", timed in chains of dependent launches (PDL)" if self.pdl else ""
            self.log(f"tuning the Triton GEMV per weight shape{chain} (once per process) ...")
        # A decode streams every layer's distinct weights: copies read in turn keep a small weight (o: 32 MB)
        # from being timed out of the L2 cache, which would favour the wrong tiling.
        copies = [weight] + [weight.clone() for _ in range(TUNE_BYTES // (weight.numel() * weight.element_size()))]
        ref = F.linear(x, weight, bias).float()  # [M, N]
        bound = tolerance(ref)
        times, errors = {}, []
        with dependent_launches(self.pdl):  # our launches as the phases that will call it make them
            for cfg in candidates(key[2]):
                try:
                    shares = reader_adds(cfg, x.shape[1], readers, bias is not None)
                    why = disagreement(x, weight, bias, cfg, ref, bound, shares)
                    if why is not None:  # a tiling that computes something else is never chosen
                        errors.append(f"{tuple(cfg)}: {why}")
                        continue
                    call = ((lambda i: torch.ops.eaglelab.gemv_shares(x, copies[i], *cfg)) if shares
                            else (lambda i: run_op(x, copies[i], bias, cfg)))  # the shares' adding: in the reader
                    times[cfg] = time_in_turn(call, len(copies), self.reps)
                except Exception as exc:  # noqa: BLE001 - a tiling that does not compile is skipped, and said
                    errors.append(f"{tuple(cfg)}: {type(exc).__name__}: {first_line(exc)}")
            if times:  # the bar to beat: F.linear timed the same way (cuBLAS launches as always)
                times[LINEAR] = time_in_turn(lambda i: F.linear(x, copies[i], bias), len(copies), self.reps)
        del copies
        self.setup_seconds += time.perf_counter() - t0
        if not times and key[2] > FEW:  # a GEMM's territory: this shape keeps F.linear, the kernel stays on
            self.chosen[key] = LINEAR
            if self.log is not None:
                self.log(f"  GEMV [{key[1]} -> {key[0]}] M<={key[2]}: F.linear (no tiling ran: {errors[0]})")
            return LINEAR
        if not times:
            self.reason = f"eager: Triton GEMV failed on [{key[1]} -> {key[0]}] ({errors[0]})"
            if self.log is not None:
                self.log(self.reason)
            return None
        best = self.chosen[key] = min(times, key=times.get)
        if self.log is not None:
            tiled = min(t for cfg, t in times.items() if cfg != LINEAR)
            self.log(f"  GEMV [{key[1]} -> {key[0]}] M<={key[2]}: {describe(best)}; best tiling {tiled * 1e3:.1f} us, "
                     f"F.linear {times[LINEAR] * 1e3:.1f} us" + "".join(f"\n    tiling skipped: {e}" for e in errors))
        return best


def tolerance(ref: torch.Tensor) -> float:
    """The largest error a tiling may show against F.linear's ``ref``: a few bf16 roundings (a wrong kernel is far
    off)."""
    return 0.03 * ref.abs().max().item() + 1e-3


def disagreement(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig,
                 ref: torch.Tensor, bound: float, shares: bool = False) -> str | None:
    """How the tiling ``cfg`` misses F.linear's ``ref`` [M, N] by more than ``bound`` (None: it agrees);
    ``shares``: a split tiling as its K shares added by :func:`add_shares` (:func:`run_shares`)."""
    y = run_shares(x, weight, bias, cfg) if shares else run_op(x, weight, bias, cfg)
    err = (y.float() - ref).abs().max().item()
    return None if err <= bound else f"max |error| {err:.3g} against F.linear > {bound:.3g}"


def add_shares(parts: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """float32 K shares [S, M, N] -> [M, N] in ``dtype``: added in order (s = 0, 1, ...), then the bias, as the
    kernel adds them; written out as S - 1 additions (no reduction) so that inductor folds them into whatever
    elementwise kernel reads the result."""
    y = parts[0]
    for s in range(1, parts.shape[0]):
        y = y + parts[s]
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def run_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig) -> torch.Tensor:
    """``torch.ops.eaglelab.gemv`` with this tiling (registered by :func:`load_op`)."""
    return torch.ops.eaglelab.gemv(x, weight, bias, *cfg)


def run_shares(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig) -> torch.Tensor:
    """:func:`run_op`'s result as ``torch.ops.eaglelab.gemv_shares`` and :func:`add_shares` make it (inside a compiled
    phase the adding folds into the kernel that reads the output)."""
    return add_shares(torch.ops.eaglelab.gemv_shares(x, weight, *cfg), bias, x.dtype)


def describe(cfg: GemvConfig) -> str:
    """A tuner's choice as the log and the bench report it."""
    if cfg == LINEAR:
        return "F.linear (faster than every tiling)"
    return f"block_n {cfg.block_n}, block_k {cfg.block_k}, split_k {cfg.split_k}, warps {cfg.num_warps}, stages {cfg.num_stages}"


@functools.cache
def load_op() -> Callable[..., torch.Tensor]:
    """Import Triton and our kernels, and register ``torch.ops.eaglelab.gemv`` (once per process)."""
    from eaglelab.engine.model import gemv_kernels  # imports triton: ImportError without it

    return gemv_kernels.register()
