"""benchmarks/lookup_replay.py (its lookup is the engine's own ``lookup_chain``): a replayed branch that never matches
gives back the engine's own cycles, and one over a loop takes the cycle to its end; the host's lookup behind the
variants proposes the engine's chain with the engine's settings, and several matches merge into one tree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.lookup_replay import continuations, lookup, matched, replay, tree_of


def test_a_branch_that_never_matches_replays_the_engines_cycles():
    row = {"prompt": [1, 2, 3], "out": [10, 11, 12, 13, 14, 15, 16], "acc": [2, 1, 3]}
    assert replay(row, 0) == 3
    assert replay(row, 4) == 3  # no token repeats: the branch (the root again) never matches


def test_a_loop_is_accepted_through_the_branch():
    """The output repeats the prompt's loop: the branch takes a cycle far past the drafter's one token."""
    row = {"prompt": [5, 6, 7, 5, 6, 7], "out": [5, 6, 7, 5, 6, 7, 5, 6, 7, 5], "acc": [1] * 9}
    assert replay(row, 0) == 9 and replay(row, 16) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 12))
def test_the_host_lookup_with_the_engines_settings_proposes_the_engines_chain(context, k):
    """One match, tails up to 4 tokens: the host's continuation is ``lookup_chain``'s, token for token (small
    alphabets make matches, ties and wrapping loops common)."""
    assert continuations(context, k, 4, 1) == [lookup(context, k)]


def test_several_matches_merge_into_a_tree_within_the_budget():
    """Tail ``1 2``: its latest match continues ``9 8``, the earlier one ``7 6``; merged, 4 nodes hold both, and a
    future along either path is matched; 3 nodes cut the second path after its first token."""
    context = [1, 2, 7, 6, 1, 2, 9, 8, 1, 2]
    paths = continuations(context, 2, 4, 2)
    assert paths == [[9, 8], [7, 6]]
    assert matched(tree_of(paths, 4), [7, 6, 5]) == 2 and matched(tree_of(paths, 4), [9, 8]) == 2
    assert matched(tree_of(paths, 3), [7, 6]) == 1
    # the same context reached through the output (its first token from the prefill): a chain of 4 takes 9 8 1 2,
    # wrong, and needs a second cycle; two matches of 2 hold 7 6 and end the output in one
    row = {"prompt": context[:-1], "out": [2, 7, 6, 5], "acc": [1, 1, 1]}
    assert replay(row, 4) == 2 and replay(row, 4, 4, 2) == 1
