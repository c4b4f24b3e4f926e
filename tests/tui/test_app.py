"""The Textual app driven headless (``App.run_test``): a record replayed, followed, paused,
restarted, a live run's output, and the `eaglelab tui` argument handling."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from rich.console import Console

from eaglelab.probes.events import EAGER_EXTEND, AllReduce, Step, eager_warning
from eaglelab.probes.record import RecordWriter
from eaglelab.tui import fmt
from eaglelab.tui.app import EagleLabApp
from eaglelab.tui.feeds import LiveRun, ReplayFeed
from eaglelab.tui.synthetic import synthetic_run, write_synthetic_record
from eaglelab.tui.w_allreduce import AllReduceTable
from eaglelab.tui.w_cycle import CycleBreakdown
from eaglelab.tui.w_graphs import GraphStatus
from eaglelab.tui.w_histogram import AcceptHistogram
from eaglelab.tui.w_metric import MetricCard
from eaglelab.tui.w_output import RunOutput
from eaglelab.tui.w_warnings import WarningLog

SIZE = (140, 44)
KNOBS: dict[str, Any] = dict(cycles=60, tp_size=2, layers=3, verify_mode="prefill", seed=7)


def drive(app: EagleLabApp, script: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``script(pilot)`` against the app headless."""

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await script(pilot)

    asyncio.run(main())


async def wait_for(pilot: Any, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


def plain(renderable: Any, width: int = 120) -> str:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def test_replay_shows_the_records_numbers(tmp_path: Path) -> None:
    """Cards, histogram, breakdown, graph table and all-reduce rows show what the events say."""
    path = write_synthetic_record(tmp_path / "run.jsonl", **KNOBS)
    events = synthetic_run(**KNOBS)
    spec = [e for e in events if isinstance(e, Step) and e.kind == "spec"]
    rows = [a for e in spec for a in e.accept_len]
    mean_accept = sum(rows) / len(rows)
    mean_verify = sum(e.phase_ms["verify"] for e in spec) / len(spec)
    reduces = [e for e in events if isinstance(e, AllReduce)]
    app = EagleLabApp(record=path)

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.view.finished)
        await pilot.pause(0.15)
        assert app.query_one("#acceptance", MetricCard).value_text == f"{mean_accept:.2f} tokens / verify"
        tput = app.query_one("#throughput", MetricCard)
        assert tput.detail_text.endswith(f"{sum(e.tokens for e in events if isinstance(e, Step))} tokens")
        hist = plain(AcceptHistogram.renderable_for(app.view, 60))
        for a in range(1, 5):
            assert any(line.split()[:1] == [str(a)] and f" {rows.count(a)} " in line for line in hist.splitlines())
        cycle = plain(CycleBreakdown.renderable_for(app.view, 80))
        assert f"{mean_verify:.2f} ms" in cycle
        assert "verify = 2.4" in cycle  # an eager extend verify costs ~2.4 decodes
        graphs = plain(app.query_one(GraphStatus).renderable_for(app.view))
        verify_line = next(line for line in graphs.splitlines() if line.strip().startswith("verify"))
        assert verify_line.split()[1:4] == ["eager", "0", str(len(spec))]
        assert f"verify {EAGER_EXTEND} ({len(spec)})" in graphs
        table = app.query_one(AllReduceTable)
        assert table.row_count == 3 * 2
        first = [r for r in reduces if r.layer == 0 and r.site == "attn"]
        assert table.get_row_at(0)[:3] == [0, "attn", len(first)]
        assert table.get_row_at(0)[4] == f"{sum(r.ms for r in first):.2f}"
        assert any(eager_warning("verify", EAGER_EXTEND) in line for line in app.query_one(WarningLog).lines_text)
        shot = app.save_screenshot("replay.svg", str(tmp_path))
        svg = Path(shot).read_text()
        assert "accept&#160;length&#160;per&#160;verify" in svg or "accept length per verify" in svg

    drive(app, script)
    assert (tmp_path / "replay.svg").stat().st_size > 10_000


def test_follow_pause_and_resume(tmp_path: Path) -> None:
    """Following a growing record: paused, new lines wait; resumed, they show."""
    events = synthetic_run(**KNOBS)
    path = tmp_path / "live.jsonl"
    writer = RecordWriter(path)
    half = len(events) // 2
    for e in events[:half]:
        writer.write(e)
    app = EagleLabApp(record=path, follow=True)

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.view.events == half)
        await pilot.press("p")
        assert app.paused
        for e in events[half:]:
            writer.write(e)
        writer.close()
        await pilot.pause(0.6)  # several ticks and follow polls
        assert app.view.events == half and not app.view.finished
        assert "PAUSED" in app._source_line()
        await pilot.press("p")
        await wait_for(pilot, lambda: app.view.finished)
        assert app.view.events == len(events)
        await pilot.press("r")  # re-read the followed record from its start
        await wait_for(pilot, lambda: app.view.finished)
        assert app.view.events == len(events)

    drive(app, script)


def test_paced_replay_and_restart(tmp_path: Path) -> None:
    """At a finite speed the replay advances over ticks; r starts it over."""
    events = synthetic_run(cycles=60, seed=1)
    span = events[-1].t - events[0].t
    app = EagleLabApp(events=events, speed=span / 1.5)  # the whole run in ~1.5 s

    async def script(pilot: Any) -> None:
        await pilot.pause(0.3)
        assert 0 < app.view.events < len(events)
        await wait_for(pilot, lambda: app.view.finished)
        before = app.model
        await pilot.press("r")
        assert app.model is not before  # a fresh reducer, fed from the first event again
        await wait_for(pilot, lambda: app.view.finished)
        assert app.view.events == len(events)

    drive(app, script)


def test_replay_feed_clamps_long_gaps():
    """An idle minute in the record replays as max_gap_s; speed 0 hands out everything at once."""
    events = synthetic_run(cycles=3, plain_steps=0)
    feed = ReplayFeed(events, speed=1.0, max_gap_s=0.5)
    assert feed._offsets[-1] <= 0.5 * (len(events) - 1)
    assert len(ReplayFeed(events, speed=0.0).advance(0.0)) == len(events)
    assert feed.advance(0.0) == [e for e in events if e.t == events[0].t]
    feed.advance(100.0)
    assert feed.done and feed.progress == 1.0
    feed.restart()
    assert not feed.done and feed.advance(0.0) == [e for e in events if e.t == events[0].t]


def test_live_run_output_and_record(tmp_path: Path) -> None:
    """--live: the subprocess's output reaches the output panel, its record the dashboard."""
    record = tmp_path / "live.jsonl"
    script_src = (
        "import sys, time\n"
        "from eaglelab.probes.record import RecordWriter\n"
        "from eaglelab.tui.synthetic import synthetic_run\n"
        "print('hello from the run', flush=True)\n"
        f"w = RecordWriter({str(record)!r})\n"
        "for i, e in enumerate(synthetic_run(cycles=20)):\n"
        "    w.write(e)\n"
        "    if i % 10 == 0: time.sleep(0.02)\n"
        "w.close(); print('done', flush=True)\n"
    )
    live = LiveRun([sys.executable, "-c", script_src], record)
    app = EagleLabApp(live=live)

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.view.finished and app._exit_code is not None)
        await pilot.pause(0.15)
        output = app.query_one(RunOutput).received
        assert "hello from the run" in output and "done" in output
        assert app._exit_code == 0
        assert any("exited with code 0" in line for line in app.query_one(WarningLog).lines_text)
        assert app.view.spec_cycles == 20

    drive(app, script)
    assert live.returncode == 0


def test_live_args_get_a_record_flag(tmp_path: Path) -> None:
    run = LiveRun.eaglelab_run(["hi", "--steps", "3"], tmp_dir=tmp_path)
    assert run.argv[-2:] == ["--record", str(tmp_path / "live.jsonl")]
    assert run.argv[1:4] == ["-m", "eaglelab", "run"]
    given = LiveRun.eaglelab_run(["hi", "--record=mine.jsonl"])
    assert given.record == Path("mine.jsonl") and given.argv.count("--record=mine.jsonl") == 1


def parse(*argv: str) -> Any:
    from eaglelab.cli import build_parser
    from eaglelab.cmd_tui import app_kwargs

    return app_kwargs(build_parser().parse_args(["tui", *argv]))


def test_command_line_sources(tmp_path: Path) -> None:
    from eaglelab.engine.errors import EagleLabError

    path = write_synthetic_record(tmp_path / "r.jsonl", cycles=2)
    assert parse(str(path)) == {"record": path, "follow": False, "speed": 0.0}
    assert parse(str(path), "--follow", "--speed", "2")["follow"] is True
    assert parse(str(tmp_path / "later.jsonl"), "--follow")["follow"] is True  # may not exist yet
    live = parse("--live", "--", "Hello", "--steps", "3")["live"]
    assert live.argv[4:7] == ["Hello", "--steps", "3"]
    assert parse("--demo")["speed"] == 1.0
    for bad in ((), (str(tmp_path / "missing.jsonl"),), ("--live",), ("a", "b"), ("--live", "--demo", "--", "x")):
        with pytest.raises(EagleLabError):
            parse(*bad)


def test_tui_imports_no_torch():
    code = "import sys, eaglelab.tui.app, eaglelab.cmd_tui; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("scale", [0.01, 1.0, 1000.0])
def test_cycle_breakdown_fits_its_width(scale: float) -> None:
    """Slow CPU runs (seconds per verify) and fast GPU runs both fit 60 cells without clipping."""
    from eaglelab.tui.model import reduce_events

    events = [
        Step(index=i, kind="spec", accept_len=(2,), num_draft_tokens=4,
             phase_ms={"draft": 2.0 * scale, "verify": 87.0 * scale, "accept": 1.0 * scale, "draft_extend": 0.01})
        for i in range(3)
    ]
    text = plain(CycleBreakdown.renderable_for(reduce_events(events), 60), width=60)
    assert "…" not in text
    assert "draft_extend" in text and f"{fmt.ms(87.0 * scale)}" in text


def test_quitting_stops_a_live_run(tmp_path: Path) -> None:
    """q while the run still goes: the subprocess is terminated, the app does not hang."""
    live = LiveRun([sys.executable, "-c", "import time; print('busy', flush=True); time.sleep(60)"], tmp_path / "r.jsonl")
    app = EagleLabApp(live=live)

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: "busy" in app.query_one(RunOutput).received)
        await pilot.press("q")

    started = time.monotonic()
    drive(app, script)
    assert live.returncode is not None and live.returncode != 0
    assert time.monotonic() - started < 20


def test_a_tick_while_the_screen_is_torn_down_draws_nothing_and_does_not_crash(tmp_path: Path) -> None:
    """The 10 Hz timer can fire while the app exits and its widgets are already gone; that tick draws nothing."""
    from eaglelab.tui.w_status import RunStatus

    app = EagleLabApp(record=write_synthetic_record(tmp_path / "run.jsonl", **KNOBS))

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.view.finished)
        await app.query_one(RunStatus).remove()
        app._dirty = True
        app._tick()  # no status bar to draw on

    drive(app, script)

