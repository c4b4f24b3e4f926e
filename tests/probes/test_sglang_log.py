"""SGLang log parsing: every line format we know, absent figures as None, start-up and health checks.

The sample lines are written for these tests from SGLang's decode/prefill log format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.sglang_log import (
    BatchLine,
    HealthRequest,
    Marker,
    SglangLogScanner,
    parse_line,
    read_sglang_log,
)

NEW_DECODE = (
    "[2025-06-01 10:00:00 TP0] Decode batch, #running-req: 1, #token: 530, token usage: 0.01, "
    "accept len: 2.43, accept rate: 0.36, cuda graph: True, gen throughput (token/s): 88.91, #queue-req: 0, "
)
DP_DECODE = (
    "[2025-06-01 10:00:01 DP1 TP1] Decode batch, #running-req: 3, #token: 4096, token usage: 0.05, "
    "accept len: 1.88, accept rate: 0.22, cuda graph: False, gen throughput (token/s): 51.20, #queue-req: 2, "
)
OLD_DECODE = (
    "[2024-11-02 09:00:05 TP0] Decode batch. #running-req: 1, #token: 40, token usage: 0.00, "
    "gen throughput (token/s): 31.54, #queue-req: 0"
)
MID_DECODE = (
    "[2025-02-10 08:00:00] Decode batch. #running-req: 2, #token: 900, token usage: 0.02, "
    "accept len: 3.10, cuda graph: True, gen throughput (token/s): 160.00, #queue-req: 0"
)
COLLECTOR_DECODE = (
    "2025-06-01T10:00:02.123456Z stdout F [2025-06-01 10:00:02 TP0] Decode batch, #running-req: 1, "
    "#token: 600, token usage: 0.01, accept len: 2.57, accept rate: 0.39, cuda graph: True, "
    "gen throughput (token/s): 92.10, #queue-req: 0, "
)
PYLOG_DECODE = (
    "INFO 06-01 10:00:03 scheduler.py:1234] Decode batch, #running-req: 1, #token: 700, "
    "token usage: 0.01, cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0,"
)
PYLOG2_DECODE = (
    "2025-06-01 10:00:04,321 - INFO - Decode batch, #running-req: 1, #token: 710, token usage: 0.01, "
    "accept len: 2.00, accept rate: 0.25, cuda graph: True, gen throughput (token/s): 85.00, #queue-req: 0,"
)
ITER_DECODE = (
    "[2025-09-01 11:00:00 TP0] Decode batch [4040], #running-req: 1, #full token: 800, full token usage: 0.02, "
    "#swa token: 120, swa token usage: 0.01, accept len: 3.00, accept rate: 0.50, cuda graph: True, "
    "gen throughput (token/s): 120.00, #queue-req: 0, "
)
OLDEST_PREFILL = (
    "[2024-09-01 09:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, "
    "cache hit rate: 12.50%, token usage: 0.00, #running-req: 0, #queue-req: 0"
)
NEW_PREFILL = (
    "[2025-06-01 09:59:58 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00, "
)
CAPTURE = "[2025-06-01 09:59:40 TP0] Capture cuda graph end. Time elapsed: 12.34 s. mem usage=1.20 GB. avail mem=40.10 GB."
READY = "[2025-06-01 09:59:59] The server is fired up and ready to roll!"
ACCESS_503 = '[2025-06-01 09:59:50] INFO:     127.0.0.1:54321 - "GET /health_generate HTTP/1.1" 503 Service Unavailable'
ACCESS_200 = 'INFO:     127.0.0.1:54322 - "GET /health HTTP/1.1" 200 OK'


def _batch(text: str) -> BatchLine:
    item = parse_line(text, 1)
    assert isinstance(item, BatchLine), text
    return item


def test_new_decode_line_every_field() -> None:
    b = _batch(NEW_DECODE)
    assert (b.kind, b.timestamp, b.ranks) == ("decode", "2025-06-01 10:00:00", {"TP": 0})
    assert (b.running_req, b.num_token, b.queue_req) == (1, 530, 0)
    assert b.token_usage == pytest.approx(0.01)
    assert b.accept_len == pytest.approx(2.43) and b.accept_rate == pytest.approx(0.36)
    assert b.cuda_graph is True and b.gen_throughput == pytest.approx(88.91)


def test_dp_ranks_and_false_graph() -> None:
    b = _batch(DP_DECODE)
    assert b.ranks == {"DP": 1, "TP": 1}
    assert b.cuda_graph is False and b.queue_req == 2


def test_old_period_format_lacks_spec_fields() -> None:
    b = _batch(OLD_DECODE)
    assert b.kind == "decode" and b.timestamp == "2024-11-02 09:00:05"
    assert b.accept_len is None and b.accept_rate is None and b.cuda_graph is None
    assert b.gen_throughput == pytest.approx(31.54)


def test_bare_timestamp_prefix_and_missing_accept_rate() -> None:
    b = _batch(MID_DECODE)
    assert b.timestamp == "2025-02-10 08:00:00" and b.ranks == {}
    assert b.accept_len == pytest.approx(3.10) and b.accept_rate is None


def test_collector_timestamp_in_front_keeps_sglangs_own() -> None:
    b = _batch(COLLECTOR_DECODE)
    assert b.timestamp == "2025-06-01 10:00:02" and b.ranks == {"TP": 0}
    assert b.accept_len == pytest.approx(2.57)


@pytest.mark.parametrize(
    ("line", "stamp"), [(PYLOG_DECODE, "06-01 10:00:03"), (PYLOG2_DECODE, "2025-06-01 10:00:04,321")]
)
def test_plain_python_logging_prefixes(line: str, stamp: str) -> None:
    b = _batch(line)
    assert b.timestamp == stamp and b.cuda_graph is True and b.running_req == 1


def test_iteration_counter_and_hybrid_token_fields() -> None:
    b = _batch(ITER_DECODE)
    assert b.num_token == 800 and b.token_usage == pytest.approx(0.02)
    assert b.accept_len == pytest.approx(3.0) and b.raw["#swa token"] == "120"


def test_prefill_lines_old_and_new() -> None:
    old = _batch(OLDEST_PREFILL)
    assert old.kind == "prefill" and old.new_token == 7
    assert old.cache_hit_rate == pytest.approx(0.125)
    assert old.cuda_graph is None and not old.looks_like_health_check
    new = _batch(NEW_PREFILL)
    assert new.cuda_graph is False and new.input_throughput == 0.0
    assert new.cache_hit_rate is None and new.looks_like_health_check


def test_markers_and_access_lines() -> None:
    cap = parse_line(CAPTURE, 3)
    assert cap == Marker("graph_captured", 3, "2025-06-01 09:59:40", 12.34)
    assert parse_line(READY, 4) == Marker("ready", 4, "2025-06-01 09:59:59")
    assert parse_line(ACCESS_503, 5) == HealthRequest("/health_generate", 503, 5)
    assert parse_line(ACCESS_200, 6) == HealthRequest("/health", 200, 6)
    assert parse_line("[2025-06-01 09:59:00 TP0] Load weight end. type=LlamaForCausalLM", 1) is None


def test_summary_of_a_start_up_and_serving_log(tmp_path: Path) -> None:
    lines = [
        "[2025-06-01 09:59:00 TP0] Load weight begin. avail mem=70.00 GB",
        CAPTURE,
        ACCESS_503,
        NEW_PREFILL,  # health-check prefill before ready, eager
        NEW_PREFILL,
        OLDEST_PREFILL,  # the warm-up request (7 tokens): not a health check
        READY,
        ACCESS_200,
        NEW_PREFILL,  # after ready: normal
        NEW_DECODE,
        DP_DECODE,
        OLD_DECODE,
        MID_DECODE,
        "garbage \x00 line",
    ]
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    s = read_sglang_log(path)
    assert (s.decode_lines, s.prefill_lines) == (4, 4)
    assert s.accept_len_mean == pytest.approx((2.43 + 1.88 + 3.10) / 3)
    assert s.accept_rate_mean == pytest.approx((0.36 + 0.22) / 2)
    assert s.gen_throughput_mean == pytest.approx((88.91 + 51.20 + 31.54 + 160.0) / 4)
    assert s.cuda_graph_fraction == pytest.approx(2 / 3)
    assert s.cache_hit_rate_mean == pytest.approx(0.125)
    assert (s.graph_captured_line, s.ready_line, s.capture_seconds) == (2, 7, 12.34)
    assert s.prefills_before_ready == 3
    assert s.health_check_prefills_before_ready == 2
    assert s.eager_health_check_prefills_before_ready == 2
    assert s.health_requests_before_ready == 1 and s.health_generate_requests == 1
    assert s.first_timestamp == "2025-06-01 09:59:40"
    assert any("2 health-check prefill(s) ran before the server was ready" in w for w in s.warnings)
    assert any("/health_generate" in w for w in s.warnings)
    assert any("33% of decode lines" in w for w in s.warnings)


def test_figures_absent_from_every_line_are_none_not_zero() -> None:
    s = SglangLogScanner().feed_all([OLD_DECODE, OLDEST_PREFILL]).summary()
    assert s.decode_lines == 1 and s.prefill_lines == 1
    assert s.accept_len_mean is None and s.accept_rate_mean is None
    assert s.cuda_graph_fraction is None and s.input_throughput_mean is None
    assert s.ready_line is None and s.warnings == ()


def test_empty_log_and_missing_file(tmp_path: Path) -> None:
    s = SglangLogScanner().feed_all([]).summary()
    assert (s.decode_lines, s.prefill_lines, s.gen_throughput_mean) == (0, 0, None)
    with pytest.raises(EagleLabError):
        read_sglang_log(tmp_path / "missing.log")


# Real logs, as posted in public SGLang threads (sources in each file's header).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def test_real_log_health_checks_during_warm_up_are_flagged() -> None:
    """sgl-project/sglang PR #30047: /health_generate polled during warm-up (503), then a health-check
    generation logged as a prefill with "npu graph: False" (line 9 of the file)."""
    s = read_sglang_log(EXAMPLES / "sglang_health_checks_during_warmup.log")
    assert (s.prefill_lines, s.decode_lines, s.ready_line) == (2, 0, 8)
    assert s.eager_health_check_prefill_lines == (9,)  # not line 6: the server's own warm-up request
    assert s.health_requests_before_ready == 1 and s.health_generate_requests == 2
    assert any("ran as eager prefills (graph: False; log line(s) 9)" in w and "eaglelab wait-ready" in w
               for w in s.warnings)
    assert any("polled the server while it was still warming up (before line 8" in w for w in s.warnings)


def test_real_log_without_health_checks_has_nothing_to_flag() -> None:
    """sgl-project/sglang issue #36081: eager long prefills are normal, the speculative decode is on graphs."""
    s = read_sglang_log(EXAMPLES / "sglang_serving_no_health_checks.log")
    assert (s.accept_len_mean, s.accept_rate_mean, s.cuda_graph_fraction) == (5.51, 0.90, 1.0)
    assert s.eager_health_check_prefill_lines == () and s.warnings == ()
