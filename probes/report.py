"""Summarise a run: an eaglelab run record (JSONL) or an SGLang server log, detected automatically;
servers' ``/metrics`` (a URL or a saved page) and vLLM logs go through :mod:`eaglelab.probes.server_report`.

Both give the same headline figures (:class:`Report`): mean accepted length, generation
throughput, the share of decode steps on CUDA graphs, how many prefill and decode steps (log
lines, for SGLang) there were, and plain-words verdicts. For a record, "decode lines" counts
plain decode steps plus speculative cycles, "prefill lines" counts prefills; the economics verdict
(:mod:`eaglelab.probes.economics`) is given when the plain-decode cost is known, from plain decode
steps in the same record (the run's own, or the baseline ``eaglelab run --record`` writes beside it)
or from ``decode_ms``.
"""

from __future__ import annotations

import json
from itertools import islice
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA, EXPECTED_EAGER
from eaglelab.probes.bus import RunTotals
from eaglelab.probes.economics import EconomicsInputs, analyse
from eaglelab.probes.events import Step
from eaglelab.probes.file_kind import file_kind
from eaglelab.probes.log_lines import split_lines
from eaglelab.probes.record import read_record
from eaglelab.probes.sglang_log import SglangLogSummary, parse_line, read_sglang_log

SOURCES = ("eaglelab-record", "sglang-log", "vllm-log", "vllm-metrics", "sglang-metrics")
_SNIFF_LINES = 200


@dataclass(frozen=True)
class Report:
    """Headline figures of one file; ``None`` where the file does not say."""

    source: str  # "eaglelab-record" | "sglang-log"
    path: str
    accept_len_mean: float | None
    accept_rate_mean: float | None
    gen_throughput_mean: float | None  # tokens/s
    cuda_graph_fraction: float | None
    decode_lines: int | None
    prefill_lines: int | None
    verdicts: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """One JSON object (what ``eaglelab report --json`` prints)."""
        return {
            "source": self.source,
            "path": self.path,
            "accept_len_mean": self.accept_len_mean,
            "accept_rate_mean": self.accept_rate_mean,
            "gen_throughput_mean": self.gen_throughput_mean,
            "cuda_graph_fraction": self.cuda_graph_fraction,
            "decode_lines": self.decode_lines,
            "prefill_lines": self.prefill_lines,
            "verdicts": list(self.verdicts),
            "details": self.details,
            "notes": list(self.notes),
        }


def detect_source(path: str | Path) -> str:
    """``"eaglelab-record"`` if the file's first lines are record JSON, else ``"sglang-log"``."""
    lines = _head_lines(Path(path))
    json_lines = sglang_lines = 0
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
                obj = None
            if isinstance(obj, dict) and "type" in obj:
                json_lines += 1
                continue
        sglang_lines += parse_line(text) is not None
    if json_lines and json_lines >= sglang_lines:
        return "eaglelab-record"
    if not any(line.strip() for line in lines):
        raise EagleLabError(
            "the file is empty", file=path, expected="an eaglelab run record (JSONL) or an SGLang server log"
        )
    return "sglang-log"


def _head_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise EagleLabError(
            "cannot report on this path", file=path, found=file_kind(path), expected="a regular file",
            hint="pass a run record (eaglelab run --record FILE) or an SGLang server log",
        )
    try:
        with open(path, "rb") as f:
            return list(islice(split_lines(f), _SNIFF_LINES))
    except OSError as exc:
        raise EagleLabError("cannot read the file", file=path, found=exc.strerror) from exc


def summarise(
    path: str | Path,
    *,
    decode_ms: float | None = None,
    expected_accept_len: float = 2.0,
    baseline_tok_s: float | None = None,
    window_s: float = 5.0,
) -> Report:
    """Detect what ``path`` is (a record, an SGLang or vLLM log, a saved ``/metrics`` page, or a
    server's URL) and summarise it; ``baseline_tok_s`` and ``window_s`` apply to servers only."""
    from eaglelab.probes import server_report

    server = dict(baseline_tok_s=baseline_tok_s, expected_accept_len=expected_accept_len)
    if server_report.is_url(str(path)):
        return server_report.summarise_url(str(path), window_s=window_s, **server)
    kind = server_report.detect(_head_lines(Path(path)))
    if kind == "metrics":
        return server_report.summarise_metrics_file(path, **server)
    if kind == "vllm-log":
        return server_report.summarise_vllm_log(path, **server)
    if detect_source(path) == "eaglelab-record":
        return summarise_record(path, decode_ms=decode_ms, expected_accept_len=expected_accept_len)
    return summarise_sglang_log(path, expected_accept_len=expected_accept_len)


# -- eaglelab run records ----------------------------------------------------------------------


def summarise_record(path: str | Path, *, decode_ms: float | None = None, expected_accept_len: float = 2.0) -> Report:
    """Summarise a JSONL run record."""
    result = read_record(path)
    totals = RunTotals()
    for event in result.events:
        totals.observe_event(event)
    steps = [e for e in result.events if isinstance(e, Step)]
    notes = list(result.notes)
    if result.skipped_lines:
        notes.append(f"{result.skipped_lines} line(s) could not be read and were skipped")
    if not steps:
        notes.append("no steps in this record")
    if not totals.finished:
        notes.append("the run did not finish: no run_finished event (killed, crashed, or still being written); "
                     "figures cover only what was recorded")
    baseline = decode_ms if decode_ms is not None else totals.decode_ms
    verdicts = record_verdicts(totals, baseline, expected_accept_len)
    return Report(
        source="eaglelab-record",
        path=str(path),
        accept_len_mean=totals.mean_accept_len,
        accept_rate_mean=totals.acceptance.accept_rate,
        gen_throughput_mean=totals.tokens_per_s if steps or totals.finished else None,
        cuda_graph_fraction=totals.replay_fraction,
        decode_lines=totals.cycles,
        prefill_lines=totals.cycles_by_kind.get("prefill", 0),
        verdicts=tuple(verdicts),
        details=_record_details(totals, result.schema_version, baseline),
        notes=tuple(notes),
    )


def _record_details(totals: RunTotals, schema_version: object, decode_ms: float | None) -> dict[str, Any]:
    info = totals.info
    phase_ms = {}
    for phase in totals.phases_seen():
        mean = totals.mean_phase_ms(phase)
        if mean is not None:
            phase_ms[phase] = mean
    return {
        "schema_version": schema_version,
        "finished": bool(totals.finished),
        "model": info.model if info else None,
        "device": info.device if info else None,
        "spec": dict(info.spec) if info else None,
        "generated_tokens": totals.generated_tokens,
        "seconds": totals.seconds,
        "cycles_by_kind": dict(totals.cycles_by_kind),
        "phase_ms_mean": phase_ms,
        "decode_ms": decode_ms,
        "per_position_accept_rate": list(totals.acceptance.per_position_rate()),
        "accept_len_histogram": {str(k): v for k, v in sorted(totals.acceptance.histogram.items())},
        "eager_reasons": dict(totals.eager_reasons),
        "warnings": [f"{s}: {m}" for s, m in totals.warnings],
    }


def economics_inputs(
    totals: RunTotals, decode_ms: float | None = None, expected_accept_len: float = 2.0
) -> EconomicsInputs | None:
    """Economics inputs from a run's spec cycles, or None when a cost or acceptance is unknown.

    ``decode_ms`` defaults to the mean decode time of the run's own plain decode steps.
    """
    if decode_ms is None:
        decode_ms = totals.decode_ms
    accept_len = totals.acceptance.mean_accept_len
    draft = totals.mean_phase_ms("draft", kind="spec")
    verify = totals.mean_phase_ms("verify", kind="spec")
    if decode_ms is None or decode_ms <= 0 or accept_len is None or draft is None or verify is None:
        return None
    spec = dict(totals.info.spec) if totals.info is not None else {}
    return EconomicsInputs(
        decode_ms=decode_ms,
        draft_ms=draft,
        verify_ms=verify,
        accept_ms=totals.mean_phase_ms("accept", kind="spec") or 0.0,
        extend_ms=totals.mean_phase_ms("draft_extend", kind="spec") or 0.0,
        accept_len=accept_len,
        verify_graph=dominant_verify_graph(totals),
        attention_mode=spec.get("attention_mode"),
        expected_accept_len=expected_accept_len,
    )


def dominant_verify_graph(totals: RunTotals) -> str | None:
    """The verify graph status most steps had (``"replay"`` or ``"eager: <reason>"``); eager wins ties."""
    counts = {f"eager: {k.split(': ', 1)[1]}": n for k, n in totals.eager_reasons.items() if k.startswith("verify: ")}
    if totals.graph_replays.get("verify"):
        counts["replay"] = totals.graph_replays["verify"]
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], k != "replay"))


def record_verdicts(totals: RunTotals, decode_ms: float | None = None, expected_accept_len: float = 2.0) -> list[str]:
    """Plain-words findings for a run: economics (or acceptance alone), eager fallbacks, warnings."""
    if decode_ms is None:
        decode_ms = totals.decode_ms
    verdicts: list[str] = []
    inputs = economics_inputs(totals, decode_ms, expected_accept_len)
    accept_len = totals.acceptance.mean_accept_len
    if inputs is not None:
        economics = analyse(inputs)
        verdicts.append(economics.verdict)
        if economics.cause not in ("acceptance_low", "pays") and inputs.accept_len < expected_accept_len:
            verdicts.append("also " + _acceptance_words(inputs.accept_len, expected_accept_len))
    elif accept_len is not None:
        if accept_len < expected_accept_len:
            verdicts.append(_acceptance_words(accept_len, expected_accept_len))
        if decode_ms is None:
            verdicts.append(
                "speedup unknown: no plain-decode steps in this record; compare against a baseline "
                "(eaglelab bench) or pass --decode-ms"
            )
    verdicts += _eager_verdicts(totals.eager_reasons, totals.cycles)
    for source, message in dict.fromkeys(totals.warnings):
        verdicts.append(f"warning from {source}: {message}")
    return verdicts


# Eager runs by design or that nobody can change here: not findings (graphs turned off, a CPU,
# the prompt's varying shape, a drafter with no network).
NOT_ACTIONABLE = EXPECTED_EAGER | {EAGER_NO_CUDA}


def _eager_verdicts(eager_reasons: dict[str, int], steps: int) -> list[str]:
    """One line per eager reason the user can act on, naming every phase it hit."""
    by_reason: dict[str, list[tuple[str, int]]] = {}
    for key, count in sorted(eager_reasons.items(), key=lambda kv: -kv[1]):
        phase, reason = key.split(": ", 1)
        if f"eager: {reason}" not in NOT_ACTIONABLE:
            by_reason.setdefault(reason, []).append((phase, count))
    lines = []
    for reason, hits in by_reason.items():
        if len(hits) == 1:
            phase, count = hits[0]
            lines.append(f"{phase} ran eagerly in {count} of {steps or count} steps: {reason}")
        else:
            lines.append(f"{', '.join(p for p, _ in hits)} ran eagerly: {reason}")
    return lines


def _acceptance_words(accept_len: float, expected: float) -> str:
    return (
        f"acceptance too low: mean accepted length {accept_len:.2f} (expected >= {expected:g} for this "
        "drafter); check wiring with eaglelab check-wiring"
    )


# -- SGLang logs -------------------------------------------------------------------------------


def summarise_sglang_log(path: str | Path, *, expected_accept_len: float = 2.0) -> Report:
    """Summarise an SGLang server log."""
    s = read_sglang_log(path)
    if not (s.decode_lines or s.prefill_lines or s.graph_captured_line or s.ready_line):
        raise EagleLabError(
            "no SGLang Decode/Prefill lines or start-up markers found", file=path,
            expected="an eaglelab run record (JSONL) or an SGLang server log",
            hint="pass the file the server's output was written to",
        )
    verdicts = list(s.warnings)
    if s.accept_len_mean is not None and s.accept_len_mean < expected_accept_len:
        verdicts.insert(0, _acceptance_words(s.accept_len_mean, expected_accept_len))
    notes = []
    if s.decode_lines and s.accept_len_mean is None:
        notes.append("no decode line prints 'accept len': speculative decoding off, or an SGLang version without it")
    return Report(
        source="sglang-log",
        path=str(path),
        accept_len_mean=s.accept_len_mean,
        accept_rate_mean=s.accept_rate_mean,
        gen_throughput_mean=s.gen_throughput_mean,
        cuda_graph_fraction=s.cuda_graph_fraction,
        decode_lines=s.decode_lines,
        prefill_lines=s.prefill_lines,
        verdicts=tuple(verdicts),
        details=_log_details(s),
        notes=tuple(notes),
    )


def _log_details(s: SglangLogSummary) -> dict[str, Any]:
    return {
        "cache_hit_rate_mean": s.cache_hit_rate_mean,
        "input_throughput_mean": s.input_throughput_mean,
        "graph_captured_line": s.graph_captured_line,
        "capture_seconds": s.capture_seconds,
        "ready_line": s.ready_line,
        "prefills_before_ready": s.prefills_before_ready,
        "health_check_prefills_before_ready": s.health_check_prefills_before_ready,
        "health_requests_before_ready": s.health_requests_before_ready,
        "eager_health_check_prefill_lines": list(s.eager_health_check_prefill_lines),
        "health_generate_requests": s.health_generate_requests,
        "first_timestamp": s.first_timestamp,
        "last_timestamp": s.last_timestamp,
    }



# -- console -----------------------------------------------------------------------------------


def render(report: Report) -> Any:
    """A rich renderable: the headline table, then verdicts and notes."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{report.source}: {escape(report.path)}", show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("mean accepted length", _fmt(report.accept_len_mean, "{:.2f}")),
        ("accept rate", _fmt(report.accept_rate_mean, "{:.1%}")),
        ("generation throughput", _fmt(report.gen_throughput_mean, "{:.1f} tok/s")),
        ("decode steps on CUDA graphs", _fmt(report.cuda_graph_fraction, "{:.0%}")),
        (_COUNT_LABELS.get(report.source, "decode steps + spec cycles"), _fmt(report.decode_lines, "{}")),
        ("prefill lines" if report.source != "eaglelab-record" else "prefills", _fmt(report.prefill_lines, "{}")),
    ]
    for phase, ms in (report.details.get("phase_ms_mean") or {}).items():
        rows.append((f"{phase} (mean)", f"{ms:.2f} ms"))
    for name, value in rows:
        table.add_row(name, value)
    parts: list[Any] = [table]
    for verdict in report.verdicts or ("nothing to flag",):
        parts.append(Text("• " + verdict))
    for note in report.notes:
        parts.append(Text("note: " + note, style="dim"))
    return Group(*parts)


_COUNT_LABELS = {"sglang-log": "decode lines", "vllm-log": "statistics lines", "vllm-metrics": "metrics pages read",
                 "sglang-metrics": "metrics pages read"}


def _fmt(value: float | int | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)
