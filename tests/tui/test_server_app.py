"""The server TUI driven headless against a loopback server and a growing log: figures shown, and a
server that is down, answers garbage or restarts gets a status line, never a crash."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from eaglelab.cli import build_parser
from eaglelab.cmd_tui import server_app_kwargs
from eaglelab.engine.errors import EagleLabError
from eaglelab.tui.server_app import ServerApp
from eaglelab.tui.server_feeds import LogFollower, MetricsPoller
from eaglelab.tui.w_histogram import AcceptHistogram
from eaglelab.tui.w_metric import MetricCard
from eaglelab.tui.w_ranks import RankTable
from eaglelab.tui.w_server_status import ServerStatus
from eaglelab.tui.w_warnings import WarningLog
from tests.loopback import FIXTURES, ScriptedServer, closed_port_url, page
from tests.tui.test_app import plain

SIZE = (140, 44)


def drive(app: ServerApp, script: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await script(pilot)

    asyncio.run(main())


async def wait_for(pilot: Any, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


def status_text(app: ServerApp) -> str:
    return plain(app.query_one(ServerStatus).render(), 140)


def warnings(app: ServerApp) -> str:
    return "\n".join(app.query_one(WarningLog).lines_text)


def test_polling_vllm_shows_acceptance_histogram_and_ranks() -> None:
    pages = [(200, page("vllm_metrics_1.txt")), (200, page("vllm_metrics_2.txt"))]
    with ScriptedServer(pages) as server:
        app = ServerApp(feed=MetricsPoller(server.url + "/metrics", interval_s=0.1), baseline_tokens_per_s=100.0)

        async def script(pilot: Any) -> None:
            await wait_for(pilot, lambda: app.view.updates >= 2)
            await pilot.pause(0.15)
            card = app.query_one("#acceptance", MetricCard)
            assert card.value_text == f"{(1980 + 850) / 1700 + 1:.2f} tokens / verify"  # weighted by drafts
            hist = plain(AcceptHistogram.renderable_for(app.view.run, 60))
            # 1700 drafts: lengths 1..4 from the per-position counters (1700-1280, 1280-930, 930-620, 620)
            for a, n in ((1, 420), (2, 350), (3, 310), (4, 620)):
                assert any(line.split()[:1] == [str(a)] and f" {n} " in line for line in hist.splitlines()), hist
            assert "engine 0" in plain(RankTable.renderable_for(app.view))
            assert "vLLM server" in status_text(app) and "ok" in status_text(app)

        drive(app, script)


def test_down_then_garbage_then_restart_are_status_lines_not_crashes() -> None:
    pages = [
        (200, "<html><body>502 Bad Gateway</body></html>"),
        (200, page("vllm_metrics_1.txt")),
        (200, page("vllm_metrics_2.txt")),
        (200, page("vllm_metrics_restarted.txt")),
    ]
    down = ServerApp(feed=MetricsPoller(closed_port_url(), interval_s=0.1, timeout_s=1.0))

    async def down_script(pilot: Any) -> None:
        await wait_for(pilot, lambda: "server down" in status_text(down))
        assert "cannot reach" in warnings(down) and down.is_running

    drive(down, down_script)

    with ScriptedServer(pages) as server:
        app = ServerApp(feed=MetricsPoller(server.url + "/metrics", interval_s=0.1))

        async def script(pilot: Any) -> None:
            await wait_for(pilot, lambda: "HTML" in warnings(app))
            await wait_for(pilot, lambda: app.view.resets == 1)
            await pilot.pause(0.15)
            assert "restarted" in warnings(app) and "1 restart(s) seen" in status_text(app)
            assert app.query_one("#acceptance", MetricCard).value_text == "1.75 tokens / verify"
            server.stop()
            await wait_for(pilot, lambda: "server down" in status_text(app))
            assert app.is_running

        drive(app, script)


def test_economics_verdict_lands_in_the_warnings_with_its_cause() -> None:
    """One page (its gauges hold the last decode interval's throughput), then the server fails."""
    with ScriptedServer([(200, page("sglang_metrics_dp.txt")), (503, "Service Unavailable")]) as server:
        app = ServerApp(feed=MetricsPoller(server.url + "/metrics", interval_s=0.1), baseline_tokens_per_s=150.0)

        async def script(pilot: Any) -> None:
            await wait_for(pilot, lambda: "economics" in warnings(app))
            assert "slower than plain decoding: 0.74x" in warnings(app) and "acceptance too low" in warnings(app)
            assert app.query_one("#economics", MetricCard).value_text == "0.74x plain decoding"
            rows = plain(RankTable.renderable_for(app.view))
            assert "DP0 TP0" in rows and "DP1 TP1" in rows
            await wait_for(pilot, lambda: "HTTP 503" in status_text(app))

        drive(app, script)


def test_following_a_growing_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = (FIXTURES / "vllm.log").read_text().split("\n")
    app = ServerApp(feed=LogFollower(log, poll_s=0.05))

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: "waiting for" in status_text(app))
        log.write_text("\n".join(lines[:8]) + "\n")  # up to the first SpecDecoding line
        await wait_for(pilot, lambda: app.query_one("#acceptance", MetricCard).value_text == "2.70 tokens / verify")
        with open(log, "a") as f:
            f.write("\n".join(lines[8:]) + "\n")
        await wait_for(pilot, lambda: app.view.run.graphs != ())
        assert app.view.run.graphs[0].replays == 480 and app.view.run.graphs[0].eager == 20
        log.write_text(lines[7] + "\n")  # rotated: a shorter file
        await wait_for(pilot, lambda: "reading it again from the start" in warnings(app))
        assert app.is_running

    drive(app, script)


def test_cli_arguments_for_servers(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    kwargs = server_app_kwargs(parse(["tui", "--server", "127.0.0.1:8000", "--interval", "2", "--baseline-tok-s", "80"]))
    assert kwargs["feed"].url == "http://127.0.0.1:8000/metrics" and kwargs["feed"].interval_s == 2.0
    assert kwargs["baseline_tokens_per_s"] == 80.0
    with pytest.raises(EagleLabError, match="choose one source"):
        server_app_kwargs(parse(["tui", "--server", "http://h:1", "--demo"]))
    with pytest.raises(EagleLabError, match="not a server URL"):
        server_app_kwargs(parse(["tui", "--server", "ftp://h/metrics"]))
    with pytest.raises(EagleLabError, match="positive"):
        server_app_kwargs(parse(["tui", "--server", "http://h:1", "--interval", "0"]))
    with pytest.raises(EagleLabError, match="no such log"):
        server_app_kwargs(parse(["tui", "--log", str(tmp_path / "missing.log")]))
    follower = server_app_kwargs(parse(["tui", "--log", str(tmp_path / "later.log"), "--follow"]))["feed"]
    assert isinstance(follower, LogFollower) and follower.follow


def test_the_server_tui_imports_no_torch() -> None:
    code = ("import sys, eaglelab.tui.server_app, eaglelab.cmd_tui, eaglelab.probes.server_report; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_a_tick_while_the_screen_is_torn_down_draws_nothing_and_does_not_crash() -> None:
    """The 10 Hz timer can fire while the app exits and its widgets are already gone (seen once in CI:
    NoMatches for ServerStatus on the emptied screen); that tick draws nothing and the app stays dirty."""
    pages = [(200, page("vllm_metrics_1.txt"))]
    with ScriptedServer(pages) as server:
        app = ServerApp(feed=MetricsPoller(server.url + "/metrics", interval_s=0.1), baseline_tokens_per_s=100.0)

        async def script(pilot: Any) -> None:
            await wait_for(pilot, lambda: app.view.updates >= 1)
            await app.query_one(ServerStatus).remove()
            app._dirty = True
            app._tick()  # no ServerStatus to draw on
            assert app._dirty

        drive(app, script)
