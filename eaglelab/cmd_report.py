"""``eaglelab report FILE|URL``: summarise a run record (JSONL), an SGLang or vLLM server log, a saved
``/metrics`` page, or a running vLLM / SGLang server (its URL: /metrics is read twice, --window apart).

Prints mean accepted length, generation throughput, the share of decode steps on CUDA graphs,
prefill and decode counts and verdicts; ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="summarise a run record, a server log, or a server's /metrics (accept length, tok/s, verdicts)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "file", metavar="FILE|URL",
        help="a run record (.jsonl), an SGLang or vLLM log, a saved /metrics page, or a server URL",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--decode-ms", metavar="MS", type=float, default=None,
        help="cost of one plain decode step, for the speedup verdict when the record has no baseline",
    )
    p.add_argument(
        "--expected-accept-len", metavar="A", type=float, default=2.0,
        help="mean accepted length this drafter should reach (default 2)",
    )
    p.add_argument(
        "--baseline-tok-s", metavar="T", type=float, default=None,
        help="a server's plain-decoding throughput at the same load, for the speedup verdict",
    )
    p.add_argument(
        "--window", metavar="S", type=float, default=5.0,
        help="a server URL: seconds between the two reads of /metrics (0: read once; default 5)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Summarise FILE; 0 on success (user errors raise EagleLabError, exit 2)."""
    import json
    from contextlib import nullcontext

    from rich.console import Console

    from eaglelab.probes.report import render, summarise
    from eaglelab.probes.server_report import is_url

    waiting = is_url(args.file) and args.window > 0
    status = Console(stderr=True).status(f"reading {args.file} twice, {args.window:g} s apart") if waiting else nullcontext()
    with status:
        report = summarise(
            args.file, decode_ms=args.decode_ms, expected_accept_len=args.expected_accept_len,
            baseline_tok_s=args.baseline_tok_s, window_s=args.window,
        )
    if args.json:
        print(json.dumps(finite_json(report.to_json()), indent=2, allow_nan=False))
        return 0
    Console().print(render(report))
    return 0


def finite_json(value: object) -> object:
    """``value`` with every NaN or infinity replaced by None: ``NaN`` is not JSON, and readers choke on it."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
