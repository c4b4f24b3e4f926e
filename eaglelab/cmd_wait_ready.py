"""``eaglelab wait-ready URL``: wait until an SGLang server is truly warm, without generating.

Polls ``URL/v1/models`` (never ``/health`` or ``/health_generate``, which generate); with
``--log FILE`` also waits for "Capture cuda graph end" and "The server is fired up and ready to
roll!" in the server log, and warns about health-check prefills that ran before the server was
ready. Exit status: 0 ready, 1 timed out, 2 a bad argument.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``wait-ready`` subcommand."""
    p = subparsers.add_parser(
        "wait-ready",
        help="wait until an SGLang server is warm (polls /v1/models, optionally tails its log)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", metavar="URL", help="server base URL, e.g. http://localhost:30000")
    p.add_argument("--log", metavar="FILE", default=None, help="server log to watch for the start-up markers")
    p.add_argument("--timeout", metavar="S", type=float, default=600.0, help="give up after S seconds (600)")
    p.add_argument("--interval", metavar="S", type=float, default=2.0, help="seconds between polls (2)")
    p.set_defaults(func=run)


_NAMES = {
    "http_ok": "HTTP /v1/models answers",
    "graph_captured": "CUDA graphs captured",
    "fired_up": "server fired up",
    "warm": "warm",
}


def run(args: argparse.Namespace) -> int:
    """Wait, print milestones as they come, return 0 when warm and 1 on timeout."""
    from rich.console import Console
    from rich.markup import escape

    from eaglelab.probes.readiness import Milestone, wait_ready

    console = Console(highlight=False)

    def show(m: Milestone) -> None:
        console.print(f"[dim]{m.elapsed_s:8.1f} s[/]  {_NAMES.get(m.name, m.name)}  [dim]{escape(m.detail)}[/]")

    console.print(f"waiting for {escape(args.url)}" + (f" (log {escape(args.log)})" if args.log else ""))
    result = wait_ready(
        args.url, log=args.log, timeout_s=args.timeout, interval_s=args.interval, on_milestone=show
    )
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    if result.ready:
        console.print(f"[bold green]ready[/] after {result.elapsed_s:.1f} s ({result.polls} polls)")
        return 0
    missing = ", ".join(_NAMES.get(n, n) for n in result.waiting_for)
    console.print(
        f"[bold red]not ready[/] after {result.elapsed_s:.1f} s: still waiting for {escape(missing)}; "
        f"last HTTP answer: {escape(result.last_http)}"
    )
    if "graph_captured" in result.waiting_for and result.milestone("fired_up") is not None:
        console.print("[yellow]the log shows the server up without captured CUDA graphs: started with --disable-cuda-graph?[/]")
    return 1
