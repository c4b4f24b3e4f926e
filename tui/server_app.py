"""Watch a running vLLM or SGLang server: acceptance, throughput, per-rank figures, CUDA graphs, economics.

::

    ServerApp(feed=MetricsPoller("http://127.0.0.1:30000/metrics")).run()   # poll /metrics
    ServerApp(feed=LogFollower("server.log")).run()                          # follow a log

The feed runs in a thread worker (it only GETs ``/metrics`` or reads the log); a 10 Hz timer folds
what it queued into :class:`ServerModel` and re-renders. A server that is down, answers something
that is not a metrics page, or restarts shows on the status line and in the warnings; the watch
carries on. When the latest figures say speculation costs time, the warnings say so with the
probable cause. Keys: ``q`` quit, ``p`` pause / resume the display, ``r`` start the totals over.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.widgets import Footer
from textual.worker import get_current_worker

from eaglelab.tui import fmt
from eaglelab.tui.crash import KeepsCrash
from eaglelab.tui.server_feeds import LogFollower, MetricsPoller
from eaglelab.tui.server_model import ServerModel, ServerView
from eaglelab.tui.w_graphs import GraphStatus
from eaglelab.tui.w_histogram import AcceptHistogram
from eaglelab.tui.w_metric import MetricCard
from eaglelab.tui.w_ranks import RankTable
from eaglelab.tui.w_server_status import ServerStatus
from eaglelab.tui.w_warnings import WarningLog


class ServerApp(KeepsCrash, App[int]):
    """Shows one server, from a :class:`MetricsPoller` or a :class:`LogFollower`."""

    TITLE = "eaglelab · server"
    CSS = """
    Screen { layout: vertical; }
    #cards { height: 6; }
    #middle { height: 1fr; min-height: 7; }
    #bottom { height: 1fr; min-height: 6; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("p", "toggle_pause", "pause"),
        Binding("r", "restart", "start over"),
    ]

    def __init__(
        self,
        *,
        feed: MetricsPoller | LogFollower,
        baseline_tokens_per_s: float | None = None,
        expected_accept_len: float = 2.0,
        tick_s: float = 0.1,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.baseline_tokens_per_s = baseline_tokens_per_s
        self.expected_accept_len = expected_accept_len
        self.tick_s = tick_s
        self.model = self._new_model()
        self.view: ServerView = self.model.view()
        self.paused = False
        self._dirty = True
        self._shown_problem: str | None = None
        self._written_statuses = 0
        self._economics_cause: str | None = None
        self._graph_hint = False

    def _new_model(self) -> ServerModel:
        return ServerModel(baseline_tokens_per_s=self.baseline_tokens_per_s, expected_accept_len=self.expected_accept_len)

    def compose(self) -> ComposeResult:
        yield ServerStatus(id="status")
        with Horizontal(id="cards"):
            yield MetricCard("acceptance", id="acceptance")
            yield MetricCard("throughput", id="throughput")
            yield MetricCard("does it pay?", sparkline=False, id="economics")
        with Horizontal(id="middle"):
            yield AcceptHistogram(id="histogram")
            yield RankTable(id="ranks")
        with Horizontal(id="bottom"):
            yield GraphStatus(id="graphs")
            yield WarningLog(id="warnings")
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(self._watch, thread=True, group="feed", exit_on_error=False)
        self.set_interval(self.tick_s, self._tick)
        self._render()

    def _watch(self) -> None:
        worker = get_current_worker()
        self.feed.run(stop=lambda: worker.is_cancelled)

    # -- the 10 Hz tick --------------------------------------------------------------------

    def _tick(self) -> None:
        try:
            self._tick_now()
        except NoMatches:  # the screen is being torn down (the app is exiting): nothing to draw on; stays dirty
            pass

    def _tick_now(self) -> None:
        updates = self.feed.drain()
        if updates:
            self.model.apply_all(updates)
            self._dirty = True
        while self.feed.notes:
            self.query_one(WarningLog).note("server", self.feed.notes.popleft(), style="red")
        problem = self.feed.problem
        if problem != self._shown_problem:
            self._shown_problem = problem
            self._dirty = True
        if self._dirty and not self.paused:
            self._render()

    def _render(self) -> None:
        view = self.model.view()
        self.view = view
        self.query_one(ServerStatus).show(view, self._source_line(), self.feed.problem)
        self._show_cards(view)
        histogram = self.query_one(AcceptHistogram)
        if view.engine == "sglang":  # SGLang exposes the mean accepted length, not per-position counts
            histogram.update(Text("SGLang reports the mean accepted length only: no histogram", style="dim"))
        else:
            histogram.show(view.run)
        self.query_one(RankTable).show(view)
        self.query_one(GraphStatus).show(view.run)
        self._log_news(view)
        self._dirty = False

    def _show_cards(self, view: ServerView) -> None:
        run = view.run
        if run.mean_accept_len is not None:
            value = f"{run.mean_accept_len:.2f} tokens / verify"
            detail = f"accept rate {fmt.pct(run.accept_rate)} · latest {fmt.num(run.recent_accept_len)}"
        else:
            value, detail = fmt.DASH, "no speculative figures yet"
        self.query_one("#acceptance", MetricCard).update_metric(value, detail, run.accept_len_trend)
        rate = run.recent_tokens_per_s
        self.query_one("#throughput", MetricCard).update_metric(
            fmt.DASH if rate is None else f"{rate:.1f} tok/s",
            f"mean {fmt.num(run.tokens_per_s, 1)} tok/s · baseline {fmt.num(self.baseline_tokens_per_s, 1)}",
            run.tokens_per_s_history,
        )
        e = view.economics
        if e is None:
            value, detail = fmt.DASH, "waiting for an accepted length"
        elif e.speedup is None:
            value = "speedup ?"
            if not self.baseline_tokens_per_s:
                detail = "pass --baseline-tok-s"
            elif run.recent_tokens_per_s == 0:
                detail = "server idle: nothing generated since the last figure"
            else:
                detail = "no throughput figure yet"
        else:
            value = f"{e.speedup:.2f}x plain decoding"
            detail = f"break-even accepted length {e.break_even_accept_len:.2f}"
        self.query_one("#economics", MetricCard).update_metric(value, detail)

    def _log_news(self, view: ServerView) -> None:
        """New status lines, and the economics verdict whenever its cause changes."""
        log = self.query_one(WarningLog)
        for status in view.statuses[self._written_statuses :]:
            log.note("server", status, style="yellow")
        self._written_statuses = len(view.statuses)
        if view.engine == "vllm" and isinstance(self.feed, MetricsPoller) and not self._graph_hint:
            log.note("server", "vLLM's /metrics has no CUDA-graph figures: start vLLM with --cudagraph-metrics "
                     "and follow its log (eaglelab tui --log FILE --follow) to see the runtime mode")
            self._graph_hint = True
        e = view.economics
        cause = e.cause if e is not None else None
        if e is not None and cause != self._economics_cause and cause != "speedup_unknown":
            style = "green" if cause == "pays" else "red"
            log.note("economics", e.verdict, style=style)
        self._economics_cause = cause

    def _source_line(self) -> str:
        if isinstance(self.feed, MetricsPoller):
            line = f"polling {self.feed.url} every {self.feed.interval_s:g} s"
        else:
            line = f"{'following' if self.feed.follow else 'read'} {self.feed.path}"
        if self.paused:
            line += " · PAUSED (p resumes)"
        return line

    # -- actions ---------------------------------------------------------------------------

    def action_toggle_pause(self) -> None:
        """Freeze or unfreeze the display (the feed keeps being read meanwhile)."""
        self.paused = not self.paused
        self._dirty = True
        if self.paused:
            self.query_one(ServerStatus).show(self.view, self._source_line(), self.feed.problem)

    def action_restart(self) -> None:
        """Start the totals over from the next update."""
        self.model = self._new_model()
        self.query_one(WarningLog).reset()
        self._written_statuses = 0
        self._economics_cause = None
        self._render()
