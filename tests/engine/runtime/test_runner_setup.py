"""A runner builds every fused weight copy when it is made, so the first generate's prefill (and its tok/s)
does not pay for them, and the time shows as the runner's set-up."""

from __future__ import annotations

from eaglelab.engine.model.layers import fused_linears
from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import random_model
from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter


def _held(fused) -> list[list[int]]:
    """The identities of the fused copies each FusedLinear holds (per layout)."""
    return [sorted(id(w) for _, w, _ in fl._fused.values()) for fl in fused]


def test_a_runner_builds_the_fused_weights_when_made_and_counts_them_as_set_up():
    target = random_model(CFG, seed=5)
    spec = SpecConfig("eagle3", num_steps=2, topk=1, attention_mode="decode")
    drafter = Eagle3Drafter(random_drafter(target, 3), spec, TAPS)
    fused = fused_linears(target) + fused_linears(drafter.net)
    lazy = Engine(target, drafter=drafter, spec=spec, runner=_Unprepared(target, drafter.net)).generate(PROMPTS[:2], 6)
    for fl in fused:  # back to a fresh model's state: nothing built
        fl._fused.clear()

    runner = EagerRunner(target, drafter.net)
    before = _held(fused)
    assert all(before), "every fused linear has its CPU copy once the runner is made"
    assert runner.setup_seconds > 0.0
    out = Engine(target, drafter=drafter, spec=spec, runner=runner).generate(PROMPTS[:2], 6)
    assert _held(fused) == before, "the first generate built fused weights inside its timed span"
    assert out.tokens == lazy.tokens


class _Unprepared(EagerRunner):
    """The runner as it was: fused copies built lazily, in the first forward."""

    def __init__(self, target, drafter) -> None:
        from eaglelab.engine.model.layers import EAGER_KERNELS

        self.target, self.drafter, self.reason, self.kernels, self._prepare_s = target, drafter, "eager", EAGER_KERNELS, 0.0


def test_the_graph_runner_counts_the_fused_weights_as_set_up_too():
    target = random_model(CFG, seed=6)
    runner = CudaGraphRunner(target, None, enabled=False)  # on CPU it runs eagerly, but is made the same way
    assert all(fl._fused for fl in fused_linears(target))
    assert runner.setup_seconds > 0.0


def test_the_graph_runner_counts_kernel_set_up_outside_a_capture_once():
    """The GEMV's tuning and the decode attention's checks happen on a shape's first eager call: inside a capture
    (its time already in the capture's) or in an eager phase, such as a drafter's extend over a prompt. Both count
    as set-up, once (a capture subtracts the kernels' share of its wall time); before, the eager ones were timed as
    generation."""
    from types import SimpleNamespace

    from eaglelab.engine.model.layers import Kernels

    target = random_model(CFG, seed=7)
    gemv = SimpleNamespace(layout=None, reason="not CUDA", setup_seconds=0.0, refusal=lambda *a: "not CUDA")
    runner = CudaGraphRunner(target, None, enabled=False, kernels=Kernels(gemv=gemv))
    before = runner.setup_seconds
    gemv.setup_seconds += 0.25  # a shape tuned in an eager phase
    assert runner.setup_seconds == before + 0.25


def test_each_cycle_reports_the_set_up_made_inside_it():
    """The engine tells the observer how much set-up (capture, compile, a kernel's tuning) a cycle held, so the
    probes keep it out of the phase means as the run keeps it out of tok/s."""
    seen = []

    class _Collect:
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_cycle(self, stats):
            seen.append((stats.kind, stats.setup_ms))

    class _TunesOnTheSecondDecode(EagerRunner):
        extra, decodes = 0.0, 0

        @property
        def setup_seconds(self):
            return super().setup_seconds + self.extra

        def phase(self, name, *a, **k):
            if name == "decode":
                self.decodes += 1
                if self.decodes == 2:
                    self.extra += 0.25
            return super().phase(name, *a, **k)

    target = random_model(CFG, seed=8)
    Engine(target, observer=_Collect(), runner=_TunesOnTheSecondDecode(target, None)).generate(PROMPTS[:1], 5)
    assert seen[0] == ("prefill", 0.0)
    assert [s for k, s in seen if k == "decode"] == [0.0, 250.0, 0.0, 0.0]
