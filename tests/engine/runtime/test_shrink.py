"""A batch sheds its ended rows (:mod:`eaglelab.engine.runtime.shrink`): once the live rows fit a smaller batch bucket
they move into the first rows and the phases run on that many. Each row's tokens must still be what plain greedy
decoding gives its prompt alone, in the order the prompts came, under eager phases and (emulated on the CPU)
CUDA-graph replays with their static buffers and pad rows, for plain decoding and both drafters, with the stop
check reading each step at once or one step late; and the rows run must fall.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime import shrink
from eaglelab.engine.runtime.generate import Engine
from tests.conftest import CycleCollector, random_model
from tests.engine.runtime.test_serve import _engine, greedy_alone
from tests.engine.runtime.test_speculative import CFG

pytestmark = pytest.mark.usefixtures("one_thread")

EOS = (2, 69)  # two tokens this model emits: rows end apart


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


@pytest.fixture(scope="module")
def alone(target):
    return greedy_alone(target, EOS)


PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10], [11, 12, 13, 11, 12, 13, 11, 12], [3, 4], list(range(20, 31)), [8],
           [8, 9, 10, 11], [40, 41, 42]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    kind=st.sampled_from(["plain", "eagle3", "eagle3-phases", "eagle3-lookup", "ngram"]),
    graphs=st.booleans(),
    lag=st.sampled_from([0, 1]),
)
def test_a_shrinking_batch_gives_each_row_what_plain_greedy_gives_it_alone(target, alone, data, kind, graphs, lag):
    prompts = data.draw(st.lists(st.lists(st.integers(3, 60), min_size=1, max_size=12), min_size=2, max_size=4),
                        label="prompts")
    max_new = data.draw(st.integers(1, 16), label="max_new")
    given_prompts = [list(p) for p in prompts]
    out = _engine(target, kind, graphs, lag, eos=EOS).generate(prompts, max_new)
    assert out.tokens == [alone(p, max_new) for p in prompts]
    assert out.stop_reasons == ["eos" if t and t[-1] in EOS else "length" for t in out.tokens]
    assert prompts == given_prompts, "rows move inside the engine, never in the caller's list"
    assert len(out.accept_lens) == (out.cycles if kind != "plain" else 0)


@pytest.mark.parametrize("kind", ["plain", "eagle3", "eagle3-phases", "ngram"])
@pytest.mark.parametrize("graphs", [False, True])
def test_rows_that_end_early_stop_costing_rows(target, alone, kind, graphs):
    """Eight prompts whose rows end at different steps, a stop check a step late: shed, the batch runs fewer rows x
    steps than the same batch kept whole (``Engine(shed_rows=False)``), with the same tokens and cycles' accepted
    lengths (under emulated graphs on the buckets 1, 2, 4 and the largest, 8: each step counts its bucket's rows, pad
    rows included)."""
    if graphs and kind == "ngram":
        pytest.skip("the n-gram drafter drafts on the host: no graphs")
    runs = {}
    for on in (False, True):
        seen = CycleCollector()
        engine = _engine(target, kind, False, 1, seen, eos=EOS)
        if graphs:
            from tests.engine.runtime.test_cuda_graphs import EmulatedRunner
            engine = Engine(target, eos_token_ids=EOS, drafter=engine.drafter, spec=engine.spec, stop_lag=1,
                            runner=EmulatedRunner.for_engine(target, engine.spec, engine.drafter, max_len=160,
                                                             buckets=(1, 2, 4, 8)), observer=seen)
        engine.shed_rows = on
        runs[on] = engine.generate(PROMPTS, 20), seen.cycles
    (whole, whole_seen), (shed, shed_seen) = runs[False], runs[True]
    assert shed.tokens == whole.tokens == [alone(p, 20) for p in PROMPTS]
    ends = sorted({len(t) for t in shed.tokens})
    assert len(ends) > 3, f"rows must end apart for this test to mean anything: {ends}"
    assert whole.row_cycles == whole.cycles * 8
    assert shed.row_cycles < whole.row_cycles
    assert [c.active_rows for c in shed_seen] == [c.active_rows for c in whole_seen]
    if kind != "plain":
        assert [sorted(c) for c in shed.accept_lens] == [sorted(c) for c in whole.accept_lens]  # in slot order
        assert [sorted(c.accept_len) for c in shed_seen] == [sorted(c.accept_len) for c in whole_seen]


def test_a_stream_keeps_the_batch_whole(target, monkeypatch):
    """A stream names rows by the prompts' indices, read from fixed slots: a streamed batch does not shed rows (and
    the stream sees every row's tokens once, in order)."""
    got: dict[int, list[int]] = {}
    engine = _engine(target, "eagle3", False, 1, eos=EOS)
    out = engine.generate(PROMPTS, 20, stream=lambda row, toks: got.setdefault(row, []).extend(toks))
    assert out.row_cycles == out.cycles * len(PROMPTS)
    assert [got.get(r, []) for r in range(len(PROMPTS))] == out.tokens


def test_the_moves_a_shrink_makes():
    """The worked example of the module's docstring, on the eager runner's counting (every row counts): 8 rows,
    rows 1, 4, 6 live -> row 4 to slot 0, row 6 to slot 2, row 1 stays; the rows whose slots were taken keep the
    outputs they had."""
    from types import SimpleNamespace

    from eaglelab.engine.core.kv_cache import KVCache
    from eaglelab.engine.runtime.loop_state import Batch, loop_state

    cache = KVCache(1, 8, 1, 6, 2, dtype=torch.float32, device="cpu")
    state = loop_state(torch.arange(8), torch.arange(100, 108), slots=6, max_new=3)
    state["out"][:, 0] = torch.arange(200, 208)
    state["n_out"] += 1
    live = [1, 4, 6]
    for r in range(8):
        state["done"][r] = r not in live
    st = Batch(cache, **state, prompts=[[r] for r in range(8)], prompt_lens=torch.ones(8, dtype=torch.long))
    runner = SimpleNamespace(padded_batch=lambda b: next(x for x in (1, 2, 4, 8) if x >= b))
    s = shrink.Shrinker(SimpleNamespace(runner=runner, drafter=None), st)
    smaller = s.shrink(st, st.done.clone())
    assert smaller is not None and smaller.root.shape[0] == 3
    assert smaller.root.tolist() == [104, 101, 106] and smaller.done.tolist() == [False, False, False]
    assert st.done[3:].all(), "the slots past the live rows are ended rows (a bucket's pad rows may include them)"
    assert s.row_at[:3] == [4, 1, 6] and s.row_at[4] is None and s.row_at[6] is None, "moved rows leave copies"
    assert smaller.prompts == [[4], [1], [6]]
    assert s.shrink(smaller, st.done.clone()) is None, "3 rows run on bucket 4 already"
    tokens, reasons = s.rows()
    assert [t[0] for t in tokens] == list(range(200, 208)), "each row's output where it ended up, in prompt order"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_a_batch_shrinks_on_cuda_graphs_and_keeps_the_eager_tokens(kind):
    """Real CUDA graphs (float32, the stop check a step late, observed): eight rows ending apart shed onto the
    buckets 4, 2 and 1, every phase replayed, each row's tokens plain greedy's of its prompt alone; and the same batch
    again, which replays bucket 8's observed cycle after the smaller buckets' were captured (each graph timed by
    events of its own: one replaced under a captured graph had crashed an H100's bench with SIGSEGV)."""
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.reasons import REPLAY
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from tests.engine.runtime.test_speculative import TAPS, random_drafter

    model = random_model(CFG, seed=21).cuda()
    if kind == "plain":
        spec, drafter = SpecConfig(cuda_graphs=True), None
    else:
        spec = SpecConfig("eagle3", num_steps=3, topk=4, num_draft_tokens=10, cuda_graphs=True)
        drafter = Eagle3Drafter(random_drafter(model, 5, draft_vocab=CFG["vocab_size"]).cuda(), spec, TAPS)
    runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=96, buckets=(1, 2, 4, 8))
    seen = CycleCollector()
    engine = Engine(model, eos_token_ids=EOS, drafter=drafter, spec=spec, runner=runner, observer=seen)
    out = engine.generate(PROMPTS, 20, warm_up=4)
    alone = [Engine(model, eos_token_ids=EOS).generate([p], 20).tokens[0] for p in PROMPTS]
    assert out.tokens == alone
    assert out.row_cycles < out.cycles * 8, "rows shed"
    again = engine.generate(PROMPTS, 20)
    torch.cuda.synchronize()
    assert again.tokens == alone
    if kind != "plain":
        assert all(0 < ms < 1e3 for c in seen.cycles if c.kind == "spec" for ms in c.phase_ms.values())
    assert not runner._failed and not runner.fallbacks, (runner._failed, dict(runner.fallbacks))
    assert all(set(c.graph.values()) == {REPLAY} for c in seen.cycles if c.kind != "prefill")


def test_each_bucket_s_cycle_graph_is_timed_by_marks_of_its_own(target):
    """Observed, a one-graph cycle records timing events inside its graph; a batch shedding rows captures the cycle
    of each smaller bucket too, and each bucket's graphs get their own two marks (shared marks would hand bucket 8's
    events to bucket 4's capture, and bucket 8's next replay would record events already destroyed)."""
    from eaglelab.engine.runtime.generate import _CYCLE_MARKS
    from tests.engine.runtime.test_cuda_graphs import EmulatedRunner

    base = _engine(target, "eagle3", False, 1, eos=EOS)
    runner = EmulatedRunner.for_engine(target, base.spec, base.drafter, max_len=160, buckets=(1, 2, 4, 8))
    engine = Engine(target, eos_token_ids=EOS, drafter=base.drafter, spec=base.spec, stop_lag=1, runner=runner,
                    observer=CycleCollector())
    out = engine.generate(PROMPTS, 20)
    assert out.row_cycles < out.cycles * 8, "rows shed"
    buckets = sorted({graph[0] for graph in _CYCLE_MARKS[runner]})
    assert buckets[-1] == 8 and len(buckets) > 1, buckets
    pairs = list(_CYCLE_MARKS[runner].values())
    assert len({id(m) for pair in pairs for m in pair}) == 2 * len(pairs), "no two graphs share marks"
