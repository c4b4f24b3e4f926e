"""``eaglelab report FILE``: summarise a run record (JSONL) or an SGLang server log.

Prints mean accepted length, generation throughput, the share of decode steps on CUDA graphs,
prefill and decode counts and verdicts; ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="summarise a run record or an SGLang log (accept length, tok/s, CUDA graphs, verdicts)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="an eaglelab run record (.jsonl) or an SGLang server log")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--decode-ms", metavar="MS", type=float, default=None,
        help="cost of one plain decode step, for the speedup verdict when the record has no baseline",
    )
    p.add_argument(
        "--expected-accept-len", metavar="A", type=float, default=2.0,
        help="mean accepted length this drafter should reach (default 2)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Summarise FILE; 0 on success (user errors raise EagleLabError, exit 2)."""
    import json

    from eaglelab.probes.report import render, summarise

    report = summarise(args.file, decode_ms=args.decode_ms, expected_accept_len=args.expected_accept_len)
    if args.json:
        print(json.dumps(finite_json(report.to_json()), indent=2, allow_nan=False))
        return 0
    from rich.console import Console

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
