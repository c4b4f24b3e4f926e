"""Incident 3: warm-up disturbed by health checks.

In production, health checks that generate (``/health_generate``, and ``/health`` in SGLang
versions where it runs a 1-token generation) polled the server while it was warming up; they ran
as eager prefills and the server log showed ``cuda graph: False`` on those batches. This script
reads two real SGLang server logs posted in public SGLang threads (their sources are in each file's
header) with ``eaglelab report``'s probe and prints them side by side:

- broken:  a start-up where ``/health_generate`` polled the server during warm-up and then ran a
  generation, logged as a prefill without a graph;
- healthy: a speculative server whose log carries no health-check traffic.

The probe flags the eager health-check batches by line and says what to do: check readiness with
``eaglelab wait-ready URL`` (it polls ``/v1/models``, which never generates, and the server log).

    python examples/incident_health_checks.py
    python examples/incident_health_checks.py --log server.log     # your own log as the broken one
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from eaglelab.probes.report import Report, summarise

DATA = Path(__file__).resolve().parent / "data"
BROKEN_LOG = DATA / "sglang_health_checks_during_warmup.log"
HEALTHY_LOG = DATA / "sglang_serving_no_health_checks.log"


def main(argv: list[str] | None = None, console: Console | None = None) -> dict[str, Report]:
    """Summarise both logs, print them side by side; returns the reports by name."""
    args = _args(argv)
    console = console or Console()
    reports = {"healthy": summarise(args.healthy), "broken": summarise(args.log)}
    console.print(side_by_side(reports))
    console.print("what to do: [bold]eaglelab wait-ready http://HOST:PORT --log server.log[/] "
                  "(exit 0 once the server is warm; it never generates)")
    return reports


def side_by_side(reports: dict[str, Report]) -> Table:
    """One column per log: the figures SGLang prints, the health-check findings, the verdicts."""
    t = Table(title="incident 3: warm-up disturbed by health checks (real SGLang logs)", title_justify="left",
              show_lines=True)
    t.add_column("", style="bold")
    for name, r in reports.items():
        t.add_column(f"{name}: {Path(r.path).name}", overflow="fold")
    rows = [
        ("mean accepted length", lambda r: _f(r.accept_len_mean, "{:.2f} (bonus incl.)")),
        ("accept rate", lambda r: _f(r.accept_rate_mean, "{:.0%}")),
        ("verify ms / decode ms", lambda r: "— (SGLang logs do not print it)"),
        ("gen throughput", lambda r: _f(r.gen_throughput_mean, "{:.1f} tok/s")),
        ("decode lines on graphs", lambda r: _f(r.cuda_graph_fraction, "{:.0%}")),
        ("health checks during warm-up", lambda r: str(r.details.get("health_requests_before_ready", 0))),
        ("eager health-check prefills", lambda r: _lines(r.details.get("eager_health_check_prefill_lines") or [])),
        ("probe verdict", lambda r: "\n".join(f"• {v}" for v in r.verdicts) or "nothing to flag"),
    ]
    for name, cell in rows:
        t.add_row(name, *(cell(r) for r in reports.values()))
    return t


def _lines(numbers: list[int]) -> str:
    return "none" if not numbers else f"{len(numbers)} (log line {', '.join(map(str, numbers))}: graph False)"


def _f(value: float | None, pattern: str) -> str:
    return "— (no line prints it)" if value is None else pattern.format(value)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, default=BROKEN_LOG, help="the log to diagnose (default: the real excerpt shipped)")
    p.add_argument("--healthy", type=Path, default=HEALTHY_LOG, help="a log to compare with")
    p.add_argument("--small", action="store_true", help="accepted for symmetry with the other examples (logs are small)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
