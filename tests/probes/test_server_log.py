"""Server logs as updates: vLLM's SpecDecoding / Engine lines in each known format, its CUDA-graph
table, and SGLang's Decode lines through the same parser ``report`` uses."""

from __future__ import annotations

import pytest

from eaglelab.probes.server_log import ServerLogWatch, parse_vllm_spec, vllm_spec_reading
from eaglelab.probes.server_totals import ServerTotals
from tests.loopback import FIXTURES

CURRENT = (
    "(APIServer pid=7) INFO 11-30 10:01:25 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 2.16, "
    "Accepted throughput: 15.00 tokens/s, Drafted throughput: 38.70 tokens/s, Accepted: 150 tokens, "
    "Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264, Avg Draft acceptance rate: 38.8%"
)
EARLIER = (
    "INFO 06-06 14:20:34 [metrics.py:86] SpecDecoding metrics: Draft acceptance rate: 38.8%, Mean acceptance "
    "length: 2.16, Accepted: 150 tokens, Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264"
)
FIRST = "INFO 04-02 18:03:41 [metrics.py:53] SpecDecoding metrics: Draft acceptance rate: 38.8%, Accepted: 150 tokens, Drafted: 387 tokens"
IDLE = "INFO 04-02 18:03:51 [metrics.py:53] SpecDecoding metrics: Draft acceptance rate: nan%, Accepted: 0 tokens, Drafted: 0 tokens"
SGLANG_DP = (
    "[2025-06-01 10:00:01 DP1 TP1] Decode batch, #running-req: 3, #token: 4096, token usage: 0.05, "
    "accept len: 1.88, accept rate: 0.22, cuda graph: False, gen throughput (token/s): 51.20, #queue-req: 2, "
)


@pytest.mark.parametrize("line", [CURRENT, EARLIER])
def test_vllm_spec_line_with_mean_length(line: str) -> None:
    spec = parse_vllm_spec(line)
    assert spec is not None and spec.mean_accept_len == 2.16
    assert (spec.accepted, spec.drafted) == (150, 387) and spec.draft_accept_rate == pytest.approx(0.388)
    assert spec.per_position == (0.543, 0.357, 0.264)
    reading = vllm_spec_reading(spec, "engine 0")
    assert reading is not None and reading.accept_len == 2.16
    assert reading.accept_rate == pytest.approx(150 / 387)
    assert reading.drafts == pytest.approx(150 / 1.16)  # accepted / (mean - 1): the drafts the line covers


def test_first_vllm_format_has_a_rate_but_no_length() -> None:
    reading = vllm_spec_reading(parse_vllm_spec(FIRST), "engine 0")  # type: ignore[arg-type]
    assert reading is not None and reading.accept_len is None and reading.accept_rate == pytest.approx(150 / 387)


def test_an_idle_vllm_interval_is_no_reading() -> None:
    assert vllm_spec_reading(parse_vllm_spec(IDLE), "engine 0") is None  # type: ignore[arg-type]
    assert parse_vllm_spec("INFO something else") is None


def test_the_vllm_fixture_log_end_to_end() -> None:
    watch, totals = ServerLogWatch(), ServerTotals()
    for i, line in enumerate((FIXTURES / "vllm.log").read_text().split("\n")):
        update = watch.feed(line, float(i))
        if update is not None:
            totals.observe(update)
    assert totals.engine == "vllm"
    drafts = (850 / 1.70, 300 / 1.50)  # 500 and 200 drafts
    assert totals.accept_len == pytest.approx((2.70 * drafts[0] + 2.50 * drafts[1]) / sum(drafts))
    assert totals.accept_rate == pytest.approx((850 + 300) / (1500 + 600))
    assert totals.per_position == pytest.approx(tuple((a * 500 + b * 200) / 700 for a, b in
                                                      ((0.76, 0.70), (0.56, 0.50), (0.38, 0.30))))
    assert totals.recent_tokens_per_s == 0.0 and totals.tokens_per_s == pytest.approx((210.4 + 198.2 + 0.0) / 3)
    assert dict(totals.graph_modes) == {"FULL": 480.0, "NONE": 20.0}
    assert totals.cuda_graph_share == pytest.approx(480 / 500)
    (row,) = totals.rank_rows()
    assert row.rank == "engine 0" and row.running_reqs == 0


def test_engine_index_names_the_rank_of_the_spec_line_after_it() -> None:
    watch = ServerLogWatch()
    engine = watch.feed("INFO 11-30 10:00:00 [loggers.py:1] Engine 001: Avg prompt throughput: 1.0 tokens/s, "
                        "Avg generation throughput: 99.5 tokens/s, Running: 3 reqs, Waiting: 0 reqs", 0.0)
    assert engine is not None and engine.readings[0].rank == "engine 1" and engine.readings[0].gen_tokens_per_s == 99.5
    spec = watch.feed(CURRENT, 1.0)
    assert spec is not None and spec.readings[0].rank == "engine 1"


def test_sglang_decode_lines_use_the_report_parser() -> None:
    watch = ServerLogWatch()
    update = watch.feed(SGLANG_DP, 0.0)
    assert update is not None and update.engine == "sglang"
    (r,) = update.readings
    assert r.rank == "DP1 TP1" and r.accept_len == 1.88 and r.accept_rate == 0.22 and r.gen_tokens_per_s == 51.2
    assert (r.cuda_graph_passes, r.eager_passes) == (0.0, 1.0) and r.running_reqs == 3
    prefill = watch.feed("[2025-06-01 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, "
                         "token usage: 0.00, #running-req: 0, #queue-req: 0,", 1.0)
    assert prefill is not None and prefill.readings == ()
    assert watch.feed("random noise | 1 | 2 |", 2.0) is None
