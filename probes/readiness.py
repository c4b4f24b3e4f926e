"""Is an SGLang server warm? Poll ``/v1/models`` and, optionally, watch its log for the markers.

"Ready" here means truly warm: ``GET <url>/v1/models`` answers 2xx and, when a log is given, it
shows both ``Capture cuda graph end`` and ``The server is fired up and ready to roll!``.

Only ``/v1/models`` is polled: it does not generate. ``/health`` may run a 1-token generation and
``/health_generate`` always does; sent while the server warms up, those run as eager prefills and
delay readiness (seen on SGLang deployments: the server reports "cuda graph: False" for them), so
this module never calls them. 503 and refused connections
simply mean "not yet". Standard library only (``urllib``).
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes import http_get
from eaglelab.probes.file_kind import file_kind, is_special
from eaglelab.probes.sglang_log import LogItem, Marker, SglangLogScanner

MODELS_PATH = "/v1/models"
MAX_ANSWER_BYTES = 1 << 20  # a model list is a few hundred bytes
_GENERATING_PATHS = ("/health", "/health_generate", "/generate", "/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class HttpProbe:
    """One poll of ``/v1/models``."""

    ok: bool
    status: int | None  # HTTP status, None when no answer came
    detail: str  # "200", "503 Service Unavailable", "connection refused", ...


@dataclass(frozen=True)
class Milestone:
    """A step towards warm, with the seconds since waiting began."""

    name: str  # "http_ok" | "graph_captured" | "fired_up" | "warm"
    elapsed_s: float
    detail: str = ""


@dataclass(frozen=True)
class ReadinessResult:
    """How waiting ended."""

    ready: bool
    elapsed_s: float
    milestones: tuple[Milestone, ...]
    polls: int
    last_http: str
    waiting_for: tuple[str, ...] = ()  # what was still missing when time ran out
    warnings: tuple[str, ...] = ()

    def milestone(self, name: str) -> Milestone | None:
        """The milestone of that name, if reached."""
        return next((m for m in self.milestones if m.name == name), None)


def models_url(url: str) -> str:
    """``<base>/v1/models`` for a server URL; refuses generating endpoints and scheme-less URLs."""
    try:
        parsed = urllib.parse.urlparse(url)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise EagleLabError(f"not a valid URL ({exc})", field="URL", found=url, expected="http://HOST:PORT") from None
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EagleLabError(
            "the server URL needs a scheme and a host", field="URL", found=url,
            expected="http://HOST:PORT", hint=f"try http://{url.split('://')[-1]}",
        )
    base = url.rstrip("/")
    for suffix in (MODELS_PATH, "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    path = urllib.parse.urlparse(base).path
    if path in _GENERATING_PATHS:
        raise EagleLabError(
            f"{path} is not a readiness endpoint: it may run a generation on a warming server",
            field="URL", found=url, expected="the server's base URL, e.g. http://localhost:30000",
            hint="pass the base URL; wait-ready polls /v1/models, which does not generate",
        )
    return base + MODELS_PATH


def is_models_answer(body: bytes) -> bool:
    """An OpenAI-style model list: a JSON object with a ``data`` list (what SGLang's /v1/models returns)."""
    import json

    if len(body) > MAX_ANSWER_BYTES:
        return False
    try:
        obj = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return False
    return isinstance(obj, dict) and isinstance(obj.get("data"), list)


def probe_models(url: str, timeout_s: float = 5.0) -> HttpProbe:
    """GET ``url`` (a ``/v1/models`` URL) once, the whole request within ``timeout_s``; never raises
    for network trouble (a server that trickles or streams without end is cut off at the deadline)."""
    try:
        answer = http_get.get(url, deadline_s=timeout_s, max_bytes=MAX_ANSWER_BYTES, accept="application/json")
    except http_get.RequestFailed as exc:
        if exc.status is not None:
            return HttpProbe(False, exc.status, f"{exc.status} {exc.reason}".strip())
        return HttpProbe(False, None, str(exc))
    if not is_models_answer(answer.body):
        return HttpProbe(False, answer.status,
                         f"{answer.status} but not an OpenAI /v1/models answer (another server on this port?)")
    return HttpProbe(True, answer.status, str(answer.status))


@dataclass
class LogTail:
    """Reads a growing log file line by line (only complete lines) into an :class:`SglangLogScanner`."""

    path: Path
    scanner: SglangLogScanner = field(default_factory=SglangLogScanner)
    _position: int = 0
    _buffer: bytes = b""

    def poll(self) -> list[LogItem]:
        """Read what was appended since the last poll; the items parsed from complete lines."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._position:  # rewritten: start over
            self._position, self._buffer, self.scanner = 0, b"", SglangLogScanner()
        if size == self._position:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._position)
            data = f.read(size - self._position)
        self._position += len(data)
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        items = [self.scanner.feed(line.decode("utf-8", errors="replace")) for line in lines]
        return [item for item in items if item is not None]


def wait_ready(
    url: str,
    *,
    log: str | Path | None = None,
    timeout_s: float = 600.0,
    interval_s: float = 2.0,
    request_timeout_s: float = 5.0,
    on_milestone: Callable[[Milestone], None] | None = None,
    probe: Callable[[str, float], HttpProbe] = probe_models,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReadinessResult:
    """Poll until the server is warm or ``timeout_s`` passes; report each milestone once."""
    target = models_url(url)
    if log is not None and is_special(log):  # a FIFO's size never grows: its markers would never be seen
        raise EagleLabError("cannot watch this server log", file=log, field="--log", found=file_kind(log),
                            expected="a regular file (or one not written yet)", hint="pass the log file itself")
    tail = LogTail(Path(log)) if log is not None else None
    start = clock()
    reached: dict[str, Milestone] = {}
    polls, last_http = 0, "not polled yet"

    def reach(name: str, detail: str) -> None:
        if name not in reached:
            reached[name] = Milestone(name, clock() - start, detail)
            if on_milestone is not None:
                on_milestone(reached[name])

    while True:
        if tail is not None:
            for item in tail.poll():
                if isinstance(item, Marker):
                    reach("fired_up" if item.name == "ready" else "graph_captured", _marker_detail(item))
        if "http_ok" not in reached:
            remaining = timeout_s - (clock() - start)
            answer = probe(target, max(min(request_timeout_s, remaining), 0.1))
            polls, last_http = polls + 1, answer.detail
            if answer.ok:
                reach("http_ok", f"GET {target} -> {answer.detail}")
        missing = _missing(reached, with_log=tail is not None)
        if not missing:
            reach("warm", "HTTP ok" + (" and both log markers seen" if tail is not None else ""))
        elapsed = clock() - start
        if not missing or elapsed >= timeout_s:
            warnings = tail.scanner.summary().warnings if tail is not None else ()
            if tail is not None and not tail.path.exists():
                warnings = (*warnings, f"log file {tail.path} never appeared")
            return ReadinessResult(
                ready=not missing, elapsed_s=elapsed, milestones=tuple(reached.values()), polls=polls,
                last_http=last_http, waiting_for=tuple(missing), warnings=tuple(warnings),
            )
        sleep(max(min(interval_s, timeout_s - elapsed), 0.0))


def _missing(reached: dict[str, Milestone], *, with_log: bool) -> list[str]:
    needed = ["http_ok"] + (["graph_captured", "fired_up"] if with_log else [])
    return [name for name in needed if name not in reached]


def _marker_detail(marker: Marker) -> str:
    text = f"log line {marker.line_no}"
    if marker.timestamp:
        text += f" at {marker.timestamp}"
    if marker.seconds is not None:
        text += f" (capture took {marker.seconds:g} s)"
    return text
