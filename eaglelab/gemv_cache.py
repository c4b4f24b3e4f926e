"""The Triton GEMV tilings this machine has tuned, kept between processes (``<eaglelab cache>/gemv_tilings.json``).

Without a device profile's tilings for the GPU at hand (the shipped drafter carries the H200's), every process used
to time each projection's tilings again (~20 s for SmolLM2), and timing noise could pick another tiling for a shape
than the last process did. A tiling is an argument of the compiled phases, so another tiling is another graph to
the compiler: its disk cache missed and the phase compiled again (on one H100, SmolLM2's decode phase compiled in
8.9 s in three processes that had tuned alike and in 34-38 s in two that had not,
benchmarks/results/h100_2026-12-05d/Y). Now a tuned shape's choice is written here as it is made, and the next
process on the same setup (GPU, dtype, torch, Triton: ``tuning_environment``) takes it instead of timing it again,
as it would a profile's; a device profile's own tilings, written by ``eaglelab tune``, still come first.

File layout (JSON; one entry per setup, a setup's tilings merged shape by shape)::

    {"schema": 1,
     "entries": [{"measured_on": {"gpu": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
                                  "torch": "2.11.0+cu130", "triton": "3.6.0"},
                  "chosen": [{"n": 960, "k": 576, "rows_bucket": 1, "block_n": 8, "block_k": 512,
                              "split_k": 1, "num_warps": 4, "num_stages": 3}, ...]}]}

A cache that cannot be read (hand-edited, cut short) is set aside with a note and the GEMV tunes as without it;
a write that fails says so once and the run goes on. Delete the file to have every shape timed again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from eaglelab.engine.errors import EagleLabError
from eaglelab.profiles import MAX_PROFILE_BYTES, GemvTilings, adopt_gemv_tilings, parse_gemv_tilings

FILE_NAME = "gemv_tilings.json"
SCHEMA = 1
MAX_ENTRIES = 16  # setups kept (a GPU x dtype x torch x Triton each); the oldest go first


def cache_path(root: Path | None = None) -> Path:
    """Where this machine keeps its tilings: ``<eaglelab cache>/gemv_tilings.json``."""
    if root is None:
        from eaglelab.engine.formats.assets import cache_dir

        root = cache_dir()
    return Path(root) / FILE_NAME


def read(path: Path) -> list[GemvTilings]:
    """Every setup's tilings in ``path`` ([] when there is no file). Raises EagleLabError naming the file and the
    field for a file that is not one."""
    if not path.is_file():
        return []
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise EagleLabError("not a GEMV tilings cache (too large)", file=str(path), found=path.stat().st_size,
                            expected=f"at most {MAX_PROFILE_BYTES} bytes", hint=f"delete {path}")
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EagleLabError("not a GEMV tilings cache", file=str(path), found=type(exc).__name__,
                            expected="JSON", hint=f"delete {path}") from None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA or not isinstance(d.get("entries"), list):
        raise EagleLabError("not a GEMV tilings cache", file=str(path), field="schema / entries",
                            expected=f'{{"schema": {SCHEMA}, "entries": [...]}}', hint=f"delete {path}")
    return [parse_gemv_tilings(e, path, f"entries[{i}]") for i, e in enumerate(d["entries"])]


def write(path: Path, entries: list[GemvTilings]) -> None:
    """``entries`` into ``path``, atomically (a reader never sees half a file)."""
    from eaglelab.engine.formats.safe_write import write_atomic

    text = json.dumps({"schema": SCHEMA, "entries": [e.to_json() for e in entries[-MAX_ENTRIES:]]}, indent=1)
    write_atomic(path, lambda tmp: tmp.write_text(text + "\n"), what="the GEMV tilings cache", flag=None)


def merged(entries: list[GemvTilings], new: GemvTilings) -> list[GemvTilings]:
    """``entries`` with ``new``'s shapes merged into the entry of its setup (``new`` wins a shape both hold), that
    entry moved last (the most recently used)."""
    same = [e for e in entries if e.measured_on == new.measured_on]
    chosen = dict(same[0].chosen) | dict(new.chosen) if same else dict(new.chosen)
    rest = [e for e in entries if e.measured_on != new.measured_on]
    return rest + [GemvTilings.of(chosen, dict(new.measured_on))]


def prepare(gemv: Any, profile: Any, device: Any, dtype: Any, log: Callable[[str], None] | None = None,
            path: Path | None = None) -> None:
    """Give a Triton GEMV what was measured before on this setup, and keep what it tunes from now on:
    ``profile``'s tilings (``eaglelab tune`` measured them with the trees), then this machine's cached ones for the
    shapes the profile lacks; each shape it still tunes is written to the cache as it is chosen."""
    if gemv is None or gemv.reason is not None:
        return
    adopt_gemv_tilings(gemv, profile, device, dtype)  # first: a shape both hold keeps the profile's tiling
    try:
        here = gemv.environment(device, dtype)  # its launches included: PDL's choices are kept apart
    except (RuntimeError, AssertionError):  # torch cannot name this GPU (no driver): no setup to key a cache on
        return
    path = path or cache_path()
    try:
        entries = read(path)
    except EagleLabError as exc:
        if log is not None:
            log(f"GEMV tilings cache not used ({exc}); every shape is tuned here")
        entries = []
    for e in entries:
        cached = {key: cfg for key, cfg in e.chosen if key not in gemv.preset}
        if dict(e.measured_on) == here and cached:
            gemv.adopt(cached, dict(e.measured_on), here, source=f"this machine's cache {path}")
    gemv.on_tuned = _remember(gemv, here, path, log)


def _remember(gemv: Any, here: dict[str, str], path: Path, log: Callable[[str], None] | None) -> Callable[[], None]:
    """The hook that writes ``gemv``'s choices into the cache after each tuning (a failed write said once)."""
    failed = False

    def remember() -> None:
        nonlocal failed
        if failed:
            return
        try:
            try:
                entries = read(path)
            except EagleLabError:
                entries = []  # an unreadable cache is replaced by what this process tuned
            write(path, merged(entries, GemvTilings.of(dict(gemv.chosen), here)))
        except (OSError, EagleLabError) as exc:
            failed = True
            if log is not None:
                log(f"GEMV tilings not kept in {path} ({type(exc).__name__}: {exc}); the next process tunes again")

    return remember
