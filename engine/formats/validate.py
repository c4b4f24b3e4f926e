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
    if tensor.element_size() == 1:  # float8: torch has no isfinite for it
        tensor = tensor.float()
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


def file_kind(path: str | Path) -> str:
    """``"a regular file"``, ``"missing"``, or what else ``path`` is (``"a FIFO (named pipe)"``, ``"a directory"``
    ...), from ``stat`` alone: nothing is opened (opening a FIFO blocks until a writer comes)."""
    import stat

    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:  # a path through a file, a loop of links, no permission, a NUL byte
        return f"unreadable ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def check_regular_file(path: str | Path, what: str, *, field: str | None = None, error: type = CheckpointError,
                       hint: str | None = None) -> Path:
    """``path`` is a regular file; a FIFO, a device, a directory or a missing path is refused by name before
    anything opens it (a FIFO would block the reader for ever)."""
    kind = file_kind(path)
    if kind != "a regular file":
        raise error(f"cannot be read as {what}", file=path, field=field, found=kind, expected="a regular file",
                    hint=hint or "pass the file itself (a FIFO, a device or a directory cannot be read as one)")
    return Path(path)


def read_user_text(path: str | Path, what: str, *, hint: str | None = None) -> str:
    """A user's text file (prompts, answers), read whole: a FIFO or directory is refused unopened, and
    bytes that are not UTF-8 are named with their line, instead of a UnicodeDecodeError."""
    check_regular_file(path, what, error=ConfigError)
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"is not UTF-8 text (line {line})", file=path, found=f"byte {data[exc.start]:#04x} at offset {exc.start}",
                          expected="UTF-8 text", hint=hint or "convert the file to UTF-8 (e.g. iconv -t utf-8)") from None


def check_text_value(value: object, file: str | Path, field: str) -> str:
    """A string from a user's JSON file that a tokenizer can encode: a lone surrogate (``"\\ud800"`` in the
    JSON) is refused with its position, instead of the tokenizer's TypeError."""
    if not isinstance(value, str):
        raise ConfigError("must be a string", file=file, field=field, found=shown(value), expected="text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError("holds a lone surrogate, which is not text", file=file, field=field,
                          found=f"{value[exc.start]!r} at character {exc.start}", expected="valid Unicode text",
                          hint="the writer escaped half of a surrogate pair: fix that line or drop it") from None
    return value


INDEX_NAME = "model.safetensors.index.json"


def read_weight_map(directory: Path) -> dict[str, str] | None:
    """``model.safetensors.index.json``'s ``weight_map`` (tensor name -> shard file name), or None when the
    directory has no index. Each shard must be a plain file name beside the index (``../x`` or ``/x`` would
    read weights from outside the checkpoint), present and a regular file; an empty map is refused (it would
    silently hide every shard)."""
    index = directory / INDEX_NAME
    if file_kind(index) == "missing":
        return None
    from eaglelab.engine.errors import read_json_object

    check_regular_file(index, "a safetensors index", field="weight_map", error=ConfigError)
    raw = read_json_object(index)
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError("must map tensor names to shard file names", file=index, field="weight_map",
                          found=shown(weight_map), hint="re-save the checkpoint, or delete the index if it is stale")
    if not weight_map:
        raise ConfigError("lists no tensors", file=index, field="weight_map", found="{}",
                          expected="each tensor name mapped to its shard",
                          hint="re-save the checkpoint, or delete the index if a single model.safetensors is meant")
    outside = sorted({v for v in weight_map.values() if not _plain_name(v)})
    if outside:
        raise ConfigError("names shard files outside the checkpoint's directory", file=index, field="weight_map",
                          found=", ".join(repr(v) for v in outside[:5]), expected="plain file names beside the index",
                          hint="copy the shards into the directory and name them without a path")
    listed = sorted(set(weight_map.values()))
    missing = [name for name in listed if file_kind(directory / name) == "missing"]
    if missing:
        raise CheckpointError("names shard files that are not in the directory", file=index, field="weight_map",
                              found=", ".join(missing[:5]), expected="every shard the index names, beside it",
                              hint="copy the missing shards, or re-save the checkpoint")
    for name in listed:
        check_regular_file(directory / name, "a safetensors shard", hint="the index names it: put the shard itself there")
    return dict(weight_map)


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def listed_weight_files(directory: Path, files: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(files to read, files ignored): with a ``model.safetensors.index.json``, only the shards it lists
    are read, so a stale shard left in the directory cannot override real weights."""
    files = sorted(files)
    weight_map = read_weight_map(directory)
    if weight_map is None:
        return files, []
    listed = set(weight_map.values())
    return [f for f in files if f.name in listed], [f for f in files if f.name not in listed]


def stale_copy(weight_map: dict[str, str] | None, name: str, shard: Path) -> bool:
    """Whether tensor ``name`` found in ``shard`` is a stale copy: the index maps it to another shard
    (the index decides where each tensor lives, as HF loaders read it)."""
    return weight_map is not None and name in weight_map and weight_map[name] != shard.name


FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors' names of the dtypes a drafter computes in
INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U8")


def check_tensor_dtype(name: str, dtype: str, file: Path, source_name: str) -> None:
    """A drafter tensor's stored dtype (from the safetensors header): weights are floats eaglelab computes
    with (float8 or integer weights carry no usable values without their scales); ``d2t`` integer
    offsets; ``t2d`` a bool or 0/1 integer mask."""
    if name == "d2t":
        ok, expected, what = dtype in INTEGER_DTYPES, "an integer type (I64)", "must hold integers (draft-to-target offsets)"
    elif name == "t2d":
        ok, expected, what = dtype in INTEGER_DTYPES + ("BOOL",), "BOOL (or a 0/1 integer mask)", "must hold a bool mask"
    else:
        ok, expected, what = dtype in FLOAT_DTYPES, "F32, BF16 or F16 weights", "is stored in a type a drafter cannot run with"
    if not ok:
        raise CheckpointError(
            what, file=file, field=source_name, found=dtype, expected=expected,
            hint="re-save the drafter in bfloat16 (dequantize float8 / integer weights with their scales first)"
            if name not in ("d2t", "t2d") else "re-save the vocabulary maps as written by SpecForge (d2t int64, t2d bool)")


def several_shards_need_an_index(directory: Path, files: list[Path]) -> None:
    """Without ``model.safetensors.index.json`` a directory may hold one weight file only: with several,
    nothing says which shard is current, and a stale copy would silently mix with the real weights."""
    if len(files) > 1 and file_kind(directory / INDEX_NAME) == "missing":
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
