"""Read SGLang server logs: Decode/Prefill batch lines, start-up markers, health-check traffic.

Every SGLang version prints scheduler statistics as ``key: value`` pairs after a fixed head::

    [2025-06-01 10:00:00 TP0] Decode batch, #running-req: 1, #token: 530, token usage: 0.01,
        accept len: 2.43, accept rate: 0.36, cuda graph: True, gen throughput (token/s): 88.91, #queue-req: 0,
    [2024-11-02 09:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0,
        cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0

Versions differ in the head (``batch,`` or the older ``batch.``, an optional `` [iter]``), in which
fields appear (``accept len``, ``accept rate``, ``cuda graph``, ``cache hit rate``, ``input
throughput``, hybrid-model ``full token usage``) and in the prefix (``[ts TP0]``, ``[ts DP1 TP1]``,
``[ts]``, a log collector's timestamp in front, or a plain Python logging prefix). So the parser
finds the head anywhere in the line and reads whatever pairs follow; a figure no line carries is
reported as ``None``, never 0.

Markers: ``Capture cuda graph end`` (target graphs captured) and ``The server is fired up and ready
to roll!`` (warm-up done). Health checks: ``/health`` and ``/health_generate`` in the HTTP access
log. A prefill is the generation a health check ran when it is a single sequence of exactly one new
token seen before the server was ready (the 1-token probe SGLang sends), or a single-sequence
prefill logged at most ``HEALTH_WINDOW`` lines before a health check answered 200 (the access line is
written when the response goes out, after its generation; a 503 generated nothing).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from eaglelab.probes.log_lines import read_lines
from eaglelab.probes.server_totals import RunningMean

GRAPH_CAPTURED_MARKER = "Capture cuda graph end"
READY_MARKER = "The server is fired up and ready to roll!"

_HEAD = re.compile(r"\b(Decode|Prefill) batch(?: \[\d+\])?[.,]\s*")
_KEY_START = re.compile(r"[#A-Za-z]")
MAX_LINE_CHARS = 16_384  # a batch line is < 1 KiB; longer lines are read up to this many characters
_SGLANG_STAMP = re.compile(
    r"\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)((?:\s+[A-Z]{2}\d+)*)\s*\]"
)
_ANY_STAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?|\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
)
_RANK = re.compile(r"([A-Z]{2})(\d+)")
_ACCESS = re.compile(r'"(?:GET|POST|HEAD) (/health(?:_generate)?)(?:\?\S*)? HTTP/[\d.]+"\s+(\d{3})')
_ELAPSED = re.compile(r"[Tt]ime elapsed:\s*([\d.]+)\s*s")
HEALTH_WINDOW = 2  # lines between a health check's prefill and its "200" access line

# Printed key (lower case) -> attribute; the first key present wins for an attribute.
_FIELDS: dict[str, str] = {
    "#running-req": "running_req",
    "#queue-req": "queue_req",
    "#token": "num_token",
    "#full token": "num_token",
    "token usage": "token_usage",
    "full token usage": "token_usage",
    "accept len": "accept_len",
    "accept rate": "accept_rate",
    "cuda graph": "cuda_graph",
    "cpu graph": "cuda_graph",
    "npu graph": "cuda_graph",
    "gen throughput (token/s)": "gen_throughput",
    "input throughput (token/s)": "input_throughput",
    "#new-seq": "new_seq",
    "#new-token": "new_token",
    "#cached-token": "cached_token",
    "cache hit rate": "cache_hit_rate",
}
_INTS = {"running_req", "queue_req", "num_token", "new_seq", "new_token", "cached_token"}


@dataclass(frozen=True)
class BatchLine:
    """One ``Decode batch`` or ``Prefill batch`` line; a figure the line lacks is None."""

    kind: str  # "decode" | "prefill"
    line_no: int  # 1-based
    timestamp: str | None
    ranks: dict[str, int]  # e.g. {"DP": 1, "TP": 1}
    raw: dict[str, str]  # every printed pair, key lower-cased
    running_req: int | None = None
    queue_req: int | None = None
    num_token: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    gen_throughput: float | None = None
    input_throughput: float | None = None
    new_seq: int | None = None
    new_token: int | None = None
    cached_token: int | None = None
    cache_hit_rate: float | None = None  # a fraction (a printed "12.5%" is 0.125)

    @property
    def looks_like_health_check(self) -> bool:
        """A prefill of one sequence of one new token: SGLang's health-check probe generation."""
        return self.kind == "prefill" and self.new_seq == 1 and self.new_token == 1


@dataclass(frozen=True)
class Marker:
    """A start-up milestone: ``"graph_captured"`` or ``"ready"``."""

    name: str
    line_no: int
    timestamp: str | None
    seconds: float | None = None  # "Time elapsed" on the capture line


@dataclass(frozen=True)
class HealthRequest:
    """An HTTP access-log line for ``/health`` or ``/health_generate``."""

    path: str
    status: int
    line_no: int


LogItem = BatchLine | Marker | HealthRequest


def parse_line(text: str, line_no: int = 0) -> LogItem | None:
    """Parse one log line; None for lines that are none of the above. Work is linear in the line's
    length, and lines past :data:`MAX_LINE_CHARS` are read only that far."""
    text = text[:MAX_LINE_CHARS]
    head = _HEAD.search(text)
    if head is not None:
        return _batch_line(text, head, line_no)
    if GRAPH_CAPTURED_MARKER in text:
        elapsed = _ELAPSED.search(text)
        return Marker("graph_captured", line_no, _timestamp(text)[0], float(elapsed.group(1)) if elapsed else None)
    if READY_MARKER in text:
        return Marker("ready", line_no, _timestamp(text)[0])
    access = _ACCESS.search(text)
    if access is not None:
        return HealthRequest(access.group(1), int(access.group(2)), line_no)
    return None


def _batch_line(text: str, head: re.Match[str], line_no: int) -> BatchLine:
    stamp, ranks = _timestamp(text[: head.start()])
    raw = _pairs(text[head.end() :])
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = _FIELDS.get(key)
        if name is not None and name not in values:
            values[name] = _value(name, value)
    kind = head.group(1).lower()
    return BatchLine(kind=kind, line_no=line_no, timestamp=stamp, ranks=ranks, raw=raw, **values)  # type: ignore[arg-type]


def _pairs(text: str) -> dict[str, str]:
    """``key: value`` pairs separated by commas (first pair of a key wins), in one linear pass.
    A key starts at its first letter or ``#``; a segment without a colon is no pair."""
    raw: dict[str, str] = {}
    for segment in text.split(","):
        key, colon, value = segment.partition(":")
        start = _KEY_START.search(key)
        if colon and start is not None:
            raw.setdefault(key[start.start() :].strip().lower(), value.strip())
    return raw


def _timestamp(prefix: str) -> tuple[str | None, dict[str, int]]:
    """SGLang's own ``[ts RANKS]`` stamp if present, else the last timestamp in the prefix."""
    stamps = list(_SGLANG_STAMP.finditer(prefix))
    if stamps:
        last = stamps[-1]
        return last.group(1), {k: int(v) for k, v in _RANK.findall(last.group(2))}
    others = _ANY_STAMP.findall(prefix)
    return (others[-1] if others else None), {}


def _value(name: str, text: str) -> object:
    if name == "cuda_graph":
        return {"true": True, "false": False}.get(text.lower())
    percent = text.endswith("%")
    try:
        number = float(text.rstrip("%").strip())
    except ValueError:
        return None
    if not math.isfinite(number):  # "nan" / "inf" printed by a broken counter: the figure is absent
        return None
    if name in _INTS:
        return int(number)
    return number / 100.0 if percent else number


@dataclass(frozen=True)
class SglangLogSummary:
    """What a log says. Means are over the lines that print the figure (unweighted); None if none do."""

    decode_lines: int
    prefill_lines: int
    accept_len_mean: float | None
    accept_rate_mean: float | None
    gen_throughput_mean: float | None
    cuda_graph_fraction: float | None  # share of decode lines with "cuda graph: True"
    cache_hit_rate_mean: float | None
    input_throughput_mean: float | None
    graph_captured_line: int | None
    ready_line: int | None
    capture_seconds: float | None
    prefills_before_ready: int
    health_check_prefills_before_ready: int
    eager_health_check_prefills_before_ready: int  # of those, lines not showing "cuda graph: True"
    health_requests_before_ready: int
    health_generate_requests: int
    first_timestamp: str | None
    last_timestamp: str | None
    warnings: tuple[str, ...] = ()
    eager_health_check_prefill_lines: tuple[int, ...] = ()  # every eager health-check prefill, before or after ready


@dataclass
class _BatchFolds:
    """What the summary needs of every batch line, folded as they come (a log of millions of lines is not
    kept: memory stays flat however long the log)."""

    decode_lines: int = 0
    prefill_lines: int = 0
    accept_len: RunningMean = field(default_factory=RunningMean)
    accept_rate: RunningMean = field(default_factory=RunningMean)
    gen_throughput: RunningMean = field(default_factory=RunningMean)
    graph_flags: int = 0  # decode lines that say "cuda graph: True" or "False"
    graph_true: int = 0
    cache_hit_rate: RunningMean = field(default_factory=RunningMean)
    input_throughput: RunningMean = field(default_factory=RunningMean)

    def add(self, b: BatchLine) -> None:
        if b.kind == "prefill":
            self.prefill_lines += 1
            self.cache_hit_rate.add(b.cache_hit_rate)
            self.input_throughput.add(b.input_throughput)
            return
        self.decode_lines += 1
        self.accept_len.add(b.accept_len)
        self.accept_rate.add(b.accept_rate)
        self.gen_throughput.add(b.gen_throughput)
        if b.cuda_graph is not None:
            self.graph_flags += 1
            self.graph_true += b.cuda_graph


@dataclass
class SglangLogScanner:
    """Incremental reader: ``feed`` lines (a whole file or a growing tail), then ``summary()``."""

    lines_seen: int = 0
    folds: _BatchFolds = field(default_factory=_BatchFolds)
    recent: deque[BatchLine] = field(default_factory=lambda: deque(maxlen=HEALTH_WINDOW))  # for health checks
    graph_captured: Marker | None = None
    ready: Marker | None = None
    prefills_before_ready: int = 0
    health_prefills_before_ready: int = 0
    eager_health_prefills_before_ready: int = 0
    health_requests_before_ready: int = 0
    health_generate_requests: int = 0
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    health_prefill_lines: dict[int, bool | None] = field(default_factory=dict)  # a health check's prefill -> cuda graph

    def feed(self, text: str) -> LogItem | None:
        """Read one line; returns what it was (or None)."""
        self.lines_seen += 1
        item = parse_line(text, self.lines_seen)
        if isinstance(item, BatchLine):
            self._observe_batch(item)
        elif isinstance(item, Marker):
            self._observe_marker(item)
        elif isinstance(item, HealthRequest):
            self.health_generate_requests += item.path == "/health_generate"
            self.health_requests_before_ready += self.ready is None
            if item.status == 200:
                self._claim_prefill_for(item)
        return item

    def _claim_prefill_for(self, request: HealthRequest) -> None:
        """The single-sequence prefill just before a health check's 200 is the generation it ran (never one
        from before the ready marker: the server answers health checks 503 until it is ready)."""
        for line in reversed(self.recent):
            if self.ready is not None and line.line_no < self.ready.line_no:
                return
            if line.kind == "prefill" and line.new_seq in (1, None) and request.line_no - line.line_no <= HEALTH_WINDOW:
                self._mark_health_prefill(line)
                return

    def feed_all(self, lines: Iterable[str]) -> "SglangLogScanner":
        """Read many lines; returns self."""
        for line in lines:
            self.feed(line)
        return self

    def _observe_batch(self, line: BatchLine) -> None:
        self.recent.append(line)
        self.folds.add(line)
        self._stamp(line.timestamp)
        if line.kind != "prefill" or self.ready is not None:
            return
        self.prefills_before_ready += 1
        if line.looks_like_health_check:
            self._mark_health_prefill(line)

    def _mark_health_prefill(self, line: BatchLine) -> None:
        if line.line_no in self.health_prefill_lines:
            return
        self.health_prefill_lines[line.line_no] = line.cuda_graph
        if self.ready is None or line.line_no < self.ready.line_no:
            self.health_prefills_before_ready += 1
            self.eager_health_prefills_before_ready += line.cuda_graph is not True

    def _observe_marker(self, marker: Marker) -> None:
        self._stamp(marker.timestamp)
        if marker.name == "graph_captured" and self.graph_captured is None:
            self.graph_captured = marker
        elif marker.name == "ready" and self.ready is None:
            self.ready = marker

    def _stamp(self, stamp: str | None) -> None:
        if stamp is not None:
            self.first_timestamp = self.first_timestamp or stamp
            self.last_timestamp = stamp

    def summary(self) -> SglangLogSummary:
        """Counts, means and warnings over everything fed so far."""
        f = self.folds
        summary = SglangLogSummary(
            decode_lines=f.decode_lines,
            prefill_lines=f.prefill_lines,
            accept_len_mean=f.accept_len.value,
            accept_rate_mean=f.accept_rate.value,
            gen_throughput_mean=f.gen_throughput.value,
            cuda_graph_fraction=f.graph_true / f.graph_flags if f.graph_flags else None,
            cache_hit_rate_mean=f.cache_hit_rate.value,
            input_throughput_mean=f.input_throughput.value,
            graph_captured_line=self.graph_captured.line_no if self.graph_captured else None,
            ready_line=self.ready.line_no if self.ready else None,
            capture_seconds=self.graph_captured.seconds if self.graph_captured else None,
            prefills_before_ready=self.prefills_before_ready,
            health_check_prefills_before_ready=self.health_prefills_before_ready,
            eager_health_check_prefills_before_ready=self.eager_health_prefills_before_ready,
            health_requests_before_ready=self.health_requests_before_ready,
            health_generate_requests=self.health_generate_requests,
            first_timestamp=self.first_timestamp,
            last_timestamp=self.last_timestamp,
            eager_health_check_prefill_lines=tuple(
                n for n, graph in sorted(self.health_prefill_lines.items()) if graph is not True),
        )
        return _with_warnings(summary, saw_startup=self.graph_captured is not None or self.ready is not None)


def _with_warnings(s: SglangLogSummary, *, saw_startup: bool) -> SglangLogSummary:
    from dataclasses import replace

    warnings: list[str] = []
    if saw_startup and s.eager_health_check_prefills_before_ready:
        warnings.append(
            f"{s.eager_health_check_prefills_before_ready} health-check prefill(s) ran before the server "
            "was ready, without CUDA graph; they delay warm-up: poll /v1/models instead of /health or "
            "/health_generate (e.g. eaglelab wait-ready URL)"
        )
    after_ready = len(s.eager_health_check_prefill_lines) - s.eager_health_check_prefills_before_ready
    if after_ready > 0:
        lines = ", ".join(str(n) for n in s.eager_health_check_prefill_lines)
        warnings.append(
            f"{after_ready} health-check generation(s) ran as eager prefills (graph: False; log line(s) {lines}): "
            "every generating health check takes a scheduler turn from real traffic; check readiness with "
            "/v1/models (eaglelab wait-ready URL) and liveness without generating"
        )
    if s.health_requests_before_ready and s.ready_line is not None:
        warnings.append(
            f"{s.health_requests_before_ready} health check(s) polled the server while it was still warming up "
            f"(before line {s.ready_line}, 'fired up and ready to roll'); wait for readiness with "
            "eaglelab wait-ready URL (polls /v1/models and the log) before sending health checks or traffic"
        )
    if s.health_generate_requests:
        warnings.append(
            f"{s.health_generate_requests} request(s) to /health_generate: each runs a generation on "
            "the server; readiness checks should use /v1/models (eaglelab wait-ready URL)"
        )
    if s.cuda_graph_fraction is not None and s.cuda_graph_fraction < 1.0:
        warnings.append(
            f"{1 - s.cuda_graph_fraction:.0%} of decode lines report cuda graph: False (batch larger "
            "than the captured sizes, or graphs disabled)"
        )
    return replace(s, warnings=tuple(warnings))


def read_sglang_log(path: str | Path) -> SglangLogSummary:
    """Summarise a whole log file, streamed line by line; :class:`EagleLabError` if it cannot be read."""
    lines = read_lines(path, what="the SGLang log", hint="pass the file the server's stdout/stderr was written to")
    return SglangLogScanner().feed_all(lines).summary()
