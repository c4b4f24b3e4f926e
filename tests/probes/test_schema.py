"""One event schema: every recorded event is the engine's stats object plus a time, field for field.

The structural test pins that each event class extends its engine stats class and adds only ``t``;
the run test records a real (tiny, CPU) speculative run and compares every line read back from the
record with the stats object the engine handed its observer: a field the record drops, renames or
mistypes fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.observer import (
    AllReduceStats,
    CycleStats,
    GraphCaptureStats,
    RunInfo,
    RunSummary,
)
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA, SOURCE_RUNNER, eager_warning
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.probes import events as ev
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.record import RecordWriter, read_record
from tests.engine.runtime.test_speculative import CFG, TAPS, random_drafter
from tests.conftest import random_model

PAIRS = [
    (RunInfo, ev.RunStarted),
    (CycleStats, ev.Step),
    (GraphCaptureStats, ev.GraphCaptured),
    (AllReduceStats, ev.AllReduce),
    (RunSummary, ev.RunFinished),
]


def _signature(cls: type) -> list[tuple[str, str, object]]:
    return [(f.name, str(f.type), f.default) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("stats_cls, event_cls", PAIRS, ids=[e.type for _, e in PAIRS])
def test_each_event_is_its_engine_stats_plus_a_time(stats_cls, event_cls):
    assert issubclass(event_cls, stats_cls)
    assert _signature(event_cls) == _signature(stats_cls) + [("t", "float", 0.0)]


def test_every_event_type_is_an_engine_stats_type_or_the_warning():
    """PhaseCost is the one other: a cost `eaglelab tune` measured, which no engine stats object carries."""
    assert set(ev.EVENT_TYPES.values()) == {e for _, e in PAIRS} | {ev.WarningEvent, ev.PhaseCost}


class Tap:
    """An observer keeping what the engine sent, as it sent it, and passing it on to a bus."""

    def __init__(self, bus: ProbeBus) -> None:
        self.bus, self.sent = bus, []

    def on_run_start(self, info):
        self.sent.append(info)
        self.bus.on_run_start(info)

    def on_cycle(self, stats):
        self.sent.append(stats)
        self.bus.on_cycle(stats)

    def on_graph_captured(self, stats):
        self.sent.append(stats)
        self.bus.on_graph_captured(stats)

    def on_allreduce(self, stats):
        self.sent.append(stats)
        self.bus.on_allreduce(stats)

    def on_warning(self, source, message):
        self.sent.append((source, message))
        self.bus.on_warning(source, message)

    def on_run_end(self, summary):
        self.sent.append(summary)
        self.bus.on_run_end(summary)


def _as_sent(event: ev.Event) -> object:
    """What the engine would have sent for ``event``: its stats object, or (source, message)."""
    if isinstance(event, ev.WarningEvent):
        return (event.source, event.message)
    stats_cls = next(s for s, e in PAIRS if isinstance(event, e))
    values = {f.name: getattr(event, f.name) for f in dataclasses.fields(stats_cls)}
    return stats_cls(**values)


def test_a_recorded_run_reads_back_as_exactly_what_the_engine_sent(tmp_path: Path):
    """A tiny EAGLE-3 run on CPU with CUDA graphs asked for (so the engine warns that every
    forward runs eagerly): the record holds one line per hook call, equal field for field."""
    target = random_model(CFG, seed=3)
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6, cuda_graphs=True)
    drafter = Eagle3Drafter(random_drafter(target, seed=4), spec, TAPS)
    bus = ProbeBus()
    writer = RecordWriter(tmp_path / "run.jsonl")
    bus.subscribe(writer)
    tap = Tap(bus)
    Engine(target, drafter=drafter, spec=spec, observer=tap, run_info={"model": "tiny"}).generate(
        [[5, 6, 7, 8], [9, 10]], 6)
    writer.close()

    read = read_record(tmp_path / "run.jsonl")
    assert read.skipped_lines == 0
    assert [_as_sent(e) for e in read.events] == tap.sent
    warnings = [s for s in tap.sent if isinstance(s, tuple)]
    assert (SOURCE_RUNNER, eager_warning("verify", EAGER_NO_CUDA)) in warnings
    assert len(warnings) == len(set(warnings))  # once per run each
    kinds = [type(s).__name__ for s in tap.sent if not isinstance(s, tuple)]
    assert kinds[0] == "RunInfo" and kinds[-1] == "RunSummary" and "CycleStats" in kinds
