"""Probes stay free: an observer costs the engine one device-to-host readback per cycle, made of one
packed copy (``engine/runtime/readback.py``), and the stats it gets, delivered one cycle late, are
exactly the run's.

Worked example: a run of 1 prefill and 6 speculative cycles reads the host 7 more times with an
observer than without (one ``tolist`` of each cycle's packed [B, W] tensor); every ``.item()``,
``.tolist()``, ``bool(t)`` or ``.cpu()`` added on a cycle's tensors for the probes would show here.
"""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.readback import Stager
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector, random_model
from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter

READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


def _counting(monkeypatch) -> dict[str, int]:
    """Count every host readback of a tensor (the calls that sync with a GPU)."""
    counts = dict.fromkeys(READS, 0)
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def _run(target, observer, spec, monkeypatch):
    drafter = Eagle3Drafter(random_drafter(target, 3), spec, TAPS)
    engine = Engine(target, eos_token_ids=(3,), drafter=drafter, spec=spec, observer=observer)
    with monkeypatch.context() as m:
        counts = _counting(m)
        out = engine.generate(PROMPTS, 12)
    return out, sum(counts.values()), engine


@pytest.mark.parametrize("shape", [(1, 3, 0), (3, 2, 6)])  # (topk, steps, tokens): a chain and a tree
def test_an_observer_adds_one_readback_per_cycle(target, shape, monkeypatch):
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt, attention_mode="decode")
    plain_out, plain_reads, _ = _run(target, None, spec, monkeypatch)
    seen = CycleCollector()
    out, reads, engine = _run(target, seen, spec, monkeypatch)
    assert out.tokens == plain_out.tokens
    assert len(seen.cycles) == out.cycles + 1  # the prefill, then every cycle, none lost to the lag
    assert engine._stager.copies == out.cycles + 1  # one packed copy per cycle
    assert reads - plain_reads == out.cycles + 1, f"{reads - plain_reads} readbacks for {out.cycles + 1} cycles"


def test_late_stats_are_the_runs_own(target, monkeypatch):
    """Delivered a cycle late, each cycle's stats still carry its own index, rows and accepted lengths
    (the same the engine returns), and accepted paths and ranks of matching lengths."""
    spec = SpecConfig("eagle3", num_steps=2, topk=3, num_draft_tokens=6, attention_mode="decode")
    seen = CycleCollector()
    out, _, _ = _run(target, seen, spec, monkeypatch)
    assert [c.index for c in seen.cycles] == list(range(out.cycles + 1))
    assert [c.kind for c in seen.cycles] == ["prefill"] + ["spec"] * out.cycles
    spec_cycles = seen.cycles[1:]
    assert [list(c.accept_len) for c in spec_cycles] == out.accept_lens
    assert seen.cycles[0].active_rows == len(PROMPTS)
    for c in spec_cycles:
        assert c.active_rows == len(c.accept_len) and c.num_draft_tokens == 6
        assert [len(p) for p in c.accepted_positions] == [a - 1 for a in c.accept_len]
        assert [len(r) for r in c.accepted_ranks] == [a - 1 for a in c.accept_len]
        assert all(1 <= r <= 3 for ranks in c.accepted_ranks for r in ranks)
        assert set(c.phase_ms) == {"draft", "verify", "accept", "draft_extend"}


def test_stager_packs_and_reads_back_each_tensor():
    """[B] and [B, k] tensors of any integer or bool dtype come back as per-row lists, in one copy."""
    stager = Stager(torch.device("cpu"))
    staged = stager.stage({"active": torch.tensor([True, False]), "path": torch.tensor([[0, 1, -1], [0, 2, 3]]),
                           "n": torch.tensor([2, 3], dtype=torch.int32)})
    assert staged.read() == {"active": [[1], [0]], "path": [[0, 1, -1], [0, 2, 3]], "n": [[2], [3]]}
    assert stager.copies == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_with_cuda_graphs_an_observer_adds_one_pinned_readback_per_cycle(monkeypatch):
    """On the GPU the readback is a non_blocking copy into pinned memory, read a cycle later."""
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    model = build_scale_model("tiny", device="cuda", seed=3).model
    spec = SpecConfig("eagle3", num_steps=3, attention_mode="decode", cuda_graphs=True)
    counted = []
    for observer in (None, CycleCollector()):
        net, taps = random_eagle3(model, seed=5, draft_vocab=256)
        drafter = Eagle3Drafter(net, spec, taps)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=64, buckets=(1, 2, 4))
        engine = Engine(model, drafter=drafter, spec=spec, runner=runner, observer=observer)
        engine.generate(PROMPTS[:2], 12)  # captures the graphs
        with monkeypatch.context() as m:
            counts = _counting(m)
            out = engine.generate(PROMPTS[:2], 12)
        counted.append(sum(counts.values()))
    assert counted[1] - counted[0] == out.cycles + 1
    assert [list(c.accept_len) for c in observer.cycles[-out.cycles:]] == out.accept_lens
    assert all(v == "replay" for c in observer.cycles[-out.cycles:] for v in c.graph.values())
