"""Watch a vLLM or SGLang server through its Prometheus ``/metrics`` page (a GET that generates nothing).

What each server exposes, from their own sources:

vLLM (``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``), labels ``engine`` and
``model_name``; counters, exposed with a ``_total`` suffix:

- ``vllm:spec_decode_num_drafts`` - verifies, one per request per step that drafted;
- ``vllm:spec_decode_num_draft_tokens`` - draft tokens offered;
- ``vllm:spec_decode_num_accepted_tokens`` - draft tokens accepted (the bonus token is not counted);
- ``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}`` - drafts whose token ``i`` (0-based)
  was accepted;
- ``vllm:generation_tokens`` - tokens generated; gauge ``vllm:num_requests_running``.

The CUDA-graph runtime mode is not on vLLM's ``/metrics``; it prints it in its log with
``--cudagraph-metrics`` (see :mod:`eaglelab.probes.server_log`).

SGLang (``python/sglang/srt/metrics/collector.py``), needs ``--enable-metrics``; scheduler labels
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` and ``dp_rank`` with DP
attention; gauges set at every decode log (every 40 decode steps by default):

- ``sglang:spec_accept_length`` - the scheduler's accepted tokens over verifies in the last decode-log
  interval, where accepted tokens include the bonus token;
- ``sglang:spec_accept_rate`` - accepted over offered draft tokens in that interval;
- ``sglang:gen_throughput`` - tokens/s in that interval; ``sglang:is_cuda_graph`` - last batch 1/0;
- counter ``sglang:cuda_graph_passes_total{mode="decode_cuda_graph"|"decode_none"}``;
- counter ``sglang:generation_tokens_total`` (the tokenizer manager's, without rank labels).

Rates come from counter deltas between two polls; a counter that went down (or, where the
exporter writes them, newer ``*_created`` times) means the server restarted, and the figures start
again from that poll.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass, field

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes import http_get
from eaglelab.probes.prom_text import Exposition, Sample, parse_exposition
from eaglelab.probes.server_readings import ServerReading, ServerUpdate

ENGINES = ("vllm", "sglang")
MAX_PAGE_BYTES = 64 << 20
# No counter of a real server comes near 2**53 (it would be exact no more); a larger value is damage,
# and sums of values below it stay finite (two counters of 1e308 made the mean infinite, then NaN).
MAX_VALUE = float(1 << 53)
MAX_POSITION = 1024  # per-position labels past this are damage (a drafter proposes a few tokens deep)

# vLLM counter families (exposed as NAME_total) -> our key.
_VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:generation_tokens": "generation_tokens",
}
_VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_VLLM_GAUGES = {"vllm:num_requests_running": "running"}
_SGLANG_GAUGES = {
    "sglang:spec_accept_length": "accept_len",
    "sglang:spec_accept_rate": "accept_rate",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:is_cuda_graph": "is_cuda_graph",
    "sglang:num_running_reqs": "running",
}
_SGLANG_GRAPH_PASSES = "sglang:cuda_graph_passes_total"
_SGLANG_GENERATED = "sglang:generation_tokens_total"
_RANK_LABELS = (("dp_rank", "DP"), ("tp_rank", "TP"), ("pp_rank", "PP"))


class MetricsError(Exception):
    """A ``/metrics`` answer that is not a vLLM or SGLang metrics page (the message says what it was)."""


class ServerUnreachable(Exception):
    """The server did not answer (down, refused, timed out, an HTTP error); the message says which."""


@dataclass(frozen=True)
class RankScrape:
    """One rank's samples in one scrape: cumulative counters, per-position counters, gauges."""

    rank: str
    counters: dict[str, float] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` page of one server, read at ``t`` (seconds on the watcher's clock)."""

    engine: str  # "vllm" | "sglang"
    t: float
    model: str | None
    ranks: dict[str, RankScrape]
    server_counters: dict[str, float] = field(default_factory=dict)  # counters without rank labels
    # ``*_created`` samples by series: when each counter was made (a series made anew = a restart)
    created: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @property
    def has_spec_metrics(self) -> bool:
        """Whether the page carries any speculative-decoding figure."""
        keys = ("drafts",) if self.engine == "vllm" else ("accept_len",)
        return any(k in r.counters or k in r.gauges for r in self.ranks.values() for k in keys)


# -- reading a page ----------------------------------------------------------------------------


def parse_scrape(text: str, t: float) -> Scrape:
    """A :class:`Scrape` from a ``/metrics`` page; :class:`MetricsError` if it is not one we know."""
    page = parse_exposition(text)
    if not page.samples:
        raise MetricsError(_garbage_words(text, page))
    engine = _engine_of(page)
    if engine is None:
        names = sorted({s.name.split(":", 1)[0] for s in page.samples if ":" in s.name})[:3]
        seen = f"metrics of {', '.join(names)}" if names else f"{len(page.samples)} samples, none named vllm:* or sglang:*"
        raise MetricsError(f"not a vLLM or SGLang metrics page ({seen})")
    ranks: dict[str, RankScrape] = {}
    server: dict[str, float] = {}
    model = next((s.label("model_name") for s in page.samples if s.label("model_name")), None)
    reader = _read_vllm if engine == "vllm" else _read_sglang
    for sample in page.samples:
        if abs(sample.value) <= MAX_VALUE:  # NaN, infinite or absurd: says nothing we can use
            reader(sample, ranks, server)
    created = {(s.name, s.labels): s.value for s in page.samples
               if s.name.endswith("_created") and s.name.startswith(engine + ":")}
    return Scrape(engine=engine, t=t, model=model, ranks=ranks, server_counters=server, created=created)


def _garbage_words(text: str, page: Exposition) -> str:
    head = text.lstrip()[:60].replace("\n", " ")
    if not head:
        return "an empty answer"
    if head.startswith("<"):
        return f"HTML, not Prometheus text ({head[:40]!r}...)"
    return f"no Prometheus samples in {len(page.bad_lines)} line(s) (starts {head[:40]!r})"


def _engine_of(page: Exposition) -> str | None:
    counts = {e: sum(s.name.startswith(e + ":") for s in page.samples) for e in ENGINES}
    best = max(counts, key=lambda e: counts[e])
    return best if counts[best] else None


def _rank(ranks: dict[str, RankScrape], key: str) -> RankScrape:
    if key not in ranks:
        ranks[key] = RankScrape(key)
    return ranks[key]


def _counter_family(name: str) -> str | None:
    """The family of a counter sample (``X_total`` or plain ``X``); None for ``X_created``."""
    if name.endswith("_created"):
        return None
    return name[: -len("_total")] if name.endswith("_total") else name


def _read_vllm(sample: Sample, ranks: dict[str, RankScrape], server: dict[str, float]) -> None:
    family = _counter_family(sample.name)
    engine = sample.label("engine")
    key = f"engine {engine}" if engine is not None else "server"
    if family in _VLLM_COUNTERS:
        _rank(ranks, key).counters[_VLLM_COUNTERS[family]] = sample.value
    elif family == _VLLM_PER_POS and _position(sample.label("position")) is not None:
        _rank(ranks, key).per_pos[_position(sample.label("position"))] = sample.value  # type: ignore[index]
    elif sample.name in _VLLM_GAUGES:
        _rank(ranks, key).gauges[_VLLM_GAUGES[sample.name]] = sample.value


def _position(label: str | None) -> int | None:
    """A ``position`` label as a draft depth: ASCII digits up to :data:`MAX_POSITION` (``"²"`` is a
    digit to ``str.isdigit`` and no number to ``int``)."""
    if label is None or not (label.isascii() and label.isdigit()) or len(label) > 6:
        return None
    value = int(label)
    return value if value <= MAX_POSITION else None


def plausible_len(value: float | None) -> float | None:
    """An accepted length (bonus included) a server can report: finite and at least 1; else None."""
    return value if value is not None and math.isfinite(value) and value >= 1.0 else None


def _read_sglang(sample: Sample, ranks: dict[str, RankScrape], server: dict[str, float]) -> None:
    key = " ".join(f"{tag}{sample.label(label)}" for label, tag in _RANK_LABELS
                   if sample.label(label) is not None and not (tag == "PP" and sample.label(label) == "0"))
    if sample.name == _SGLANG_GENERATED:
        server["generation_tokens"] = server.get("generation_tokens", 0.0) + sample.value
    elif sample.name in _SGLANG_GAUGES:
        _rank(ranks, key or "server").gauges[_SGLANG_GAUGES[sample.name]] = sample.value
    elif sample.name == _SGLANG_GRAPH_PASSES and sample.label("mode") in ("decode_cuda_graph", "decode_none"):
        _rank(ranks, key or "server").counters[f"passes:{sample.label('mode')}"] = sample.value


# -- two pages -> rates ------------------------------------------------------------------------


def update_between(previous: Scrape | None, current: Scrape) -> ServerUpdate:
    """The figures between two scrapes of one server; ``previous=None``: since the server started.

    Since-start figures need no rate, so throughput (a rate) is left out for them.
    """
    dt = current.t - previous.t if previous is not None else None
    readings = []
    for key, rank in sorted(current.ranks.items()):
        before = previous.ranks.get(key) if previous is not None else None
        convert = _vllm_reading if current.engine == "vllm" else _sglang_reading
        readings.append(convert(rank, before, dt, idle=_idle(previous, current)))
    return ServerUpdate(
        engine=current.engine,
        t=current.t,
        readings=tuple(readings),
        gen_tokens_per_s=_server_throughput(previous, current, dt),
        model=current.model,
        status=None if current.has_spec_metrics else _no_spec_words(current.engine),
    )


def _no_spec_words(engine: str) -> str:
    if engine == "vllm":
        return "no vllm:spec_decode_* counters: this server runs without speculative decoding (--speculative-config)"
    return "no sglang:spec_accept_length: this server runs without speculative decoding (--speculative-algorithm)"


def _delta(now: dict, before: dict | None, key) -> float | None:
    if key not in now:
        return None
    return now[key] - (before.get(key, 0.0) if before is not None else 0.0)


def _vllm_reading(rank: RankScrape, before: RankScrape | None, dt: float | None, idle: bool) -> ServerReading:
    # vLLM counts accepted draft tokens without the bonus token, one draft per request per verify:
    # accepted length (bonus included) = 1 + d(accepted) / d(drafts); accept rate = d(accepted) /
    # d(draft_tokens); per-position = d(per_pos[i]) / d(drafts) (drafts that reached depth i + 1).
    c, b = rank.counters, before.counters if before is not None else None
    drafts, offered, accepted = _delta(c, b, "drafts"), _delta(c, b, "draft_tokens"), _delta(c, b, "accepted")
    generated = _delta(c, b, "generation_tokens")
    spoke = drafts is not None and drafts > 0
    per_pos = tuple(
        (rank.per_pos[i] - (before.per_pos.get(i, 0.0) if before is not None else 0.0)) / drafts
        for i in sorted(rank.per_pos)
    ) if spoke else ()
    return ServerReading(
        rank=rank.rank,
        accept_len=plausible_len(1.0 + accepted / drafts) if spoke and accepted is not None and accepted >= 0 else None,
        accept_rate=accepted / offered if spoke and accepted is not None and accepted >= 0 and offered else None,
        per_position=per_pos,  # type: ignore[arg-type]
        drafts=drafts if spoke else None,
        draft_tokens=offered if spoke else None,
        gen_tokens_per_s=generated / dt if generated is not None and dt else None,
        running_reqs=rank.gauges.get("running"),
    )


def _sglang_reading(rank: RankScrape, before: RankScrape | None, dt: float | None, idle: bool) -> ServerReading:
    # SGLang's spec_accept_length already counts the bonus token (accepted tokens + one per request,
    # over verifies): it is our accepted length as is. Its gauges hold the last decode-log interval,
    # so while nothing is generated they are stale and are not reported.
    g, c = rank.gauges, rank.counters
    b = before.counters if before is not None else None
    graphs, eager = _delta(c, b, "passes:decode_cuda_graph"), _delta(c, b, "passes:decode_none")
    if graphs is not None or eager is not None:  # a mode never seen has no series yet: 0 passes
        graphs, eager = graphs or 0.0, eager or 0.0
    elif "is_cuda_graph" in g and not idle:
        graphs, eager = (1.0, 0.0) if g["is_cuda_graph"] >= 0.5 else (0.0, 1.0)  # one batch seen
    accept_len = plausible_len(g.get("accept_len")) if not idle else None
    return ServerReading(
        rank=rank.rank,
        accept_len=accept_len,
        accept_rate=g.get("accept_rate") if accept_len is not None else None,
        gen_tokens_per_s=g.get("gen_throughput") if not idle else None,
        cuda_graph_passes=graphs,
        eager_passes=eager,
        running_reqs=g.get("running"),
    )


def _idle(previous: Scrape | None, current: Scrape) -> bool:
    """SGLang: no token generated since the last poll (its gauges then describe an older interval)."""
    if previous is None or "generation_tokens" not in current.server_counters:
        return False
    return current.server_counters["generation_tokens"] <= previous.server_counters.get("generation_tokens", 0.0)


def _server_throughput(previous: Scrape | None, current: Scrape, dt: float | None) -> float | None:
    if previous is None or not dt or dt <= 0:
        return None
    if "generation_tokens" in current.server_counters:
        return (current.server_counters["generation_tokens"] - previous.server_counters.get("generation_tokens", 0.0)) / dt
    if current.engine == "vllm":
        rates = [_delta(r.counters, previous.ranks[k].counters if k in previous.ranks else None, "generation_tokens")
                 for k, r in current.ranks.items()]
        present = [d for d in rates if d is not None]
        return sum(present) / dt if present else None
    return None


def went_back(previous: Scrape, current: Scrape) -> str | None:
    """Which counter decreased between two scrapes (a restarted server), or None."""
    if previous.engine != current.engine:
        return f"the server changed from {previous.engine} to {current.engine}"
    pairs = [(f"{k}", previous.server_counters.get(k), v) for k, v in current.server_counters.items()]
    for key, rank in current.ranks.items():
        old = previous.ranks.get(key)
        if old is None:
            continue
        pairs += [(f"{key} {name}", old.counters.get(name), v) for name, v in rank.counters.items()]
        pairs += [(f"{key} per-position {i}", old.per_pos.get(i), v) for i, v in rank.per_pos.items()]
    for name, old_value, new_value in pairs:
        if old_value is not None and new_value < old_value:
            return f"{name} went from {old_value:g} to {new_value:g}"
    for series, made in current.created.items():  # a restart caught after the counters passed the old values
        if series in previous.created and made > previous.created[series]:
            return f"{series[0]} was created anew"
    return None


class MetricsWatch:
    """Turns successive ``/metrics`` pages of one server into updates.

    The first page gives since-start figures; each later one the figures since the previous page.
    A page whose counters went down (a restart) starts over: its update has ``status`` saying so
    and carries the restarted server's since-start figures.
    """

    def __init__(self) -> None:
        self.previous: Scrape | None = None

    def observe(self, text: str, t: float) -> ServerUpdate:
        """Read one page fetched at ``t``; :class:`MetricsError` if it is not a metrics page."""
        scrape = parse_scrape(text, t)
        previous, self.previous = self.previous, scrape
        if previous is None:
            return update_between(None, scrape)
        reason = went_back(previous, scrape)
        if reason is not None:
            update = update_between(None, scrape)
            return ServerUpdate(
                engine=update.engine, t=t, readings=update.readings, model=update.model, reset=True,
                status=f"counters reset ({reason}): the server restarted; figures start again from this poll",
            )
        return update_between(previous, scrape)


# -- fetching ----------------------------------------------------------------------------------


def metrics_url(url: str, *, field: str = "--server") -> str:
    """``url`` with ``/metrics`` added when it names only a server; user errors raise, naming ``field``
    (the flag or argument the URL came from)."""
    try:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise EagleLabError(f"not a valid URL ({exc})", field=field, found=url,
                            expected="http://HOST:PORT[/metrics]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EagleLabError(
            "not a server URL", field=field, found=url, expected="http://HOST:PORT[/metrics]",
            hint="e.g. eaglelab tui --server http://127.0.0.1:30000",
        )
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def fetch_metrics(url: str, *, timeout_s: float = 5.0) -> str:
    """GET ``url`` (a ``/metrics`` page) directly, without proxies; :class:`ServerUnreachable` if no
    complete answer came within ``timeout_s`` for the whole request (not per read: a server that
    trickles bytes or streams without end is cut off) or it was larger than :data:`MAX_PAGE_BYTES`."""
    try:
        answer = http_get.get(url, deadline_s=timeout_s, max_bytes=MAX_PAGE_BYTES, accept="text/plain")
    except http_get.RequestFailed as exc:
        if exc.status is not None:
            hint = " (SGLang serves /metrics only with --enable-metrics)" if exc.status == 404 else ""
            raise ServerUnreachable(f"{exc} from {url}{hint}") from None
        raise ServerUnreachable(f"cannot reach {url}: {exc}") from None
    return answer.body.decode("utf-8", errors="replace")
