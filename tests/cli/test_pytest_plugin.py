"""The fixtures eaglelab registers through pytest11, used from another project's test file."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.mark.slow
def test_fixtures_guard_a_drafter_in_another_suite(pytester, default_target):
    from eaglelab.draft_registry import shipped_drafter_dir

    drafter = shipped_drafter_dir()
    pytester.makepyfile(
        f'''
        def test_lossless_and_accepting(eaglelab_spec_run):
            run = eaglelab_spec_run(["Summarize the key ideas of open source software in a few bullet points."],
                                    draft={str(drafter)!r}, steps=3, max_new_tokens=24)
            assert run.identical_to_plain
            assert run.mean_accept_len > 1.5
            assert any(type(e).__name__ == "Step" for e in run.events)

        def test_ngram_lossless(eaglelab_spec_run):
            run = eaglelab_spec_run(["Count: 1 2 3 1 2 3 1 2 3"], draft="ngram", max_new_tokens=12)
            assert run.identical_to_plain

        def test_static_wiring(eaglelab_check_wiring):  # static checks alone never read OK: not checked numerically
            report = eaglelab_check_wiring({str(drafter)!r})
            assert report["verdict"] == "inconclusive" and report["exit_code"] == 4
        '''
    )
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
