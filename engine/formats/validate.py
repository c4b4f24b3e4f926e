"""The checks every file reader shares: finite and integer tensors, weight files, sizes, torch.load.

Checks of single config values (numbers, ranges, ``rope_scaling``) are in
:mod:`eaglelab.engine.core.fields`, below ``model``, which uses them too.

Each check either returns the value it checked (converted to the type wanted) or raises a
:class:`~eaglelab.engine.errors.ConfigError` / :class:`~eaglelab.engine.errors.CheckpointError`
that names the file, the field, what was found, what was expected and what to do. Readers call
these instead of ``float(d.get(...))``, which turns ``"abc"`` into a traceback and ``NaN`` into a
model that silently produces garbage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from eaglelab.engine.core.fields import shown, value_range
from eaglelab.engine.errors import CheckpointError, ConfigError


def check_finite_tensor(tensor: Any, source: str | Path, name: str, *, hint: str | None = None) -> None:
    """A floating tensor holds no NaN or infinity (integer and bool tensors always pass)."""
    import torch

    if not torch.is_floating_point(tensor) or tensor.numel() == 0:
        return
    bad = (~torch.isfinite(tensor)).sum().item()
    if bad:
        kind = "NaN" if torch.isnan(tensor).any().item() else "infinite"
        raise CheckpointError(
            f"holds {bad} non-finite value(s) ({kind} among them)", file=source, field=name,
            found=f"{bad} of {tensor.numel()} values", expected="finite numbers only",
            hint=hint or "the weights are corrupt or came from a diverged training run: re-export or retrain them",
        )


def check_integer_tensor(tensor: Any, source: str | Path, name: str, *, low: int | None = None,
                         high: int | None = None) -> None:
    """An integer tensor (int32/int64) whose values lie in [low, high]."""
    import torch

    if tensor.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise CheckpointError("must hold integers", file=source, field=name, found=str(tensor.dtype).replace("torch.", ""),
                              expected="int64", hint="re-save it with .long(); a float copy loses exact offsets")
    if tensor.numel() == 0:
        return
    lo, hi = int(tensor.min().item()), int(tensor.max().item())
    if (low is not None and lo < low) or (high is not None and hi > high):
        raise CheckpointError("values out of range", file=source, field=name, found=f"{lo}..{hi}",
                              expected=value_range(low, high, False))


def listed_weight_files(directory: Path, files: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(files to read, files ignored): with a ``model.safetensors.index.json``, only the shards it lists
    are read, so a stale shard left in the directory cannot override real weights."""
    files = sorted(files)
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        return files, []
    from eaglelab.engine.errors import read_json_object

    raw = read_json_object(index)
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError("must map tensor names to shard file names", file=index, field="weight_map",
                          found=shown(weight_map), hint="re-save the checkpoint, or delete the index if it is stale")
    listed = set(weight_map.values())
    missing = sorted(name for name in listed if not (directory / name).is_file())
    if missing:
        raise CheckpointError("names shard files that are not in the directory", file=index, field="weight_map",
                              found=", ".join(missing[:5]), expected="every shard the index names, beside it",
                              hint="copy the missing shards, or re-save the checkpoint")
    return [f for f in files if f.name in listed], [f for f in files if f.name not in listed]


def several_shards_need_an_index(directory: Path, files: list[Path]) -> None:
    """Without ``model.safetensors.index.json`` a directory may hold one weight file only: with several,
    nothing says which shard is current, and a stale copy would silently mix with the real weights."""
    if len(files) > 1 and not (directory / "model.safetensors.index.json").exists():
        names = ", ".join(f.name for f in files[:4]) + (", ..." if len(files) > 4 else "")
        raise CheckpointError(
            "several safetensors shards but no index", file=directory / "model.safetensors.index.json",
            field="weight_map", found=f"no index file; {len(files)} shards: {names}",
            expected="model.safetensors.index.json mapping each tensor to its shard",
            hint="copy model.safetensors.index.json from where the shards came from (it is saved with them), "
                 "or keep a single .safetensors file in the directory")


def check_safetensors_size(path: Path) -> None:
    """A safetensors file is as long as its header says (8-byte length, JSON header, then the data up to
    the largest ``data_offsets`` end): a download or copy cut short is named as such, before any read."""
    import json
    import struct

    size = path.stat().st_size
    truncated = "the download or copy was cut short: fetch this file again (compare its size with the source's)"
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError("is truncated: shorter than a safetensors header", file=path, field="header",
                                  found=f"{size} bytes", expected="at least 8 bytes", hint=truncated)
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError("is truncated: the file ends inside its safetensors header", file=path,
                                  field="header", found=f"{size} bytes", expected=f"at least {8 + n} bytes", hint=truncated)
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return  # not a size problem: safetensors' own reader reports the damage
    ends = {name: meta["data_offsets"][1] for name, meta in header.items()
            if isinstance(meta, dict) and isinstance(meta.get("data_offsets"), list) and len(meta["data_offsets"]) == 2
            and isinstance(meta["data_offsets"][1], int)}
    if not ends:
        return
    last = max(ends, key=ends.__getitem__)
    need = 8 + n + ends[last]
    if size < need:
        raise CheckpointError("is truncated: shorter than its safetensors header says", file=path,
                              field=f"data_offsets of {last}", found=f"{size} bytes",
                              expected=f"{need} bytes ({need - size} missing)", hint=truncated)


def load_tensor_dict(path: str | Path, *, what: str, required: Iterable[str] = (), hint: str | None = None) -> dict:
    """``torch.load(weights_only=True)`` of a file that must hold a dict with ``required`` keys; any
    failure (not a torch file, a pickle of objects, truncated, the wrong content) is a CheckpointError."""
    path = Path(path)
    obj = torch_load(path, what=what, hint=hint)
    if not isinstance(obj, dict):
        raise CheckpointError(f"is not {what}", file=path, found=type(obj).__name__, expected="a dict", hint=hint)
    missing = [key for key in required if key not in obj]
    if missing:
        raise CheckpointError(f"is not {what}: keys missing", file=path, found=", ".join(missing), hint=hint)
    return obj


def torch_load(path: str | Path, *, what: str, hint: str | None = None, data: bytes | None = None) -> Any:
    """``torch.load(weights_only=True)`` of a user's file (or of its ``data``, already read).

    Damaged bytes make torch's reader fail in many ways (``UnpicklingError``, ``RuntimeError``, but
    also ``IndexError``, ``struct.error``, ``UnicodeDecodeError`` ...): every one of them means "this
    file cannot be read", so every one becomes a CheckpointError naming the file.
    """
    import io
    import pickle

    import torch

    try:
        source = io.BytesIO(data) if data is not None else path
        return torch.load(source, weights_only=True, map_location="cpu")
    except OSError:
        raise  # the path itself (missing, a directory, no permission): the CLI reports it as such
    except pickle.UnpicklingError as exc:  # objects outside the allow-list: never unpickled
        raise CheckpointError(f"cannot be read with weights_only=True ({_first_line(exc)})", file=path,
                              hint="eaglelab loads only tensors and plain containers; re-save it as a dict of tensors") from None
    except Exception as exc:  # noqa: BLE001 - any failure to decode untrusted bytes; reported, not hidden
        raise CheckpointError(f"cannot be read as {what} ({type(exc).__name__}: {_first_line(exc)})", file=path,
                              hint=hint or "the file is truncated, damaged or not what eaglelab expects: regenerate it") from None


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, terminal colour codes removed, at most 200 characters."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:200]
