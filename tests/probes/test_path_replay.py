"""The wide tree's accepted paths replayed for smaller trees (probes/path_replay.py)."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes.path_replay import depth_start, path_replay
from eaglelab.probes.tuning import max_draft_tokens

RESULTS = "benchmarks/results/h200_2026-12-03b/C/"


def _step(ranks, positions):
    return SimpleNamespace(kind="spec", accepted_ranks=ranks, accepted_positions=positions)


def test_worked_example_two_steps_topk_two():
    """Ranks (1, 2) at positions (1, 4) of a full 2-step topk-2 tree: depth-2 node is 2nd best at its depth."""
    r = path_replay([_step([[1, 2]], [[1, 4]])], 2, 2, 7)
    assert r.paths == (((1, 1), (2, 2)),)
    assert r.accept_len(2, 1, 3) == 2.0  # a chain stops at the rank-2 node
    assert r.accept_len(2, 2, 4) == 3.0  # 1 + 2 <= 3
    assert r.accept_len(2, 2, 3) == 2.0  # 1 + 2 > 2


def test_chain_keeps_top1_children_however_the_wide_tree_ranked_them():
    """Ranks (1, 1) at positions (1, 4) of a full 2-step topk-2 tree: the depth-2 node is 2nd best of its depth in
    the wide tree (the depth-1 rank-2 node's top child outscored it), but a chain drafts only top-1 children, so it
    keeps it: 3 tokens (the wide rank 2 alone would give 1 + 2 > 2, 2 tokens)."""
    r = path_replay([_step([[1, 1]], [[1, 4]])], 2, 2, 7)
    assert r.paths == (((1, 1), (1, 2)),)
    assert r.accept_len(2, 1, 3) == 3.0


def test_narrower_topk_caps_the_wide_rank_by_its_own_candidates():
    """Wide tree 3 steps, topk 4 (37 nodes); a path of top-1 children whose depth-2 node is 5th of the 16
    depth-2 candidates (position 5 + 4 = 9) and depth-3 node 1st (position 21).

    topk 2 holds 4 depth-2 candidates; ahead of a sibling-rank-1 node at most the 2 children of the other frontier
    node: rank min(5, 1 + 2) = 3. N 6: 1 + 3 <= 5 keeps depth 2; the rank-3 node is off the 2-node frontier, so
    depth 3 is not drafted: 3 tokens (the wide rank 5 alone: 1 + 5 > 5, 2 tokens). N 4: 1 + 3 > 3: 2 tokens.
    topk 4 is the wide tree's own width: rank 5 stands (1 + 5 <= 6 at N 7, parent 5 > 4 stops depth 3)."""
    r = path_replay([_step([[1, 1, 1]], [[1, 9, 21]])], 3, 4, max_draft_tokens(3, 4))
    assert r.paths == (((1, 1), (1, 5), (1, 1)),)
    assert r.accept_len(3, 2, 6) == 3.0
    assert r.accept_len(3, 2, 4) == 2.0
    assert r.accept_len(3, 1, 4) == 4.0  # the chain: every sibling rank is 1
    assert r.accept_len(3, 4, 7) == 3.0
    assert r.accept_len(3, 4, 6) == 2.0


def test_pruned_or_positionless_wide_tree_is_not_replayed():
    assert path_replay([_step([[1]], [[1]])], 2, 2, 6) is None
    assert path_replay([_step([[1]], [])], 2, 2, 7) is None


_path = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 16)), min_size=0, max_size=5)


@st.composite
def _replays(draw):
    paths = draw(st.lists(_path, min_size=1, max_size=30))
    # a real wide tree expands only its frontier: every node but the last has q <= topk
    paths = [[(r, q if i == len(p) - 1 else min(q, 4)) for i, (r, q) in enumerate(p)] for p in paths]
    ranks = [[r for r, _ in p] for p in paths]
    positions = [[depth_start(d, 4) + (q if d > 1 else min(q, 4)) - 1 for d, (_, q) in enumerate(p, 1)] for p in paths]
    return path_replay([_step(ranks, positions)], 5, 4, max_draft_tokens(5, 4))


@settings(max_examples=60, deadline=None)
@given(_replays(), st.integers(1, 5), st.sampled_from([1, 2, 4]))
def test_replay_equals_observed_on_wide_tree_bounded_and_monotone(replay, steps, topk):
    assert replay.accept_len(5, 4, max_draft_tokens(5, 4)) == pytest.approx(replay.observed_mean)
    top = max_draft_tokens(steps, topk)
    got = [replay.accept_len(steps, topk, n) for n in range(2, top + 1)] if topk > 1 else [replay.accept_len(steps, 1, 0)]
    assert all(1.0 <= a <= steps + 1 for a in got)
    assert got == sorted(got)  # more draft tokens never lose a kept node
    if topk == 4:  # the chain is a subtree of the widest full tree (not of a narrower one: its frontier may drop it)
        assert replay.accept_len(steps, 1, 0) <= got[-1] + 1e-12


def test_recorded_h200_tune_replay_beats_the_table_model():
    """On the H200 tune of 2026-12-03 the table model predicted every confirmed E[a] low (2.6-9.8%);
    the replay is within 7% on each and its mean absolute error is about half the table's."""
    from eaglelab.bench.tune_predict import replay_against_confirmation

    rows = replay_against_confirmation(RESULTS + "h200_tune.jsonl", RESULTS + "h200_tune.json")
    assert len(rows) == 6
    before = [r["before"] / r["measured"] - 1 for r in rows]
    after = [r["after"] / r["measured"] - 1 for r in rows]
    assert all(e < -0.02 for e in before)
    assert max(abs(e) for e in after) < 0.07
    assert sum(abs(e) for e in after) < 0.6 * sum(abs(e) for e in before)


def test_recorded_h200_tune_rank_cap_moves_only_narrower_trees_and_closer():
    """The tune of 2026-12-03c printed E[a] replayed with the wide tree's own ranks: the rank cap leaves its topk-4
    trees (the wide tree's width) as printed and brings both topk-2 trees at batch 32 closer to the confirmation
    (4/2/8: 2.563 -> 2.595, measured 2.697; 3/2/6: 2.370 -> 2.388, measured 2.540)."""
    from eaglelab.bench.tune_predict import replay_against_confirmation

    c = "benchmarks/results/h200_2026-12-03c/C/"
    rows = replay_against_confirmation(c + "h200_tune.jsonl", c + "h200_tune.json")
    assert len(rows) == 6
    for r in rows:
        if r["config"][1] == 4:
            assert r["after"] == pytest.approx(r["before"], abs=1e-12)
        else:
            assert abs(r["after"] - r["measured"]) < abs(r["before"] - r["measured"]) - 0.01
    got = {r["config"]: round(r["after"], 3) for r in rows if r["config"][1] == 2}
    assert got == {(4, 2, 8): 2.595, (3, 2, 6): 2.388}
