"""``benchmarks/tune_prediction_errors.py`` on the two recorded H200 tunes: it reproduces the tables recorded in
``benchmarks/results/h200_2026-12-03c/C/README_prediction.md`` line for line, its "replay, wide q" column (path
replay without the rank cap) is what the 2026-12-03c tune printed, and a wrong folder is a message and exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tune_prediction_errors as tpe  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
FOLDERS = [RESULTS / "h200_2026-12-03b/C", RESULTS / "h200_2026-12-03c/C"]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.parent.name)
def test_the_tables_are_the_recorded_ones(folder):
    recorded = (RESULTS / "h200_2026-12-03c/C/README_prediction.md").read_text().splitlines()
    lines = [line for line in tpe.table(folder).splitlines() if line.startswith("| ") and "steps/topk/N" not in line]
    assert len(lines) == 6 + 9
    missing = [line for line in lines if line not in recorded]
    assert not missing, missing


def test_the_uncapped_replay_is_what_the_0312c_tune_printed():
    """That tune printed E[a] by path replay before the rank cap: the script's "wide q" column equals it."""
    rows = [r for r in tpe.rows(FOLDERS[1]) if r["a_wide_q"] is not None]
    assert len(rows) == 6
    for r in rows:
        assert r["a_wide_q"] == pytest.approx(r["a_printed"], rel=1e-9), r["config"]
    assert {r["config"] for r in rows if abs(r["a_new"] - r["a_wide_q"]) > 1e-3} == {"4/2/8", "3/2/6"}  # topk 2


def test_no_folder_or_a_folder_without_a_tune_is_a_message_and_exit_2(tmp_path, capsys):
    assert tpe.main([]) == 2 and "usage" in capsys.readouterr().err
    assert tpe.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "h200_tune.json") in err and "no such file" in err and "Traceback" not in err
