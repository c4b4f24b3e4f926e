"""The engine's contracts are types: the shipped drafters and runners satisfy the protocols, and a
drafter written against the protocol alone (it sees a read-only DraftView, never the Batch) runs
through the engine without changing the greedy output.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eaglelab.engine.runtime.contracts import DraftView, Drafter, Runner
from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA, EAGER_OFF, SOURCE_RUNNER, eager_warning
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.tree import DraftTree, chain_tree
from tests.engine.runtime.test_speculative import CFG, TAPS, random_drafter
from tests.conftest import random_model


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=11)


def test_shipped_drafters_and_runners_satisfy_the_protocols(target):
    spec = SpecConfig("eagle3", num_steps=2)
    eagle = Eagle3Drafter(random_drafter(target, seed=1), spec, TAPS)
    ngram = NgramDrafter(SpecConfig("ngram", num_steps=2))
    assert isinstance(eagle, Drafter) and isinstance(ngram, Drafter)
    assert eagle.net is not None and ngram.net is None and ngram.target_taps == ()
    assert isinstance(EagerRunner(target), Runner)
    assert isinstance(CudaGraphRunner.for_engine(target, spec, eagle, max_len=64), Runner)


class RepeatRoot:
    """Proposes the root repeated: a drafter that needs no network and only the view's root."""

    target_taps: tuple[int, ...] = ()
    net = None

    def __init__(self, steps: int) -> None:
        self.steps, self.views = steps, []

    def begin(self, view: DraftView, prompt_ids, aux, runner: Runner) -> None:
        self.views.append(view)

    def propose(self, view: DraftView, runner: Runner) -> DraftTree:
        self.views.append(view)
        return chain_tree(view.root[:, None].repeat(1, self.steps + 1))

    def commit(self, view: DraftView, acc, aux, runner: Runner) -> None:
        self.views.append(view)


def test_a_protocol_only_drafter_runs_and_changes_nothing(target):
    prompts = [[5, 6, 7, 8], [9, 10, 9, 10, 9]]
    plain = Engine(target).generate(prompts, 10)
    drafter = RepeatRoot(steps=2)
    assert isinstance(drafter, Drafter)
    spec = SpecConfig("ngram", num_steps=2)  # any drafting algorithm: the engine only sees the protocol
    out = Engine(target, drafter=drafter, spec=spec).generate(prompts, 10)
    assert out.tokens == plain.tokens
    view = drafter.views[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.root = torch.zeros_like(view.root)  # type: ignore[misc]
    assert view.prompts == prompts and view.cache_len >= max(map(len, prompts)) + 10
    assert {f.name for f in dataclasses.fields(DraftView)} == {"root", "lengths", "out", "n_out", "prompts", "cache_len"}


class Warnings:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __getattr__(self, name):  # every other hook: ignored
        return lambda *a: None

    def on_warning(self, source: str, message: str) -> None:
        self.seen.append((source, message))


@pytest.mark.parametrize("graphs, want", [(False, []), (True, ["prefill", "decode"])])
def test_the_engine_warns_once_per_run_of_each_eager_fallback_nobody_chose(target, graphs, want):
    """Graphs off by choice: silence. Graphs asked for on a machine without CUDA: one warning per
    phase and run (the default eager runner says why: no CUDA device)."""
    if torch.cuda.is_available():
        pytest.skip("pins the CPU fallback")
    obs = Warnings()
    engine = Engine(target, spec=SpecConfig(cuda_graphs=graphs), observer=obs)
    for _ in range(2):
        obs.seen.clear()
        engine.generate([[5, 6, 7]], 4)
        assert obs.seen == [(SOURCE_RUNNER, eager_warning(p, EAGER_NO_CUDA)) for p in want]
    assert engine.runner.graph_status("decode", "decode", 1) == {"decode": EAGER_NO_CUDA if graphs else EAGER_OFF}
