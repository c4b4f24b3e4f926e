"""Device profiles: the measured-best speculative settings for one drafter on one kind of device.

A profile says, per batch bucket, which tree (steps, topk, draft tokens) ran fastest for a drafter on a
device, with the figure that decided it, and the regime that was measured in: our kernels (the few-row GEMV, the
decode attention), their launches dependent or not (``pdl``), ``torch.compile``. ``run``, ``bench``, ``tune``, the
TUI and the pytest fixtures take their defaults from the profile that matches the device at hand (flags given on the
command line always win), and every value chosen this way carries its reason to the run's summary.

Where profiles come from, first match wins:

1. ``eaglelab tune`` writes one per (drafter, device) into the eaglelab cache
   (``$EAGLELAB_CACHE/profiles/``), from the configurations it confirmed by real runs;
2. a drafter directory may ship ``eaglelab_profiles.json`` beside its weights: the shipped drafter carries
   the profiles measured for it on the H200 and on a CPU.

A profile matches a device by name (``torch.cuda.get_device_name``, or ``cpu``) and dtype; a drafter by the
SHA-256 of its weights and config (:func:`drafter_digest`), so a retrained drafter never inherits the old
one's tree. A GPU with no profile of its own takes one measured on a GPU of its family (:data:`GPU_FAMILIES`:
the same chip generation, e.g. an H100 the H200's), saying so, until ``eaglelab tune`` measures its own: on an
H100 the H200 profile's batch-8 tree served 1.64x where the default chain gave 1.46x, one session
(benchmarks/results/h100_2026-12-05). A GPU's own profile with no bucket for some batch sizes (a tune at batch 1
alone) takes its family's buckets for those (:func:`with_family_buckets`). This module imports no torch.

File layout (JSON, one file may hold profiles for several devices)::

    {"schema": 1,
     "profiles": [{"device": "NVIDIA H200", "dtype": "bfloat16", "drafter_sha256": "...",
                   "compile": true, "gemv": true, "decode_attn": true, "pdl": false,
                   "kernels_reason": "...",
                   "buckets": [{"max_batch": 1, "steps": 5, "topk": 4, "draft_tokens": 24,
                                "measured": "2.00x over plain decoding, ..."}, ...],
                   "gemv_tilings": {"measured_on": {"gpu": "NVIDIA H200", "dtype": "bfloat16",
                                                    "torch": "2.11.0+cu130", "triton": "3.6.0"},
                                    "chosen": [{"n": 960, "k": 576, "rows_bucket": 1, "block_n": 8,
                                                "block_k": 512, "split_k": 1, "num_warps": 4,
                                                "num_stages": 3}, ...]},
                   "source": "..."}]}

``gemv_tilings`` (optional) is the Triton GEMV tuner's choice per (N, K, rows bucket), all zeros where F.linear
was faster; the GEMV takes them in place of timing those shapes only where ``measured_on`` is the setup at hand
(:meth:`eaglelab.engine.model.gemv.TritonGemv.adopt`), else it tunes as without them and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.model.gemv_tiling import KERNEL_ROWS
from eaglelab.engine.runtime.spec_config import MAX_LOOKUP_TOKENS, tree_label

SCHEMA = 1
SHIPPED_NAME = "eaglelab_profiles.json"  # beside a drafter's weights
MAX_PROFILE_BYTES = 1 << 20  # a profile is a few KB: anything larger is not one


@dataclass(frozen=True)
class BucketChoice:
    """The tree measured fastest for batches up to ``max_batch`` (the next bucket takes larger ones)."""

    max_batch: int
    steps: int
    topk: int
    draft_tokens: int
    measured: str = ""  # the figure that chose it, e.g. "2.00x over plain decoding (2,446.5 vs 1,222.9 tok/s)"
    lookup_tokens: int = 0  # a prompt-lookup branch beside the tree (absent from the file: none)
    measured_on: str = ""  # a GPU of the profile's family it was measured on, lent to fill a gap ("": the profile's own)

    @property
    def label(self) -> str:
        return tree_label(self.steps, self.topk, self.draft_tokens, self.lookup_tokens)


TILING_FIELDS = ("block_n", "block_k", "split_k", "num_warps", "num_stages")  # the GEMV's GemvConfig, in order
SHAPE_FIELDS = ("n", "k", "rows_bucket")
ENVIRONMENT_FIELDS = ("gpu", "dtype", "torch", "triton")  # the GEMV's tuning_environment
LAUNCHES = "launches"  # in measured_on only where the tilings were timed in dependent launches (TritonGemv.environment)
SPLIT_K = "split_k"  # in measured_on only where split tilings were timed as shares the reader adds (gemv.SHARES)
OPTIONAL_FIELDS = (LAUNCHES, SPLIT_K)


@dataclass(frozen=True)
class GemvTilings:
    """The GEMV tuner's choices measured on one setup: ``chosen`` maps (N, K, rows bucket) to the 5 ints of a
    tiling (:data:`TILING_FIELDS`; zeros: F.linear); ``measured_on`` is (name, value) per :data:`ENVIRONMENT_FIELDS`,
    :data:`LAUNCHES` where they were timed in chains of dependent launches (``--pdl``), and :data:`SPLIT_K` where
    split tilings were timed as K shares that the compiled reader adds."""

    measured_on: tuple[tuple[str, str], ...]
    chosen: tuple[tuple[tuple[int, int, int], tuple[int, ...]], ...]

    @classmethod
    def of(cls, chosen: dict[tuple[int, int, int], tuple[int, ...]], measured_on: dict[str, str]) -> GemvTilings:
        """From a tuner's ``chosen`` and its ``tuning_environment`` (shapes sorted, so files diff well)."""
        fields = ENVIRONMENT_FIELDS + tuple(k for k in OPTIONAL_FIELDS if k in measured_on)
        return cls(tuple((k, str(measured_on[k])) for k in fields),
                   tuple((tuple(key), tuple(int(v) for v in cfg)) for key, cfg in sorted(chosen.items())))

    def to_json(self) -> dict[str, Any]:
        return {"measured_on": dict(self.measured_on),
                "chosen": [dict(zip(SHAPE_FIELDS, key)) | dict(zip(TILING_FIELDS, cfg)) for key, cfg in self.chosen]}


@dataclass(frozen=True)
class DeviceProfile:
    """The measured-best settings of one drafter on one kind of device (see the module docstring)."""

    device: str  # "NVIDIA H200" | "cpu"
    dtype: str  # "bfloat16" | "float32" | ...
    drafter_sha256: str
    buckets: tuple[BucketChoice, ...]
    compile: bool | None = None  # the regime the trees were measured in; recorded, not applied (compile's default,
    #                              on with CUDA graphs, is the engine's; a profile measured without it says so here)
    gemv: bool | None = None
    decode_attn: bool | None = None
    pdl: bool | None = None  # the captured phases' kernels launched dependently (tune --pdl); run's default here
    kernels_reason: str = ""
    source: str = ""  # what measured it: a command and a date, or the tune run that wrote it
    gemv_tilings: GemvTilings | None = None  # the GEMV tuner's choices on this device (None: it tunes on first use)
    path: str = field(default="", compare=False)  # the file it was read from
    stands_in_for: str = field(default="", compare=False)  # a GPU of its family it was found for ("": its own)

    def bucket(self, batch: int) -> BucketChoice:
        """The smallest bucket that holds ``batch`` rows, else the largest one."""
        fits = [b for b in self.buckets if b.max_batch >= batch]
        return min(fits, key=lambda b: b.max_batch) if fits else max(self.buckets, key=lambda b: b.max_batch)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        d.pop("stands_in_for")
        d["buckets"] = [{k: v for k, v in asdict(b).items() if (k != "lookup_tokens" or v) and k != "measured_on"}
                        for b in self.buckets if not b.measured_on]  # a lent bucket is never written as this GPU's
        if self.gemv_tilings is None:
            d.pop("gemv_tilings")
        else:
            d["gemv_tilings"] = self.gemv_tilings.to_json()
        return d


def device_key(device_type: str, device_name: str | None) -> str:
    """The name a profile matches: ``cpu`` for any CPU, the GPU's marketing name for CUDA devices."""
    return "cpu" if device_type == "cpu" else (device_name or device_type)


def drafter_digest(drafter_dir: str | Path) -> str:
    """SHA-256 of a drafter: its config.json, then every tensor of its ``*.safetensors`` files by name (name,
    dtype, shape, bytes), so the same weights digest alike whether one file holds them or several shards."""
    root = Path(drafter_dir)
    h = hashlib.sha256()
    config = root / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    tensors: dict[str, tuple[Path, dict]] = {}
    for shard in sorted(root.glob("*.safetensors")):
        for name, entry in _safetensors_header(shard).items():
            tensors[name] = (shard, entry)
    for name in sorted(tensors):
        shard, entry = tensors[name]
        h.update(f"{name}|{entry['dtype']}|{entry['shape']}|".encode())
        h.update(_tensor_bytes(shard, entry))
    return h.hexdigest()


def _safetensors_header(path: Path) -> dict[str, dict]:
    """A safetensors file's header (8 bytes of little-endian length, then JSON), metadata left out."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= 100 * 2**20:
            raise EagleLabError("not a safetensors file (header length)", file=str(path), found=n,
                                expected="a header of 1 byte .. 100 MiB")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: {**v, "start": 8 + n} for k, v in header.items()}


def _tensor_bytes(path: Path, entry: dict) -> bytes:
    begin, end = entry["data_offsets"]
    with path.open("rb") as f:
        f.seek(entry["start"] + begin)
        return f.read(end - begin)


def adopt_gemv_tilings(gemv: Any, profile: DeviceProfile | None, device: Any, dtype: Any) -> str | None:
    """Hand ``profile``'s GEMV tilings to the Triton GEMV ``gemv`` (``TritonGemv.adopt``), which takes them only
    where they were measured on this GPU, dtype, torch and Triton. Returns why they were not taken (None: taken,
    or the profile has none, or the GEMV is off anyway)."""
    if profile is None or profile.gemv_tilings is None or gemv.reason is not None:
        return None
    t = profile.gemv_tilings
    return gemv.adopt(dict(t.chosen), dict(t.measured_on), gemv.environment(device, dtype),
                      source=f"the device profile in {profile.path or 'memory'}")


def gemv_tilings_of(gemv: Any, device: Any, dtype: Any) -> GemvTilings | None:
    """What a Triton GEMV chose on this setup, for a profile (``eaglelab tune`` writes it); None: it chose
    nothing or is off."""
    if gemv is None or gemv.reason is not None or not gemv.chosen:
        return None
    return GemvTilings.of(dict(gemv.chosen), gemv.environment(device, dtype))


def cache_profile_path(cache: Path, drafter_sha256: str) -> Path:
    """Where ``tune`` keeps the profiles it wrote for one drafter."""
    return cache / "profiles" / f"{drafter_sha256[:16]}.json"


# GPUs of one chip generation (the same SM architecture, so the same kernels and much the same latencies): a
# profile measured on one stands in for another until `eaglelab tune` measures that one's own. A name matches a
# family when one of its words is one of the family's chips ("NVIDIA H100 80GB HBM3" -> Hopper).
GPU_FAMILIES = (("Hopper", ("H100", "H200", "H800", "H20", "GH200")),
                ("Blackwell", ("B100", "B200", "GB200")),
                ("Ampere", ("A100", "A800")))


def gpu_family(device: str) -> str | None:
    """The :data:`GPU_FAMILIES` family of a device name, None for a CPU or a GPU none lists."""
    words = set(device.replace("-", " ").split())
    return next((family for family, chips in GPU_FAMILIES if words & set(chips)), None)


def find_profile(device: str, dtype: str, drafter_dir: str | Path | None, cache: Path,
                 drafter_sha256: str | None = None) -> DeviceProfile | None:
    """The profile for this drafter on this device and dtype: tune's (in ``cache``) first, then the
    one shipped beside the drafter; failing both, one measured on a GPU of this one's family (the same order),
    its ``stands_in_for`` naming this device. None when none fits. A file that is not a profile is an error
    that names it (a profile silently ignored would give wrong defaults without a word)."""
    if drafter_dir is None:
        return None
    sha = drafter_sha256 or drafter_digest(drafter_dir)
    found = [p for path in (cache_profile_path(cache, sha), Path(drafter_dir) / SHIPPED_NAME) if path.is_file()
             for p in read_profiles(path) if p.dtype == dtype and p.drafter_sha256 == sha]
    own = next((p for p in found if p.device == device), None)
    family = gpu_family(device)
    kin = next((p for p in found if family is not None and p.device != device and gpu_family(p.device) == family),
               None)
    if own is not None:
        return with_family_buckets(own, kin)
    return replace(kin, stands_in_for=device) if kin is not None else None


def with_family_buckets(own: DeviceProfile, kin: DeviceProfile | None) -> DeviceProfile:
    """``own`` with the buckets of ``kin`` (a profile of a GPU of its family) for the batch sizes ``own`` has none
    for, each lent bucket naming where it was measured (``measured_on``). A tune at batch 1 alone writes a
    profile with one bucket, and a bucket's tree would otherwise take every larger batch: on an H100 whose own
    profile held only batch 1's 5/4/24 + 16, the 80 MT-bench first turns served with --eos gave 1.75x at batch 8
    and 1.34x at 32, where the H200 profile's 4/4/12 + 8 and chain of 3 gave 1.92x and 1.60x on another H100
    (benchmarks/results/h100_2026-12-05c, h100_2026-12-05b).

    Example: own buckets 1; kin's 1, 8, 32 -> 1 (own), 8 and 32 (kin's, measured_on kin.device)."""
    if kin is None:
        return own
    have = {b.max_batch for b in own.buckets}
    lent = tuple(replace(b, measured_on=kin.device) for b in kin.buckets if b.max_batch not in have)
    if not lent:
        return own
    return replace(own, buckets=tuple(sorted((*own.buckets, *lent), key=lambda b: b.max_batch)))


def read_profiles(path: Path) -> list[DeviceProfile]:
    """Every profile in a profiles file, checked field by field."""
    try:
        if path.stat().st_size > MAX_PROFILE_BYTES:
            raise EagleLabError("too large for a profiles file", file=str(path),
                                found=f"{path.stat().st_size} bytes", expected=f"<= {MAX_PROFILE_BYTES} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EagleLabError("not a readable profiles file", file=str(path), found=_first_line(exc),
                            expected=f"JSON written by `eaglelab tune` (schema {SCHEMA})",
                            hint="delete it and run `eaglelab tune` again") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("profiles"), list):
        raise EagleLabError("not a profiles file", file=str(path), field="schema / profiles",
                            found=_short(doc), expected=f'{{"schema": {SCHEMA}, "profiles": [...]}}',
                            hint="delete it and run `eaglelab tune` again")
    return [_profile(p, path, i) for i, p in enumerate(doc["profiles"])]


def merge_tuned(old: DeviceProfile | None, new: DeviceProfile) -> tuple[DeviceProfile, tuple[BucketChoice, ...]]:
    """A tune's ``new`` profile with the buckets of the one it replaces (``old``: the same device, dtype and
    drafter) for the batch sizes it did not tune, when both were measured in the same regime (compile, GEMV,
    decode attention, dependent launches): ``tune --batch-sizes 8`` after ``tune --batch-sizes 1`` keeps batch 1's tree.
    -> (the profile to write, the buckets kept from ``old``). GEMV tilings measured on the same setup are
    merged the same way (the new run's choice wins for a shape both have).

    Example: old buckets 1, 8, 32, new bucket 8 -> buckets 1 (old), 8 (new), 32 (old)."""

    same = old is not None and (old.device, old.dtype, old.drafter_sha256) == (new.device, new.dtype,
                                                                             new.drafter_sha256)
    regime = lambda p: (p.compile, p.gemv, p.decode_attn, bool(p.pdl))  # noqa: E731 - absent pdl: off
    if not same or regime(old) != regime(new):
        return new, ()
    tuned = {b.max_batch for b in new.buckets}
    kept = tuple(b for b in old.buckets if b.max_batch not in tuned)
    tilings = new.gemv_tilings or old.gemv_tilings
    if old.gemv_tilings and new.gemv_tilings and old.gemv_tilings.measured_on == new.gemv_tilings.measured_on:
        chosen = dict(old.gemv_tilings.chosen) | dict(new.gemv_tilings.chosen)
        tilings = GemvTilings(new.gemv_tilings.measured_on, tuple(sorted(chosen.items())))
    buckets = tuple(sorted((*new.buckets, *kept), key=lambda b: b.max_batch))
    return replace(new, buckets=buckets, gemv_tilings=tilings), kept


def write_profile(path: Path, profile: DeviceProfile) -> None:
    """Add ``profile`` to the file at ``path`` (replacing one for the same device, dtype and drafter),
    written to a temporary file first and renamed, so a reader never sees half a file."""
    kept = [p for p in (read_profiles(path) if path.is_file() else [])
            if (p.device, p.dtype, p.drafter_sha256) != (profile.device, profile.dtype, profile.drafter_sha256)]
    doc = {"schema": SCHEMA, "profiles": [p.to_json() for p in (*kept, profile)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _profile(d: Any, path: Path, i: int) -> DeviceProfile:
    where = f"profiles[{i}]"
    if not isinstance(d, dict):
        raise _bad(path, where, d, "an object")
    text = {k: _text(d, k, path, where) for k in ("device", "dtype", "drafter_sha256")}
    flags = {k: _flag(d, k, path, where) for k in ("compile", "gemv", "decode_attn", "pdl")}
    buckets = d.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise _bad(path, f"{where}.buckets", buckets, "a non-empty list of buckets")
    return DeviceProfile(
        **text, **flags, buckets=tuple(_bucket(b, path, f"{where}.buckets[{j}]") for j, b in enumerate(buckets)),
        kernels_reason=str(d.get("kernels_reason", "")), source=str(d.get("source", "")),
        gemv_tilings=parse_gemv_tilings(d["gemv_tilings"], path, f"{where}.gemv_tilings") if "gemv_tilings" in d else None,
        path=str(path))


def parse_gemv_tilings(g: Any, path: Path, where: str) -> GemvTilings:
    """A profile's ``gemv_tilings`` (or a tilings cache's entry, eaglelab/gemv_cache.py): exactly the known fields,
    each of its type and range; EagleLabError naming ``path`` and ``where`` otherwise."""
    _only(g, ("measured_on", "chosen"), path, where)
    env = g["measured_on"]
    fields = ENVIRONMENT_FIELDS + tuple(k for k in OPTIONAL_FIELDS if isinstance(env, dict) and k in env)
    _only(env, fields, path, f"{where}.measured_on")  # launches, split_k: optional (OPTIONAL_FIELDS)
    for k in fields:
        _text(env, k, path, f"{where}.measured_on")
    chosen = g["chosen"]
    if not isinstance(chosen, list):
        raise _bad(path, f"{where}.chosen", chosen, "a list of {n, k, rows_bucket, " + ", ".join(TILING_FIELDS) + "}")
    table: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for j, c in enumerate(chosen):
        at = f"{where}.chosen[{j}]"
        _only(c, SHAPE_FIELDS + TILING_FIELDS, path, at)
        key = tuple(_int(c, k, 1, 1 << 20, path, at) for k in SHAPE_FIELDS)
        cfg = tuple(_int(c, k, 0, 1024, path, at) for k in TILING_FIELDS)
        if key[2] & (key[2] - 1) or key[2] > KERNEL_ROWS:
            raise _bad(path, f"{at}.rows_bucket", key[2], f"a power of two up to {KERNEL_ROWS} (1, 2, 4, ..., "
                       f"{KERNEL_ROWS}: the rows the GEMV takes)")
        if 0 in cfg and any(cfg):
            raise _bad(path, at, c, "a tiling of positive values, or all zeros for F.linear")
        if key in table:
            raise _bad(path, at, c, "one choice per (n, k, rows_bucket)")
        table[key] = cfg
    return GemvTilings.of(table, env)


def _only(d: Any, fields: tuple[str, ...], path: Path, where: str) -> None:
    """``d`` is an object with exactly ``fields``: a missing or unknown one is named."""
    if not isinstance(d, dict):
        raise _bad(path, where, d, "an object of " + ", ".join(fields))
    for k in d:
        if k not in fields:
            raise _bad(path, f"{where}.{k}", d[k], "no such field (known: " + ", ".join(fields) + ")")
    for k in fields:
        if k not in d:
            raise _bad(path, f"{where}.{k}", None, "present")


def _int(d: dict, k: str, low: int, high: int, path: Path, where: str) -> int:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise _bad(path, f"{where}.{k}", v, f"an integer in [{low}, {high}]")
    return v


def _bucket(b: Any, path: Path, where: str) -> BucketChoice:
    if not isinstance(b, dict):
        raise _bad(path, where, b, "an object")
    ints = {k: _int(b, k, low, 4096, path, where)
            for k, low in (("max_batch", 1), ("steps", 1), ("topk", 1), ("draft_tokens", 2))}
    if ints["topk"] == 1 and ints["draft_tokens"] != ints["steps"] + 1:
        raise _bad(path, f"{where}.draft_tokens", ints["draft_tokens"], f"steps + 1 = {ints['steps'] + 1} for a chain")
    lookup = _int(b, "lookup_tokens", 0, MAX_LOOKUP_TOKENS, path, where) if "lookup_tokens" in b else 0
    return BucketChoice(**ints, measured=str(b.get("measured", "")), lookup_tokens=lookup)


def _text(d: dict, k: str, path: Path, where: str) -> str:
    v = d.get(k)
    if not isinstance(v, str) or not v:
        raise _bad(path, f"{where}.{k}", v, "a non-empty string")
    return v


def _flag(d: dict, k: str, path: Path, where: str) -> bool | None:
    v = d.get(k)
    if v is not None and not isinstance(v, bool):
        raise _bad(path, f"{where}.{k}", v, "true, false or absent")
    return v


def _bad(path: Path, where: str, found: Any, expected: str) -> EagleLabError:
    return EagleLabError("unexpected value in a profiles file", file=str(path), field=where, found=_short(found),
                         expected=expected, hint="delete the file and run `eaglelab tune` again")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
