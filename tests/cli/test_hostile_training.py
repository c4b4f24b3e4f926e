"""Hostile inputs to capture, train, distill, synthesize, trace and the acceptance guard, round 2 (issue
#39): each case ended in a traceback, a hang, a wrong OK or the user's data lost before its fix."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from eaglelab.acceptance_guard import AcceptanceMeasurement, BaselineError, compare, read_baseline, write_baseline

SETTINGS = {"model": "m", "draft_shape": "eagle3", "prompts": "abc", "max_new_tokens": 32}


def flat(text: str) -> str:
    return " ".join(text.split())


# ---- the acceptance guard ------------------------------------------------------------------------------


def measured(mean: float, positions: tuple[float, ...], steps: int = 40) -> AcceptanceMeasurement:
    return AcceptanceMeasurement(mean, positions, None, steps, dict(SETTINGS))


@pytest.mark.parametrize("field, value", [("mean_accept_len", "NaN"), ("mean_accept_len", "Infinity"),
                                          ("per_position", "[NaN, 0.1]"), ("per_position", "[1.5]"),
                                          ("mean_accept_len", "-1"), ("accept_rate", "NaN")])
def test_a_baseline_that_is_not_a_number_is_refused_not_a_pass_forever(tmp_path, field, value) -> None:
    """Before: a NaN baseline made every change NaN, NaN < -tolerance is False: the guard passed any drafter."""
    path = tmp_path / "b.json"
    write_baseline(path, measured(1.5, (0.4, 0.1)))
    text = path.read_text()
    obj = json.loads(text)
    obj[field] = "@@"
    path.write_text(json.dumps(obj).replace('"@@"', value))
    with pytest.raises(BaselineError, match="b.json") as info:
        read_baseline(path)
    assert field in str(info.value) and "--eaglelab-update-baseline" in str(info.value)


def test_a_measurement_that_is_not_a_number_regresses_and_is_never_written(tmp_path) -> None:
    base = measured(1.5, (0.4, 0.1))
    assert compare(measured(math.nan, (0.4, 0.1)), base, "b.json").regressed
    assert compare(measured(1.5, (math.nan, 0.1)), base, "b.json").regressed
    for bad in (measured(math.nan, (0.4,)), measured(1.0, (), steps=0)):
        with pytest.raises(BaselineError, match="nothing written"):
            write_baseline(tmp_path / "b.json", bad)
        assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("tolerance", [math.nan, -0.1, math.inf, "0.1"])
def test_a_tolerance_that_would_disable_the_guard_is_refused(tolerance) -> None:
    base = measured(1.5, (0.4, 0.1))
    with pytest.raises(BaselineError, match="tolerance"):
        compare(measured(1.0, (0.0, 0.0)), base, "b.json", tolerance=tolerance)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_baseline_path_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind) -> None:
    path = tmp_path / "b.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(BaselineError, match="not a regular file"):
        read_baseline(path)
