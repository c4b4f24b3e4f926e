"""Per-position acceptance while training: the rates over every anchor imply the accepted lengths reported beside
them, the rates over the engine's cycles follow the walk, and every evaluation of a run (resumed pieces included)
reaches the checkpoint and the drafter's card."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.training.offline_eval import cycle_rates, implied_len, summarise, walk
from eaglelab.engine.training.online import Subset, TargetStates, TokenData, split_heldout
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import TargetHead, Trainer
from tests.engine.training.test_online import FakeClock, _cfg, distill
from tests.engine.training.test_train import TAPS, VOCAB, fresh, prompts, sharp_target

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


def test_every_evaluation_survives_a_resume_into_the_history(tmp_path):
    """A run stopped by the time limit after its first evaluations, resumed from the checkpoint: the history holds
    every evaluation of both pieces, in step order, each with per-position rates over anchors and cycles."""
    model = sharp_target(seed=1)
    distill(model, prompts(16, seed=11), tmp_path / "d", max_new=12)
    data = TokenData(tmp_path / "d")
    vocab = build_draft_vocab(data.token_counts(VOCAB), 64)
    train, held = split_heldout(len(data), 4, seed=0)

    def trainer(cfg, clock=None):
        return Trainer(fresh(model, vocab), TargetHead.from_model(model), Subset(data, train), cfg,
                       states=TargetStates(model, TAPS), heldout=Subset(data, held), checkpoint_dir=tmp_path / "ck",
                       **({"clock": clock} if clock else {}))

    first = trainer(_cfg(eval_every=1, time_limit=8.0), FakeClock())
    res = first.train()
    assert res.stopped_by_time and len(first.eval_history) == first.step >= 1
    resumed = trainer(_cfg(eval_every=1))
    resumed.load_checkpoint(first.save_checkpoint())
    rest = resumed.train()
    steps = [e["step"] for e in resumed.eval_history]
    assert steps == list(range(1, resumed.step + 1)) and len(rest.evals) == resumed.step - first.step
    last = resumed.eval_history[-1]
    assert len(last["per_position"]) == len(last["cycle_per_position"]) == 3
    assert all(0.0 <= r <= 1.0 for r in last["per_position"] + last["cycle_per_position"])
    assert implied_len(last["per_position"], 3) == pytest.approx(last["accept_len"][2], rel=1e-5)
