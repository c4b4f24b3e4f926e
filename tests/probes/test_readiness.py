"""wait-ready against a local HTTP server (503 first, then 200) and a log file the test writes."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.readiness import HttpProbe, LogTail, Milestone, models_url, probe_models, wait_ready

CAPTURE = "[2025-06-01 09:59:40 TP0] Capture cuda graph end. Time elapsed: 3.21 s. mem usage=1.20 GB."
HEALTH_PREFILL = (
    "[2025-06-01 09:59:41 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00, "
)
READY = "[2025-06-01 09:59:42] The server is fired up and ready to roll!"


class _Server:
    """A stand-in SGLang: /v1/models answers 503 until ``ready_after`` seconds, then 200."""

    def __init__(self, ready_after: float) -> None:
        self.paths: list[str] = []
        self.started = time.monotonic()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.paths.append(self.path)
                up = time.monotonic() - outer.started >= ready_after
                code = 200 if up and self.path == "/v1/models" else 503
                body = b'{"object": "list", "data": []}' if code == 200 else b"starting"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server(ready_after=0.5)
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_models_url_normalises_and_refuses_generating_endpoints() -> None:
    assert models_url("http://h:30000") == "http://h:30000/v1/models"
    assert models_url("http://h:30000/") == "http://h:30000/v1/models"
    assert models_url("http://h:30000/v1") == "http://h:30000/v1/models"
    assert models_url("http://h:30000/v1/models") == "http://h:30000/v1/models"
    for bad in ("http://h:30000/health_generate", "http://h:30000/generate", "http://h:30000/health", "localhost:30000"):
        with pytest.raises(EagleLabError):
            models_url(bad)


def test_probe_says_not_yet_then_ok(server: _Server) -> None:
    first = probe_models(server.url + "/v1/models", 2.0)
    assert (first.ok, first.status) == (False, 503)
    time.sleep(0.55)
    assert probe_models(server.url + "/v1/models", 2.0).ok


def test_connection_refused_is_not_ready() -> None:
    p = probe_models(f"http://127.0.0.1:{_free_port()}/v1/models", 1.0)
    assert not p.ok and p.status is None and p.detail == "connection refused"


def test_http_only_ready_after_the_503_phase(server: _Server) -> None:
    seen: list[Milestone] = []
    r = wait_ready(server.url, timeout_s=10, interval_s=0.05, on_milestone=seen.append)
    assert r.ready and [m.name for m in seen] == ["http_ok", "warm"]
    assert 0.4 <= r.elapsed_s < 5.0
    assert r.polls >= 2 and r.polls == len(server.paths)
    assert set(server.paths) == {"/v1/models"}  # never a generating endpoint


def test_waits_for_both_log_markers_and_warns_about_eager_health_prefills(server: _Server, tmp_path: Path) -> None:
    log = tmp_path / "server.log"

    def write_log() -> None:
        time.sleep(0.2)
        with open(log, "a") as f:
            f.write(CAPTURE + "\n" + HEALTH_PREFILL + "\n")
        time.sleep(0.8)  # HTTP is up at 0.5 s; warm only once the ready marker lands
        with open(log, "a") as f:
            f.write(READY[:20])
            f.flush()
            time.sleep(0.1)
            f.write(READY[20:] + "\n")

    writer = threading.Thread(target=write_log)
    writer.start()
    r = wait_ready(server.url, log=log, timeout_s=10, interval_s=0.05)
    writer.join()
    assert r.ready
    names = [m.name for m in r.milestones]
    assert names == ["graph_captured", "http_ok", "fired_up", "warm"]
    fired = r.milestone("fired_up")
    assert fired is not None and fired.elapsed_s >= 1.0
    assert "capture took 3.21 s" in (r.milestone("graph_captured") or Milestone("", 0)).detail
    assert any("1 health-check prefill(s) ran before the server was ready" in w for w in r.warnings)
    assert set(server.paths) == {"/v1/models"}


def test_times_out_when_the_server_never_answers(tmp_path: Path) -> None:
    r = wait_ready(f"http://127.0.0.1:{_free_port()}", log=tmp_path / "none.log", timeout_s=0.4, interval_s=0.05)
    assert not r.ready
    assert r.waiting_for == ("http_ok", "graph_captured", "fired_up")
    assert 0.4 <= r.elapsed_s < 3.0 and r.last_http == "connection refused"
    assert any("never appeared" in w for w in r.warnings)


def test_fake_clock_timeout_is_exact() -> None:
    now = [0.0]
    r = wait_ready(
        "http://x:1", timeout_s=3.0, interval_s=1.0,
        probe=lambda url, t: HttpProbe(False, 503, "503"),
        clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert not r.ready and r.polls == 4 and r.elapsed_s == 3.0 and r.last_http == "503"


def test_log_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    tail = LogTail(log)
    assert tail.poll() == []
    log.write_text(CAPTURE + "\n" + READY[:10])
    assert [getattr(i, "name", None) for i in tail.poll()] == ["graph_captured"]
    with open(log, "a") as f:
        f.write(READY[10:] + "\n")
    assert [getattr(i, "name", None) for i in tail.poll()] == ["ready"]


def test_cli_exit_codes(server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eaglelab.cli import main

    log = tmp_path / "s.log"
    log.write_text(CAPTURE + "\n" + READY + "\n")
    assert main(["wait-ready", server.url, "--log", str(log), "--timeout", "10", "--interval", "0.05"]) == 0
    assert "ready" in capsys.readouterr().out
    dead = f"http://127.0.0.1:{_free_port()}"
    assert main(["wait-ready", dead, "--timeout", "0.3", "--interval", "0.05"]) == 1
    assert "not ready" in capsys.readouterr().out
    assert main(["wait-ready", "localhost:1"]) == 2
