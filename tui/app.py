"""The eaglelab TUI: watch a speculative run's acceptance, speed, cycle time, graphs and all-reduces.

::

    EagleLabApp(record="run.jsonl").run()                 # replay a record (all at once)
    EagleLabApp(record="run.jsonl", speed=1.0).run()      # ... at its recorded pace
    EagleLabApp(record="run.jsonl", follow=True).run()    # tail a record being written
    EagleLabApp(live=LiveRun.eaglelab_run([...])).run()   # start a run and follow its record

Nothing here blocks: reading, tailing and the live run happen in thread workers that queue
events; a 10 Hz timer folds the queue into :class:`RunModel` and re-renders once per tick.
Keys: ``q`` quit, ``p`` pause / resume, ``r`` restart the replay (or re-read a followed record).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.widgets import Footer
from textual.worker import get_current_worker

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.events import Event
from eaglelab.probes.record import read_record
from eaglelab.tui import fmt
from eaglelab.tui.crash import KeepsCrash
from eaglelab.tui.feeds import FollowFeed, LiveRun, ReplayFeed
from eaglelab.tui.messages import FollowEnded, RecordFailed, RecordLoaded, RunExited
from eaglelab.tui.model import RunModel, RunView
from eaglelab.tui.w_allreduce import AllReduceTable
from eaglelab.tui.w_cycle import CycleBreakdown
from eaglelab.tui.w_graphs import GraphStatus
from eaglelab.tui.w_histogram import AcceptHistogram
from eaglelab.tui.w_metric import MetricCard
from eaglelab.tui.w_output import RunOutput
from eaglelab.tui.w_status import RunStatus
from eaglelab.tui.w_warnings import WarningLog


# A replay advances by at most this much per tick, so a stalled UI slows it instead of jumping.
MAX_TICK_S = 0.5


class EagleLabApp(KeepsCrash, App[int]):
    """Shows one run from a record (replayed or followed), from given events, or from a live run."""

    TITLE = "eaglelab"
    CSS = """
    Screen { layout: vertical; }
    #cards { height: 6; }
    #middle { height: 1fr; min-height: 7; }
    #bottom { height: 1fr; min-height: 6; }
    #logs { height: 5; }
    #logs > WarningLog { width: 1fr; }
    #logs > RunOutput { width: 2fr; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("p", "toggle_pause", "pause"),
        Binding("r", "restart", "restart"),
    ]

    def __init__(
        self,
        *,
        record: str | Path | None = None,
        events: Sequence[Event] | None = None,
        follow: bool = False,
        speed: float = 0.0,
        live: LiveRun | None = None,
        tick_s: float = 0.1,
        window: int = 32,
    ) -> None:
        super().__init__()
        assert sum(x is not None for x in (record, events, live)) == 1, "give one of record, events, live"
        self.record = Path(record) if record is not None else (live.record if live is not None else None)
        self.follow = follow or live is not None
        self.speed = speed
        self.live = live
        self.tick_s = tick_s
        self.window = window
        self.model = RunModel(window=window)
        self.view: RunView = self.model.view()
        self.paused = False
        self._replay: ReplayFeed | None = ReplayFeed(events, speed=speed) if events is not None else None
        self._follow: FollowFeed | None = None
        self._problem: str | None = None
        self._exit_code: int | None = None
        self._dirty = True
        self._shown_source = ""
        self._last_tick = time.monotonic()

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunStatus(id="status")
        with Horizontal(id="cards"):
            yield MetricCard("acceptance", id="acceptance")
            yield MetricCard("throughput", id="throughput")
            yield MetricCard("cycle time", id="cycle")
        with Horizontal(id="middle"):
            yield AcceptHistogram(id="histogram")
            yield CycleBreakdown(id="breakdown")
        with Horizontal(id="bottom"):
            yield GraphStatus(id="graphs")
            yield AllReduceTable(id="allreduce")
        with Horizontal(id="logs"):
            yield WarningLog(id="warnings")
            if self.live is not None:
                yield RunOutput(id="output")
        yield Footer()

    def on_mount(self) -> None:
        if self.live is not None:
            self.live.start()
            self.run_worker(self._pump_live, thread=True, group="live", exit_on_error=False)
        if self.follow:
            self._start_follow()
        elif self._replay is None:
            self.run_worker(self._load_record, thread=True, group="load", exit_on_error=False)
        self._last_tick = time.monotonic()
        self.set_interval(self.tick_s, self._tick)
        self._render()

    def on_unmount(self) -> None:
        if self.live is not None:
            self.live.stop()

    # -- workers (threads; they talk back through messages and queues) ---------------------

    def _load_record(self) -> None:
        assert self.record is not None
        try:
            result = read_record(self.record)
        except EagleLabError as exc:
            self.post_message(RecordFailed(str(exc)))
            return
        self.post_message(RecordLoaded(result.events, result.skipped_lines, result.notes))

    def _start_follow(self) -> None:
        assert self.record is not None
        self.workers.cancel_group(self, "follow")
        feed = FollowFeed(self.record)
        self._follow = feed
        self.run_worker(lambda: self._follow_loop(feed), thread=True, group="follow", exit_on_error=False)

    def _follow_loop(self, feed: FollowFeed) -> None:
        worker = get_current_worker()
        try:
            feed.run(stop=lambda: worker.is_cancelled)
        except OSError as exc:
            self.post_message(FollowEnded(f"{feed.path}: {exc.strerror or exc}"))
            return
        self.post_message(FollowEnded("stopped"))

    def _pump_live(self) -> None:
        assert self.live is not None
        self.post_message(RunExited(self.live.pump_output()))

    # -- messages --------------------------------------------------------------------------

    def on_record_loaded(self, message: RecordLoaded) -> None:
        self._replay = ReplayFeed(message.events, speed=self.speed)
        log = self.query_one(WarningLog)
        if message.skipped_lines:
            log.note("record", f"skipped {message.skipped_lines} unreadable line(s)")
        for note in message.notes:
            log.note("record", note)

    def on_record_failed(self, message: RecordFailed) -> None:
        self._problem = message.error
        self.query_one(WarningLog).note("error", message.error, style="red")

    def on_follow_ended(self, message: FollowEnded) -> None:
        if message.reason != "stopped":
            self._problem = message.reason
            self.query_one(WarningLog).note("error", message.reason, style="red")

    def on_run_exited(self, message: RunExited) -> None:
        self._exit_code = message.returncode
        style = "green" if message.returncode == 0 else "red"
        self.query_one(WarningLog).note("run", f"eaglelab run exited with code {message.returncode}", style=style)

    # -- the 10 Hz tick: drain queues, fold, render once -----------------------------------

    def _tick(self) -> None:
        try:
            self._tick_now()
        except NoMatches:  # the screen is being torn down (the app is exiting): nothing to draw on; stays dirty
            pass

    def _tick_now(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = min(now - self._last_tick, MAX_TICK_S), now
        if self.live is not None:
            text = self.live.drain_output()
            if text:
                self.query_one(RunOutput).append(text)
        if not self.paused:
            events = self._take(dt)
            if events:
                self.model.apply_all(events)
                self._dirty = True
        if self._dirty or self._source_line() != self._shown_source:
            self._render()

    def _take(self, dt: float) -> list[Event]:
        if self._follow is not None:
            return self._follow.drain()
        if self._replay is not None:
            return self._replay.advance(dt)
        return []

    def _render(self) -> None:
        view = self.model.view()
        self.view = view
        self._shown_source = self._source_line()
        self.query_one(RunStatus).show(view, self._shown_source)
        self._show_cards(view)
        self.query_one(AcceptHistogram).show(view)
        self.query_one(CycleBreakdown).show(view)
        self.query_one(GraphStatus).show(view)
        self.query_one(AllReduceTable).show(view)
        log = self.query_one(WarningLog)
        log.show(view)
        self.query_one("#logs").display = self.live is not None or bool(log.lines_text)
        self._dirty = False

    def _show_cards(self, view: RunView) -> None:
        speculative = view.header is not None and view.header.speculative
        if view.mean_accept_len is not None:
            value = f"{view.mean_accept_len:.2f} tokens / verify"
            detail = f"accept rate {fmt.pct(view.accept_rate)} · recent {fmt.num(view.recent_accept_len)}"
        else:
            value = fmt.DASH
            detail = "no speculative cycles yet" if speculative or view.header is None else "plain decoding"
        self.query_one("#acceptance", MetricCard).update_metric(value, detail, view.accept_len_trend)
        rate = view.recent_tokens_per_s
        self.query_one("#throughput", MetricCard).update_metric(
            fmt.DASH if rate is None else f"{rate:.1f} tok/s",
            f"run {fmt.num(view.tokens_per_s, 1)} tok/s · {view.generated_tokens} tokens",
            view.tokens_per_s_history,
        )
        ratio = view.verify_over_decode
        steps = f"{view.spec_cycles} cycles" if view.spec_cycles else f"{view.decode_steps} steps"
        detail = steps if ratio is None else f"{steps} · verify {ratio:.2f}× decode"
        self.query_one("#cycle", MetricCard).update_metric(fmt.ms(view.cycle_ms), detail, view.cycle_ms_history)

    def _source_line(self) -> str:
        if self.live is not None:
            pid = self.live.process.pid if self.live.process is not None else "?"
            what = f"live run (pid {pid})" if self._exit_code is None else f"live run exited ({self._exit_code})"
            line = f"{what} → {self.record}"
        elif self.follow:
            line = f"following {self.record}"
        elif self._replay is None:
            line = f"loading {self.record}" if self._problem is None else f"cannot read {self.record}"
        else:
            pace = "at once" if self.speed <= 0 else f"×{self.speed:g}"
            name = self.record.name if self.record is not None else "events"
            line = f"replay {name} {fmt.pct(self._replay.progress, 0)} ({pace})"
        if self.paused:
            line += " · PAUSED (p resumes)"
        return line

    # -- actions ---------------------------------------------------------------------------

    def action_toggle_pause(self) -> None:
        """Freeze or unfreeze the display (a followed record keeps being read meanwhile)."""
        self.paused = not self.paused

    def action_restart(self) -> None:
        """Start over: replay from the first event, or re-read a followed record from its start."""
        self.model = RunModel(window=self.window)
        self.query_one(WarningLog).reset()
        if self.follow:
            self._start_follow()
        elif self._replay is not None:
            self._replay.restart()
        self._render()
