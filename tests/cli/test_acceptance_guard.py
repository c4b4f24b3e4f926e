"""The acceptance guard: a drafter's acceptance pinned against a baseline file, from another project."""

from __future__ import annotations

import json

import pytest

from eaglelab.acceptance_guard import AcceptanceMeasurement, BaselineError, compare, read_baseline, write_baseline

pytest_plugins = ["pytester"]

SETTINGS = {"model": "m 1", "draft_shape": "eagle3, 3 steps", "prompts": "abc", "max_new_tokens": 32}


def measurement(mean, positions, **settings):
    return AcceptanceMeasurement(mean, tuple(positions), None, 40, {**SETTINGS, **settings})


def test_a_drop_beyond_the_tolerance_is_a_regression_with_a_readable_diff():
    base = measurement(1.45, (0.30, 0.10, 0.05))
    now = measurement(1.20, (0.15, 0.08, 0.01))
    c = compare(now, base, "b.json", tolerance=0.05, mean_tolerance=0.1)
    assert c.regressed
    flagged = [r.name for r in c.rows if r.regressed]
    assert flagged == ["mean accepted length", "position 1"]  # 0.02 and 0.04 drops are within 0.05
    text = c.diff()
    assert "mean accepted length     1.450    1.200   -0.250" in text
    assert text.count("REGRESSED") == 2 and "--eaglelab-update-baseline" in text


def test_within_tolerance_or_better_passes():
    base = measurement(1.45, (0.30, 0.10))
    assert not compare(measurement(1.40, (0.27, 0.30, 0.1)), base, "b.json").regressed
    assert "improved" in compare(measurement(1.60, (0.40, 0.10)), base, "b.json").diff()


def test_other_settings_are_another_experiment():
    c = compare(measurement(1.45, (0.3,), prompts="xyz"), measurement(1.45, (0.3,)), "b.json")
    assert c.regressed and "prompts: baseline 'abc', now 'xyz'" in c.diff()


def test_baseline_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "sub" / "b.json"
    assert read_baseline(path) is None
    write_baseline(path, measurement(1.5, (0.4, 0.1)))
    assert read_baseline(path) == measurement(1.5, (0.4, 0.1))
    path.write_text("{not json")
    with pytest.raises(BaselineError, match="b.json: cannot read the baseline"):
        read_baseline(path)
    path.write_text(json.dumps({"per_position": [0.1]}))
    with pytest.raises(BaselineError, match="mean_accept_len"):
        read_baseline(path)


@pytest.mark.slow
def test_guard_from_another_project_writes_then_catches_a_regression(pytester, default_target):
    """An outside test file names the drafter like the CLI (draft="default"); the first run writes the
    baseline, a run against a better baseline fails with the diff."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.eaglelab_acceptance(draft="default", baseline="acceptance/smollm2.json",
                                         prompts=["Summarize the key ideas of open source software."],
                                         max_new_tokens=12)
        def test_drafter_still_accepts(eaglelab_acceptance):
            eaglelab_acceptance()
        """
    )
    first = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    first.assert_outcomes(passed=1, warnings=1)
    path = pytester.path / "acceptance" / "smollm2.json"
    written = json.loads(path.read_text())
    assert written["settings"]["draft"] == "default" and written["mean_accept_len"] >= 1.0
    assert len(written["per_position"]) == 3  # 3 draft steps
    written["mean_accept_len"] += 0.5  # a baseline the drafter no longer reaches
    rates = written["per_position"]
    weakest = rates.index(min(rates))  # a position with room above it (the first may already accept every time)
    assert rates[weakest] <= 0.7, rates
    rates[weakest] += 0.3
    path.write_text(json.dumps(written))
    second = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    second.assert_outcomes(failed=1)
    second.stdout.fnmatch_lines(["*mean accepted length*-0.500*REGRESSED*", f"*position {weakest + 1}*REGRESSED*",
                                 "*--eaglelab-update-baseline*"])
