"""benchmarks/lookup_replay.py: its lookup is the engine's (so the replay estimates what the engine would do), and
a replayed branch that never matches gives back the engine's own cycles."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.lookup_replay import lookup, replay
from eaglelab.engine.runtime.lookup import lookup_chain


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=30), st.integers(1, 8))
def test_the_replay_looks_up_what_the_engine_would(context, k):
    proposal = lookup(context, k)
    engine = lookup_chain(torch.tensor([context]), torch.tensor([len(context)]), k)[0].tolist()
    assert proposal == engine or (proposal == [] and engine == [context[-1]] * k)


def test_a_branch_that_never_matches_replays_the_engines_cycles():
    row = {"prompt": [1, 2, 3], "out": [10, 11, 12, 13, 14, 15, 16], "acc": [2, 1, 3]}
    assert replay(row, 0) == 3
    assert replay(row, 4) == 3  # no token ever repeats: the branch proposes nothing that matches


def test_a_loop_is_accepted_through_the_branch():
    """The output repeats the prompt's loop: the branch takes a cycle far past the drafter's one token."""
    row = {"prompt": [5, 6, 7, 5, 6, 7], "out": [5, 6, 7, 5, 6, 7, 5, 6, 7, 5], "acc": [1] * 9}
    assert replay(row, 0) == 9 and replay(row, 16) == 1
