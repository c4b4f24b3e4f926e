"""``eaglelab report FILE|URL``: summarise a run record (JSONL), an SGLang or vLLM server log, a saved
``/metrics`` page, or a running vLLM / SGLang server (its URL: /metrics is read twice, --window apart).

Prints mean accepted length, generation throughput, the share of decode steps on CUDA graphs,
prefill and decode counts and verdicts; ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable


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


MAX_WINDOW_S = 3600.0  # a longer window is a typo (an hour of one reading); 0 reads once


def run(args: argparse.Namespace) -> int:
    """Summarise FILE; 0 on success (user errors raise EagleLabError, exit 2)."""
    import json
    from contextlib import nullcontext

    from rich.console import Console

    from eaglelab.probes.report import render, summarise
    from eaglelab.probes.server_report import is_url

    check_server_flags(args)
    waiting = is_url(args.file) and args.window > 0
    status = Console(stderr=True).status(f"reading {args.file} twice, {args.window:g} s apart") if waiting else nullcontext()
    with status:
        report = summarise(
            args.file, decode_ms=args.decode_ms, expected_accept_len=args.expected_accept_len,
            baseline_tok_s=args.baseline_tok_s, window_s=args.window,
        )
    if args.json:
        text = json.dumps(finite_json(report.to_json()), indent=2, allow_nan=False)
        return emit(lambda: print(text))
    return emit(lambda: _console().print(render(report)))


def check_server_flags(args: argparse.Namespace) -> None:
    """``--window`` in 0..MAX_WINDOW_S and ``--baseline-tok-s`` a positive finite number (``nan`` slept
    for ever or gave a "nanx" verdict)."""
    import math

    from eaglelab.engine.errors import EagleLabError

    if not 0.0 <= args.window <= MAX_WINDOW_S:
        raise EagleLabError("out of range", field="--window", found=args.window,
                            expected=f"seconds from 0 (read once) to {MAX_WINDOW_S:g}")
    baseline = args.baseline_tok_s
    if baseline is not None and not (math.isfinite(baseline) and baseline > 0):
        raise EagleLabError("must be a positive finite number", field="--baseline-tok-s", found=baseline,
                            expected="the server's plain-decoding tokens/s, e.g. 82.5")


def _console() -> Any:
    """A rich console that leaves a closed pipe to :func:`emit` (rich's own handling exits with 1)."""
    from rich.console import Console

    class PipeAware(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeAware()


def emit(write: Callable[[], None]) -> int:
    """Run ``write`` (it prints to standard output) and flush here, so where the output goes fails inside
    the command: a closed pipe (``report | head``) ends quietly with 0; a full disk is a user error
    naming standard output (it was a BrokenPipeError traceback, or "Exception ignored" and exit 120)."""
    import sys

    from eaglelab.engine.errors import EagleLabError

    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: nothing more to say, and nobody to say it to
        _stdout_to_devnull()
        return 0
    except OSError as exc:
        _stdout_to_devnull()
        raise EagleLabError("cannot write the report to standard output", found=exc.strerror or str(exc),
                            hint="free space where the output is redirected, or redirect it elsewhere") from exc
    return 0


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the text still buffered (and any later print) is not written again
    into the pipe or disk that failed, at exit or by the error report."""
    import os
    import sys

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # a stdout without a descriptor (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


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
