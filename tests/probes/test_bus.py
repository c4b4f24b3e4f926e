"""ProbeBus: the engine's observer; builds events only for subscribers; totals by hand."""

from __future__ import annotations

import pytest

from eaglelab.engine.runtime.observer import (
    AllReduceStats,
    CycleStats,
    GraphCaptureStats,
    Observer,
    RunInfo,
    RunSummary,
)
from eaglelab.probes import events as ev
from eaglelab.probes.bus import ProbeBus, RunTotals

INFO = RunInfo("m", "d", "cpu", "float32", 1, {"algorithm": "eagle3"}, {}, {"torch": "2"})


def _drive(bus: ProbeBus) -> None:
    bus.on_run_start(INFO)
    bus.on_graph_captured(GraphCaptureStats("verify", 1, 0.5, 1000))
    bus.on_cycle(CycleStats(0, "prefill", {"prefill": 40.0}, accept_len=(1,)))
    bus.on_cycle(
        CycleStats(1, "spec", {"draft": 3.0, "verify": 30.0, "accept": 1.0}, accept_len=(3,),
                   num_draft_tokens=4, graph={"verify": "eager: attention mode prefill", "draft": "replay"})
    )
    bus.on_cycle(
        CycleStats(2, "spec", {"draft": 3.0, "verify": 10.0, "accept": 1.0}, accept_len=(2,),
                   num_draft_tokens=4, graph={"verify": "replay", "draft": "replay"})
    )
    bus.on_allreduce(AllReduceStats(0, "mlp", 100, 0.25, 0, 2, "verify"))
    bus.on_allreduce(AllReduceStats(0, "mlp", 100, 0.75, 0, 2, "verify"))
    bus.on_warning("graphs", "verify eager")
    bus.on_run_end(RunSummary(5, 6, 0.1, 2, 2.5))


def test_bus_is_an_engine_observer() -> None:
    assert isinstance(ProbeBus(), Observer)


def test_no_subscriber_builds_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("an event was built without a subscriber")

    for cls in (ev.RunStarted, ev.Step, ev.GraphCaptured, ev.AllReduce, ev.RunFinished):
        for name in ("from_info", "from_stats", "from_summary"):
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, boom)
    monkeypatch.setattr("eaglelab.probes.bus.WarningEvent", boom)
    bus = ProbeBus()
    _drive(bus)
    assert bus.totals is not None and bus.totals.cycles == 2


def test_subscribers_get_every_event_in_order_and_can_leave() -> None:
    got: list[ev.Event] = []
    bus = ProbeBus(clock=lambda: 123.0)
    leave = bus.subscribe(got.append)
    _drive(bus)
    assert [e.type for e in got] == [
        "run_started", "graph_captured", "step", "step", "step",
        "allreduce", "allreduce", "warning", "run_finished",
    ]
    assert all(e.t == 123.0 for e in got)
    leave()
    assert not bus.has_subscribers
    bus.on_warning("x", "y")
    assert len(got) == 9


def test_totals_by_hand() -> None:
    bus = ProbeBus()
    _drive(bus)
    t = bus.totals
    assert t is not None
    assert t.cycles_by_kind == {"prefill": 1, "spec": 2}
    assert t.mean_accept_len == pytest.approx(2.5)
    assert t.mean_phase_ms("verify") == pytest.approx(20.0)
    assert t.mean_phase_ms("prefill", kind="spec") is None
    assert t.replay_fraction == pytest.approx(0.5)
    assert t.graph_replays == {"draft": 2, "verify": 1}
    assert t.eager_reasons == {"verify: attention mode prefill": 1}
    assert t.allreduce[(0, "mlp", "verify")] == [2, pytest.approx(1.0), 200]
    assert t.generated_tokens == 6 and t.tokens_per_s == pytest.approx(60.0)
    assert t.busy_ms == pytest.approx(40 + 34 + 14)
    assert t.warnings == [("graphs", "verify eager")]


def test_totals_from_events_equal_totals_from_stats() -> None:
    got: list[ev.Event] = []
    bus = ProbeBus()
    bus.subscribe(got.append)
    _drive(bus)
    replayed = RunTotals()
    for event in got:
        replayed.observe_event(ev.from_json(ev.to_json(event)))  # type: ignore[arg-type]
    live = bus.totals
    assert live is not None
    assert replayed.cycles_by_kind == live.cycles_by_kind
    assert replayed.phase_ms_sum == live.phase_ms_sum
    assert replayed.mean_accept_len == live.mean_accept_len
    assert replayed.replay_fraction == live.replay_fraction
    assert replayed.allreduce == live.allreduce


def test_aggregate_off_keeps_no_totals_and_close_reaches_sinks() -> None:
    closed: list[bool] = []

    class Sink:
        def __call__(self, event: ev.Event) -> None:
            pass

        def close(self) -> None:
            closed.append(True)

    bus = ProbeBus(aggregate=False)
    bus.subscribe(Sink())
    _drive(bus)
    bus.close()
    assert bus.totals is None and closed == [True]


def test_a_baseline_run_on_the_same_bus_only_lends_its_decode_cost():
    """The plain baseline `eaglelab run` sends to the run's bus: its steps, warnings and totals go to
    ``totals.baseline``; the run's decode cost comes from it; the run's own figures do not move."""
    import dataclasses

    bus = ProbeBus()
    _drive(bus)
    before = (bus.totals.generated_tokens, bus.totals.cycles, bus.totals.seconds, list(bus.totals.warnings))
    assert bus.totals.decode_ms is None
    bus.on_run_start(dataclasses.replace(INFO, spec={"algorithm": "none"}, baseline=True))
    for i, ms in enumerate((10.0, 14.0)):
        bus.on_cycle(CycleStats(i + 1, "decode", {"decode": ms}, accept_len=(1,)))
    bus.on_warning("runner", "the baseline's")
    bus.on_run_end(RunSummary(3, 2, 0.03, 2, None))
    t = bus.totals
    assert (t.generated_tokens, t.cycles, t.seconds, t.warnings) == before
    assert t.decode_ms == pytest.approx(12.0) and not t.in_baseline
    assert t.baseline is not None and t.baseline.warnings == [("runner", "the baseline's")]
    assert t.observe_event(ev.Step(9, "decode", {"decode": 1.0})) is True


def test_set_up_inside_a_cycle_stays_out_of_the_phase_means() -> None:
    """A GPU run's first prefill and first cycle hold a lazy capture and a compile (seconds): the summary's
    "prefill ms (mean)" read 28,435 ms and the economics line "186 ms per plain decode" before."""
    t = RunTotals()
    t.observe_cycle(CycleStats(0, "prefill", {"prefill": 2004.0}, accept_len=(1,), setup_ms=2000.0))
    t.observe_cycle(CycleStats(1, "decode", {"decode": 900.0}, accept_len=(1,), setup_ms=899.5))
    t.observe_cycle(CycleStats(2, "decode", {"decode": 0.5}, accept_len=(1,)))
    t.observe_cycle(CycleStats(3, "spec", {"draft": 500.0, "verify": 700.0}, accept_len=(3,), setup_ms=1199.0))
    t.observe_cycle(CycleStats(4, "spec", {"draft": 0.3, "verify": 1.0}, accept_len=(3,)))
    assert t.mean_phase_ms("prefill") == pytest.approx(4.0)  # one phase: the set-up comes off it
    assert t.decode_ms == pytest.approx(0.5)  # the compile's step keeps 0.5 ms alone: the mean reads (0.5 + 0.5) / 2
    assert t.mean_phase_ms("verify") == pytest.approx(1.0) and t.mean_phase_ms("draft") == pytest.approx(0.3)
    assert t.cycles_by_kind == {"prefill": 1, "decode": 2, "spec": 2}  # counted, only their times left out
