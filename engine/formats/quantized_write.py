"""Write INT weights as compressed-tensors ``pack-quantized`` stores them (Kimi-K2-Thinking / K2.5's routed experts).

The reader is :mod:`eaglelab.engine.formats.quantized`; this is its inverse for the symmetric
group/channel case, so a scale model can ship its experts the way Kimi does::

    weight [out, in] (bf16)         groups of ``group_size`` columns (channel: one group of all of them)
    amax   = max(|min(g, 0)|, max(g, 0))  per row and group, in the weight's dtype
    scale  = amax / ((2^b - 1) / 2)       (INT4: amax / 7.5; a zero scale becomes the dtype's eps)
    q      = round(clamp(w / scale, -2^(b-1), 2^(b-1) - 1))     # int8 in [-8, 7] for INT4
    weight_packed [out, ceil(in*b/32)] int32: element i of a row at bit i*b, stored as q + 2^(b-1)
    weight_scale  [out, groups] (the weight's dtype), weight_shape [2] int64 = [out, in]

The arithmetic order (clamp, then round half to even, in the weight's dtype) is the library's, so the
packed words and scales are bit-identical to what compressed-tensors' own compressor writes
(``tests/engine/formats/test_quantized_write.py`` checks against it); dequantized, ``q * scale`` is exact
in float32.
"""

from __future__ import annotations

import math

import torch

# Kimi-K2-Thinking / K2.5's ``quantization_config.ignore``: everything but the routed experts stays bf16
KIMI_IGNORE = ("lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               r"re:.*vision_tower.*", r"re:.*mm_projector.*")


def symmetric_scales(weight: torch.Tensor, num_bits: int = 4, group_size: int | None = 32) -> torch.Tensor:
    """weight [out, in] -> scale [out, groups] in the weight's dtype (``group_size`` None: per channel)."""
    rows, cols = weight.shape
    size = cols if group_size is None else group_size
    assert cols % size == 0, f"in_features {cols} is not a multiple of group_size {size}"
    g = weight.reshape(rows, cols // size, size)  # [out, G, size]
    zero = torch.zeros((), dtype=weight.dtype, device=weight.device)
    amax = torch.maximum(g.amin(-1).minimum(zero).abs(), g.amax(-1).maximum(zero))  # [out, G]
    half_range = torch.tensor(((1 << num_bits) - 1) / 2, dtype=weight.dtype, device=weight.device)
    scale = amax / half_range
    return torch.where(scale == 0, torch.tensor(torch.finfo(weight.dtype).eps, dtype=weight.dtype, device=weight.device), scale)


def quantize_symmetric(weight: torch.Tensor, scale: torch.Tensor, num_bits: int = 4) -> torch.Tensor:
    """weight [out, in], scale [out, G] -> int8 [out, in] in [-2^(b-1), 2^(b-1) - 1] (clamp, then round)."""
    rows, cols = weight.shape
    groups = scale.shape[1]
    low, high = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    scaled = weight.reshape(rows, groups, cols // groups) / scale.unsqueeze(-1)  # [out, G, size], the weight's dtype
    return torch.round(scaled.clamp(low, high)).reshape(rows, cols).to(torch.int8)


def pack_int32(q: torch.Tensor, num_bits: int) -> torch.Tensor:
    """int8 [R, C] signed values -> int32 [R, ceil(C*b/32)]: element i at bit i*b of the row's little-endian
    words, stored as q + 2^(b-1); an element may straddle two words (b = 3, 5, 6, 7)."""
    assert 1 <= num_bits <= 8 and q.dim() == 2, f"need int8 [R, C] and 1-8 bits, got {list(q.shape)}, {num_bits}"
    rows, cols = q.shape
    stored = (q.to(torch.int64) + (1 << (num_bits - 1)))  # [R, C] in [0, 2^b)
    assert int(stored.min()) >= 0 and int(stored.max()) < (1 << num_bits), "values outside the num_bits range"
    bits = (stored.unsqueeze(-1) >> torch.arange(num_bits, device=q.device)) & 1  # [R, C, b], low bit first
    words = math.ceil(cols * num_bits / 32)
    flat = torch.zeros(rows, words * 32, dtype=torch.int64, device=q.device)
    flat[:, : cols * num_bits] = bits.reshape(rows, cols * num_bits)  # bit i*b + j of the row
    weights = torch.ones(32, dtype=torch.int64, device=q.device) << torch.arange(32, device=q.device)  # [32]
    unsigned = (flat.view(rows, words, 32) * weights).sum(-1)  # [R, W] in [0, 2^32)
    return torch.where(unsigned >= 1 << 31, unsigned - (1 << 32), unsigned).to(torch.int32)


def pack_quantized(weight: torch.Tensor, num_bits: int = 4, group_size: int | None = 32) -> dict[str, torch.Tensor]:
    """One linear's ``weight`` [out, in] -> its stored tensors ``{"weight_packed", "weight_scale", "weight_shape"}``
    (symmetric; ``group_size`` None: per channel), as compressed-tensors' ``pack-quantized`` writes them."""
    scale = symmetric_scales(weight, num_bits, group_size)
    q = quantize_symmetric(weight, scale, num_bits)
    return {"weight_packed": pack_int32(q, num_bits).contiguous(), "weight_scale": scale.contiguous(),
            "weight_shape": torch.tensor(list(weight.shape), dtype=torch.int64)}


def pack_quantized_config(num_bits: int = 4, group_size: int | None = 32, ignore: tuple[str, ...] = KIMI_IGNORE,
                          targets: tuple[str, ...] = ("Linear",)) -> dict:
    """The ``quantization_config`` a checkpoint of :func:`pack_quantized` weights carries (W4A16 as Kimi's:
    one config group over every ``Linear`` but the ``ignore`` list)."""
    weights = {"num_bits": num_bits, "type": "int", "symmetric": True, "strategy": "group" if group_size else "channel",
               "group_size": group_size, "dynamic": False, "actorder": None, "block_structure": None,
               "observer": "minmax", "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": list(targets), "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": list(ignore), "kv_cache_scheme": None}
