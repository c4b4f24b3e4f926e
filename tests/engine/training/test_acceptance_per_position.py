"""Per-position acceptance while training: the rates over every anchor imply the accepted lengths reported beside
them, the rates over the engine's cycles follow the walk, every evaluation of a run (resumed pieces included)
reaches the checkpoint and the drafter's card, and a fresh run's history starts with its starting point (step 0:
the new drafter, or the warm start's init drafter exactly)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from eaglelab.engine.training.offline_eval import cycle_rates, implied_len, summarise, walk
from eaglelab.engine.training.online import Subset, TargetStates, TokenData, split_heldout
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import TargetHead, Trainer, drafter_config, new_drafter, save_drafter
from eaglelab.engine.training.warm_start import warm_start
from tests.engine.training.test_online import FakeClock, _cfg, distill
from tests.engine.training.test_train import DRAFT_VOCAB, IDS, TAPS, VOCAB, fresh, prompts, sharp_target

pytestmark = pytest.mark.usefixtures("one_thread")


def test_implied_len_worked_example_and_equal_to_accept_len_over_anchors():
    """rates (0.8, 0.5) -> 2.2; on 500 random hit rows the rates summarise reports imply its accept_len exactly."""
    assert implied_len((0.8, 0.5)) == pytest.approx(2.2) and implied_len((0.8, 0.5), 1) == pytest.approx(1.8)
    g = torch.Generator().manual_seed(0)
    hits = torch.rand(500, 5, generator=g) < torch.tensor([0.7, 0.75, 0.8, 0.85, 0.9])
    ev = summarise(3, hits)
    for k in range(1, 6):
        assert implied_len(ev.per_position, k) == pytest.approx(ev.chain(k), rel=1e-6)


def test_cycle_rates_worked_example_and_from_the_walk():
    """lens (1, 3, 4), chain 3: drafts accepted 0, 2, 3 -> position 0: 2 of 3; 1: 2 of 2; 2: 1 of 2. The walk of
    test_online's example (chain 2: cycles 3, 1, 2) -> position 0: 2 of 3, position 1: 1 of 2."""
    assert cycle_rates([1, 3, 4], 3) == pytest.approx((2 / 3, 1.0, 0.5))
    hits = torch.tensor([[1, 1], [0, 0], [1, 1], [0, 1], [1, 0], [1, 1]], dtype=torch.bool)
    cycles = [walk(hits, torch.ones(6, dtype=torch.bool), 0, k) for k in (1, 2)]
    ev = summarise(0, hits, cycles)
    assert cycles[1] == [3, 1, 2] and ev.cycle_per_position == pytest.approx((2 / 3, 0.5))
    assert implied_len(ev.cycle_per_position) == pytest.approx(1 + 2 / 3 + 2 / 3 * 0.5)


@pytest.fixture
def split(tmp_path):
    """A distilled data set of the tiny target: (model, data, draft vocabulary, train indices, held-out indices)."""
    model = sharp_target(seed=1)
    distill(model, prompts(16, seed=11), tmp_path / "d", max_new=12)
    data = TokenData(tmp_path / "d")
    train, held = split_heldout(len(data), 4, seed=0)
    return model, data, build_draft_vocab(data.token_counts(VOCAB), DRAFT_VOCAB), train, held


def _trainer(split, cfg, net=None, evaluate_on=None, **kw):
    """A trainer on the training split, evaluating on the held-out one (or on the samples ``evaluate_on``)."""
    model, data, vocab, train, held = split
    return Trainer(net if net is not None else fresh(model, vocab), TargetHead.from_model(model), Subset(data, train),
                   cfg, states=TargetStates(model, TAPS), heldout=Subset(data, evaluate_on or held), **kw)


def test_a_fresh_run_evaluates_its_starting_point_as_step_0(split):
    """eval_every 2 over 6 steps: evaluations at 0 (before the first step), 2, 4 and 6; step 0's figures are an
    evaluation of the untrained drafter itself (a twin of the same seed, never trained)."""
    tr = _trainer(split, _cfg(eval_every=2))
    res = tr.train()
    assert [e.step for e in res.evals] == [0, 2, 4, 6] and [e["step"] for e in tr.eval_history] == [0, 2, 4, 6]
    assert res.evals[0] == _trainer(split, _cfg(eval_every=2)).evaluate()
    assert res.evals[-1] != res.evals[0]  # the drafter trained in between
    assert _trainer(split, _cfg()).train().evals == []  # evaluation off: none, not even step 0


def test_a_warm_start_begins_at_its_init_drafters_acceptance(split, tmp_path):
    """A drafter trained 24 steps and saved in float32, then warm-started into a wider MLP (128 -> 160: the new
    units' down_proj columns are 0, so the function is the init's): the new run's step 0 equals the init drafter's
    own last evaluation on the same samples, figure for figure. (Evaluated on its training samples, where 24 steps
    already get drafts accepted, so the match is not two drafters that both accept nothing.)"""
    model, _, vocab, train, _ = split
    init = _trainer(split, _cfg(eval_every=100, epochs=8), evaluate_on=train)
    before = init.train().evals[-1]
    assert before.step == 24 and before.chain(3) > 1.3
    save_drafter(init.net, tmp_path / "init", target=model.config, sglang_layer_ids=list(IDS), dtype=torch.float32)
    wide = new_drafter(drafter_config(model.config, 3, DRAFT_VOCAB, 160), TargetHead.from_model(model), vocab.mapping)
    assert warm_start(wide, tmp_path / "init", list(IDS), model.lm_head.weight).widened
    res = _trainer(split, _cfg(eval_every=1, max_steps=1), wide, evaluate_on=train).train()
    assert [e.step for e in res.evals] == [0, 1] and res.evals[0] == replace(before, step=0)


def test_every_evaluation_survives_a_resume_into_the_history(split, tmp_path):
    """A run stopped by the time limit after its first evaluations, resumed from the checkpoint: the history holds
    every evaluation of both pieces, in step order, each with per-position rates over anchors and cycles; the
    first piece's step 0 stays the only one (a resumed piece does not evaluate a starting point again)."""
    first = _trainer(split, _cfg(eval_every=1, time_limit=8.0), clock=FakeClock(), checkpoint_dir=tmp_path / "ck")
    res = first.train()
    assert res.stopped_by_time and len(first.eval_history) == first.step + 1 and first.step >= 1
    resumed = _trainer(split, _cfg(eval_every=1), checkpoint_dir=tmp_path / "ck")
    resumed.load_checkpoint(first.save_checkpoint())
    rest = resumed.train()
    steps = [e["step"] for e in resumed.eval_history]
    assert steps == list(range(0, resumed.step + 1)) and len(rest.evals) == resumed.step - first.step
    assert resumed.eval_history[: first.step + 1] == first.eval_history and rest.evals[0].step == first.step + 1
    last = resumed.eval_history[-1]
    assert len(last["per_position"]) == len(last["cycle_per_position"]) == 3
    assert all(0.0 <= r <= 1.0 for r in last["per_position"] + last["cycle_per_position"])
    assert implied_len(last["per_position"], 3) == pytest.approx(last["accept_len"][2], rel=1e-5)
