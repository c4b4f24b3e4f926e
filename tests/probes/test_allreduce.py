"""The all-reduce probe: pairing calls across ranks (min = transfer, spread = skew), and a real
2-rank gloo run counting two all-reduces per layer with the right byte counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglelab.probes.allreduce import AllReduceProbe, summarize
from eaglelab.probes.events import AllReduce


def ev(rank, layer, site, ms, nbytes=256, phase="decode", in_graph=False):
    return AllReduce(layer=layer, site=site, nbytes=nbytes, ms=ms, rank=rank, world_size=2, phase=phase,
                     in_graph=in_graph)


def test_min_over_ranks_is_transfer_and_spread_is_skew():
    """Two calls of layer 0 attn on 2 ranks: (1.0, 3.0) and (2.5, 0.5) ms -> transfer 0.75, skew 2.0."""
    events = [ev(0, 0, "attn", 1.0), ev(0, 0, "attn", 2.5), ev(1, 0, "attn", 3.0), ev(1, 0, "attn", 0.5)]
    s = summarize(events)
    assert s.ranks == (0, 1) and s.matched_calls == 2 and s.unmatched_calls == 0
    (site,) = s.sites
    assert (site.layer, site.site, site.calls, site.nbytes) == (0, "attn", 2, 256)
    assert site.transfer_ms == pytest.approx((1.0 + 0.5) / 2)
    assert site.skew_ms == pytest.approx((2.0 + 2.0) / 2)
    assert site.max_ms == pytest.approx((3.0 + 2.5) / 2)
    assert site.bus_gbps == pytest.approx(256 / 0.75 / 1e6)
    assert s.totals() == pytest.approx((1.5, 4.0))


def test_calls_pair_by_order_and_mismatches_are_not_averaged():
    """Rank 1 is missing its last call and disagrees on the second: only the first call pairs."""
    events = [ev(0, 0, "attn", 1.0), ev(0, 0, "mlp", 1.0), ev(0, 1, "attn", 1.0),
              ev(1, 0, "attn", 2.0), ev(1, 1, "attn", 2.0)]
    s = summarize(events)
    assert s.matched_calls == 1
    assert s.unmatched_calls == 3  # 5 events, 2 paired
    assert [(x.layer, x.site) for x in s.sites] == [(0, "attn")]


def test_per_layer_splits_sites_and_phases():
    events = []
    for rank, extra in ((0, 0.0), (1, 0.4)):
        events += [ev(rank, 0, "attn", 1.0 + extra, phase="prefill"), ev(rank, 0, "moe", 2.0 + extra, phase="prefill"),
                   ev(rank, 0, "attn", 0.1 + extra), ev(rank, 0, "moe", 0.2 + extra, in_graph=True)]
    s = summarize(events)
    assert s.per_layer("decode") == {0: {"attn": pytest.approx((0.1, 0.4)), "moe": pytest.approx((0.2, 0.4))}}
    assert s.per_layer()[0]["attn"] == pytest.approx(((1.0 + 0.1) / 2, 0.4))
    assert s.calls_per_layer("prefill") == {0: 2}
    assert {x.in_graph for x in s.sites if x.site == "moe" and x.phase == "decode"} == {True}
    assert summarize([]).sites == ()


def test_probe_keeps_only_allreduce_events_and_publishes_peers():
    probe = AllReduceProbe()
    probe("not an event")
    probe(ev(0, 0, "attn", 1.0))
    assert len(probe.events) == 1
    sent = []
    n = probe.publish_peers(sent.append, [ev(0, 0, "attn", 1.0), ev(1, 0, "attn", 2.0)], own_rank=0)
    assert n == 1 and sent[0].rank == 1


# ---- a real run on 2 gloo ranks ----------------------------------------------------------------

def _probe_run(tp, record: str, model_name: str):
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.probes.bus import ProbeBus
    from eaglelab.probes.record import RecordWriter
    from tests.engine.model.test_tp import DENSE, MOE, PROMPTS, build, random_drafter

    model = build(DENSE if model_name == "dense" else MOE, tp)
    bus, probe = ProbeBus(), AllReduceProbe()
    bus.subscribe(probe)
    writer = RecordWriter(record) if tp.rank == 0 else None
    if writer is not None:
        bus.subscribe(writer)
    drafter = random_drafter(model)
    engine = Engine(model, drafter=drafter, spec=drafter.spec, observer=bus)
    with tp.guard("generate"):
        engine.generate(PROMPTS, 4)
        events = probe.gather(tp)
    if writer is not None:
        probe.publish_peers(bus, events, own_rank=tp.rank)
        writer.close()
    return [(e.rank, e.layer, e.site, e.phase, e.nbytes, e.ms) for e in events]


@pytest.fixture(scope="module", params=["dense", "moe"])
def run(request, tmp_path_factory):
    from tests.tp_harness import RankFailure, spawn_ranks

    record = tmp_path_factory.mktemp("rec") / f"{request.param}.jsonl"
    results = spawn_ranks(_probe_run, 2, str(record), request.param)
    for r in results:
        assert not isinstance(r, RankFailure), r
    return request.param, results, record


def test_two_allreduces_per_layer_with_byte_counts(run):
    """Every target forward: attn + mlp/moe per layer (3 layers), B*T*H*4 bytes each, and the head's
    all-gather (B*T*V_pad*4); the embedding is replicated (no collective) and the replicated drafter
    runs none."""
    name, results, _ = run
    events = results[0]
    assert results[0] == results[1]  # every rank has every rank's events
    rank0 = [e for e in events if e[0] == 0]
    rank1 = [e for e in events if e[0] == 1]
    assert [e[1:5] for e in rank0] == [e[1:5] for e in rank1]  # same calls, same order
    H, B = 32, 2
    prefill = [e for e in rank0 if e[3] == "prefill"]
    T = 8  # longest prompt
    for layer in range(3):
        sites = [(e[2], e[4]) for e in prefill if e[1] == layer]
        second = "moe" if name == "moe" and layer >= 1 else "mlp"
        assert sites == [("attn", B * T * H * 4), (second, B * T * H * 4)]
    assert [e for e in rank0 if e[1] == -1 or e[2] == "embed"] == []
    assert [(e[2], e[4]) for e in prefill if e[1] == 3] == [("head", B * 102 * 4)]  # 101 -> 2 x 51 rows
    verify = [e for e in rank0 if e[3] == "verify"]
    assert verify, "no verify forward was timed"
    n_verify = sum(1 for e in verify if e[2] == "head")
    for layer in range(3):
        assert sum(1 for e in verify if e[1] == layer) == 2 * n_verify
    N = 6  # draft tokens per verify
    assert {e[4] for e in verify if e[1] in (0, 1, 2)} == {B * N * H * 4}
    assert {e[4] for e in verify if e[2] == "head"} == {B * N * 102 * 4}
    drafted = [e for e in rank0 if e[3] in ("draft", "draft_extend")]
    assert n_verify > 0 and drafted == []  # the replicated drafter: no collective in draft or extend
    assert all(e[5] >= 0 for e in events)


def test_record_holds_both_ranks_and_summarizes(run):
    """The record written by rank 0 holds both ranks' events; summarize pairs every call."""
    from eaglelab.probes.record import read_record

    _, results, record = run
    events = [e for e in read_record(Path(record)).events if isinstance(e, AllReduce)]
    assert len(events) == len(results[0])
    s = summarize(events)
    assert s.ranks == (0, 1) and s.unmatched_calls == 0 and s.matched_calls == len(events) // 2
    per_layer = s.calls_per_layer("prefill")
    assert per_layer[0] == per_layer[1] == per_layer[2] == 2
    assert all(x.transfer_ms <= x.max_ms and x.skew_ms >= 0 for x in s.sites)
