"""Building blocks shared by the target model and the EAGLE-3 drafter: RMSNorm, rotary embedding,
grouped-query attention over a static KV cache, the SwiGLU MLP, fused projections, and the
:class:`Kernels` a forward runs its elementwise work with (eager here; ``engine/runtime/compile.py``
builds a ``torch.compile``'d set).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back before the weight (as HF Llama does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, kernels: "Kernels | None" = None) -> torch.Tensor:
        return (kernels or EAGER_KERNELS).rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] normalised in float32, cast back, times weight [H] (HF Llama's order)."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, NH, T, D] and k [B, KVH, T, D] rotated by cos/sin [B, 1, T, D]."""
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, [..., I]."""
    return F.silu(gate) * up


class Gemv(Protocol):
    """A matmul kernel for a few rows: ``x [M, K] @ weight [N, K]^T (+ bias)``; the Triton GEMV on CUDA
    (``engine/model/gemv.py``), the C kernel on CPU (``engine/model/cpu_gemm.py``)."""

    reason: str | None  # why it is off for good (None: on)
    setup_seconds: float  # time spent tuning or building it (kept out of tok/s)
    layout: str | None  # the weight copy it reads, made by ``pack`` (None: [N, K] as nn.Linear keeps it)

    def refusal(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """Why this call does not take the kernel (None: it does)."""

    def pack(self, weight: torch.Tensor) -> Any:
        """weight [N, K] in the kernel's ``layout`` (called once per weight, when the copy is built)."""

    def __call__(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None, sums_fused: bool = False,
                 readers: int = 1) -> torch.Tensor:
        """x [M, K], weight [N, K] (or as ``pack`` made it) -> [M, N]. ``sums_fused``: only compiled elementwise code
        reads the result (a kernel may then leave partial sums for that code to add); ``readers``: how many
        projections the result is split among (each read by its own kernel)."""


class DecodeAttention(Protocol):
    """An attention kernel for a few query rows over the static cache (``engine/model/decode_attention.py``)."""

    reason: str | None  # why it is off for good (None: on)
    setup_seconds: float  # time spent checking it (kept out of tok/s)

    def refusal(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> str | None:
        """Why this call does not take the kernel (None: it does)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, NH, T, D], k/v [B, KVH, S, D], mask bool [B, T, S] -> [B, NH, T, D]."""


@dataclass(frozen=True)
class Kernels:
    """The elementwise work of a layer (RMSNorm, rotary, SwiGLU), and the matmul kernel for a few rows.
    The eager set is the reference; a compiled set fuses each piece into one or two kernels (same maths,
    same dtypes), and offers ``compile_phase`` to compile whole phases. ``gemv`` (None: off) runs the
    projections of a decode or a verify (M <= 256 rows, CUDA and CPU alike) as a memory-bound kernel;
    ``attention`` (None: off) the attention of a decode, a verify or a draft step (T <= 64 query rows
    under a mask) as a kernel made for a few rows; both fall back to the reference per call, with a reason."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rotary_qk
    swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = swiglu
    compiled: bool = False
    # Under CUDA graphs: wraps a whole phase's function (label, fn) -> compiled fn; the phase then
    # runs these pieces eagerly inside it and the compiler fuses across them. None: not compiled.
    compile_phase: Callable[[str, Callable], Callable] | None = None
    gemv: Gemv | None = None
    attention: DecodeAttention | None = None
    # Under CUDA graphs on Hopper or later: the captured phases' kernels launch dependently (``pdl.py``), inductor's
    # compiled with PDL code, ours with their PDL entry. Set only where ``pdl.refusal`` found none.
    pdl: bool = False

    def eager_pieces(self) -> "Kernels":
        """What runs inside a compiled phase: the eager elementwise pieces (the compiler fuses across
        them), with this set's GEMV and attention kernel."""
        if self.gemv is None and self.attention is None and not self.pdl:
            return EAGER_KERNELS
        return Kernels(gemv=self.gemv, attention=self.attention, pdl=self.pdl)


EAGER_KERNELS = Kernels()


def _version(t: torch.Tensor) -> int:
    """In-place writes seen so far (inference tensors keep no count: 0)."""
    return 0 if t.is_inference() else t._version


class FusedLinear:
    """One matmul for one or several projections of the same input (q/k/v, gate/up; o, down, the head).

    On CUDA: several projections get a concatenated copy of their weights (and biases); a single one
    uses its own weight. On CPU: one transposed, contiguous copy ``[in, sum out]`` for all of them,
    because MKL's GEMM for a few rows (the verify's M = N tree nodes) runs far slower on the
    ``x W^T`` layout than on ``x Wt`` (measured by ``benchmarks/cpu_verify.py``). The copies are
    rebuilt when a weight is replaced or changed in place (``.to()``, a new load). With gradients on,
    the projections run separately so training sees its own parameters. Given a ``gemv`` kernel, calls
    it takes (see its ``refusal``) run on it instead of a GEMM, on the weight copy in its ``layout``:
    the Triton GEMV (CUDA, M <= 256, bf16/fp16) or the few-row C kernel (CPU, M <= 256, float32). While
    that C kernel is on, the calls it refuses for their rows (a long prompt) run each projection on its own
    weight (MKL, no third copy of the weights). ``sums_fused``: the output is read only by compiled elementwise
    code (a norm, a residual add, the rotary and the cache write, the SwiGLU), never leaving the compiled graph or
    entering a collective, so the Triton GEMV may leave a split's K shares for that code to add (``gemv.SHARES``).
    """

    def __init__(self, *linears: nn.Module, sums_fused: bool = False) -> None:
        self.linears, self.sums_fused = linears, sums_fused
        self._fused: dict[str, tuple[tuple, Any, torch.Tensor | None]] = {}  # layout -> (key, w, b)
        self.transpose_on_cpu = True  # False keeps the x W^T layout on CPU too (to measure against it)

    def __call__(self, x: torch.Tensor, gemv: Gemv | None = None) -> tuple[torch.Tensor, ...]:
        """x [..., in] -> one output per projection [..., out_i]."""
        if torch.is_grad_enabled():
            return tuple(lin(x) for lin in self.linears)
        if gemv is not None and gemv.refusal(x, self.linears[0].weight) is None:
            weight, bias = self._gemv_weights(gemv)
            y = gemv(x.reshape(-1, x.shape[-1]), weight, bias, sums_fused=self.sums_fused,
                     readers=len(self.linears))  # [M, sum out]
            return self._split(y.view(*x.shape[:-1], y.shape[-1]))
        if self._packs_here(gemv, x.device):  # a prefill beside the C kernel: MKL on the weights as they are
            return tuple(F.linear(x, lin.weight, lin.bias) for lin in self.linears)
        transposed = x.device.type == "cpu" and self.transpose_on_cpu
        if len(self.linears) == 1 and not transposed:  # nothing to fuse or transpose
            lin = self.linears[0]
            return (F.linear(x, lin.weight, lin.bias),)
        weight, bias = self._weights("kn" if transposed else "nk")
        if transposed:
            x2 = x.reshape(-1, x.shape[-1])  # [M, in]
            y = x2 @ weight if bias is None else torch.addmm(bias, x2, weight)  # [M, sum out]
            y = y.view(*x.shape[:-1], y.shape[-1])
        else:
            y = F.linear(x, weight, bias)
        return self._split(y)

    def prepare(self, device: torch.device, gemv: Gemv | None = None) -> None:
        """Build the fused copy the forwards on ``device`` will use now, instead of in the first call (with
        ``gemv``: the copy in its layout, when it keeps one, instead of the transposed one)."""
        if self._packs_here(gemv, device):
            self._gemv_weights(gemv)
            return
        transposed = device.type == "cpu" and self.transpose_on_cpu
        if len(self.linears) > 1 or transposed:
            self._weights("kn" if transposed else "nk")

    def _packs_here(self, gemv: Gemv | None, device: torch.device) -> bool:
        """Whether ``gemv`` is a kernel on and keeping its own weight copy for this CPU module."""
        return (gemv is not None and gemv.layout is not None and gemv.reason is None and device.type == "cpu"
                and self.linears[0].weight.dtype == torch.float32)

    def _split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[..., sum out] -> one view per projection [..., out_i]."""
        return y.split([lin.weight.shape[0] for lin in self.linears], dim=-1) if len(self.linears) > 1 else (y,)

    def _gemv_weights(self, gemv: Gemv) -> tuple[Any, torch.Tensor | None]:
        """The weight and bias ``gemv`` reads: its packed copy, or [N, K] (a single projection's own)."""
        if gemv.layout is not None:
            return self._weights(gemv.layout, gemv.pack)
        if len(self.linears) == 1:
            return self.linears[0].weight, self.linears[0].bias
        return self._weights("nk")

    def _weights(self, layout: str, pack: Callable[[torch.Tensor], Any] | None = None) -> tuple[Any, torch.Tensor | None]:
        """The fused weight, [sum out, in] ("nk"), [in, sum out] ("kn") or ``pack``'s layout, and bias,
        rebuilt when stale."""
        held = self._fused.get(layout)
        if torch.compiler.is_compiling():  # a compiled phase runs eagerly first: its fused copy is current
            assert held is not None, "FusedLinear: compiled before one eager call fused the weights"
            return held[1], held[2]
        key = tuple((lin.weight.data_ptr(), _version(lin.weight)) for lin in self.linears)
        if held is None or held[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                weight = torch.cat([lin.weight.detach() for lin in self.linears])  # [sum out, in]
                if layout == "kn":
                    weight = weight.t().contiguous()
                elif pack is not None:
                    weight = pack(weight)
                biases = [lin.bias for lin in self.linears]
                bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
            held = self._fused[layout] = (key, weight, bias)
        return held[1], held[2]


def fused_linears(model: nn.Module) -> list[FusedLinear]:
    """Every :class:`FusedLinear` a model's modules hold (to set their CPU layout in a measurement)."""
    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, FusedLinear)]


def prepare_fused(*models: nn.Module | None, gemv: Gemv | None = None) -> float:
    """Build every fused weight copy of ``models`` (a None is skipped) for their device (and ``gemv``, the
    runner's few-row kernel). -> seconds taken.

    A runner does this once when it is made, so the copies (on CPU a transposed or packed copy of every
    weight, ~0.4 s for a 135M model on two cores) count as set-up, never as the first prompt's prefill."""
    t0 = time.perf_counter()
    for model in models:
        if model is None:
            continue
        device = next(model.parameters()).device
        for fused in fused_linears(model):
            fused.prepare(device, gemv)
    return time.perf_counter() - t0


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [D/2], with Llama 3 ("llama3"), linear or YaRN ("yarn") scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    if kind == "linear":
        return (inv_freq / float(scaling["factor"])).float()
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        return torch.where(is_mid, mid, scaled).float()
    return inv_freq.float()


def _yarn_inv_freq(inv_freq: torch.Tensor, dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN: extrapolate the fast dimensions, interpolate (divide by ``factor``) the slow ones, with a
    linear ramp between the dimensions that turn ``beta_fast`` and ``beta_slow`` times over the
    original context."""
    factor = float(scaling["factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def dim_turning(turns: float) -> float:  # the dimension whose wavelength fits old_ctx `turns` times
        return dim * math.log(old_ctx / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_turning(fast), dim_turning(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # 0 fast .. 1 slow
    return (inv_freq / factor * ramp + inv_freq * (1 - ramp)).float()


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: dict | None) -> float:
    """The factor YaRN multiplies cos and sin by (1 for every other rope type)."""
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, m, m_all = float(scaling["factor"]), scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:
        return yarn_mscale(factor, float(m)) / yarn_mscale(factor, float(m_all))
    return yarn_mscale(factor)


class Rotary(nn.Module):
    """Rotary position embedding (the rotate-half layout HF checkpoints use)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self.attention_factor = rope_attention_factor(scaling)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, T, D] for positions [B, T]."""
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by cos/sin [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    kernel: DecodeAttention | None = None,
) -> torch.Tensor:
    """Grouped-query attention.

    q [B, H, T, D]; k, v [B, KVH, S, D]; mask bool [B, T, S] (True = may attend) or None for
    causal over T == S. Returns [B, H, T, D]. Given a ``kernel`` (``Kernels.attention``), the calls it
    takes (a few query rows under a mask: see its ``refusal``) run on it instead of SDPA.
    """
    if kernel is not None and kernel.refusal(q, k, mask) is None:
        return kernel(q, k, v, mask)
    gqa = q.shape[1] != k.shape[1]  # SDPA shares each KV head over its query group, no copy
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=gqa)


def prefix_mask(slots: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Mask [B, T, S] letting the token written at slot s see every slot <= s (causal over the cache).

    ``slots`` [B, T] are the cache slots the new tokens occupy; slots before them hold the row's
    committed context.
    """
    cols = torch.arange(kv_len, device=slots.device)
    return cols[None, None, :] <= slots[..., None]


# Inside a compiled phase, inductor does not keep a cheap elementwise tensor that several opaque ops read: it
# computes it again for each (the attention op's mask: one kernel a layer in a decode, ~1 us each of 30). Passed
# through an opaque op first, it is one buffer every reader shares (a decode 0.845 -> 0.805 ms on an H100:
# benchmarks/results/h100_2026-12-06c/G).
SHARE_MASK = True


@torch.library.custom_op("eaglelab::shared", mutates_args=())
def _shared(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_shared.register_fake
def _shared_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def shared(x: torch.Tensor, readers: int) -> torch.Tensor:
    """``x`` for ``readers`` opaque ops to read: under ``torch.compile`` with more than one, a copy made once by an
    op the compiler cannot look into (so it computes ``x`` once, not once per reader); else ``x`` itself."""
    if SHARE_MASK and readers > 1 and torch.compiler.is_compiling():
        return _shared(x)
    return x
