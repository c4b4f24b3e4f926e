"""benchmarks/lookup_replay.py (its lookup is the engine's own ``lookup_chain``): a replayed branch that never matches
gives back the engine's own cycles, and one over a loop takes the cycle to its end."""

from __future__ import annotations

from benchmarks.lookup_replay import replay


def test_a_branch_that_never_matches_replays_the_engines_cycles():
    row = {"prompt": [1, 2, 3], "out": [10, 11, 12, 13, 14, 15, 16], "acc": [2, 1, 3]}
    assert replay(row, 0) == 3
    assert replay(row, 4) == 3  # no token repeats: the branch (the root again) never matches


def test_a_loop_is_accepted_through_the_branch():
    """The output repeats the prompt's loop: the branch takes a cycle far past the drafter's one token."""
    row = {"prompt": [5, 6, 7, 5, 6, 7], "out": [5, 6, 7, 5, 6, 7, 5, 6, 7, 5], "acc": [1] * 9}
    assert replay(row, 0) == 9 and replay(row, 16) == 1
