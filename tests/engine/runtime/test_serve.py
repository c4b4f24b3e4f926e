"""Continuous batching (``Engine.generate(max_batch=...)``): a row whose request ends takes the next prompt while
the other rows keep running. Each request's tokens must be exactly what plain greedy decoding gives it alone, in
whichever row it ran, after however many moves, under eager phases and (emulated on the CPU) CUDA-graph replays
with their static buffers, for plain decoding and both drafters, with the stop check reading each step at once
or one step late.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.loop_state import loop_state, move_row, start_rows
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector, random_model
from tests.engine.runtime.test_cuda_graphs import EmulatedRunner
from tests.engine.runtime.test_speculative import CFG, TAPS, random_drafter

pytestmark = pytest.mark.usefixtures("one_thread")

EOS = (7,)


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


def greedy_alone(target, eos: tuple[int, ...]):
    """-> get(prompt, max_new): plain greedy output of a prompt generated alone (batch 1), cached."""
    memo: dict[tuple, list[int]] = {}

    def get(prompt: list[int], max_new: int) -> list[int]:
        key = (tuple(prompt), max_new)
        if key not in memo:
            memo[key] = Engine(target, eos_token_ids=eos).generate([prompt], max_new).tokens[0]
        return memo[key]
    return get


@pytest.fixture(scope="module")
def alone(target):
    """Plain greedy output of a prompt generated alone (batch 1), cached per (prompt, max_new)."""
    return greedy_alone(target, EOS)


def _engine(target, kind: str, graphs: bool, lag: int, observer=None, eos=EOS) -> Engine:
    if kind == "plain":
        spec = SpecConfig(cuda_graphs=graphs)
        drafter, net = None, None
    elif kind == "ngram":
        spec, graphs = SpecConfig("ngram", num_steps=3, topk=1), False  # drafts on the host: no graphs
        drafter, net = NgramDrafter(spec), None
    else:
        spec = SpecConfig("eagle3", num_steps=3, topk=4, num_draft_tokens=10, cuda_graphs=graphs,
                          one_graph_cycle=kind != "eagle3-phases", lookup_tokens=5 if kind == "eagle3-lookup" else 0)
        net = random_drafter(target, 5, draft_vocab=CFG["vocab_size"])  # the whole vocabulary: drafts get accepted
        drafter = Eagle3Drafter(net, spec, TAPS)
    runner = (EmulatedRunner.for_engine(target, spec, drafter, max_len=160, buckets=(1, 2, 4)) if graphs
              else EagerRunner(target, net))
    return Engine(target, eos_token_ids=eos, drafter=drafter, spec=spec, runner=runner, stop_lag=lag,
                  observer=observer)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    kind=st.sampled_from(["plain", "eagle3", "eagle3-phases", "eagle3-lookup", "ngram"]),
    graphs=st.booleans(),
    lag=st.sampled_from([0, 1]),
    max_batch=st.integers(1, 3),
)
def test_served_requests_get_what_plain_greedy_gives_each_alone(target, alone, data, kind, graphs, lag, max_batch):
    prompts = data.draw(st.lists(st.lists(st.integers(3, 60), min_size=1, max_size=12), min_size=max_batch + 1,
                                 max_size=max_batch + 4), label="prompts")
    max_new = data.draw(st.integers(1, 14), label="max_new")
    refill = data.draw(st.one_of(st.none(), st.integers(1, max_batch)), label="refill_rows")
    engine = _engine(target, kind, graphs, lag)
    out = engine.generate(prompts, max_new, max_batch=max_batch, refill_rows=refill)
    assert out.tokens == [alone(p, max_new) for p in prompts]
    assert out.row_cycles == out.cycles * engine.runner.padded_batch(max_batch), "the batch's rows, not the queue's"
    assert out.stop_reasons == ["eos" if t and t[-1] in EOS else "length" for t in out.tokens]
    assert out.prompt_tokens == sum(map(len, prompts))
    assert out.prefill_rows[0] == max_batch and sum(out.prefill_rows) == len(prompts)
    assert all(len(cycle) <= max_batch for cycle in out.accept_lens), "never more rows than max_batch"


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_rows_refill_as_requests_end(target, alone, kind):
    """Seven prompts of very different lengths and budgets through two rows, graphs emulated, the stop check a
    step late: every request's tokens as alone; one prefill event for the first two, at most one per refill after;
    fewer steps than two-at-a-time batches that wait for their longest row; drafts accepted (the path moved)."""
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10], [11, 12, 13, 11, 12, 13, 11, 12], [3, 4], list(range(20, 31)), [8],
               [8, 9, 10, 11]]
    seen = CycleCollector()
    out = _engine(target, kind, True, 1, seen).generate(prompts, 24, max_batch=2, warm_up=3)
    assert out.tokens == [alone(p, 24) for p in prompts]
    kinds = [c.kind for c in seen.cycles]
    assert kinds[0] == "prefill" and 1 < kinds.count("prefill") <= 1 + len(prompts) - 2  # rows ending together: one
    assert all(c.active_rows <= 2 for c in seen.cycles)
    batched = sum(max(len(alone(p, 24)) for p in prompts[i: i + 2]) for i in range(0, len(prompts), 2))
    assert out.cycles < batched
    if kind == "eagle3":
        assert any(a > 1 for cycle in out.accept_lens for a in cycle), "a draft token accepted"


@pytest.mark.parametrize("buckets, prefills", [((1, 2, 4), 3), ((1, 4), 5), ((4,), 5)], ids=["every", "no-2", "no-1"])
def test_rows_that_end_together_start_their_next_prompts_together(target, buckets, prefills):
    """No EOS, so every row of a plain batch ends at the same step: the next prompts are prefilled as one batch
    when a graph bucket fits the free rows exactly (2 rows: bucket 2), one by one when the bucket of 2 is
    missing (bucket 4 would write rows that hold running requests), and eagerly, said, with no bucket of 1."""
    prompts = [[5, 6, 7], [9, 10, 11, 12], [13], [14, 15], [16, 17, 18, 19, 20], [21, 22]]
    spec = SpecConfig(cuda_graphs=True)
    runner = EmulatedRunner.for_engine(target, spec, None, max_len=64, buckets=buckets)
    seen = CycleCollector()
    out = Engine(target, spec=spec, runner=runner, stop_lag=1, observer=seen).generate(prompts, 5, max_batch=2)
    assert out.tokens == [Engine(target).generate([p], 5).tokens[0] for p in prompts]
    assert sum(c.kind == "prefill" for c in seen.cycles) == len(out.prefill_rows) == prefills
    assert sum(out.prefill_rows) == len(prompts)
    eager = {reason for (phase, reason) in runner.fallbacks if phase == "prefill"}
    assert bool(eager) == (buckets == (4,)), eager


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
@pytest.mark.parametrize("refill", [None, 1, 2, 4])
def test_free_rows_wait_for_each_other_to_share_a_prefill(target, kind, refill):
    """Ten prompts through four rows (two EOS tokens this model emits, so rows end apart; graphs emulated, buckets 1, 2,
    4; the stop check a step late): every request's tokens as alone, whatever the rows wait for. Waiting for all
    four rows (a refill only when none is live) prefills the queue four at a time, as batches would; waiting for
    two never prefills one prompt alone but the queue's last; the default (B // 4) at four rows and 1 refill as
    soon as any row is free, so one-prompt prefills happen."""
    from eaglelab.engine.runtime.serving import refill_rows

    assert [refill_rows(b) for b in (1, 3, 4, 8, 32)] == [1, 1, 1, 2, 8]
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10], [11, 12, 13, 11, 12, 13, 11, 12], [3, 4], list(range(20, 31)), [8],
               [8, 9, 10, 11], [40, 41, 42], [50], [51, 52, 53, 54, 55]]
    max_new, eos = 20, (2, 69)
    out = _engine(target, kind, True, 1, eos=eos).generate(prompts, max_new, max_batch=4, refill_rows=refill)
    assert out.tokens == [Engine(target, eos_token_ids=eos).generate([p], max_new).tokens[0] for p in prompts]
    ends = sorted({len(t) for t in out.tokens})
    assert len(ends) > 3, f"rows must end apart for this test to mean anything: {ends}"
    rows = out.prefill_rows
    assert rows[0] == 4 and sum(rows) == len(prompts)
    if refill == 4:
        assert rows == [4, 4, 2]
    elif refill == 2:
        assert all(k >= 2 for k in rows[1:-1]), rows
    else:
        assert 1 in rows[1:-1], rows


def test_serving_refuses_what_it_cannot_do(target):
    engine = _engine(target, "plain", False, 0)
    with pytest.raises(ValueError, match="at least one row"):
        engine.generate([[3], [4]], 4, max_batch=0)
    with pytest.raises(ValueError, match=r"must be 1\.\.2"):
        engine.generate([[3], [4], [5]], 4, max_batch=2, refill_rows=3)
    with pytest.raises(ValueError, match=r"must be 1\.\.4"):  # said even when the prompts fit the rows
        engine.generate([[3], [4]], 4, max_batch=4, refill_rows=0)
    with pytest.raises(ValueError, match="no max_batch"):
        engine.generate([[3], [4]], 4, refill_rows=1)
    with pytest.raises(ValueError, match="stream one batch"):
        engine.generate([[3], [4]], 4, max_batch=1, stream=lambda row, toks: None)

    from types import SimpleNamespace

    from eaglelab.engine.runtime import serving

    with pytest.raises(ValueError, match="tensor parallelism"):  # each rank would move and refill alone
        serving.check(SimpleNamespace(target=SimpleNamespace(tp=object()), drafter=None), 2, None)

    class Fixed(NgramDrafter):  # a drafter written before continuous batching: no refill, no move_row
        refill = move_row = None

    spec = SpecConfig("ngram", num_steps=2, topk=1)
    fixed = Engine(target, eos_token_ids=EOS, drafter=Fixed(spec), spec=spec)
    assert fixed.generate([[3], [4]], 4, max_batch=2).tokens  # as many rows as prompts: one batch, no refill
    with pytest.raises(ValueError, match="cannot take a new prompt"):
        fixed.generate([[3], [4]], 4, max_batch=1)


def test_row_moves_and_starts():
    """The row operations continuous batching is made of, on a small state and cache."""
    cache = KVCache(2, 3, 1, 5, 2, dtype=torch.float32, device="cpu")
    cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).view_as(cache.k))
    cache.v.copy_(-cache.k)
    before = cache.k.clone()
    cache.copy_row(0, 2)
    assert torch.equal(cache.k[:, 2], before[:, 0]) and torch.equal(cache.v[:, 2], -before[:, 0])
    assert torch.equal(cache.k[:, :2], before[:, :2]), "other rows untouched"

    state = loop_state(torch.tensor([4, 2, 6]), torch.tensor([11, 12, 13]), slots=6, max_new=3)
    state["n_out"] += torch.tensor([1, 3, 2])
    state["done"][1] = True
    move_row(state, 0, 1)
    assert state["lengths"].tolist() == [4, 4, 6] and state["root"].tolist() == [11, 11, 13]
    assert state["n_out"].tolist() == [1, 1, 2] and state["done"].tolist() == [False, False, False]
    start_rows(state, torch.tensor([9]), torch.tensor([42]), max_new=3, eos=torch.tensor([7]))
    assert state["lengths"].tolist() == [9, 4, 6] and state["root"].tolist() == [42, 11, 13]
    assert state["out"][0].tolist() == [42, -1, -1, -1, -1, -1] and state["n_out"].tolist() == [1, 1, 2]
    assert state["done"].tolist() == [False, False, False]
    move_row(state, 0, 2)
    start_rows(state, torch.tensor([1, 5]), torch.tensor([7, 30]), max_new=3, eos=torch.tensor([7]))  # row 0: an EOS
    assert state["lengths"].tolist() == [1, 5, 9] and state["root"].tolist() == [7, 30, 42]
    assert state["done"].tolist() == [True, False, False] and state["hit_eos"].tolist() == [True, False, False]
    assert state["n_out"].tolist() == [1, 1, 1] and state["out"][1, :2].tolist() == [30, -1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_served_on_cuda_graphs_gets_the_eager_tokens(kind):
    """Real CUDA graphs (float32, the stop check a step late): every phase replays, prompts that start together in
    the bucket that fits them, and each request's tokens are plain greedy's of that prompt alone."""
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.reasons import REPLAY

    model = random_model(CFG, seed=21).cuda()
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10], [11, 12, 13, 11, 12, 13, 11, 12], [3, 4], list(range(20, 31)), [8]]
    if kind == "plain":
        spec, drafter = SpecConfig(cuda_graphs=True), None
    else:
        spec = SpecConfig("eagle3", num_steps=3, topk=4, num_draft_tokens=10, cuda_graphs=True)
        drafter = Eagle3Drafter(random_drafter(model, 5, draft_vocab=CFG["vocab_size"]).cuda(), spec, TAPS)
    runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=96, buckets=(1, 2, 4))
    seen = CycleCollector()
    engine = Engine(model, eos_token_ids=EOS, drafter=drafter, spec=spec, runner=runner, observer=seen)
    out = engine.generate(prompts, 16, max_batch=3, warm_up=4)
    alone = [Engine(model, eos_token_ids=EOS).generate([p], 16).tokens[0] for p in prompts]
    assert out.tokens == alone
    assert not runner._failed and not runner.fallbacks, (runner._failed, dict(runner.fallbacks))
    assert all(set(c.graph.values()) == {REPLAY} for c in seen.cycles if c.kind != "prefill")


def test_an_mla_moe_target_with_an_mla_drafter_serves_losslessly():
    """A Kimi-shaped target (latent attention: a K-only cache, one row a token; MoE layers) and the EAGLE-3 MLA
    drafter: rows moved and refilled through caches with no V buffer give each prompt's plain greedy tokens."""
    from tests.engine.model.test_eagle3_mla import TAPS as MLA_TAPS, YARN, mla_drafter, random_model as mla_model
    from tests.engine.model.test_eagle3_mla import TCFG

    target = mla_model(TCFG, seed=3)
    assert target.make_cache(1, 4, dtype=torch.float32, device="cpu").v is None
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5)
    drafter = Eagle3Drafter(mla_drafter(target.embed_tokens, rope_scaling=YARN), spec, MLA_TAPS)
    out = Engine(target, eos_token_ids=(2,), drafter=drafter, spec=spec).generate(prompts, 10, max_batch=2)
    assert out.tokens == [Engine(target, eos_token_ids=(2,)).generate([p], 10).tokens[0] for p in prompts]


def test_sampled_serving_gives_every_request_its_budget(target):
    """Sampling draws per row, so served tokens differ from a lone run's; each request still gets its own row's
    tokens: at most max_new, ending on EOS exactly when its stop reason says so, the same run twice alike."""
    from eaglelab.engine.runtime.sampling import SamplingParams

    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14], [3, 4], [20, 21, 22]]
    runs = []
    for _ in range(2):
        engine = _engine(target, "eagle3", False, 0)
        runs.append(engine.generate(prompts, 9, SamplingParams(temperature=0.9, top_p=0.95),
                                    torch.Generator().manual_seed(5), max_batch=2))
    out = runs[0]
    assert out.tokens == runs[1].tokens and len(out.tokens) == len(prompts)
    for toks, why in zip(out.tokens, out.stop_reasons):
        assert 1 <= len(toks) <= 9 and (why == "eos") == (toks[-1] in EOS) and EOS[0] not in toks[:-1]
        assert why == "eos" or len(toks) == 9
