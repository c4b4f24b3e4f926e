"""Sinks: the console summary's figures and the TensorBoard scalars, read back from the event file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from eaglelab.engine.runtime.observer import CycleStats, RunInfo, RunSummary
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.sinks import ConsoleSummary, TensorBoardSink

INFO = RunInfo("tiny", "d", "cpu", "float32", 1, {"algorithm": "eagle3", "attention_mode": "decode"}, {}, {})


def _drive(bus: ProbeBus) -> None:
    bus.on_run_start(INFO)
    bus.on_cycle(CycleStats(0, "prefill", {"prefill": 40.0}, accept_len=(1,)))
    bus.on_cycle(CycleStats(1, "decode", {"decode": 10.0}, accept_len=(1,), graph={"decode": "replay"}))
    bus.on_cycle(CycleStats(2, "spec", {"draft": 2.0, "verify": 12.0, "accept": 1.0}, accept_len=(4,),
                            num_draft_tokens=6, graph={"verify": "replay"}))
    bus.on_cycle(CycleStats(3, "spec", {"draft": 2.0, "verify": 12.0, "accept": 1.0}, accept_len=(2,),
                            num_draft_tokens=6, graph={"verify": "eager: batch 9 > largest bucket 8"}))
    bus.on_run_end(RunSummary(5, 8, 0.1, 3, 3.0))


def test_console_summary_prints_figures_and_verdict_at_the_end() -> None:
    from rich.console import Console

    out = io.StringIO()
    summary = ConsoleSummary(Console(file=out, width=200, color_system=None))
    bus = ProbeBus()
    bus.subscribe(summary)
    _drive(bus)
    text = out.getvalue()
    assert "tokens generated" in text and " 8 " in text
    assert "80.0" in text  # 8 tokens / 0.1 s
    assert "3.00" in text  # mean accepted length (4 + 2) / 2
    assert "ms per phase (mean)" in text and "verify 12.00" in text
    assert "67%" in text  # 2 of 3 decode/spec steps replayed
    # decode 10 ms, cycle 15 ms, accept 3: 30 / 15 = 2.00x
    assert "speculation pays: 2.00x predicted" in text
    assert "verify ran eagerly in 1 of 3 steps: batch 9 > largest bucket 8" in text


def test_tensorboard_sink_writes_the_expected_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    bus = ProbeBus()
    bus.subscribe(sink)
    _drive(bus)
    bus.close()
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "accept_len/mean", "accept_len/step", "throughput/tok_s", "graph/replay_fraction",
        "phase_ms/prefill", "phase_ms/decode", "phase_ms/draft", "phase_ms/verify", "phase_ms/accept",
        "run/tok_s",
    }
    assert expected <= tags

    def values(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    assert values("accept_len/mean") == [(2, 4.0), (3, pytest.approx(3.0))]
    assert values("accept_len/step") == [(2, 4.0), (3, 2.0)]
    assert values("throughput/tok_s") == [(1, pytest.approx(100.0)), (2, pytest.approx(4000 / 15)),
                                          (3, pytest.approx(2000 / 15))]
    assert values("graph/replay_fraction") == [(1, 1.0), (2, 1.0), (3, pytest.approx(2 / 3))]
    assert values("phase_ms/verify") == [(2, 12.0), (3, 12.0)]
    assert values("run/tok_s") == [(3, pytest.approx(80.0))]


def test_probe_rows_leave_the_graph_share_out_where_no_graphs_ran() -> None:
    """`eaglelab run` folds these into its one summary: on a CPU (no graphs) no replay share is shown."""
    summary = ConsoleSummary(print_on_finish=False)
    bus = ProbeBus()
    bus.subscribe(summary)
    _drive(bus)
    labels = [label for label, _ in summary.probe_rows(graphs=False)]
    assert labels == ["accept rate", "ms per phase (mean)"]
    assert dict(summary.probe_rows(graphs=True))["CUDA-graph replay share"] == "67%"
