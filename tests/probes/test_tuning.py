"""The tuning model: SGLang's tree over rank paths, expected accepted length, cycle cost, ranking."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes import tuning as T


def _table() -> T.AcceptanceTable:
    return T.AcceptanceTable(((0.6, 0.2), (0.5, 0.1)))


def test_tree_follows_sglangs_rule_on_the_docstring_example() -> None:
    """Candidates (1,) .6, (2,) .2, (1,1) .3, (1,2) .06, (2,1) .1, (2,2) .02: the best 3 are kept."""
    assert T.sglang_tree(_table(), steps=2, topk=2, draft_tokens=4) == [(1,), (2,), (1, 1)]
    assert T.expected_accept_len(_table(), 2, 2, 4) == pytest.approx(1 + 0.6 + 0.2 + 0.3)


def test_frontier_limits_what_later_steps_can_reach() -> None:
    """topk 1 expands only the best node: (2, 1) is never a candidate, however many tokens."""
    table = T.AcceptanceTable(((0.5, 0.45), (0.1, 0.0), (0.0,)))
    assert T.sglang_tree(table, steps=2, topk=1, draft_tokens=3) == [(1,), (1, 1)]
    # topk 2: the frontier after step 1 is both depth-1 nodes, so (2, 1) appears (score .45 * .1)
    tree = T.sglang_tree(table, steps=2, topk=2, draft_tokens=6)
    assert (2, 1) in tree and len(tree) == 5


def test_wide_tree_beam_keeps_only_topk_frontier_per_depth() -> None:
    """Depth 3 children exist only under the 2 best depth-2 nodes."""
    table = T.AcceptanceTable(((0.5, 0.3), (0.6, 0.2), (0.7, 0.1)))
    tree = T.sglang_tree(table, steps=3, topk=2, draft_tokens=T.max_draft_tokens(3, 2))
    depth3_parents = {p[:2] for p in tree if len(p) == 3}
    assert depth3_parents == {(1, 1), (2, 1)}  # scores .30 and .18 beat (1, 2) .10
    assert len(tree) == 2 + 4 + 4


def test_expected_accept_len_worked_example_chain() -> None:
    table = T.AcceptanceTable(((0.6,), (0.5,)))
    assert T.expected_accept_len(table, 2, 1, 3) == pytest.approx(1.9)


def test_unmeasured_depths_count_as_rejected() -> None:
    table = T.AcceptanceTable(((0.8,),))
    assert T.expected_accept_len(table, 4, 1, 5) == pytest.approx(1.8)


def test_table_rejects_non_probabilities() -> None:
    with pytest.raises(ValueError, match="rank 1"):
        T.AcceptanceTable(((1.5,),))
    with pytest.raises(ValueError, match="sum"):
        T.AcceptanceTable(((0.7, 0.6),))


def test_bad_tree_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="draft tokens"):
        T.sglang_tree(_table(), steps=2, topk=2, draft_tokens=8)


@settings(max_examples=200, deadline=None)
@given(p=st.floats(0.0, 1.0), steps=st.integers(1, 12))
def test_chain_prediction_equals_the_closed_form(p: float, steps: int) -> None:
    table = T.AcceptanceTable.constant(p, depths=steps, ranks=3)
    got = T.expected_accept_len(table, steps, 1, steps + 1)
    assert got == pytest.approx(T.chain_closed_form(p, steps), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(ps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10))
def test_chain_prediction_is_the_sum_of_products(ps: list[float]) -> None:
    table = T.AcceptanceTable(tuple((p,) for p in ps))
    want = 1 + sum(math.prod(ps[: d + 1]) for d in range(len(ps)))
    assert T.expected_accept_len(table, len(ps), 1, len(ps) + 1) == pytest.approx(want)


_rows = st.lists(st.floats(0.0, 0.33), min_size=3, max_size=3)  # a row sums to <= 1


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(_rows, min_size=1, max_size=4), topk=st.integers(1, 3))
def test_more_draft_tokens_never_lower_the_expectation(rows, topk: int) -> None:
    table = T.AcceptanceTable(tuple(tuple(r) for r in rows))
    steps = len(rows)
    got = [T.expected_accept_len(table, steps, topk, n) for n in range(1, T.max_draft_tokens(steps, topk) + 1)]
    assert all(b >= a - 1e-12 for a, b in zip(got, got[1:]))
    assert 1.0 <= got[-1] <= steps + 1
    tree = T.sglang_tree(table, steps, topk, T.max_draft_tokens(steps, topk))
    assert all(p[:-1] in tree for p in tree if len(p) > 1)  # closed under ancestors


def test_counts_from_cycles_censor_unexpanded_paths() -> None:
    """Row 1 accepted ranks (1, 2) and its last node had children: depth 3 offered, missed.
    Row 2 accepted nothing at depth 1. Row 3 accepted (2,) at a node that was not expanded."""
    step = SimpleNamespace(kind="spec", accepted_ranks=((1, 2), (), (2,)), path_open=(True, True, False))
    counts = T.table_from_steps([step, SimpleNamespace(kind="decode", accepted_ranks=(), path_open=())])
    table = counts.table()
    assert table.offered == (3, 1, 1)
    assert table.rates[0] == pytest.approx((1 / 3, 1 / 3))
    assert table.rates[1] == pytest.approx((0.0, 1.0))
    assert table.rates[2] == pytest.approx((0.0, 0.0))
    assert counts.mean_accept_len == pytest.approx((3 + 1 + 2) / 3)


def _costs(batch: int = 1) -> T.PhaseCosts:
    keys = [(s, k) for s in (1, 2, 3) for k in (1, 2)]
    return T.PhaseCosts(
        batch=batch, decode_ms=10.0, verify_ms={n: 10.0 + 2.0 * n for n in range(2, 9)},
        draft_ms={key: 1.0 + 2.0 * (key[0] - 1) * key[1] for key in keys},
        extend_ms={key: 2.5 for key in keys}, accept_ms={key: 0.5 for key in keys}, prefill_ms=40.0,
    )


def test_prediction_parts_worked_example() -> None:
    """Docstring example: E[a] 1.9, cycle 3 + 14 + 0.5 + 2.5 = 20 ms against 10 ms decodes."""
    pred = T.predict(T.AcceptanceTable(((0.6,), (0.5,))), _costs(), 2, 1, 3)
    pred = T.Prediction(**{**pred.__dict__, "draft_ms": 3.0, "verify_ms": 14.0})
    assert pred.cycle_ms == pytest.approx(20.0)
    assert pred.tok_per_s == pytest.approx(95.0)
    assert pred.speedup == pytest.approx(0.95)
    assert pred.break_even_accept_len == pytest.approx(2.0)
    assert pred.end_to_end_tok_per_s(new_tokens=11, prefill_ms=40.0) == pytest.approx(11e3 / (40 + 10 / 1.9 * 20))


def test_ranking_prefers_the_cheap_short_chain_when_acceptance_falls_off() -> None:
    table = T.AcceptanceTable(((0.9, 0.05), (0.3, 0.1), (0.1, 0.1)))
    configs = T.grid_configs((1, 2, 3), (1, 2), range(2, 9))
    ranked = T.rank_configs(table, _costs(), configs)
    assert (ranked[0].steps, ranked[0].topk, ranked[0].draft_tokens) == (1, 1, 2)
    assert [p.tok_per_s for p in ranked] == sorted((p.tok_per_s for p in ranked), reverse=True)
    assert len(ranked) == len(T.distinct_configs(table, configs)) < len(configs)


def test_configurations_that_keep_the_same_tree_with_a_larger_topk_are_dropped() -> None:
    """(1, 2, 2) keeps the root's top-1 like the chain (1, 1, 2); (2, 2, 2) drafts a step more: kept."""
    got = T.distinct_configs(_table(), [(1, 1, 2), (1, 2, 2), (2, 2, 2), (1, 2, 3)])
    assert got == [(1, 1, 2), (1, 2, 3), (2, 2, 2)]


def test_grid_lists_valid_trees_only() -> None:
    got = T.grid_configs((1, 2), (1, 2), (2, 3, 4, 7))
    assert got == [(1, 1, 2), (2, 1, 3), (1, 2, 2), (1, 2, 3), (2, 2, 2), (2, 2, 3), (2, 2, 4), (2, 2, 7)]


def test_paste_lines_spell_the_servers_flags() -> None:
    assert T.sglang_flags(2, 1, 3, "/d") == ("--speculative-algorithm EAGLE3 --speculative-draft-model-path /d "
                                             "--speculative-num-steps 2 --speculative-eagle-topk 1 "
                                             "--speculative-num-draft-tokens 3")
    assert T.vllm_speculative_config(2, "/d") == (
        "--speculative-config '{\"method\": \"eagle3\", \"model\": \"/d\", \"num_speculative_tokens\": 2}'")


def test_costs_from_events_group_by_batch_and_key() -> None:
    ev = lambda phase, batch, ms, **kw: SimpleNamespace(phase=phase, batch=batch, ms=ms, tokens=kw.get("tokens", 0),  # noqa: E731
                                                       steps=kw.get("steps", 0), topk=kw.get("topk", 0))
    got = T.costs_from_events([
        ev("decode", 1, 10.0), ev("verify", 1, 12.0, tokens=3), ev("draft", 1, 2.0, steps=2, topk=1),
        ev("draft_extend", 1, 2.5, steps=2, topk=1), ev("accept", 1, 0.5, steps=2, topk=1), ev("prefill", 1, 40.0),
        ev("verify", 8, 20.0, tokens=3),  # no decode at batch 8: left out
    ])
    assert list(got) == [1]
    c = got[1]
    assert c.covers(2, 1, 3) and not c.covers(3, 1, 4)
    assert (c.decode_ms, c.verify_ms, c.prefill_ms, c.begin_ms) == (10.0, {3: 12.0}, 40.0, 0.0)


def test_a_whole_cycle_measured_as_one_predicts_without_phases():
    """tune times whole cycles of run's regime (a one-graph cycle has no phases to add): a ``cycle`` event for
    (steps, topk, N) covers that configuration alone, and its prediction's cycle is that time.

    Worked example: chain of 2 with p = 0.6, 0.5: E[a] = 1.9; a 20 ms cycle at batch 1 = 95 tok/s; plain 10 ms a
    token = 100 tok/s: 0.95x."""
    from eaglelab.probes.events import PhaseCost

    costs = T.costs_from_events([PhaseCost("decode", 1, 10.0), PhaseCost("prefill", 1, 4.0),
                                 PhaseCost("cycle", 1, 20.0, tokens=3, steps=2, topk=1)])[1]
    assert costs.cycle_ms == {(2, 1, 3): 20.0} and costs.covers(2, 1, 3) and not costs.covers(3, 1, 4)
    table = T.AcceptanceTable(((0.6,), (0.5,)))
    pred = T.predict(table, costs, 2, 1, 3)
    assert pred.whole_cycle_ms == 20.0 and pred.cycle_ms == 20.0 and pred.accept_len == pytest.approx(1.9)
    assert pred.tok_per_s == pytest.approx(95.0) and pred.speedup == pytest.approx(0.95)
    assert [(p.steps, p.topk) for p in T.rank_configs(table, costs, [(2, 1, 3), (1, 1, 2)])] == [(2, 1)]


def test_two_call_lengths_give_the_step_and_the_prompts_cost():
    from eaglelab.bench.tune import fit_two

    fit = fit_two((40.0, 10), (70.0, 20))  # 3 ms a step, 10 ms fixed
    assert (fit.per, fit.fixed) == pytest.approx((3.0, 10.0))
    noisy = fit_two((50.0, 10), (45.0, 20))  # the long call no slower: all of it per step
    assert (noisy.per, noisy.fixed) == pytest.approx((2.25, 0.0))
