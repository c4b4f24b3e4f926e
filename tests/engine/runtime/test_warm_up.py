"""``Engine.generate(..., warm_up=N)``: N tokens of the same prompts generated first, unobserved and unstreamed, so a
run's one-time costs (lazy captures and compiles, first replays, a compile's garbage) are set-up, not tok/s.

The run after a warm-up must be the run without one: the same tokens (a sampled run too: the generator's state is
restored), the same cycles for the observer (none of the warm-up's), the same stream; and under the graph runner
(emulated on CPU) every graph the run needs is captured during the warm-up, so the run itself captures nothing and
its cycles carry no set-up.
"""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.sampling import SamplingParams
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.engine.runtime.test_cuda_graphs import EmulatedRunner, Recorder, _drafter, tiny  # noqa: F401 (fixture)

PROMPTS = [[5, 9, 2, 7], [3, 3, 8]]
SPECS = {
    "plain": SpecConfig(cuda_graphs=True),
    "tree": SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6, attention_mode="decode", cuda_graphs=True),
}


def _run(model, kind: str, warm_up: int, sampling=SamplingParams(), seed: int | None = None, runner=None):
    spec = SPECS[kind]
    drafter = _drafter(model, spec, "eagle3") if spec.enabled else None
    runner = runner or EmulatedRunner.for_engine(model, spec, drafter, max_len=64, buckets=(1, 2))
    rec, streamed = Recorder(), {0: [], 1: []}
    engine = Engine(model, drafter=drafter, spec=spec, runner=runner, observer=rec, stop_lag=1)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    out = engine.generate(PROMPTS, 12, sampling, gen, stream=lambda b, t: streamed[b].extend(t), warm_up=warm_up)
    return out, rec, streamed, runner


@pytest.mark.parametrize("kind", list(SPECS))
def test_a_warmed_up_run_is_the_run_without_a_warm_up(tiny, kind):  # noqa: F811
    cold, cold_rec, cold_stream, _ = _run(tiny, kind, 0)
    warm, warm_rec, warm_stream, runner = _run(tiny, kind, 8)
    assert warm.tokens == cold.tokens and warm.accept_lens == cold.accept_lens and warm.cycles == cold.cycles
    assert warm_stream == cold_stream and [warm_stream[b] for b in (0, 1)] == warm.tokens
    assert [(c.index, c.kind, c.accept_len) for c in warm_rec.cycles] == \
        [(c.index, c.kind, c.accept_len) for c in cold_rec.cycles]  # the warm-up's cycles are not the run's
    # every graph was captured during the warm-up (reported to the observer): the run's cycles made no set-up
    assert len(warm_rec.captures) == len(runner.capture_stats) > 0
    assert all(c.setup_ms == 0.0 for c in warm_rec.cycles)
    assert warm.setup_seconds > 0.0


def test_a_sampled_run_draws_what_it_would_without_a_warm_up(tiny):  # noqa: F811
    sampling = SamplingParams(temperature=1.0)
    for kind in SPECS:
        cold, *_ = _run(tiny, kind, 0, sampling, seed=11)
        warm, *_ = _run(tiny, kind, 6, sampling, seed=11)
        assert warm.tokens == cold.tokens, kind


def test_a_warm_up_longer_than_the_run_is_cut_to_it(tiny):  # noqa: F811
    out, rec, _, _ = _run(tiny, "tree", 500)
    ref, *_ = _run(tiny, "tree", 0)
    assert out.tokens == ref.tokens and len(rec.cycles) == ref.cycles + 1  # the prefill, then every cycle


def test_an_eager_engine_warms_up_too(tiny):  # noqa: F811
    """No graph runner (CPU, eager): a warm-up changes nothing but the set-up it reports."""
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6, attention_mode="decode")
    outs = []
    for warm_up in (0, 5):
        net_drafter = _drafter(tiny, spec, "eagle3")
        assert isinstance(net_drafter, Eagle3Drafter)
        outs.append(Engine(tiny, drafter=net_drafter, spec=spec).generate(PROMPTS, 10, warm_up=warm_up))
    assert outs[0].tokens == outs[1].tokens and outs[1].setup_seconds > outs[0].setup_seconds


def test_a_session_warms_up_only_a_graph_runner(tiny_dir):
    """`eaglelab run` warms up what CUDA graphs capture lazily: two cycles' worth of tokens (both graphs of the
    observed one-graph cycle), or two decode steps for the plain baseline; nothing on an eager runner."""
    import argparse

    from eaglelab.session import add_engine_args, build_session

    p = argparse.ArgumentParser()
    add_engine_args(p)
    session = build_session(p.parse_args(["--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram",
                                          "--steps", "4"]), log=lambda m: None)
    assert session.runner_factory is None and session.warm_up_tokens() == 0
    session.runner_factory = lambda spec, drafter: None  # as a CUDA session has one
    assert session.warm_up_tokens() == 2 * (4 + 1) + 2 and session.warm_up_tokens(session.spec.plain()) == 3
