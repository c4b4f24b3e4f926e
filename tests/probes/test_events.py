"""Events round-trip through JSON, tolerate unknown fields and types, and reject broken ones."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.observer import (
    PHASES,
    AllReduceStats,
    CycleStats,
    GraphCaptureStats,
    RunInfo,
    RunSummary,
)
from eaglelab.probes import events as ev


def _info() -> RunInfo:
    return RunInfo(
        model="smollm2-135m",
        model_digest="abc123",
        device="cpu",
        dtype="float32",
        batch_size=2,
        spec={"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        model_config={"num_hidden_layers": 30, "hidden_size": 576},
        versions={"torch": "2.13", "python": "3.12"},
        tp_size=1,
    )


def test_schema_version_is_one() -> None:
    assert ev.SCHEMA_VERSION == 1


def test_every_event_type_has_a_distinct_name() -> None:
    names = [cls.type for cls in ev.EVENT_TYPES.values()]
    assert sorted(names) == sorted(
        ["run_started", "step", "graph_captured", "allreduce", "warning", "run_finished", "phase_cost"]
    )


def test_built_from_engine_stats_round_trip_through_json_text() -> None:
    cycle = CycleStats(
        index=7,
        kind="spec",
        phase_ms={"draft": 3.0, "verify": 29.5, "accept": 0.5, "draft_extend": 2.0},
        accept_len=(3, 1),
        accepted_positions=((1, 2), ()),
        accepted_ranks=((1, 2), ()),
        path_open=(False, True),
        num_draft_tokens=4,
        verify_tokens=8,
        graph={"verify": "eager: attention mode prefill", "draft": "replay"},
        active_rows=2,
    )
    built = [
        ev.RunStarted.from_info(_info(), t=1.0),
        ev.Step.from_stats(cycle, t=2.0),
        ev.GraphCaptured.from_stats(GraphCaptureStats("decode", 4, 1.25, 1 << 20), t=3.0),
        ev.AllReduce.from_stats(AllReduceStats(5, "mlp", 4096, 0.03, 0, 2, "verify", True), t=4.0),
        ev.WarningEvent("graphs", "verify ran eagerly", t=5.0),
        ev.RunFinished.from_summary(RunSummary(10, 64, 1.6, 20, 3.2, ("eos", "length")), t=6.0),
        ev.PhaseCost("verify", 4, 12.5, tokens=8, t=7.0),
    ]
    for event in built:
        text = json.dumps(ev.to_json(event))
        back = ev.from_json(json.loads(text))
        assert back == event, event.type
    step = built[1]
    assert step.tokens == 4
    assert step.cycle_ms == pytest.approx(35.0)
    assert built[-2].tokens_per_s == pytest.approx(40.0)


def test_to_json_carries_the_type_and_lists() -> None:
    obj = ev.to_json(ev.Step(index=1, kind="decode", phase_ms={"decode": 12.0}, accept_len=(1, 1)))
    assert obj["type"] == "step"
    assert obj["accept_len"] == [1, 1]
    assert obj["graph"] == {}


def test_unknown_fields_are_ignored_and_unknown_types_give_none() -> None:
    obj = {"type": "warning", "source": "x", "message": "y", "t": 1.0, "added_in_v2": [1, 2]}
    assert ev.from_json(obj) == ev.WarningEvent("x", "y", 1.0)
    assert ev.from_json({"type": "from_the_future", "a": 1}) is None
    assert ev.from_json({"no_type": True}) is None


def test_missing_defaulted_fields_take_their_defaults() -> None:
    back = ev.from_json({"type": "step", "index": 3, "kind": "decode", "phase_ms": {"decode": 1}})
    assert back == ev.Step(index=3, kind="decode", phase_ms={"decode": 1.0})


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "step", "kind": "decode", "phase_ms": {}},  # index missing
        {"type": "step", "index": "three", "kind": "decode", "phase_ms": {}},
        {"type": "step", "index": 1, "kind": "decode", "phase_ms": {}, "accept_len": [1.5]},
        {"type": "allreduce", "layer": 1, "site": "mlp", "nbytes": 1, "ms": 0.1, "rank": 0,
         "world_size": 2, "phase": "decode", "in_graph": "yes"},
        [1, 2, 3],
    ],
)
def test_broken_known_events_raise_decode_error(obj: object) -> None:
    with pytest.raises(ev.EventDecodeError):
        ev.from_json(obj)  # type: ignore[arg-type]


_rows = st.integers(min_value=0, max_value=4)


@st.composite
def _steps(draw: st.DrawFn) -> ev.Step:
    n = draw(_rows)
    phases = draw(st.lists(st.sampled_from(PHASES), unique=True, max_size=4))
    return ev.Step(
        index=draw(st.integers(0, 10**6)),
        kind=draw(st.sampled_from(["prefill", "decode", "spec"])),
        phase_ms={p: draw(st.floats(0, 1e4, allow_nan=False)) for p in phases},
        accept_len=tuple(draw(st.integers(0, 9)) for _ in range(n)),
        accepted_positions=tuple(
            tuple(draw(st.lists(st.integers(1, 60), max_size=6))) for _ in range(n)
        ),
        num_draft_tokens=draw(st.integers(0, 64)),
        verify_tokens=draw(st.integers(0, 512)),
        graph={p: draw(st.sampled_from(["replay", "eager: batch 9 > largest bucket 8"])) for p in phases},
        active_rows=n,
        t=draw(st.floats(0, 2e9, allow_nan=False)),
    )


@settings(max_examples=60, deadline=None)
@given(_steps())
def test_any_step_survives_a_json_round_trip(step: ev.Step) -> None:
    assert ev.from_json(json.loads(json.dumps(ev.to_json(step)))) == step
