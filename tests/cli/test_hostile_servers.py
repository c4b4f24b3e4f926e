"""Hostile servers and server files, second sweep (issue #39): ``report URL``, ``wait-ready`` and
``tui --server`` against servers that trickle, stream without end, send endless headers or garbage;
``/metrics`` pages and vLLM logs with values no server should print; flags that are not numbers a
watch can use. Each case failed (a hang, an internal error, a wrong verdict, an unclear message)
before its fix. Only 127.0.0.1; every wait is bounded by ``bounded`` (a hang detector, not a timer).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.hostile_inputs import assert_handled, flat, run_cli
from tests.cli.test_hostile_properties import TRIED, bounded
from tests.loopback import FIXTURES, MISBEHAVIOURS, MisbehavingServer, ScriptedServer, page

HANGS = ("trickle_body", "trickle_headers")  # a per-read timeout never fires on these: they hung


# ---- misbehaving servers: every request ends, with a message --------------------------------------------


@pytest.mark.parametrize("mode", MISBEHAVIOURS)
def test_report_url_ends_on_any_misbehaving_server(mode, capsys) -> None:
    with MisbehavingServer(mode) as server, bounded(30):
        argv = ["report", server.url, "--window", "0", "--json"]
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    out = json.loads(outcome.out)
    assert outcome.rc == 2 and out["field"] == "URL" and "could not be read" in out["error"]
    assert server.url in flat(outcome.err)


@pytest.mark.parametrize("mode", MISBEHAVIOURS)
def test_wait_ready_ends_on_time_on_any_misbehaving_server(mode, capsys) -> None:
    with MisbehavingServer(mode) as server, bounded(30):
        argv = ["wait-ready", server.url, "--timeout", "1", "--interval", "0.2"]
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 1 and "not ready" in flat(outcome.out)


@pytest.mark.parametrize("mode", HANGS + ("endless_headers", "garbage"))
def test_tui_poller_records_the_problem_and_returns(mode) -> None:
    from eaglelab.tui.server_feeds import MetricsPoller

    with MisbehavingServer(mode) as server, bounded(30):
        poller = MetricsPoller(server.url + "/metrics", timeout_s=1.0)
        poller.poll_once()
    assert poller.problem is not None and poller.problem.startswith("server down") and "please report" not in poller.problem


def test_the_deadline_is_per_request_not_per_read() -> None:
    """A server sending a byte every 20 ms never lets a per-read timeout fire; the request still ends,
    saying why, and no figure comes from the half page."""
    from eaglelab.probes.server_metrics import ServerUnreachable, fetch_metrics

    with MisbehavingServer("trickle_body") as server, bounded(30):
        with pytest.raises(ServerUnreachable, match="no complete answer within 0.5 s"):
            fetch_metrics(server.url + "/metrics", timeout_s=0.5)
        assert server.connections == 1


def test_a_body_shorter_than_announced_is_not_read_as_a_page() -> None:
    from eaglelab.probes.server_metrics import ServerUnreachable, fetch_metrics

    with MisbehavingServer("short_body") as server, bounded(30):
        with pytest.raises(ServerUnreachable, match="cut short: 9 bytes of the 1000"):
            fetch_metrics(server.url + "/metrics", timeout_s=2.0)


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "https://127.0.0.1:1"])
def test_report_on_a_url_that_cannot_be_used_names_the_url(url, capsys) -> None:
    """An unclosed IPv6 bracket or a port past 65535 was an internal error (ValueError from urllib)."""
    argv = ["report", url, "--window", "0"]
    with bounded(30):
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 2 and "'URL'" in outcome.err and url in flat(outcome.err)


# ---- flags --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, value", [
    ("--window", "nan"), ("--window", "inf"), ("--window", "-1"), ("--window", "1e12"),
    ("--baseline-tok-s", "nan"), ("--baseline-tok-s", "inf"), ("--baseline-tok-s", "0"), ("--baseline-tok-s", "-5"),
])
def test_report_flags_a_watch_cannot_use_are_exit_2(flag, value, capsys) -> None:
    """``--window nan`` was an internal error (sleep(nan)), ``1e12`` slept for ever, ``-1`` silently read
    once; ``--baseline-tok-s nan`` gave "slower than plain decoding: nanx"."""
    with ScriptedServer([(200, page("vllm_metrics_1.txt"))]) as server, bounded(30):
        argv = ["report", server.url, flag, value]
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 2 and flag in flat(outcome.err) and f"found: {float(value)!r}" in flat(outcome.err)


@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_baseline_on_a_log_never_gives_a_nan_verdict(value, capsys) -> None:
    argv = ["report", str(FIXTURES / "vllm.log"), "--baseline-tok-s", value, "--json"]
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    out = json.loads(outcome.out)
    assert outcome.rc == 2 and out["verdict"] == "error" and out["field"] == "--baseline-tok-s"


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_tui_refuses_an_infinite_baseline(value) -> None:
    from eaglelab.cli import build_parser
    from eaglelab.cmd_tui import server_app_kwargs
    from eaglelab.engine.errors import EagleLabError

    args = build_parser().parse_args(["tui", "--server", "http://127.0.0.1:9", "--baseline-tok-s", value])
    with pytest.raises(EagleLabError, match="--baseline-tok-s"):
        server_app_kwargs(args)


# ---- values no server should print ---------------------------------------------------------------------------

VLLM_PAGE = page("vllm_metrics_2.txt")
DRAFTS = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1700.0'


@pytest.mark.parametrize("text, said", [
    (VLLM_PAGE + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="²"} 5\n', None),
    (VLLM_PAGE + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="99999999999"} 5\n', None),
    (VLLM_PAGE.replace(DRAFTS, DRAFTS.replace("1700.0", "1e308")) + DRAFTS.replace('"0"', '"1"').replace("1700.0", "1e308")
     + '\nvllm:spec_decode_num_accepted_tokens_total{engine="1"} 1e308\n', None),
    (VLLM_PAGE.replace("2830.0", "-5.0"), "inconclusive"),
    (VLLM_PAGE.replace("1700.0", "0.0"), "inconclusive"),
])
def test_a_metrics_page_with_impossible_values_is_never_an_internal_error(tmp_path, capsys, text, said) -> None:
    saved = tmp_path / "page.txt"
    saved.write_text(text)
    argv = ["report", str(saved), "--json"]
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    out = json.loads(outcome.out)
    assert outcome.rc == 0
    assert out["accept_len_mean"] is None or 1.0 <= out["accept_len_mean"] < 1e6
    if said:
        assert any(said in v for v in out["verdicts"])


VLLM_LOG = (FIXTURES / "vllm.log").read_text()


@pytest.mark.parametrize("old, new", [
    ("Mean acceptance length: 2.70", "Mean acceptance length: 1.2.3"),
    ("Mean acceptance length: 2.70", "Mean acceptance length: 0.50"),
    ("Avg generation throughput: 210.4 tokens/s", "Avg generation throughput: 1.2.3 tokens/s"),
    ("Per-position acceptance rate: 0.760", "Per-position acceptance rate: 0.7.6"),
    ("Avg Draft acceptance rate: 56.7%", "Avg Draft acceptance rate: 5.6.7%"),
])
def test_a_vllm_log_with_garbled_numbers_is_read(tmp_path, capsys, old, new) -> None:
    assert old in VLLM_LOG
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG.replace(old, new))
    argv = ["report", str(log), "--json"]
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    out = json.loads(outcome.out)
    assert outcome.rc == 0 and (out["accept_len_mean"] is None or out["accept_len_mean"] >= 1.0)


NUMBERS = ["1.2.3", "1e400", "-1e400", "1e308", "-1e308", "NaN", "+Inf", "-Inf", "0", "-1", "²", "0x10", "1_0", "",
           "99999999999999999999999", "5e-324"]
LABELS = ['position="²"', 'position="-1"', 'position="99999999999999"', 'engine="\\n"', 'tp_rank="x"', 'dp_rank="²"',
          'mode="decode_none"', 'position="0"']


@st.composite
def mutated_page(draw, text: str) -> str:
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if line.startswith("#") or " " not in line:
            continue
        head, _, _ = line.rpartition(" ")
        if draw(st.booleans()):
            lines[i] = f"{head} {draw(st.sampled_from(NUMBERS))}"
        else:
            brace = head.find("{")
            name = head[:brace] if brace >= 0 else head
            lines.insert(i, f"{name}{{{draw(st.sampled_from(LABELS))}}} {draw(st.sampled_from(NUMBERS))}")
    return "\n".join(lines)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_metrics_pages_and_vllm_logs(tmp_path_factory, capsys, data) -> None:
    """Any value or label a page or log may hold: exit 0 or 2, a finite accepted length >= 1, or none."""
    name = data.draw(st.sampled_from(["vllm_metrics_1.txt", "vllm_metrics_2.txt", "sglang_metrics_1.txt",
                                      "sglang_metrics_dp.txt", "vllm.log"]))
    text = page(name)
    if name.endswith(".log"):
        lines = text.split("\n")
        i = data.draw(st.integers(0, len(lines) - 1))
        at = data.draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:at] + data.draw(st.sampled_from(NUMBERS)) + lines[i][at:]
        text = "\n".join(lines)
    else:
        text = data.draw(mutated_page(text))
    work = tmp_path_factory.getbasetemp() / f"case_{name}"
    work.write_text(text)
    argv = ["report", str(work), "--json", "--baseline-tok-s", "100"]
    TRIED["server pages and logs"] += 1
    with bounded():
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    if outcome.rc == 0:
        length = json.loads(outcome.out)["accept_len_mean"]
        assert length is None or (math.isfinite(length) and length >= 1.0), length


# ---- issue #36: an idle window, and SGLang's TP ranks ------------------------------------------------------


def test_an_idle_vllm_window_shows_the_since_start_figures(capsys) -> None:
    """Counters that did not move in the window: every figure was "—" and the verdict "nothing to flag"."""
    with ScriptedServer([(200, page("vllm_metrics_2.txt"))]) as server, bounded(30):
        argv = ["report", server.url, "--window", "0.05", "--json"]
        outcome = run_cli(argv, capsys)
    out = json.loads(outcome.out)
    assert outcome.rc == 0
    assert out["accept_len_mean"] == pytest.approx(1 + 2830 / 1700)  # since the server started
    assert out["gen_throughput_mean"] == 0.0  # the window's rate: nothing generated
    assert out["details"]["since_start"]["accept_len"] == pytest.approx(1 + 2830 / 1700)
    assert any("idle" in n and "since the server started" in n for n in out["notes"])
    assert out["verdicts"] and all("nothing to flag" not in v for v in out["verdicts"])


def test_sglang_tp_ranks_of_one_dp_group_are_not_summed(tmp_path, capsys) -> None:
    """Two TP ranks of one DP group report the same batch: 82 tok/s each is 82 tok/s, not 164."""
    labels = 'model_name="m",engine_type="unified",tp_rank="{}",pp_rank="0",moe_ep_rank="0"'
    text = "".join(
        f"sglang:gen_throughput{{{labels.format(r)}}} 82.0\nsglang:spec_accept_length{{{labels.format(r)}}} 2.5\n"
        for r in (0, 1))
    saved = tmp_path / "tp2.txt"
    saved.write_text("# TYPE sglang:gen_throughput gauge\n" + text)
    out = json.loads(run_cli(["report", str(saved), "--json"], capsys).out)
    assert out["gen_throughput_mean"] == pytest.approx(82.0)
    dp = page("sglang_metrics_dp.txt")  # DP attention: two DP groups, each its own batches: summed
    saved.write_text(dp)
    assert json.loads(run_cli(["report", str(saved), "--json"], capsys).out)["gen_throughput_mean"] == pytest.approx(111.6)


# ---- names from a server or a record are text, not markup ---------------------------------------------------


def test_a_label_that_looks_like_markup_is_shown_as_it_is(tmp_path) -> None:
    """``engine="[/]"`` on a page crashed the TUI's rank table (rich read the name as a closing tag)."""
    import io

    from rich.console import Console

    from eaglelab.probes.server_metrics import MetricsWatch
    from eaglelab.tui.server_model import ServerModel
    from eaglelab.tui.w_ranks import RankTable

    text = page("vllm_metrics_2.txt").replace('engine="0"', 'engine="[/]"')
    model = ServerModel()
    model.apply_all([MetricsWatch().observe(text, 0.0)])
    out = io.StringIO()
    Console(file=out, width=120).print(RankTable.renderable_for(model.view()))
    assert "engine [/]" in out.getvalue()


def test_a_graph_phase_that_looks_like_markup_is_shown_as_it_is() -> None:
    import io

    from rich.console import Console

    from eaglelab.probes import events as ev
    from eaglelab.tui.model import RunModel
    from eaglelab.tui.w_graphs import GraphStatus

    model = RunModel()
    model.apply_all([ev.Step(0, "decode", {"decode": 1.0}, accept_len=(1,), graph={"[/]": "replay", "[b]x": "eager: y"})])
    out = io.StringIO()
    Console(file=out, width=120).print(GraphStatus().renderable_for(model.view()))
    assert "[/]" in out.getvalue() and "[b]x" in out.getvalue()
