"""Quantized targets as they ship: read the scheme from the checkpoint's config, dequantize on load.

Schemes read (each linear's stored tensors -> one float ``weight``; modules kept unquantized, such as
the config's ``ignore`` list, are stored as a plain ``weight`` and load as they are):

| ``quantization_config`` | stored per linear | weight = |
|---|---|---|
| ``quant_method: compressed-tensors``, ``format: pack-quantized`` (Kimi-K2-Thinking / K2.5 routed experts: INT4, symmetric, group 32) | ``weight_packed`` int32 [out, ceil(in*b/32)], ``weight_scale`` [out, groups], ``weight_shape`` [2], asymmetric: ``weight_zero_point`` int32 packed along rows | ``(q - zp) * scale[group]`` |
| ``quant_method: fp8``, ``weight_block_size: [128, 128]`` (DeepSeek-V3, Kimi-K2-Instruct) | ``weight`` float8_e4m3fn, ``weight_scale_inv`` [ceil(out/128), ceil(in/128)] | ``w * scale_inv[block]`` |
| ``quant_method: modelopt``, ``quant_algo: NVFP4`` (config.json or ``hf_quant_config.json``) | ``weight`` uint8 [out, in/2] (two e2m1 per byte), ``weight_scale`` float8_e4m3fn [out, in/16], ``weight_scale_2`` scalar | ``e2m1 * scale[16-group] * weight_scale_2`` |
| ``quant_method: compressed-tensors``, ``format: nvfp4-pack-quantized`` | ``weight_packed`` uint8, ``weight_scale`` float8_e4m3fn, ``weight_global_scale`` | ``e2m1 * scale / global_scale`` |

Packing, as compressed-tensors writes it: element i of a row sits at bit ``i * b`` of the row's
little-endian int32 words, stored as ``q + 2^(b-1)``; an asymmetric zero point is packed the same way
down the rows. e2m1: low nibble first; bit 3 the sign, bits 0-2 index ``0, .5, 1, 1.5, 2, 3, 4, 6``.

Dequantized where no kernel of ours pays: every scheme becomes the run's dtype on load (bf16 on CUDA)
and activations run unquantized; :meth:`QuantizedReader.notes` says so in the run's notes. Any other
scheme is refused with exit 2 naming the file, the field, what was found and what is read.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from eaglelab.engine.core.fields import shown
from eaglelab.engine.errors import CheckpointError, ConfigError, read_json_object

FP8_BLOCK = 128
NVFP4_GROUP = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
READ = ("compressed-tensors with format pack-quantized (INT1-8 weights, group/channel) or nvfp4-pack-quantized"
        " | fp8 with weight_block_size (DeepSeek block FP8) | modelopt with quant_algo NVFP4")
FIX = ("dequantize it to bf16 with the library that wrote it (e.g. compressed-tensors' ModelCompressor."
       "decompress_model, then save_pretrained) and pass that directory")
Getter = Callable[[str], "torch.Tensor | None"]  # a checkpoint tensor by its full name, or None


# ---- the arithmetic ----------------------------------------------------------------------------------------
def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: int | tuple[int, int] = FP8_BLOCK) -> torch.Tensor:
    """Block FP8 [out, in] with scales [ceil(out/bo), ceil(in/bi)] -> float32 [out, in] (edge blocks partial)."""
    bo, bi = (block, block) if isinstance(block, int) else block
    rows, cols = weight.shape
    s = scale_inv.float().reshape(math.ceil(rows / bo), math.ceil(cols / bi))
    s = s.repeat_interleave(bo, 0)[:rows].repeat_interleave(bi, 1)[:, :cols]
    return weight.float() * s


def unpack_int32(packed: torch.Tensor, num_bits: int, count: int) -> torch.Tensor:
    """int32 [R, W] -> [R, count] unsigned integers (uint8 or int64): element i of a row from bits
    [i*b, i*b + b) of the row's words (little end first), as stored (offset by 2^(b-1))."""
    if 8 % num_bits == 0 and sys.byteorder == "little":  # 1, 2, 4, 8 bits never straddle a byte: split bytes (fast)
        shifts = torch.arange(0, 8, num_bits, dtype=torch.uint8, device=packed.device)
        nbytes = packed.contiguous().reshape(-1).view(torch.uint8).reshape(packed.shape[0], -1)  # [R, 4W], little end first
        return ((nbytes.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)).reshape(packed.shape[0], -1)[:, :count]
    words = packed.long() & 0xFFFFFFFF  # [R, W] the words as unsigned
    pairs = words | (torch.cat([words[:, 1:], torch.zeros_like(words[:, :1])], 1) << 32)  # word w and w+1
    start = torch.arange(count, device=packed.device) * num_bits  # [count] first bit of each element
    return (pairs[:, start // 32] >> (start % 32)) & ((1 << num_bits) - 1)


def dequantize_packed_int(packed: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int], num_bits: int,
                          zero_point: torch.Tensor | None = None, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """compressed-tensors ``pack-quantized`` -> float32 ``shape``: ``(q - zp) * scale`` per group of columns.

    ``scale`` [out, G] (G = 1: per channel); ``zero_point`` int32 [ceil(out*b/32), G] packed down the rows
    (asymmetric only); ``g_idx`` [in]: each column's group (activation order), else column // (in / G).
    """
    rows, cols = shape
    offset = 1 << (num_bits - 1)
    scale = scale.float().reshape(rows, -1)  # [out, G]
    groups = scale.shape[1]
    zp = torch.zeros_like(scale) if zero_point is None else \
        unpack_int32(zero_point.t().contiguous(), num_bits, rows).t().float() - offset  # [out, G]
    q = unpack_int32(packed, num_bits, cols).float()  # [out, in], offset by 2^(b-1)
    if g_idx is not None:  # activation order: any column in any group
        g = g_idx.long()
        return (q - offset - zp[:, g]) * scale[:, g]
    size = math.ceil(cols / groups)
    if cols % size:  # a ragged last group
        g = torch.arange(cols, device=q.device) // size
        return (q - offset - zp[:, g]) * scale[:, g]
    q = q.reshape(rows, groups, size)  # [out, G, size]
    return ((q - (offset + zp).unsqueeze(-1)) * scale.unsqueeze(-1)).reshape(rows, cols)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [R, C/2] -> float32 [R, C]: two e2m1 values per byte, low nibble first."""
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1).long()  # [R, C]
    magnitude = torch.tensor(E2M1_VALUES, device=packed.device)[nibbles & 0x7]
    return torch.where(nibbles & 0x8 != 0, -magnitude, magnitude)


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_factor: float, group: int = NVFP4_GROUP) -> torch.Tensor:
    """NVFP4 uint8 [out, in/2] with e4m3 scales [out, in/group] -> float32 [out, in], times ``global_factor``
    (modelopt's ``weight_scale_2``; compressed-tensors' 1 / ``weight_global_scale``)."""
    values = unpack_e2m1(packed)  # [out, in]
    per = scale.float().repeat_interleave(group, 1)[:, : values.shape[1]]
    return values * per * global_factor


# ---- the scheme -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IntArgs:
    """One compressed-tensors config group's weights: ``targets`` and how they were quantized."""

    targets: tuple[str, ...]
    num_bits: int
    symmetric: bool
    strategy: str  # "group" | "channel"
    group_size: int | None


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's ``quantization_config`` (or modelopt's ``hf_quant_config.json``) says."""

    kind: str  # "none" | "pack-quantized" | "nvfp4-pack-quantized" | "fp8-block" | "modelopt-nvfp4"
    source: str  # the file that said so
    groups: tuple[IntArgs, ...] = ()
    block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    activations: bool = False  # the scheme quantizes activations too (we run them unquantized)

    def args_for(self, module: str, field: str) -> IntArgs:
        """The config group whose ``targets`` name ``module`` (a regex or name first, then a class name)."""
        named = [g for g in self.groups for t in g.targets if _names(t, module)]
        classes = [g for g in self.groups if any(not t.startswith("re:") and "." not in t and t[:1].isupper() for t in g.targets)]
        if named or classes:
            return (named or classes)[0]
        raise CheckpointError("a packed weight no config group targets", file=self.source, field=field,
                              found=[list(g.targets) for g in self.groups],
                              hint="the checkpoint does not match its quantization_config; re-export it")


def _on(get: Getter, device: torch.device) -> Getter:
    def moved(name: str) -> torch.Tensor | None:
        t = get(name)
        return None if t is None else t.to(device)

    return moved


def _names(target: str, module: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return module == target or module.endswith("." + target)


def read_scheme(model_dir: str | Path) -> QuantScheme:
    """The quantization scheme of an HF model directory (``kind == "none"`` when it has none): config.json's
    ``quantization_config``, a multimodal wrapper's ``text_config.quantization_config`` (Kimi-K2.5), or
    modelopt's ``hf_quant_config.json``."""
    model_dir = Path(model_dir)
    config_file = model_dir / "config.json"
    config = read_json_object(config_file) if config_file.exists() else {}
    qc = config.get("quantization_config")
    source, prefix = config_file, "quantization_config."
    text = config.get("text_config")
    if qc is None and isinstance(text, dict) and text.get("quantization_config") is not None:
        qc, prefix = text["quantization_config"], "text_config.quantization_config."  # Kimi-K2.5 keeps it there
    if qc is None and (model_dir / "hf_quant_config.json").exists():
        source, prefix = model_dir / "hf_quant_config.json", ""
        qc = {"quant_method": "modelopt", **read_json_object(source)}
    if qc is None:
        return QuantScheme("none", str(config_file))
    if not isinstance(qc, dict):
        raise ConfigError("must be an object", file=source, field=prefix.rstrip(".") or "quantization_config", found=shown(qc))
    method = qc.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, str(source))
    if method == "fp8":
        return _fp8(qc, str(source))
    if isinstance(method, str) and method.lower().startswith("modelopt"):
        return _modelopt(qc, str(source), prefix)
    raise ConfigError("a quantization scheme eaglelab does not read", file=source, field=prefix + "quant_method",
                      found=shown(method), expected=READ, hint=FIX)


def _compressed_tensors(qc: dict, source: str) -> QuantScheme:
    field = "quantization_config.format"
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError("missing or empty", file=source, field="quantization_config.config_groups",
                          found=shown(groups), hint="copy quantization_config from the model's original config.json")
    formats = {g.get("format") or fmt for g in groups.values() if isinstance(g, dict)} if fmt in (None, "mixed-precision") else {fmt}
    if len(formats) != 1 or next(iter(formats)) not in ("pack-quantized", "nvfp4-pack-quantized"):
        raise ConfigError("a compressed-tensors format eaglelab does not read", file=source, field=field,
                          found=shown(fmt if len(formats) != 1 else next(iter(formats))),
                          expected=f"pack-quantized | nvfp4-pack-quantized (eaglelab reads {READ})", hint=FIX)
    kind = next(iter(formats))
    args, activations = [], False
    for name, g in groups.items():
        where = f"quantization_config.config_groups.{name}"
        if not isinstance(g, dict) or not isinstance(g.get("weights"), dict):
            raise ConfigError("needs a 'weights' object", file=source, field=where, found=shown(g))
        activations |= bool(g.get("input_activations"))
        args.append(_int_args(g, kind, source, where))
    return QuantScheme(kind, source, groups=tuple(args), activations=activations)


def _int_args(g: dict, kind: str, source: str, where: str) -> IntArgs:
    w = g["weights"]
    targets = g.get("targets") or ["Linear"]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ConfigError("must be a list of names", file=source, field=where + ".targets", found=shown(targets))
    want_type = "float" if kind == "nvfp4-pack-quantized" else "int"
    strategy = w.get("strategy")
    ok_strategy = ("tensor_group",) if kind == "nvfp4-pack-quantized" else ("group", "channel")
    bits = w.get("num_bits")
    if w.get("type", want_type) != want_type or strategy not in ok_strategy or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ConfigError(f"weights {kind} does not read", file=source, field=where + ".weights",
                          found=shown({k: w.get(k) for k in ("type", "num_bits", "strategy")}),
                          expected=f"type {want_type}, num_bits 1-8, strategy {' | '.join(ok_strategy)}", hint=FIX)
    size = w.get("group_size")
    if strategy == "group" and (not isinstance(size, int) or size < 1):
        raise ConfigError("must be a positive integer", file=source, field=where + ".weights.group_size", found=shown(size))
    return IntArgs(tuple(targets), bits, bool(w.get("symmetric", True)), strategy, size)


def _fp8(qc: dict, source: str) -> QuantScheme:
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ConfigError("FP8 without a block size (per-tensor FP8) is not read", file=source,
                          field="quantization_config.weight_block_size", found=shown(block),
                          expected=f"[128, 128] (eaglelab reads {READ})", hint=FIX)
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ConfigError("an FP8 format eaglelab does not read", file=source, field="quantization_config.fmt",
                          found=shown(qc.get("fmt")), expected="e4m3", hint=FIX)
    return QuantScheme("fp8-block", source, block=(block[0], block[1]), activations=True)


def _modelopt(qc: dict, source: str, prefix: str) -> QuantScheme:
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else qc
    field = prefix + ("quantization.quant_algo" if inner is not qc else "quant_algo")
    algo = inner.get("quant_algo")
    if not isinstance(algo, str) or algo.upper() not in ("NVFP4", "W4A16_NVFP4"):
        raise ConfigError("a modelopt algorithm eaglelab does not read", file=source, field=field, found=shown(algo),
                          expected=f"NVFP4 | W4A16_NVFP4 (eaglelab reads {READ})", hint=FIX)
    size = inner.get("group_size", NVFP4_GROUP)
    if size != NVFP4_GROUP:
        raise ConfigError("NVFP4 scales one e4m3 per 16 values", file=source, field=field.replace("quant_algo", "group_size"),
                          found=shown(size), expected=NVFP4_GROUP)
    return QuantScheme("modelopt-nvfp4", source, activations=algo.upper() == "NVFP4")


# ---- the reader --------------------------------------------------------------------------------------------
class QuantizedReader:
    """Turns a checkpoint's stored tensors into float ones per ``scheme``; remembers what it dequantized.

    A loader asks :meth:`stored_names` where a parameter may be stored, reads the first present, then
    passes it through :meth:`load` with a getter for its companion tensors (scales, shapes)."""

    def __init__(self, scheme: QuantScheme, device: str | torch.device = "cpu") -> None:
        self.scheme, self.device = scheme, torch.device(device)  # where the arithmetic runs (a GPU's is ~100x a CPU's)
        self.dequantized: list[str] = []

    @classmethod
    def of(cls, model_dir: str | Path, device: str | torch.device = "cpu") -> "QuantizedReader":
        return cls(read_scheme(model_dir), device)

    def stored_names(self, name: str) -> tuple[str, ...]:
        """``x.weight`` may be stored as ``x.weight`` or (compressed-tensors) ``x.weight_packed``."""
        return (name, name + "_packed") if name.endswith(".weight") else (name,)

    def load(self, stored: str, tensor: torch.Tensor, get: Getter) -> torch.Tensor:
        """The float tensor for ``stored`` (a full checkpoint name); plain tensors come back as they are."""
        kind, base, weight = self.scheme.kind, stored.rpartition(".")[0], stored.endswith(".weight")
        packed = stored.endswith(".weight_packed")
        fp8 = tensor.dtype in FLOAT8 and kind in ("fp8-block", "none") and weight
        fp4 = tensor.dtype == torch.uint8 and kind == "modelopt-nvfp4" and weight
        if not (packed or fp8 or fp4):
            if (not tensor.is_floating_point() or tensor.dtype in FLOAT8) and weight:
                raise self._unexpected(stored, tensor)
            return tensor
        if packed and kind not in ("pack-quantized", "nvfp4-pack-quantized"):
            raise self._unexpected(stored, tensor)
        tensor, get = tensor.to(self.device), _on(get, self.device)
        if packed:
            out = self._packed(base, tensor, get)
        elif fp8:
            bo, bi = self.scheme.block
            scale = self._need(get, base + ".weight_scale_inv", None, (math.ceil(tensor.shape[0] / bo), math.ceil(tensor.shape[1] / bi)))
            out = dequantize_fp8(tensor, scale, self.scheme.block)
        else:
            scale = self._need(get, base + ".weight_scale", torch.float8_e4m3fn, (tensor.shape[0], tensor.shape[1] * 2 // NVFP4_GROUP))
            out = dequantize_nvfp4(tensor, scale, float(self._need(get, base + ".weight_scale_2").float().reshape(-1)[0]))
        self.dequantized.append(base)
        return out

    def _packed(self, base: str, packed: torch.Tensor, get: Getter) -> torch.Tensor:
        field = base + ".weight_packed"
        if self.scheme.kind == "nvfp4-pack-quantized":
            rows, cols = packed.shape[0], packed.shape[1] * 2
            scale = self._need(get, base + ".weight_scale", torch.float8_e4m3fn, (rows, cols // NVFP4_GROUP))
            return dequantize_nvfp4(packed, scale, 1.0 / float(self._need(get, base + ".weight_global_scale").float().reshape(-1)[0]))
        args = self.scheme.args_for(base, field)
        shape = self._need(get, base + ".weight_shape").reshape(-1).tolist()
        if len(shape) != 2 or min(shape) < 1:
            raise CheckpointError("must hold [out_features, in_features]", file=self.scheme.source, field=base + ".weight_shape", found=shape)
        rows, cols = shape
        want = (rows, math.ceil(cols * args.num_bits / 32))
        if packed.dtype != torch.int32 or tuple(packed.shape) != want:
            raise CheckpointError("wrong packed weight", file=self.scheme.source, field=field,
                                  found=f"{packed.dtype} {list(packed.shape)}", expected=f"torch.int32 {list(want)}",
                                  hint="the checkpoint does not match its quantization_config (num_bits) or weight_shape")
        groups = 1 if args.strategy == "channel" else math.ceil(cols / args.group_size)
        scale = self._need(get, base + ".weight_scale", None, (rows, groups))
        zp = None if args.symmetric else self._need(get, base + ".weight_zero_point", torch.int32,
                                                    (math.ceil(rows * args.num_bits / 32), groups))
        return dequantize_packed_int(packed, scale, (rows, cols), args.num_bits, zp, get(base + ".weight_g_idx"))

    def _need(self, get: Getter, name: str, dtype: torch.dtype | None = None, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = get(name)
        if t is None:
            raise CheckpointError("missing tensor (the scheme stores it with every quantized weight)", file=self.scheme.source,
                                  field=name, hint="the checkpoint is incomplete or does not match its quantization_config")
        if (dtype is not None and t.dtype != dtype) or (shape is not None and tuple(t.shape) != shape):
            raise CheckpointError("wrong scale tensor", file=self.scheme.source, field=name, found=f"{t.dtype} {list(t.shape)}",
                                  expected=f"{dtype or 'float'} {list(shape) if shape else ''}".strip(),
                                  hint="the checkpoint does not match its quantization_config")
        if t.is_floating_point() and not torch.isfinite(t.float()).all():
            raise CheckpointError("holds non-finite values", file=self.scheme.source, field=name, hint="the scales are corrupt: re-download")
        return t

    def _unexpected(self, stored: str, tensor: torch.Tensor) -> CheckpointError:
        return CheckpointError("a quantized tensor the config's scheme does not describe", file=self.scheme.source, field=stored,
                               found=f"{tensor.dtype} {list(tensor.shape)} under scheme '{self.scheme.kind}'",
                               expected=READ, hint="config.json's quantization_config must say how these weights were "
                               "quantized (copy it from the model's original config.json), or " + FIX)

    def notes(self, dtype: torch.dtype) -> tuple[str, ...]:
        """What was dequantized, into what, and why: for the run's notes (empty when nothing was)."""
        if not self.dequantized:
            return ()
        what = "routed experts" if all(re.search(r"\.experts\.\d+\.", n) for n in self.dequantized) else \
            f"{len(self.dequantized)} linears"
        into = str(dtype).removeprefix("torch.")
        s = self.scheme
        if s.kind == "pack-quantized":
            a = s.groups[0]
            how = f"INT{a.num_bits} (compressed-tensors pack-quantized, {'symmetric' if a.symmetric else 'asymmetric'}, " + \
                (f"group {a.group_size})" if a.strategy == "group" else "per channel)")
            kernel = f"no INT{a.num_bits} kernel of ours"
        elif s.kind == "fp8-block":
            how, kernel = f"block FP8 e4m3 ({s.block[0]}x{s.block[1]} scales)", "no FP8 kernel of ours"
        elif s.kind == "none":
            how, kernel = "block FP8 e4m3 (no quantization_config: read as DeepSeek's 128x128)", "no FP8 kernel of ours"
        else:
            how = "NVFP4 (" + ("modelopt" if s.kind == "modelopt-nvfp4" else "compressed-tensors") + ", e4m3 scales per 16)"
            kernel = "no FP4 kernel of ours"
        acts = "; activations run unquantized" if s.activations else ""
        return (f"target: {what} {how}, dequantized to {into} on load: {kernel}{acts}",)
