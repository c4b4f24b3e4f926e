"""``eaglelab report`` for servers: a ``/metrics`` URL, a saved ``/metrics`` page, or a vLLM log.

- A URL is read twice, ``window_s`` apart, so throughput and acceptance describe that window (a
  window of 0 reads it once: acceptance since the server started, no throughput for vLLM).
- A saved page gives the since-start figures its counters hold (SGLang: its last decode-log
  interval's gauges).
- A vLLM log gives the mean over its ``SpecDecoding metrics`` and ``Engine NNN`` lines.

All end in :class:`eaglelab.probes.server_totals.ServerTotals` and the live economics verdict.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes.log_lines import read_lines
from eaglelab.probes.prom_text import parse_exposition
from eaglelab.probes.report import Report
from eaglelab.probes.server_economics import live_economics
from eaglelab.probes.server_log import ServerLogWatch, parse_vllm_spec
from eaglelab.probes.server_metrics import (
    MetricsError,
    MetricsWatch,
    ServerUnreachable,
    fetch_metrics,
    metrics_url,
    update_between,
)
from eaglelab.probes.server_totals import ServerTotals

SERVER_SOURCES = ("vllm-metrics", "sglang-metrics", "vllm-log")


def is_url(text: str) -> bool:
    """Whether a report argument names a server rather than a file."""
    return text.startswith(("http://", "https://"))


def detect(lines: Iterable[str]) -> str | None:
    """``"metrics"`` for a saved ``/metrics`` page, ``"vllm-log"`` for a vLLM log, else None."""
    head = list(lines)
    text = "\n".join(head)
    if any(line.startswith(("# TYPE vllm:", "# TYPE sglang:")) for line in head):
        return "metrics"
    samples = parse_exposition(text).samples
    if samples and sum(s.name.startswith(("vllm:", "sglang:")) for s in samples) * 2 >= len(samples):
        return "metrics"
    if any(parse_vllm_spec(line) is not None or "Avg generation throughput:" in line for line in head):
        return "vllm-log"
    return None


def summarise_url(
    url: str,
    *,
    window_s: float = 5.0,
    baseline_tok_s: float | None = None,
    expected_accept_len: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Report:
    """Read a server's ``/metrics`` (twice, ``window_s`` apart) and summarise it."""
    target = metrics_url(url, field="URL")
    watch = MetricsWatch()
    pages = 1 if window_s <= 0 else 2
    totals = ServerTotals()
    for i in range(pages):
        if i:
            sleep(window_s)
        text = _fetch(target)
        try:
            update = watch.observe(text, clock())
        except MetricsError as exc:
            raise EagleLabError("not a vLLM or SGLang metrics page", field="URL", found=f"{target}: {exc}",
                                hint="point at the server's /metrics (SGLang: start it with --enable-metrics)") from exc
        if pages == 1 or i:  # with a window, only the window's figures count
            totals.observe(update)
    notes = [f"figures over {window_s:g} s between two reads of {target}" if pages == 2
             else f"one read of {target}: acceptance since the server started"]
    since = None
    if pages == 2 and watch.previous is not None:  # the counters' totals, beside the window's rates
        since = ServerTotals()
        since.observe(update_between(None, watch.previous))
    return _report(totals, f"{totals.engine}-metrics", target, baseline_tok_s, expected_accept_len, notes, since)


def _fetch(url: str) -> str:
    try:
        return fetch_metrics(url)
    except ServerUnreachable as exc:
        raise EagleLabError(
            "the server's metrics could not be read", field="URL", found=str(exc),
            hint="check the address and port (vLLM: the API port; SGLang: start it with --enable-metrics)",
        ) from exc


def summarise_metrics_file(
    path: str | Path, *, baseline_tok_s: float | None = None, expected_accept_len: float = 2.0
) -> Report:
    """Summarise a saved ``/metrics`` page (``curl URL/metrics > page.txt``)."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    totals = ServerTotals()
    try:
        totals.observe(MetricsWatch().observe(text, 0.0))
    except MetricsError as exc:
        raise EagleLabError("not a vLLM or SGLang metrics page", file=path, found=str(exc),
                            hint="save one with: curl http://HOST:PORT/metrics > page.txt") from exc
    notes = ["one saved page: vLLM figures are since the server started; SGLang's are its last decode-log interval"]
    return _report(totals, f"{totals.engine}-metrics", str(path), baseline_tok_s, expected_accept_len, notes)


def summarise_vllm_log(
    path: str | Path, *, baseline_tok_s: float | None = None, expected_accept_len: float = 2.0
) -> Report:
    """Summarise a vLLM server log from its periodic statistics lines."""
    watch = ServerLogWatch()
    totals = ServerTotals()
    lines = read_lines(path, what="the vLLM log", hint="pass the file the server's stdout/stderr was written to")
    for number, line in enumerate(lines):
        update = watch.feed(line, float(number))
        if update is not None and update.engine == "vllm":
            totals.observe(update)
    notes = []
    if totals.accept_len is None:
        notes.append("no 'SpecDecoding metrics' line with an acceptance figure: speculative decoding off, or idle")
    return _report(totals, "vllm-log", str(path), baseline_tok_s, expected_accept_len, notes)


def _report(
    totals: ServerTotals, source: str, path: str, baseline: float | None, expected: float, notes: list[str],
    since: ServerTotals | None = None,
) -> Report:
    """The report of what ``totals`` folded; ``since``: the same server's figures from its counters'
    totals, shown beside a window's and standing in for its acceptance when the window had none."""
    verdicts = list(totals.statuses)
    accept_len, accept_rate = totals.accept_len, totals.accept_rate
    if accept_len is None and since is not None and since.accept_len is not None:
        accept_len, accept_rate = since.accept_len, since.accept_rate
        notes.append(_IDLE_WORDS.get(totals.engine or "", _IDLE_WORDS["vllm"]))
    if accept_len is not None:
        economics = live_economics(
            max(accept_len, 1.0), totals.tokens_per_s, baseline_tokens_per_s=baseline,  # max: rounding of a mean
            expected_accept_len=expected, cuda_graph_share=totals.cuda_graph_share, engine=totals.engine,
        )
        verdicts.insert(0, economics.verdict)
    else:
        verdicts.insert(0, _INCONCLUSIVE)
    for row in totals.rank_rows():
        notes.append(
            f"{row.rank}: accepted length {_fmt(row.accept_len, '{:.2f}')}, accept rate "
            f"{_fmt(row.accept_rate, '{:.1%}')}, {_fmt(row.gen_tokens_per_s, '{:.1f}')} tok/s, "
            f"CUDA graph {_fmt(row.cuda_graph_share, '{:.0%}')}"
        )
    return Report(
        source=source,
        path=path,
        accept_len_mean=accept_len,
        accept_rate_mean=accept_rate,
        gen_throughput_mean=totals.tokens_per_s,
        cuda_graph_fraction=totals.cuda_graph_share,
        decode_lines=totals.updates,
        prefill_lines=None,
        verdicts=tuple(verdicts),
        details={
            "engine": totals.engine,
            "model": totals.model,
            "per_position_accept_rate": list(totals.per_position),
            "accept_len_histogram": {str(a): n for a, n in totals.histogram},
            "cuda_graph_modes": dict(totals.graph_modes),
            "ranks": [row.__dict__ for row in totals.rank_rows()],
            "baseline_tok_s": baseline,
            "since_start": _since_json(since),
        },
        notes=tuple(notes),
    )


_INCONCLUSIVE = (
    "inconclusive: no usable acceptance figure (nothing drafted while watched, speculative decoding off, "
    "or counters that cannot be right); read the server again while it serves speculative requests"
)
_IDLE_WORDS = {
    "vllm": "the server drafted nothing during the window: acceptance shown is since the server started "
            "(idle window); throughput is the window's",
    "sglang": "the server generated nothing during the window (idle): acceptance shown is its last decode-log "
              "interval, since the server started; throughput is the window's",
}


def _since_json(since: ServerTotals | None) -> dict | None:
    if since is None:
        return None
    return {"accept_len": since.accept_len, "accept_rate": since.accept_rate,
            "per_position_accept_rate": list(since.per_position), "cuda_graph_fraction": since.cuda_graph_share}


def _fmt(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)
