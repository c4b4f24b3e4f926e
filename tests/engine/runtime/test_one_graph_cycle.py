"""The one-graph cycle (``SpecConfig.one_graph_cycle``) computes what the five phases compute.

The same functions run in the same order, so the tokens, the accepted lengths, what the observer sees of
each cycle (accepted positions, sibling ranks, graph status) and, sampled, the random draws agree exactly
with the phase-per-graph cycle; and greedy, both equal plain greedy decoding.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.reasons import REPLAY
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.sampling import SamplingParams
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector, random_model
from tests.engine.runtime.test_cuda_graphs import EmulatedRunner, _phase_graph
from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter

TREES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=4, num_draft_tokens=37)}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return random_model(CFG, seed=21)


def _net():
    """A random drafter over the target's whole (small) vocabulary: a wide tree then hits now and then."""
    return random_drafter(random_model(CFG, seed=21), 5, draft_vocab=CFG["vocab_size"]), TAPS


def _run(model, one_graph: bool, tree: str, graphs: bool, sampling=SamplingParams(), eos=(), max_new=40):
    spec = SpecConfig("eagle3", **TREES[tree], cuda_graphs=graphs, one_graph_cycle=one_graph)
    net, taps = _net()
    drafter = Eagle3Drafter(net, spec, taps)
    runner = (EmulatedRunner.for_engine(model, spec, drafter, max_len=192, buckets=(4,)) if graphs
              else EagerRunner(model, net))
    seen = CycleCollector()
    eng = Engine(model, eos_token_ids=eos, drafter=drafter, spec=spec, runner=runner, observer=seen)
    assert eng.one_graph == one_graph
    gen = torch.Generator().manual_seed(11)
    out = eng.generate(PROMPTS, max_new, sampling=sampling, generator=gen)
    cycles = [c for c in seen.cycles if c.kind == "spec"]
    assert cycles and all(set(c.graph.values()) == {REPLAY} for c in cycles) == graphs, "graphs replayed, or none"
    return out, cycles, runner


def _same(a, b) -> None:
    (out_a, cyc_a, _), (out_b, cyc_b, _) = a, b
    assert out_a.tokens == out_b.tokens and out_a.stop_reasons == out_b.stop_reasons
    assert out_a.accept_lens == out_b.accept_lens and out_a.cycles == out_b.cycles
    assert [(c.accept_len, c.accepted_positions, c.accepted_ranks, c.path_open) for c in cyc_a] == \
           [(c.accept_len, c.accepted_positions, c.accepted_ranks, c.path_open) for c in cyc_b]


@pytest.mark.parametrize("tree", ["chain", "tree"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_greedy_one_graph_cycle_is_the_phase_cycle_and_plain_greedy(tiny, tree, graphs):
    one = _run(tiny, True, tree, graphs, eos=(7,))
    _same(one, _run(tiny, False, tree, graphs, eos=(7,)))
    plain = Engine(tiny, eos_token_ids=(7,), runner=EagerRunner(tiny)).generate(PROMPTS, 40)
    assert one[0].tokens == plain.tokens
    if tree == "tree":
        assert any(a > 1 for cyc in one[0].accept_lens for a in cyc), "a draft token accepted (acceptance exercised)"


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_sampled_one_graph_cycle_draws_what_the_phase_cycle_draws(tiny, graphs):
    """Rejection sampling: the cycle's draws (a uniform per node, the race) come from the generator in the
    same order, so the sampled tokens are the same too."""
    sampling = SamplingParams(temperature=0.8, top_p=0.9)
    _same(_run(tiny, True, "tree", graphs, sampling), _run(tiny, False, "tree", graphs, sampling))


def test_one_graph_cycle_replays_one_graph_a_cycle_and_reports_every_forward(tiny):
    out, cycles, runner = _run(tiny, True, "tree", True)
    assert _phase_graph(runner, "cycle", 4).graph.replays == len(cycles) == out.cycles
    assert not any(k[1] in ("draft", "verify", "accept", "advance") for k in runner._graphs), "no phase graphs"
    assert all(c.graph == {"draft": REPLAY, "verify": REPLAY, "draft_extend": REPLAY} for c in cycles)
    # the phases are timed from inside the graph: each cycle has its own draft, verify, accept, extend times
    assert all(set(c.phase_ms) == {"draft", "verify", "accept", "draft_extend"} for c in cycles)
    assert all(ms >= 0 for c in cycles for ms in c.phase_ms.values())


def test_the_drafter_carry_is_runner_state_and_survives_a_second_run(tiny):
    """What a cycle hands the next (the drafter's root hidden state and log-probs) lives in the runner's
    bound state buffers; a second run on the same runner (new prompts, fewer rows) replays the same graph."""
    spec = SpecConfig("eagle3", **TREES["tree"], cuda_graphs=True)
    net, taps = _net()
    drafter = Eagle3Drafter(net, spec, taps)
    runner = EmulatedRunner.for_engine(tiny, spec, drafter, max_len=192, buckets=(4,))
    eng = Engine(tiny, drafter=drafter, spec=spec, runner=runner)
    ref = Engine(tiny, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=EagerRunner(tiny, net))
    for prompts in (PROMPTS, PROMPTS[1:2]):
        assert eng.generate(prompts, 16).tokens == ref.generate(prompts, 16).tokens
    bound = {key[0] for key in runner._state}
    assert {"draft_hidden", "draft_logits"} <= bound
    assert drafter.next_hidden.data_ptr() == runner._state[next(k for k in runner._state if k[0] == "draft_hidden")].data_ptr()
    assert len([k for k in runner._graphs if k[1] == "cycle"]) == 1


@pytest.mark.parametrize("why", ["prefill-mode verify", "one_graph_cycle off"])
def test_the_cycle_runs_as_phases_where_it_cannot_be_one(tiny, why):
    spec = SpecConfig("eagle3", num_steps=2, attention_mode="prefill" if why.startswith("prefill") else "decode",
                      one_graph_cycle=why.startswith("prefill"))
    net, taps = _net()
    eng = Engine(tiny, drafter=Eagle3Drafter(net, spec, taps), spec=spec)
    assert not eng.one_graph


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_graph_of_the_cycle_is_the_phase_cycle_and_times_its_parts():
    """On CUDA: the captured cycle (timed by external events recorded at each replay, two graphs alternating)
    gives the phase-per-graph run's tokens and accepted lengths, with every part's time read back."""
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    model = random_model(CFG, seed=21).to("cuda")
    results, cycle_graphs = {}, {}
    for one_graph in (True, False):
        spec = SpecConfig("eagle3", **TREES["tree"], cuda_graphs=True, one_graph_cycle=one_graph)
        drafter = Eagle3Drafter(random_drafter(model, 5, draft_vocab=CFG["vocab_size"]).to("cuda"), spec, TAPS)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=192, buckets=(1, 4))
        seen = CycleCollector()
        out = Engine(model, drafter=drafter, spec=spec, runner=runner, observer=seen).generate(PROMPTS, 40)
        cycles = [c for c in seen.cycles if c.kind == "spec"]
        assert not runner._failed and all(set(c.graph.values()) == {REPLAY} for c in cycles), runner._failed
        assert all({"draft", "verify", "accept", "draft_extend"} <= set(c.phase_ms) for c in cycles)
        assert all(0 < ms < 1e3 for c in cycles for ms in c.phase_ms.values())
        results[one_graph] = (out.tokens, out.accept_lens)
        cycle_graphs[one_graph] = len([k for k in runner._graphs if k[1] == "cycle" and k[2] == 4])
        if one_graph:  # parts back to back: each part's end event is the next one's start (n parts, n + 1 events)
            from eaglelab.engine.runtime.generate import _CYCLE_MARKS

            marked = [m.take() for pair in _CYCLE_MARKS[runner].values() for m in pair]
            assert len([taken for taken in marked if taken]) >= 2, "bucket 4's two graphs timed"
            for taken in (t for t in marked if t):  # a pair made for a bucket whose second graph never ran: empty
                assert [name for name, _, _ in taken] == ["draft", "verify", "accept", "draft_extend", "accept"]
                assert all(b is c for (_, _, b), (_, c, _) in zip(taken, taken[1:]))
                assert len({id(e) for _, a, b in taken for e in (a, b)}) == len(taken) + 1
    assert results[True] == results[False]
    # observed on CUDA, the cycle alternates two graphs of bucket 4 (and of the smaller buckets its ended rows were
    # shed onto, each pair timed by marks of its own), so a replay never re-records unread times
    assert cycle_graphs == {True: 2, False: 0}


def test_the_engine_reports_the_one_graph_status_for_every_forward(tiny):
    """``Engine.graph_status`` (what probe_overhead.py prints) reads the cycle's graph for draft, verify and
    draft_extend: the runner alone knows no phase of those names when the cycle is one graph."""
    out, cycles, runner = _run(tiny, True, "tree", True)
    spec = SpecConfig("eagle3", **TREES["tree"], cuda_graphs=True)
    net, taps = _net()
    eng = Engine(tiny, drafter=Eagle3Drafter(net, spec, taps), spec=spec, runner=runner)
    assert eng.graph_status("spec", 3) == {"draft": REPLAY, "verify": REPLAY, "draft_extend": REPLAY}
    assert runner.graph_status("spec", "decode", 3)["verify"] != REPLAY, "the runner's own phase names: none ran"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 4), topk=st.integers(1, 3), extra=st.integers(0, 6), eos=st.sampled_from([(), (7,), (9, 11)]),
       max_new=st.integers(2, 20))
def test_any_tree_runs_the_same_as_one_graph_and_as_phases(tiny, steps, topk, extra, eos, max_new):
    """For any chain or tree shape, stop tokens and budget: the same tokens, stop reasons and accepted lengths,
    and the drafter ends in the same state (the last draft-extend's root hidden state and log-probs, exactly)."""
    most = 1 + topk + (steps - 1) * topk * topk
    n = steps + 1 if topk == 1 else min(2 + extra, most)
    got, carried = [], []
    for one_graph in (True, False):
        spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=n, one_graph_cycle=one_graph)
        net, taps = _net()
        drafter = Eagle3Drafter(net, spec, taps)
        out = Engine(tiny, eos_token_ids=eos, drafter=drafter, spec=spec,
                     runner=EagerRunner(tiny, net)).generate(PROMPTS, max_new)
        got.append((out.tokens, out.stop_reasons, out.accept_lens, out.cycles))
        carried.append((drafter.next_hidden, drafter.next_logits))
    assert got[0] == got[1]
    assert all(torch.equal(a, b) for a, b in zip(*carried))
