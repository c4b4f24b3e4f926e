"""The mechanics of tune's cost runs and confirmation, on fake systems that record their calls and advance a fake
clock: every prompt group is warmed before anything is timed, passes interleave, a cycle's cost holds the wait for
a batch's slowest row, only the best screened trees compile, and passes that disagree are named."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from eaglelab.bench import harness as H
from eaglelab.bench import tune as TP
from eaglelab.bench.configs import Regime
from eaglelab.probes.tuning import AcceptanceTable


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeSystem:
    """Rows that accept ``accepts[r]`` tokens a cycle (plain: 1); a call costs ``prefill_ms`` plus the batch's
    cycles (its slowest row's) times ``cycle_ms``, on ``clock``; every call goes into ``log``."""

    def __init__(self, name, log, clock, cycle_ms, prefill_ms=5.0, accepts=None):
        self.name, self.log, self.clock = name, log, clock
        self.cycle_ms, self.prefill_ms, self.accepts = cycle_ms, prefill_ms, accepts
        self.spec = None
        self.ctx = SimpleNamespace(device=torch.device("cpu"))

    def engine(self):
        return self

    def generate(self, group, n):
        self.log.append((self.name, len(group[0]), n))
        rows = [math.ceil((n - 1) / (self.accepts[i % len(self.accepts)] if self.accepts else 1))
                for i in range(len(group))]
        cycles = max(rows)
        self.clock.t += (self.prefill_ms + cycles * self.cycle_ms) / 1e3
        lens = [[a for r, a in zip(rows, self.accepts or [1] * len(group)) if r > c] for c in range(cycles)]
        return SimpleNamespace(tokens=[[0] * n for _ in group], accept_lens=lens if self.accepts else [],
                               setup_seconds=0.0)


class FakeSystems:
    def __init__(self, make):
        self.make, self.made, self.notes = make, {}, []

    def __call__(self, c, regime=None):
        key = (c, bool(regime and regime.compile))
        if key not in self.made:
            self.made[key] = self.make(c, key[1])
        return self.made[key]

    def note(self, c, compiled, batch):
        self.notes.append((c, compiled, batch))


def _ctx(prompts, new_tokens=16):
    return H.BenchContext(target=torch.nn.Linear(1, 1), spec=None, make_drafter=None, prompts=prompts,
                          max_new_tokens=new_tokens, batch_sizes=(2,))


def test_confirmation_warms_every_group_of_every_contender_then_interleaves_its_passes():
    """Example: 4 prompts at batch 2 are 2 groups (widths 3+4 and 5+6 tokens); plain and one tree each make one
    untimed call per group at the full 16 tokens, then 3 passes run plain g0 g1, tree g0 g1, plain g0 g1, ..."""
    log, clock = [], Clock()
    prompts = [[1] * 3, [1] * 4, [1] * 5, [1] * 6]
    systems = FakeSystems(lambda c, _: FakeSystem("plain" if c is None else "tree", log, clock, 1.0,
                                                  accepts=None if c is None else [2, 3]))
    settings = TP.TuneSettings({2: ((2, 1, 3),)}, new_tokens=16, cost_tokens=4, confirm=1, passes=3)
    got = TP.confirm_batch(_ctx(prompts), settings, systems, 2, [None, (2, 1, 3)], clock)
    one_pass = lambda who: [(who, 3, 16), (who, 5, 16)]  # noqa: E731  (group 0 starts with 3 tokens, group 1 with 5)
    assert log == one_pass("plain") + one_pass("tree") + (one_pass("plain") + one_pass("tree")) * 3
    assert [len(m.passes) for m in got] == [3, 3]
    assert got[1].accept_len == pytest.approx((8 * 2 + 5 * 3) / 13)  # 15 tokens: 8 cycles of 2, 5 of 3


def test_a_cycle_costs_the_wait_for_the_batchs_slowest_row():
    """Two rows accepting 4 and 2 tokens a cycle, 1 ms a cycle, 5 ms a prompt: at 9 tokens the rows need 2 and 4
    cycles (the batch runs 4), at 33 tokens 8 and 16 (the batch 16): 12 ms more over 9 more average-row cycles,
    1.33 ms per row-cycle, 5 ms fixed; that fit gives the 33-token call's 21 ms back from the rows' mean cycles."""
    log, clock = [], Clock()
    system = FakeSystem("tree", log, clock, cycle_ms=1.0, prefill_ms=5.0, accepts=[4, 2])
    fit = TP.cost_fit(system, [[[1] * 3, [1] * 4]], short=9, long=33, speculative=True, clock=clock)
    assert fit.per == pytest.approx(12 / 9) and fit.fixed == pytest.approx(5.0)
    assert fit.fixed + fit.per * (8 + 16) / 2 == pytest.approx(5.0 + 16 * 1.0)
    assert log[0] == ("tree", 3, 33), "the first call is the untimed warm pass at the confirmation's length"


def test_the_cost_fit_sums_every_group_and_gives_the_prompts_cost_per_group():
    """Plain decoding over 2 groups, 1 ms a step, 5 ms a prompt: 8 and 32 tokens are 7 and 31 steps per group."""
    clock = Clock()
    system = FakeSystem("plain", [], clock, cycle_ms=1.0, prefill_ms=5.0)
    fit = TP.cost_fit(system, [[[1] * 3], [[1] * 5]], short=8, long=32, speculative=False, clock=clock)
    assert fit.per == pytest.approx(1.0) and fit.fixed == pytest.approx(5.0)


def test_screening_compiles_only_the_best_uncompiled_trees_and_scales_the_others():
    """Three chains at batch 1, uncompiled cycles 2.0, 2.2 and 4.0 ms, compiled ones half that; a constant 90%
    acceptance ranks 2/1/3 first (1.9 x 0.9 ... per ms): with confirm 1 only it and plain decoding compile, and the
    others' cycles are published as uncompiled x 0.5."""
    log, clock = [], Clock()
    unc = {None: 1.0, (1, 1, 2): 2.0, (2, 1, 3): 2.2, (3, 1, 4): 4.0}
    systems = FakeSystems(lambda c, compiled: FakeSystem(c, log, clock, unc[c] * (0.5 if compiled else 1.0),
                                                         accepts=None if c is None else [1]))
    regime = Regime(graphs=True, compile=True)
    settings = TP.TuneSettings({1: ((1, 1, 2), (2, 1, 3), (3, 1, 4))}, new_tokens=16, cost_tokens=4, confirm=1,
                               regime=regime, screen=True)
    published = []
    screen = TP.measure_costs(_ctx([[1] * 3, [1] * 4]), settings, systems, 1, published.append,
                              table=AcceptanceTable.constant(0.9, 3), clock=clock)
    assert sorted({(c, comp) for c, comp, _ in systems.notes if comp}, key=str) == [((2, 1, 3), True), (None, True)]
    cycles = {(e.steps, e.topk, e.tokens): e.ms for e in published if e.phase == "cycle"}
    assert screen.ratio == pytest.approx(0.5) and screen.plain_ratio == pytest.approx(0.5)
    assert cycles == pytest.approx({(1, 1, 2): 1.0, (2, 1, 3): 1.1, (3, 1, 4): 2.0})
    assert TP.cost_runs(settings, 1) == 1 + 1 + 3 + 1


def test_passes_that_disagree_by_more_than_10_percent_are_named_and_warned():
    """Plain reads 100 and 100 tok/s; one tree 137 and 79 (1.37x .. 0.79x over plain), another 131 and 133."""
    from eaglelab.cmd_tune import _confirm_table, _error_lines

    rows = [dict(batch=8, steps=0, topk=0, draft_tokens=1, passes=[100.0, 100.0], predicted_tok_per_s=100.0,
                 measured_tok_per_s=100.0, predicted_accept_len=None, measured_accept_len=None),
            dict(batch=8, steps=4, topk=4, draft_tokens=12, passes=[137.0, 79.0], predicted_tok_per_s=110.0,
                 measured_tok_per_s=108.0, predicted_accept_len=2.6, measured_accept_len=2.8),
            dict(batch=8, steps=3, topk=2, draft_tokens=6, passes=[131.0, 133.0], predicted_tok_per_s=130.0,
                 measured_tok_per_s=132.0, predicted_accept_len=2.3, measured_accept_len=2.5)]
    got = TP.disagreements(rows)
    assert [(d["steps"], d["topk"], d["draft_tokens"]) for d in got] == [(4, 4, 12)]
    assert got[0]["low"] == pytest.approx(0.79) and got[0]["high"] == pytest.approx(1.37)
    lines = _error_lines(rows)
    assert sum("WARNING" in line for line in lines) == 1 and "0.79x .. 1.37x" in lines[-1]
    assert TP.disagreements(rows[:1] + rows[2:]) == []
    assert _confirm_table(rows).row_count == 3


def test_tune_prints_its_total_and_per_phase_wall_time_and_the_shapes_compiled():
    from eaglelab.cmd_tune import _timing_lines

    line = _timing_lines({"seconds": {"set-up": 60.0, "acceptance": 5.0, "costs": 300.0, "confirmation": 40.0,
                                      "total": 405.0}, "compiled_shapes": 9})[0]
    assert "405.0 s in total" in line and "costs 300.0 s" in line and "9 graph sets compiled" in line


def test_the_confirmation_measures_what_run_takes_now_beside_the_predicted_best():
    """The H200 tune of 2026-12-05 in small: 5/4/16 predicted first, 5/4/24 second, both compiled; with --confirm 1
    and a branch of 16 the confirmation runs 5/4/16, 5/4/16 + 16 and, since the profile in use holds 5/4/24 + 16,
    that too (measured only, marked); here it measures fastest, so the profile keeps it."""
    log, clock = [], Clock()
    cycle = {None: 1.0, (5, 4, 16): 2.0, (5, 4, 16, 16): 1.9, (5, 4, 24, 16): 1.8}
    systems = FakeSystems(lambda c, _: FakeSystem(c, log, clock, cycle[c], accepts=None if c is None else [4]))

    def pred(s, k, n, a, ms):
        return dict(steps=s, topk=k, draft_tokens=n, batch=1, accept_len=a, decode_ms=1.0, draft_ms=0.0,
                    verify_ms=0.0, accept_ms=0.0, extend_ms=0.0, whole_cycle_ms=ms)

    report = {"predictions": {"1": [pred(5, 4, 16, 3.2, 1.2), pred(4, 4, 12, 3.0, 1.15), pred(5, 4, 24, 3.2, 1.27)]},
              "costs": {"1": {"batch": 1, "decode_ms": 1.0, "prefill_ms": 2.0, "begin_ms": 3.0, "verify_ms": {},
                              "draft_ms": {}, "extend_ms": {}, "accept_ms": {}, "cycle_ms": {}}},
              "screens": {"1": {"compiled": [[5, 4, 16], [5, 4, 24]]}}}
    settings = TP.TuneSettings({1: ((4, 4, 12), (5, 4, 16), (5, 4, 24))}, new_tokens=16, cost_tokens=4, confirm=1,
                               passes=2, lookup={1: (16,)}, incumbent={1: (5, 4, 24, 16)})
    rows = TP.confirm(_ctx([[1] * 3, [1] * 4]), settings, report, lambda *a: None, systems, clock)
    got = [(r["steps"], r["topk"], r["draft_tokens"], r["lookup_tokens"], r["incumbent"]) for r in rows]
    assert got == [(0, 0, 1, 0, False), (5, 4, 16, 0, False), (5, 4, 16, 16, False), (5, 4, 24, 16, True)]
    assert rows[1]["predicted_accept_len"] == 3.2 and rows[3]["predicted_tok_per_s"] is None
    # timed on the fake clock, not the host's: 2 prompts of 16 tokens, each 5 ms + 4 cycles of 4 tokens at 1.8 ms
    assert rows[3]["measured_tok_per_s"] == pytest.approx(32 / (2 * (5.0 + 4 * 1.8) / 1e3))
    best = TP.winners(rows)[1]
    assert (best["steps"], best["draft_tokens"], best["lookup_tokens"]) == (5, 24, 16)
