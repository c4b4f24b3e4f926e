"""A Triton attention kernel for the few query rows of a decode, a verify or a draft step:
``softmax(q k^T / sqrt(D), masked) v`` for q [B, NH, T, D] (T <= 64) over a layer of the static KV cache
k, v [B, KVH, S, D] (read through its strides, never copied) under a bool mask [B, T, S] (True = attend:
the engine's prefix masks for a decode, tree masks for a verify or a draft step).

At bs 1 a decode's attention is a few small reads that SDPA, made for many query rows, spreads thinly.
Here one program takes the GROUP = NH / KVH query heads that share a KV head, all T rows of each (a
tensor-core dot of GROUP * T rows padded to 16; past 64 rows, blocks of 64 in programs of their own), so
each K and V row is read once per KV head (per block of rows); the
cache's slots are split across programs (flash-decoding: each split keeps a partial max, sum and
weighted sum in float32, and a small second kernel merges the splits), so even one row fills the GPU;
and a block of slots whose mask slice is all False is skipped before its K and V are read: a static
cache of 2048 slots with 150 in use reads ~150 slots' worth, not 2048. A row with no allowed slot gives
zeros (SDPA gives NaN there; the engine's masks always allow a row's own slot).

The kernel is a PyTorch custom op (``torch.ops.eaglelab.decode_attention``, with a shape-only fake
implementation) so it composes with ``torch.compile(fullgraph=True)`` and CUDA-graph capture. Triton is
optional: it is imported on first use only (``decode_attention_kernels.py``); without it (or without CUDA)
the kernel is unavailable with a reason and attention takes SDPA.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from eaglelab.engine.model.triton_ops import DTYPES, capturing, first_line, time_in_turn, unavailable
from eaglelab.engine.model.triton_ops import dtype_refusal as kernel_dtype_refusal

MAX_ROWS = 64  # query rows (T) per sequence the kernel takes; more is a prefill, SDPA's job
FEW = 16  # past this many rows (a wide tree's verify, a short prompt) a shape keeps SDPA where it is faster
HEAD_DIMS = (16, 32, 64, 128, 256)  # tl.arange needs a power of two


class AttnPlan(NamedTuple):
    """How a call is cut: cache slots per block, splits of the cache (programs per KV head), warps."""

    block_s: int
    splits: int
    num_warps: int


ROW_BLOCK = 64  # query rows per program (the kernel's largest BLOCK_M): more rows take more programs


def plan(batch: int, kv_heads: int, slots: int, sms: int, rows: int = 1, head_dim: int = 64,
         max_splits: int = 16) -> AttnPlan:
    """The cut for ``slots`` static cache slots: one split while the cache is a couple of blocks (a merge
    kernel would cost more than it saves), else enough splits for about one program per SM (at most one
    per block, at most ``max_splits``: the merge reads every split's partial); 8 warps for head dim 128
    and up, else 4.

    Blocks of 64 slots for a program of up to 16 query rows (``rows`` = group x T). Past 16 rows, by what an
    H200 sweep of every cut measured (benchmarks/results/h200_2026-12-04/attn, Triton 3.6):
    - head dim 128 (an 8B's verify): 64-slot blocks for one block of rows, 128-slot blocks once the
      rows take several programs (T >= 24 at a group of 4), and the splits counting those programs (a
      power of two near SMs / (batch x KV heads x row blocks)): up to 1.9x faster than 32-slot blocks with
      splits per head at batch 1, 1.2-4.2x at batch 8 (one 128-slot program per head and row block), and
      as fast as the best swept cut within 12% at every shape swept but 16 rows over a 128-slot cache
      (7.5 us against 6.4). ptxas reports spills for these tiles; the sweep says they are faster anyway.
    - other head dims: 32-slot blocks, splits per head. For SmolLM2's 64 that is within 0-15% of the best
      swept cut at batch 1 and 5-40% at batch 8 (no simple rule did better on both); 256 was not swept
      (its 128-slot tiles fit sm_90's shared memory but spill ~3 KB under ptxas).

    Example: 8B decode at bs 1 (8 KV heads, 4 rows, D 128) on 132 SMs: 128 slots -> 1 split; 2048 slots
    (32 blocks of 64) -> min(ceil(132 / 8), 32, 16) = 16 splits; at bs 8 -> ceil(132 / 64) = 3 splits.
    8B verify of 24 (96 rows: 2 row blocks) over 2048 slots: 128-slot blocks, 132 / 16 -> 8 splits at bs 1,
    132 / 128 -> 1 at bs 8."""
    warps = 8 if head_dim >= 128 else 4
    swept = rows > 16 and head_dim == 128  # the 8B verify's cuts, by the sweep
    row_blocks = -(-rows // ROW_BLOCK)
    block_s = (128 if row_blocks > 1 else 64) if swept else (64 if rows <= 16 else 32)
    blocks = -(-slots // block_s)
    if blocks <= 2:
        return AttnPlan(block_s, 1, warps)
    if swept:
        cap = min(blocks, max_splits)
        near = 1 << max(0, round(math.log2(sms / (batch * kv_heads * row_blocks))))
        return AttnPlan(block_s, min(near, 1 << (cap.bit_length() - 1)), warps)
    return AttnPlan(block_s, max(1, min(-(-sms // (batch * kv_heads)), blocks, max_splits)), warps)


def triton_unavailable() -> str | None:
    """Why the kernel cannot run here (None: it can): Triton not importable, or the op not registered."""
    return unavailable("Triton decode attention", load_op)


def dtype_refusal(dtype: torch.dtype) -> str | None:
    """Why a model whose weights are ``dtype`` has no call taken (None: it can)."""
    return kernel_dtype_refusal(dtype, "the decode attention")


def refusal(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, unavailable: str | None = None) -> str | None:
    """Why attention of q [B, NH, T, D] over k [B, KVH, S, D] under ``mask`` does not take the kernel (None: it does)."""
    if unavailable is not None:
        return unavailable
    if torch.is_grad_enabled():
        return "gradients on (the decode attention has no backward)"
    if mask is None:
        return "no mask (a causal prefill: SDPA's job)"
    T, D = q.shape[2], q.shape[3]
    if not 1 <= T <= MAX_ROWS:
        return f"{T} query rows (the decode attention takes 1..{MAX_ROWS})"
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        return f"dtypes {q.dtype}/{k.dtype} (the decode attention takes bfloat16 or float16, alike)"
    if D not in HEAD_DIMS:
        return f"head dim {D} (the decode attention takes {', '.join(map(str, HEAD_DIMS))})"
    if q.shape[1] % k.shape[1] != 0:
        return f"{q.shape[1]} query heads over {k.shape[1]} KV heads (not whole groups)"
    if mask.dtype != torch.bool or tuple(mask.shape) != (q.shape[0], T, k.shape[2]):
        return f"mask {mask.dtype} {tuple(mask.shape)} (expected bool {(q.shape[0], T, k.shape[2])})"
    if q.device.type != "cuda":
        return f"not CUDA (device {q.device.type})"
    return None


class TritonDecodeAttention:
    """The attention a forward uses for a few query rows (``Kernels.attention``):
    ``attention(q [B, NH, T, D], k, v [B, KVH, S, D], mask [B, T, S]) -> [B, NH, T, D]``.

    The first eager call of each (T, D, group) shape is checked against SDPA on its own inputs (a host
    sync, once per shape); if the kernel fails or disagrees there, it is switched off for good and
    ``reason`` says why: callers then take SDPA. Past :data:`FEW` rows (where SDPA's tiles start to fill)
    the check also times both on CUDA, and a shape that fails, disagrees or is slower keeps SDPA alone
    (``declined`` says why; the kernel stays on for the rest). Compiled and captured calls run the op as
    planned (or SDPA for a declined shape). ``setup_seconds`` is the checking time (kept out of tok/s like
    a compile)."""

    def __init__(self, log: Callable[[str], None] | None = None, sms: int | None = None) -> None:
        self.log = log
        self.sms = sms if sms is not None else _multiprocessors()  # read here: never inside a compiled trace
        self.reason = triton_unavailable()
        self.checked: set[tuple[int, int, int]] = set()
        self.declined: dict[tuple[int, int, int], str] = {}  # shapes past FEW rows kept on SDPA, and why
        self.setup_seconds = 0.0

    def refusal(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> str | None:
        """Why this call does not take the kernel (None: it does)."""
        return refusal(q, k, mask, self.reason)

    def plan(self, q: torch.Tensor, k: torch.Tensor) -> AttnPlan:
        """The cut of this call (a function of the shapes only: compiled and captured calls make the same)."""
        rows = q.shape[1] // k.shape[1] * q.shape[2]
        return plan(q.shape[0], k.shape[1], k.shape[2], self.sms, rows=rows, head_dim=q.shape[3])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, NH, T, D], k/v [B, KVH, S, D], mask bool [B, T, S] -> [B, NH, T, D] in q's dtype."""
        if self.reason is not None:  # off for good (no Triton, or the kernel failed here)
            return sdpa(q, k, v, mask)
        q = q if q.stride(-1) == 1 else q.contiguous()  # rows may be strided, elements not
        k = k if k.stride(-1) == 1 else k.contiguous()
        v = v if v.stride(-1) == 1 else v.contiguous()
        key = (q.shape[2], q.shape[3], q.shape[1] // k.shape[1])
        if key in self.declined:
            return sdpa(q, k, v, mask)
        if key not in self.checked and not torch.compiler.is_compiling() and not capturing(q):
            if not self._check(key, q, k, v, mask):
                return sdpa(q, k, v, mask)
        return run_op(q, k, v, mask, self.plan(q, k))

    def _check(self, key, q, k, v, mask) -> bool:
        """Run the kernel on these inputs against SDPA in float32; off for good (``reason``) if it fails or disagrees,
        or past :data:`FEW` rows, this shape alone on SDPA (``declined``) if it fails, disagrees or is slower."""
        t0 = time.perf_counter()
        why = None
        try:
            got = run_op(q, k, v, mask, self.plan(q, k)).float()
            ref = sdpa(q.float(), k.float(), v.float(), mask)
            seen = mask.any(-1)[:, None, :, None]  # [B, 1, T, 1]: rows with an allowed slot (SDPA: NaN otherwise)
            err = (got - ref).abs().where(seen, 0.0).max().item()
            tolerance = 0.02 * ref.abs().where(seen, 0.0).max().item() + 1e-2  # bf16 roundings; a wrong kernel is far off
            if not err <= tolerance:
                why = f"eager: Triton decode attention disagreed with SDPA (T {key[0]}, D {key[1]}: " \
                      f"max |error| {err:.3g} > {tolerance:.3g})"
            elif key[0] > FEW:
                why = slower_than_sdpa(q, k, v, mask, self.plan(q, k))
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile here is switched off, and said
            why = f"eager: Triton decode attention failed (T {key[0]}, D {key[1]}: {type(exc).__name__}: {first_line(exc)})"
        self.setup_seconds += time.perf_counter() - t0
        if why is not None:
            if key[0] > FEW:
                self.declined[key] = why
            else:
                self.reason = why
            if self.log is not None:
                self.log(why if key[0] <= FEW else f"  decode attention (T {key[0]}, D {key[1]}, group {key[2]}): SDPA "
                         f"for this shape ({why.removeprefix('eager: ')})")
            return False
        self.checked.add(key)
        return True


def run_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cut: AttnPlan) -> torch.Tensor:
    """``torch.ops.eaglelab.decode_attention`` with this cut (registered by :func:`load_op`)."""
    return torch.ops.eaglelab.decode_attention(q, k, v, mask, *cut)


def slower_than_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cut: AttnPlan) -> str | None:
    """Why SDPA is kept for this shape (None: the kernel is as fast or faster): both timed in CUDA graphs on these
    inputs (on a CPU, Triton's interpreter: nothing to time)."""
    if not q.is_cuda:
        return None
    ours = time_in_turn(lambda i: run_op(q, k, v, mask, cut), 1, 20)
    theirs = time_in_turn(lambda i: sdpa(q, k, v, mask), 1, 20)
    if ours <= theirs:
        return None
    return f"SDPA faster: {theirs * 1e3:.1f} us against {ours * 1e3:.1f} us"


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The engine's attention (``layers.attend``'s): SDPA with the bool mask, the KV heads shared over their groups."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=q.shape[1] != k.shape[1])


def _multiprocessors() -> int:
    """The current CUDA device's SMs (8 without CUDA: Triton's interpreter on CPU, where any plan works)."""
    if not torch.cuda.is_available():
        return 8
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@functools.cache
def load_op() -> Callable[..., torch.Tensor]:
    """Import Triton and our kernels, and register ``torch.ops.eaglelab.decode_attention`` (once per process)."""
    from eaglelab.engine.model import decode_attention_kernels  # imports triton: ImportError without it

    return decode_attention_kernels.register()
