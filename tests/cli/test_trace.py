"""`eaglelab trace` writes a profiler trace holding one range per phase, with distributedInfo, and
TensorBoard (with its PyTorch profiler plugin, a dependency) serves its Overview, Operator and Trace views."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

PHASES = {"prefill", "draft", "verify", "accept", "draft_extend"}


@pytest.fixture(scope="module", params=["ngram", "default"])
def trace_logdir(request, tmp_path_factory, default_target) -> Path:
    """An n-gram run (a phase each) and an EAGLE-3 run (the cycle one phase: its parts are the ranges)."""
    from eaglelab.cli import main

    logdir = tmp_path_factory.mktemp("tb")
    rc = main(["trace", "--logdir", str(logdir / "run1"), "--max-new-tokens", "5", "--draft", request.param,
               "Count: 1 2 3 1 2 3"])
    assert rc == 0
    return logdir


@pytest.mark.slow
def test_trace_has_phase_ranges(trace_logdir):
    (trace_file,) = list((trace_logdir / "run1").glob("*.pt.trace.json"))
    trace = json.loads(trace_file.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert PHASES <= names
    assert trace["distributedInfo"]["rank"] == 0


@pytest.mark.slow
def test_tensorboard_profiler_plugin_serves_the_trace(trace_logdir, tmp_path):
    """TensorBoard on loopback, queried through the plugin's own HTTP endpoints, as its web page does."""
    server, base, runs = _serve(trace_logdir, tmp_path / "tensorboard.err")
    try:
        assert runs == ["run1"]
        assert _get(f"{base}/views?run=run1") == ["Overview", "Operator", "Trace"]
        (worker,) = _get(f"{base}/workers?run=run1&view=Overview")
        (span,) = _get(f"{base}/spans?run=run1&worker={worker}")
        where = f"run=run1&worker={worker}&span={span}"
        overview = _get(f"{base}/overview?{where}")
        assert {"title": "Device Type", "value": "CPU"} in overview["environments"]
        ops = [row[0] for row in _get(f"{base}/operation?{where}&group_by=Operation")["host_total_time"]["rows"]]
        # the target's GEMMs: on CPU the projections run on our few-row C kernel (its range eaglelab::cpu_gemm),
        # or without a compiler on MKL (aten::linear, aten::mm)
        assert {"eaglelab::cpu_gemm", "aten::linear", "aten::mm"} & set(ops), sorted(ops)
        events = _get(f"{base}/trace?{where}")["traceEvents"]
        assert PHASES <= {e.get("name") for e in events}  # our per-phase ranges in the Trace view
    finally:
        server.terminate()
        server.wait(timeout=30)


def _serve(logdir: Path, err_path: Path, tries: int = 3) -> tuple[subprocess.Popen, str, list[str]]:
    """TensorBoard on a free loopback port, its plugin's base URL and the runs it loaded. A port found free can be
    taken by another process before TensorBoard binds it (it then says it could not bind and exits): another port,
    up to ``tries``; any other exit fails with what TensorBoard wrote."""
    for _ in range(tries):
        port = _free_port()
        with err_path.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://127.0.0.1:{port}/data/plugin/pytorch_profiler"
        try:
            runs = _wait_for_runs(base, server)
        except BaseException:
            server.terminate()
            server.wait(timeout=30)
            raise
        if runs is not None:
            return server, base, runs
        said = err_path.read_text(errors="replace")
        assert "could not bind" in said, f"tensorboard exited ({server.returncode}): {said[-2000:]}"
    raise AssertionError(f"tensorboard could not bind a free port in {tries} tries")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    if body[:2] == b"\x1f\x8b":  # the Trace view is served gzipped
        body = gzip.decompress(body)
    return json.loads(body)


def _wait_for_runs(base: str, server: subprocess.Popen, timeout_s: float = 180.0) -> list[str] | None:
    """The runs TensorBoard serves once it has loaded them; None if it exited first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return None
        try:
            got = _get(f"{base}/runs")
            if got["runs"] and not got["loading"]:
                return got["runs"]
        except OSError:
            pass
        time.sleep(1.0)
    raise AssertionError(f"tensorboard did not load the trace in {timeout_s:.0f} s")
