"""Pin a drafter's acceptance against a baseline file, and say in plain words what regressed.

A *measurement* is the acceptance of one drafter on one fixed prompt set, greedy: the mean accepted
length (bonus included, cut at EOS as SGLang counts it) and the per-position acceptance (the share
of verify steps whose accepted run reached draft position 1, 2, ...). The baseline file is the
same measurement as JSON, with the settings that produced it. :func:`compare` checks a new
measurement against it: a figure that fell by more than the tolerance is a regression; the same
settings are required (another model, drafter shape or prompt set is a different experiment).

Worked example: baseline mean 1.45, positions (0.30, 0.10, 0.05); now mean 1.20, positions
(0.15, 0.04, 0.01); tolerance 0.05 (mean: 0.1) -> the mean and positions 1 and 2 regressed, and
the diff shows baseline, now and change for each.

Pure Python (no torch): the pytest plugin measures, this module compares and writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
# A mean accepted length counts whole tokens per verify; per-position figures are fractions.
DEFAULT_TOLERANCE = 0.05
DEFAULT_MEAN_TOLERANCE = 0.10

# The fixed prompt set used when a test names none: short, of different kinds, chat-templated.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Summarize the key ideas of open source software in a few bullet points.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash table is to a new programmer.",
    "List three things to check before deploying a web service.",
)


def prompts_digest(prompts: list[str] | tuple[str, ...]) -> str:
    """A short digest of the prompt set, so a baseline is never compared with other prompts."""
    return hashlib.sha256("\n\x00".join(prompts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AcceptanceMeasurement:
    """One drafter's acceptance on one prompt set, and what produced it."""

    mean_accept_len: float
    per_position: tuple[float, ...]
    accept_rate: float | None
    verify_steps: int  # row-cycles measured
    settings: dict[str, Any] = field(default_factory=dict)  # model, draft, spec, prompts digest, tokens

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_position"] = list(self.per_position)
        return {"schema": SCHEMA, **d}

    @classmethod
    def from_json(cls, d: dict[str, Any], path: str | Path = "") -> "AcceptanceMeasurement":
        """Read a baseline object; every figure must be a finite number in its range (a NaN baseline would
        compare as 'not regressed' against anything, disabling the guard for good)."""
        try:
            m = cls(
                mean_accept_len=float(d["mean_accept_len"]),
                per_position=tuple(float(x) for x in d["per_position"]),
                accept_rate=None if d.get("accept_rate") is None else float(d["accept_rate"]),
                verify_steps=int(d.get("verify_steps", 0)),
                settings=dict(d.get("settings") or {}),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise BaselineError(
                f"{path}: not an eaglelab acceptance baseline ({type(exc).__name__}: {exc}); expected "
                "mean_accept_len and per_position; rewrite it with --eaglelab-update-baseline"
            ) from None
        problem = m.problem()
        if problem:
            raise BaselineError(f"{path}: {problem}; a baseline must hold measured figures: "
                                "rewrite it with --eaglelab-update-baseline")
        return m

    def problem(self) -> str | None:
        """What makes these figures unusable as a measurement (NaN, infinite, out of range), or None."""
        figures = [("mean_accept_len", self.mean_accept_len, 0.0, None)]
        figures += [(f"per_position[{i}]", x, 0.0, 1.0) for i, x in enumerate(self.per_position)]
        if self.accept_rate is not None:
            figures.append(("accept_rate", self.accept_rate, 0.0, 1.0))
        for name, x, low, high in figures:
            if not math.isfinite(x) or x < low or (high is not None and x > high):
                want = f"a finite number >= {low:g}" + (f" and <= {high:g}" if high is not None else "")
                return f"field '{name}' is {x!r}, expected {want}"
        return None


class BaselineError(ValueError):
    """A baseline file that cannot be read, or that belongs to other settings."""


@dataclass(frozen=True)
class Row:
    """One compared figure."""

    name: str
    baseline: float | None
    now: float | None
    tolerance: float

    @property
    def change(self) -> float | None:
        return None if self.baseline is None or self.now is None else self.now - self.baseline

    @property
    def regressed(self) -> bool:
        """A drop beyond the tolerance, or a figure that is not a number (never a silent pass)."""
        if self.change is None:
            return False
        return not math.isfinite(self.change) or self.change < -self.tolerance - 1e-12


@dataclass(frozen=True)
class Comparison:
    """A measurement against its baseline."""

    path: str
    rows: tuple[Row, ...]
    settings_diff: tuple[str, ...] = ()

    @property
    def regressed(self) -> bool:
        return bool(self.settings_diff) or any(r.regressed for r in self.rows)

    def diff(self) -> str:
        """The readable report: one line per figure (baseline, now, change, verdict)."""
        lines = [f"acceptance against {self.path}:"]
        for what in self.settings_diff:
            lines.append(f"  settings differ: {what}")
        if self.settings_diff:
            lines.append("  (a different experiment: rerun with --eaglelab-update-baseline if this change is intended)")
            return "\n".join(lines)
        width = max(len(r.name) for r in self.rows)
        lines.append(f"  {'figure'.ljust(width)}  baseline      now   change   tolerance")
        for r in self.rows:
            verdict = "REGRESSED" if r.regressed else ("improved" if (r.change or 0) > r.tolerance else "ok")
            lines.append(
                f"  {r.name.ljust(width)}  {_f(r.baseline):>8}  {_f(r.now):>7}  {_signed(r.change):>7}   "
                f"-{r.tolerance:.2f}      {verdict}"
            )
        if self.regressed:
            lines.append("  acceptance regressed: check the drafter's wiring (eaglelab check-wiring) and its training data;")
            lines.append("  if the drop is intended, rerun with --eaglelab-update-baseline")
        return "\n".join(lines)


def compare(now: AcceptanceMeasurement, baseline: AcceptanceMeasurement, path: str | Path, *,
            tolerance: float = DEFAULT_TOLERANCE, mean_tolerance: float = DEFAULT_MEAN_TOLERANCE) -> Comparison:
    """Compare figure by figure; positions missing on one side count as 0 acceptance."""
    for name, tol in (("tolerance", tolerance), ("mean_tolerance", mean_tolerance)):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise BaselineError(f"eaglelab_acceptance: {name}={tol!r}, expected a finite number >= 0 "
                                f"(e.g. {name}={DEFAULT_TOLERANCE})")
    settings_diff = tuple(
        f"{k}: baseline {baseline.settings.get(k)!r}, now {now.settings.get(k)!r}"
        for k in sorted(set(baseline.settings) | set(now.settings))
        if k in SETTINGS_THAT_MUST_MATCH and baseline.settings.get(k) != now.settings.get(k)
    )
    depth = max(len(now.per_position), len(baseline.per_position))
    pad = lambda xs: list(xs) + [0.0] * (depth - len(xs))  # noqa: E731
    rows = [Row("mean accepted length", baseline.mean_accept_len, now.mean_accept_len, mean_tolerance)]
    rows += [Row(f"position {d + 1}", b, n, tolerance)
             for d, (b, n) in enumerate(zip(pad(baseline.per_position), pad(now.per_position)))]
    return Comparison(str(path), tuple(rows), settings_diff)


# A baseline measured with other settings is another experiment, not a regression.
SETTINGS_THAT_MUST_MATCH = ("model", "draft_shape", "prompts", "max_new_tokens")


def read_baseline(path: str | Path) -> AcceptanceMeasurement | None:
    """The baseline at ``path``; None when there is no file yet."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"{p}: cannot read the baseline ({exc.strerror}); pass a JSON file's path") from None
    if not stat.S_ISREG(mode):  # a FIFO would block the test run for ever
        raise BaselineError(f"{p}: cannot read the baseline: it is not a regular file (a directory, FIFO or device); "
                            "pass a JSON file's path")
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{p}: cannot read the baseline ({exc}); rewrite it with --eaglelab-update-baseline") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{p}: expected a JSON object; rewrite it with --eaglelab-update-baseline")
    return AcceptanceMeasurement.from_json(data, p)


def write_baseline(path: str | Path, m: AcceptanceMeasurement) -> None:
    """Write ``m`` as the baseline (creating folders); a measurement that is not a number is refused, never
    pinned."""
    problem = m.problem() or (None if m.verify_steps >= 1 else
                              f"field 'verify_steps' is {m.verify_steps}, expected >= 1 (no speculative step was measured)")
    if problem:
        raise BaselineError(f"{path}: the measured acceptance cannot be a baseline ({problem}); nothing written: "
                            "check that the drafter proposes tokens (eaglelab check-wiring) and that max_new_tokens > 0")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(m.to_json(), indent=2, allow_nan=False) + "\n")


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _signed(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"
