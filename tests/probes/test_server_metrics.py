"""Watching a server's /metrics: the exposition parser, vLLM and SGLang pages, rates between polls,
restarts, garbage, and the conversion of vLLM's counters into our acceptance definitions, checked
against :class:`AcceptanceStats` (what our own runs report)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.acceptance import AcceptanceStats
from eaglelab.probes.prom_text import parse_exposition
from eaglelab.probes.server_metrics import (
    MetricsError,
    MetricsWatch,
    ServerUnreachable,
    fetch_metrics,
    metrics_url,
    parse_scrape,
)
from eaglelab.probes.server_readings import histogram_from_reach
from eaglelab.probes.server_totals import ServerTotals
from tests.loopback import ScriptedServer, closed_port_url, page

# -- the text format ---------------------------------------------------------------------------


def test_exposition_reads_labels_escapes_specials_and_lists_bad_lines() -> None:
    text = (
        "# HELP x A help line.\n# TYPE x counter\n"
        'x_total{a="1",b="q\\"uote\\\\back\\nline"} 3.5 1700000000000\n'
        "y NaN\ny{z=\"\"} +Inf\nz -Inf\n"
        "this is not a sample\n"
        '{a="1"} 2\n'
    )
    page_ = parse_exposition(text)
    x = page_.named("x_total")[0]
    assert x.value == 3.5 and x.label("b") == 'q"uote\\back\nline' and x.label("a") == "1"
    assert page_.types == {"x": "counter"}
    assert page_.named("z")[0].value == float("-inf") and page_.named("y")[1].value == float("inf")
    assert page_.named("y")[0].value != page_.named("y")[0].value  # NaN
    assert page_.bad_lines == (7, 8)


label_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(labels=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), label_text, max_size=4),
       value=st.floats(allow_nan=False, width=64))
def test_any_label_value_survives_the_escaping(labels: dict[str, str], value: float) -> None:
    """A sample written the way exporters escape it reads back as it was."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
    sample = parse_exposition(f"m{{{body}}} {value!r}\n").samples[0]
    assert dict(sample.labels) == labels and sample.value == value


# -- vLLM --------------------------------------------------------------------------------------


def test_vllm_first_page_gives_since_start_figures_without_a_rate() -> None:
    update = MetricsWatch().observe(page("vllm_metrics_1.txt"), 0.0)
    (r,) = update.readings
    assert update.engine == "vllm" and update.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.rank == "engine 0" and r.drafts == 1200
    assert r.accept_len == pytest.approx(1 + 1980 / 1200)  # 2.65, the bonus token included
    assert r.accept_rate == pytest.approx(1980 / 3600)
    assert r.per_position == pytest.approx((900 / 1200, 650 / 1200, 430 / 1200))
    assert r.gen_tokens_per_s is None and update.gen_tokens_per_s is None


def test_vllm_rates_come_from_counter_deltas_between_polls() -> None:
    watch = MetricsWatch()
    watch.observe(page("vllm_metrics_1.txt"), 100.0)
    update = watch.observe(page("vllm_metrics_2.txt"), 110.0)
    (r,) = update.readings
    assert r.drafts == 500 and r.draft_tokens == 1500
    assert r.accept_len == pytest.approx(1 + 850 / 500)
    assert r.accept_rate == pytest.approx(850 / 1500)
    assert r.per_position == pytest.approx((0.76, 0.56, 0.38))
    assert r.gen_tokens_per_s == pytest.approx(1350 / 10) and update.gen_tokens_per_s == pytest.approx(135.0)
    assert r.running_reqs == 4 and not update.reset


def test_a_restarted_vllm_server_starts_the_figures_over() -> None:
    watch, totals = MetricsWatch(), ServerTotals()
    for t, name in ((0.0, "vllm_metrics_1.txt"), (10.0, "vllm_metrics_2.txt")):
        totals.observe(watch.observe(page(name), t))
    update = watch.observe(page("vllm_metrics_restarted.txt"), 20.0)
    assert update.reset and "restarted" in (update.status or "")
    assert "went from" in (update.status or "")
    totals.observe(update)
    assert totals.resets == 1
    assert totals.accept_len == pytest.approx(1 + 30 / 40)  # the restarted server's own figures only
    after = watch.observe(page("vllm_metrics_restarted.txt"), 30.0)
    assert not after.reset and after.readings[0].accept_len is None  # idle: nothing drafted since


def test_a_restart_is_caught_by_created_times_after_counters_passed_the_old_values() -> None:
    watch = MetricsWatch()
    watch.observe(page("vllm_metrics_1.txt"), 0.0)
    later = page("vllm_metrics_2.txt").replace("1764520000.0", "1764520900.0")  # counters made anew
    update = watch.observe(later, 60.0)
    assert update.reset and "created anew" in (update.status or "")
    assert update.readings[0].accept_len == pytest.approx(1 + 2830 / 1700)  # the new process's since-start


def simulate_vllm_counters(cycles: list[int], k: int) -> tuple[str, AcceptanceStats]:
    """A vLLM page for chain cycles with accepted lengths ``cycles`` (bonus included), k draft tokens.

    vLLM's scheduler does, per request per step: drafts += 1, draft_tokens += k,
    accepted += a - 1, per_pos[i] += 1 for i < a - 1. Our engine's Step says the same cycle has
    accept_len = a and num_draft_tokens = k + 1 (root included).
    """
    drafts, accepted, per_pos = len(cycles), sum(a - 1 for a in cycles), [0] * k
    for a in cycles:
        for i in range(a - 1):
            per_pos[i] += 1
    lines = [
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {float(drafts)}',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {float(drafts * k)}',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {float(accepted)}',
    ] + [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {float(n)}'
         for i, n in enumerate(per_pos)]
    ours = AcceptanceStats()

    class Cycle:
        kind, num_draft_tokens = "spec", k + 1

        def __init__(self, a: int) -> None:
            self.accept_len = (a,)

    for a in cycles:
        ours.observe_step(Cycle(a))
    return "\n".join(lines) + "\n", ours


@settings(max_examples=80, deadline=None)
@given(data=st.data(), k=st.integers(1, 6))
def test_vllm_counters_convert_to_our_acceptance_definitions(data: st.DataObject, k: int) -> None:
    """Mean accepted length, accept rate, per-position acceptance and the histogram read from vLLM's
    counters equal what AcceptanceStats computes from the same cycles."""
    cycles = data.draw(st.lists(st.integers(1, k + 1), min_size=1, max_size=60))
    text, ours = simulate_vllm_counters(cycles, k)
    totals = ServerTotals()
    totals.observe(MetricsWatch().observe(text, 0.0))
    assert totals.accept_len == pytest.approx(ours.mean_accept_len)
    assert totals.accept_rate == pytest.approx(ours.accept_rate)
    assert totals.per_position == pytest.approx(ours.per_position_rate(k))
    expected = {a: float(ours.histogram.get(a, 0)) for a in range(1, k + 2)}
    assert dict(totals.histogram) == pytest.approx(expected)


def test_non_finite_values_are_ignored() -> None:
    text = page("vllm_metrics_1.txt").replace("vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1980.0",
                                             "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} NaN")
    assert "NaN" in text
    (r,) = MetricsWatch().observe(text, 0.0).readings
    assert r.accept_len is None and r.drafts == 1200


def test_histogram_from_reach_worked_example() -> None:
    assert histogram_from_reach(10, (6, 2)) == (4, 4, 2)


def test_vllm_without_speculation_says_so() -> None:
    text = '# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{engine="0",model_name="m"} 5.0\n'
    update = MetricsWatch().observe(text, 0.0)
    assert "without speculative decoding" in (update.status or "")
    assert all(r.accept_len is None for r in update.readings)


# -- SGLang ------------------------------------------------------------------------------------


def test_sglang_gauges_are_our_figures_and_graph_passes_come_from_deltas() -> None:
    watch = MetricsWatch()
    first = watch.observe(page("sglang_metrics_1.txt"), 0.0)
    assert first.engine == "sglang" and first.readings[0].rank == "TP0"
    update = watch.observe(page("sglang_metrics_2.txt"), 10.0)
    (r,) = update.readings
    assert r.accept_len == 2.51 and r.accept_rate == 0.38  # SGLang's accept length counts the bonus
    assert r.gen_tokens_per_s == pytest.approx(90.2)
    assert (r.cuda_graph_passes, r.eager_passes) == (120, 40) and r.cuda_graph_share == pytest.approx(0.75)
    assert update.gen_tokens_per_s == pytest.approx(900 / 10)


def test_sglang_mode_never_seen_counts_zero_passes() -> None:
    """prometheus_client shows a labelled series only once used: no decode_none line, no eager pass."""
    text = "\n".join(line for line in page("sglang_metrics_1.txt").split("\n") if 'mode="decode_none"' not in line)
    (r,) = MetricsWatch().observe(text, 0.0).readings
    assert (r.cuda_graph_passes, r.eager_passes) == (400, 0) and r.cuda_graph_share == 1.0


def test_sglang_idle_server_reports_no_stale_acceptance() -> None:
    """Its gauges keep the last decode interval's values; with no token generated they are not news."""
    watch = MetricsWatch()
    watch.observe(page("sglang_metrics_2.txt"), 0.0)
    update = watch.observe(page("sglang_metrics_2.txt"), 5.0)
    assert update.readings[0].accept_len is None and update.readings[0].gen_tokens_per_s is None
    assert update.gen_tokens_per_s == 0.0


def test_sglang_ranks_are_named_by_their_labels() -> None:
    scrape = parse_scrape(page("sglang_metrics_dp.txt"), 0.0)
    assert sorted(scrape.ranks) == ["DP0 TP0", "DP1 TP1"]
    totals = ServerTotals()
    totals.observe(MetricsWatch().observe(page("sglang_metrics_dp.txt"), 0.0))
    rows = {r.rank: r for r in totals.rank_rows()}
    assert rows["DP0 TP0"].accept_len == 1.88 and rows["DP1 TP1"].cuda_graph_share == pytest.approx(0.95)
    assert totals.accept_len == pytest.approx((1.88 + 2.1) / 2)
    assert totals.recent_tokens_per_s == pytest.approx(51.2 + 60.4)


# -- what is not a metrics page ----------------------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ("", "an empty answer"),
    ("<!doctype html><html><body>Not Found</body></html>", "HTML"),
    ("Traceback (most recent call last):\n  oops\n", "no Prometheus samples"),
    ("node_cpu_seconds_total{cpu=\"0\"} 1.0\n", "not a vLLM or SGLang"),
])
def test_garbage_is_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(MetricsError, match=words):
        MetricsWatch().observe(text, 0.0)


def test_metrics_url_adds_the_path_and_refuses_other_schemes() -> None:
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:1/") == "http://h:1/metrics"
    assert metrics_url("https://h/custom/metrics") == "https://h/custom/metrics"
    with pytest.raises(EagleLabError, match="not a server URL"):
        metrics_url("ftp://h/metrics")


def test_fetch_reads_a_loopback_server_and_names_what_went_wrong() -> None:
    with ScriptedServer([(200, page("vllm_metrics_1.txt"))]) as server:
        assert "vllm:spec_decode_num_drafts_total" in fetch_metrics(server.url + "/metrics")
        with pytest.raises(ServerUnreachable, match="HTTP 404.*--enable-metrics"):
            fetch_metrics(server.url + "/nothing")
    with pytest.raises(ServerUnreachable, match="cannot reach"):
        fetch_metrics(closed_port_url(), timeout_s=2.0)
