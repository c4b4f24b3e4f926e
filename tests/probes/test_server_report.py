"""``eaglelab report`` on servers: a saved /metrics page, a URL read twice, a vLLM log; and the CLI's
clear errors (no traceback, exit 2) for a server that is down or answers garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglelab.cli import main
from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.report import render, summarise
from tests.loopback import FIXTURES, ScriptedServer, closed_port_url, page


def test_saved_vllm_page_gives_since_start_acceptance() -> None:
    report = summarise(FIXTURES / "vllm_metrics_2.txt")
    assert report.source == "vllm-metrics"
    assert report.accept_len_mean == pytest.approx(1 + 2830 / 1700)
    assert report.details["per_position_accept_rate"] == pytest.approx([1280 / 1700, 930 / 1700, 620 / 1700])
    assert report.gen_throughput_mean is None  # one read of a counter is no rate


def test_saved_sglang_page_reports_each_rank_and_the_verdict() -> None:
    report = summarise(FIXTURES / "sglang_metrics_dp.txt", baseline_tok_s=150.0)
    assert report.source == "sglang-metrics" and report.gen_throughput_mean == pytest.approx(111.6)
    assert report.verdicts[0].startswith("speculation is slower than plain decoding: 0.74x")
    assert "acceptance too low" in report.verdicts[0]
    assert any(n.startswith("DP0 TP0: accepted length 1.88") for n in report.notes)


def test_url_is_read_twice_and_reports_the_window() -> None:
    pages = [(200, page("vllm_metrics_1.txt")), (200, page("vllm_metrics_2.txt"))]
    with ScriptedServer(pages) as server:
        report = summarise(server.url, window_s=0.05, baseline_tok_s=100.0)
    assert server.requests == ["/metrics", "/metrics"]
    assert report.accept_len_mean == pytest.approx(2.70)
    assert report.gen_throughput_mean is not None and report.gen_throughput_mean > 0
    assert "figures over 0.05 s" in report.notes[0]


def test_vllm_log_report() -> None:
    report = summarise(FIXTURES / "vllm.log")
    assert report.source == "vllm-log" and report.cuda_graph_fraction == pytest.approx(0.96)
    assert report.details["cuda_graph_modes"] == {"FULL": 480.0, "NONE": 20.0}
    text = str(render(report))
    assert text


def test_cli_report_json_on_a_saved_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(FIXTURES / "vllm_metrics_1.txt"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "vllm-metrics" and out["accept_len_mean"] == pytest.approx(2.65)


def test_cli_report_on_a_down_server_is_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", closed_port_url(), "--window", "0"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err


def test_cli_report_on_garbage_is_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with ScriptedServer([(200, "<html>a login page</html>")]) as server:
        assert main(["report", server.url, "--window", "0"]) == 2
    err = capsys.readouterr().err
    assert "not a vLLM or SGLang metrics page" in err and "HTML" in err and "Traceback" not in err


def test_a_saved_garbage_page_that_looked_like_metrics(tmp_path: Path) -> None:
    path = tmp_path / "page.txt"
    path.write_text("# TYPE vllm:x counter\n")
    with pytest.raises(EagleLabError, match="not a vLLM or SGLang metrics page"):
        summarise(path)
