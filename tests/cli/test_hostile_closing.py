"""The hostile-input sweep's closing leftovers (issue #39): a host name whose lookup never ends, a server log
read whole into memory, check-wiring's own prompts past a small target's window. Each test failed before
its fix."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest

from tests.cli.hostile_inputs import assert_handled, flat, Outcome, run_cli

GUARD_S = 60.0  # far past every deadline below: the guard only proves the command returned at all


@pytest.fixture
def dns_hangs(monkeypatch):
    """``socket.getaddrinfo`` blocks for names (as behind a dead DNS server) until the test ends. Each test has its
    own table of lookups in flight: one a test before abandoned may not have seen its release yet, and reusing it
    (as a poller should) would fail at once with the release's error instead of waiting out the deadline."""
    from eaglelab.probes import http_get

    real, release = socket.getaddrinfo, threading.Event()
    monkeypatch.setattr(http_get, "_lookups", {})

    def slow(host, *args, **kwargs):
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, *args, **kwargs)
        release.wait()
        raise socket.gaierror(socket.EAI_AGAIN, "lookup abandoned by the test")

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    yield
    release.set()


def _run_guarded(argv: list[str], capsys) -> Outcome:
    """``run_cli`` in a thread, failing the test (not hanging it) if the command does not return."""
    box: list[Outcome] = []
    worker = threading.Thread(target=lambda: box.append(run_cli(argv, capsys)), daemon=True)
    worker.start()
    worker.join(GUARD_S)
    assert box, f"{argv} still running after {GUARD_S:g} s: the lookup is not bounded"
    return box[0]


# ---- 1. name resolution under the request deadline --------------------------------------------------------


def test_http_get_bounds_a_hanging_lookup_by_its_deadline(dns_hangs):
    from eaglelab.probes import http_get

    with pytest.raises(http_get.RequestFailed) as caught:
        http_get.get("http://slow-dns.example:30000/v1/models", deadline_s=0.3, max_bytes=100)
    assert "'slow-dns.example' did not resolve within the 0.3 s deadline" in str(caught.value)


def test_wait_ready_with_a_hanging_lookup_times_out_naming_the_host(dns_hangs, capsys):
    argv = ["wait-ready", "http://slow-dns.example:30000", "--timeout", "0.5", "--interval", "0.1"]
    o = _run_guarded(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 1, text
    assert re.search(r"'slow-dns\.example' did not resolve within the 0\.[1-5] s deadline", text), text


def test_report_url_with_a_hanging_lookup_exits_2_naming_the_host(dns_hangs, capsys):
    argv = ["report", "http://slow-dns.example:30000/metrics", "--window", "0"]
    o = _run_guarded(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2, text
    assert "'slow-dns.example' did not resolve within the 5 s deadline" in text, text


def test_an_ip_address_is_not_looked_up(dns_hangs):
    """127.0.0.1 goes straight to connect (refused here), never to the hanging resolver."""
    from eaglelab.probes import http_get

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(http_get.RequestFailed, match="refused"):
        http_get.get(f"http://127.0.0.1:{port}/", deadline_s=5.0, max_bytes=100)


# ---- 2. a server log is streamed, never read whole --------------------------------------------------------


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_report_on_a_big_log_holds_far_less_than_the_file(kind, tmp_path, capsys):
    """An 8 MB log (a small log repeated 8 MB over): the report's figures equal the small log's (counts times the
    repeats) and the memory it allocates peaks far below the file's size (it held the whole text, and every
    parsed line, before)."""
    import json
    import tracemalloc

    from tests.probes.test_log_lines import EXAMPLES

    small = tmp_path / "small.log"
    if kind == "sglang":
        small.write_text(next(p for p in EXAMPLES if "serving" in p.name).read_text())
    else:
        small.write_text((Path(__file__).parents[1] / "fixtures" / "server" / "vllm.log").read_text())
    one = small.read_text()
    repeats = (8 << 20) // len(one) + 1
    big = tmp_path / "big.log"
    big.write_text(one * repeats)
    small_o = run_cli(["report", str(small), "--json"], capsys)  # also imports every module before the count
    tracemalloc.start()
    try:
        o = run_cli(["report", str(big), "--json"], capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_handled(o, ["report", "--json"])
    assert o.rc == 0 == small_o.rc, o.err
    assert peak < big.stat().st_size / 4, f"peak {peak / 2**20:.1f} MiB for a {big.stat().st_size / 2**20:.0f} MiB log"
    got, want = json.loads(o.out), json.loads(small_o.out)
    assert got["source"] == want["source"]
    for key in ("accept_len_mean", "accept_rate_mean", "gen_throughput_mean", "cuda_graph_fraction"):
        assert want[key] is not None and got[key] == pytest.approx(want[key], rel=1e-9), key
    if kind == "sglang":
        assert got["decode_lines"] == repeats * want["decode_lines"] > 1000


# ---- 3. check-wiring's own prompts and the context window -------------------------------------------------


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    from tests.cli.hostile_inputs import make_inputs
    from tests.conftest import add_word_tokenizer, tiny_config

    inputs = make_inputs(tmp_path_factory.mktemp("hostile_closing"))
    add_word_tokenizer(inputs.target, vocab=tiny_config()["vocab_size"])
    return inputs


def test_check_wiring_refuses_new_tokens_past_the_window_before_generating(valid, capsys, monkeypatch):
    """No --texts, no --data: the built-in prompts plus --new-tokens 300 for a 256-token target is exit 2 naming
    --new-tokens, the window and the most that fits, before the target generates a token."""
    from eaglelab.probes import tap_search

    def no_generation(*args, **kwargs):
        raise AssertionError("generated past the window")

    monkeypatch.setattr(tap_search, "target_texts", no_generation)
    argv = ["check-wiring", str(valid.drafter), "--target", str(valid.target), "--search", "--new-tokens", "300"]
    for extra in ([], ["--json"]):
        o = run_cli(argv + extra, capsys)
        assert_handled(o, argv + extra)
        text = flat(o.out + o.err)
        assert o.rc == 2, text
        assert "--new-tokens" in text and "<= 256" in text and "max_position_embeddings" in text, text
        assert re.search(r"use --new-tokens \d+ or less", text), text


def test_check_wiring_with_new_tokens_that_fit_still_runs(valid, capsys):
    argv = ["check-wiring", str(valid.drafter), "--target", str(valid.target), "--search", "--new-tokens", "8", "--json"]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    assert o.rc in (0, 1, 4), o.err


def test_check_wiring_refuses_a_built_in_prompt_past_a_small_window():
    """A target whose window is shorter than a built-in prompt: the error names --texts (the way out), not PROMPT."""
    from types import SimpleNamespace

    from eaglelab.check_wiring_search import _check_window
    from eaglelab.engine.errors import EagleLabError

    with pytest.raises(EagleLabError) as err:
        _check_window([[1] * 3, [1] * 9], 0, SimpleNamespace(max_position_embeddings=8))
    assert (err.value.field, err.value.found) == ("--texts", "9 tokens")
    assert "--texts FILE" in err.value.hint
