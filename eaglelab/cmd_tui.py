"""``eaglelab tui``: watch a run in the terminal: acceptance, tok/s, cycle breakdown, CUDA graphs, all-reduce.

  eaglelab tui RUN.jsonl                 replay a record (all at once; --speed 1 for its own pace)
  eaglelab tui RUN.jsonl --follow        tail a record while `eaglelab run --record RUN.jsonl` writes it
  eaglelab tui --live -- "Hi" --steps 3  start `eaglelab run "Hi" --steps 3 --record <tmp>` and follow it
  eaglelab tui --demo                    a synthetic run (no model needed)
  eaglelab tui --server URL              watch a vLLM or SGLang server through its /metrics
  eaglelab tui --log FILE --follow       watch a vLLM or SGLang server log as it is written

A server's speedup needs its plain-decoding throughput at the same load: --baseline-tok-s.

Keys: q quit, p pause / resume, r restart the replay (or re-read a followed record).
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tui`` subcommand."""
    p = subparsers.add_parser(
        "tui",
        help="terminal UI: replay or follow a run record, or watch a live run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("record", nargs="?", metavar="RECORD", help="a run record (.jsonl) written by `eaglelab run --record`")
    p.add_argument("run_args", nargs="*", metavar="RUN_ARGS", help=argparse.SUPPRESS)
    p.add_argument("--follow", action="store_true", help="tail RECORD (or --log FILE) as it is written (waits for it to appear)")
    p.add_argument(
        "--speed", type=float, default=None, metavar="X",
        help="replay at X times the recorded pace; 0 shows the whole record at once (default 0; --demo: 1)",
    )
    p.add_argument("--live", action="store_true", help="run `eaglelab run` with the arguments after `--` and follow it")
    p.add_argument("--demo", action="store_true", help="replay a synthetic EAGLE-3 run (eager verify, tp 2)")
    p.add_argument("--server", metavar="URL", help="poll a vLLM or SGLang server's /metrics (http://HOST:PORT)")
    p.add_argument("--log", metavar="FILE", help="read a vLLM or SGLang server log (with --follow: keep tailing it)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="--server: seconds between polls (default 1)")
    p.add_argument(
        "--baseline-tok-s", type=float, default=None, metavar="T",
        help="--server/--log: the server's plain-decoding throughput at the same load, for the speedup verdict",
    )
    p.add_argument(
        "--expected-accept-len", type=float, default=2.0, metavar="A",
        help="--server/--log: mean accepted length the drafter should reach (default 2)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the app on the chosen source; returns 0 when the user quits."""
    if args.server is not None or args.log is not None:
        from eaglelab.tui.server_app import ServerApp

        return run_app(ServerApp(**server_app_kwargs(args)))
    from eaglelab.tui.app import EagleLabApp

    return run_app(EagleLabApp(**app_kwargs(args)))


def run_app(app: Any) -> int:
    """Run ``app`` (a :class:`KeepsCrash` app); an error that ended it is raised again here, so it is reported
    as every command reports one: a user's mistake as a clear message (exit 2), a bug of ours as a short
    report (exit 3) after the line naming the file its full traceback was written to."""
    app.run()
    crash = app.crash
    if crash is None:
        return exit_code(app)
    from eaglelab.engine.errors import EagleLabError

    if not isinstance(crash, (EagleLabError, OSError)):
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, highlight=False).print(f"[dim]the TUI stopped on an internal error; full traceback in "
                                                    f"{escape(write_traceback(crash))}[/]")
    raise crash


def write_traceback(exc: BaseException) -> str:
    """Write ``exc``'s traceback to a new file in the temporary directory; its path."""
    import os
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="eaglelab-tui-crash-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(exc)))
    return path


def exit_code(app: Any) -> int:
    """0 when the user quit; the internal-error code when the app crashed (Textual has printed the
    traceback then, and returns as if the user had quit: the command said 0)."""
    from eaglelab.errors import INTERNAL_ERROR_EXIT

    return 0 if app.return_code in (0, None) else INTERNAL_ERROR_EXIT


def server_app_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ServerApp` keyword arguments for ``--server`` / ``--log`` (user errors raise)."""
    import math
    from pathlib import Path

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.server_metrics import metrics_url
    from eaglelab.tui.server_feeds import LogFollower, MetricsPoller

    others = [name for name, on in (("RECORD", args.record), ("--live", args.live), ("--demo", args.demo),
                                    ("--server", args.server), ("--log", args.log)) if on]
    if len(others) > 1 or args.run_args:
        raise EagleLabError("choose one source", field="--server/--log", found=" ".join(others),
                            expected="a server URL, or a server log")
    for name, value in (("--interval", args.interval), ("--baseline-tok-s", args.baseline_tok_s),
                        ("--expected-accept-len", args.expected_accept_len)):
        if value is not None and not (math.isfinite(value) and value > 0):  # inf gave a "0.00x" verdict
            raise EagleLabError("must be a positive finite number", field=name, found=value)
    if args.server is not None:
        feed: MetricsPoller | LogFollower = MetricsPoller(metrics_url(args.server), interval_s=args.interval)
    else:
        path = Path(args.log)
        check_readable(path, follow=args.follow, what="log",
                       hint="use --follow to wait for a log that a server is about to write")
        feed = LogFollower(path, follow=args.follow)
    return {"feed": feed, "baseline_tokens_per_s": args.baseline_tok_s, "expected_accept_len": args.expected_accept_len}


def check_readable(path: Path, *, follow: bool, what: str, hint: str) -> None:
    """Refuse a path that is not a regular file (with ``follow``, a missing one is waited for); a FIFO or
    a device is named as one and never opened (a FIFO blocks the open, and its size never grows)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.file_kind import file_kind

    kind = file_kind(path)
    if kind == "a regular file" or (kind == "missing" and follow):
        return
    if kind == "missing":
        raise EagleLabError(f"no such {what}", file=path, found=kind, hint=hint)
    raise EagleLabError(f"cannot read this {what}", file=path, found=kind, expected="a regular file",
                        hint=f"pass the {what} file itself")


def app_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`EagleLabApp` keyword arguments for the parsed command line (user errors raise)."""
    from pathlib import Path

    from eaglelab.engine.errors import EagleLabError

    chosen = [name for name, on in (("--live", args.live), ("--demo", args.demo)) if on]
    if len(chosen) > 1:
        raise EagleLabError("choose one source", field="--live/--demo", found=" ".join(chosen), expected="one of them")
    if args.live:
        from eaglelab.tui.feeds import LiveRun

        run_args = [a for a in (args.record, *args.run_args) if a is not None]
        if not run_args:
            raise EagleLabError(
                "--live needs the arguments of `eaglelab run`", field="--live", found="nothing after --",
                hint='e.g. eaglelab tui --live -- "Write a haiku" --steps 3',
            )
        return {"live": LiveRun.eaglelab_run(run_args)}
    if args.run_args:
        raise EagleLabError(
            "one record at a time", field="RECORD", found=" ".join([args.record, *args.run_args]),
            hint="to pass arguments to a run, use --live -- ARGS",
        )
    if args.demo:
        from eaglelab.tui.synthetic import synthetic_run

        events = synthetic_run(cycles=400, tp_size=2, layers=8, verify_mode="prefill", plain_steps=24)
        return {"events": events, "speed": 1.0 if args.speed is None else args.speed}
    if args.record is None:
        raise EagleLabError(
            "nothing to show", field="RECORD", found="no record given",
            hint="pass a record (eaglelab run PROMPT --record run.jsonl), --live -- RUN_ARGS, or --demo",
        )
    path = Path(args.record)
    check_readable(path, follow=args.follow, what="run record",
                   hint="use --follow to wait for a record that a run is about to write")
    if not args.follow:
        from eaglelab.probes.record import read_record

        found = read_record(path)
        if not found.events and not found.skipped_lines:
            raise EagleLabError(
                "the run record holds no events", file=path, found="an empty file" if found.schema_version is None
                else "a header and nothing else (the run stopped before its first step)",
                hint="replay a record of a run that started, or use --follow to wait for one being written",
            )
        if not found.events and found.skipped_lines:
            raise EagleLabError(
                "not an eaglelab run record", file=path,
                found=f"{found.skipped_lines} lines, none of them an event", expected="JSONL events",
                hint="write one with eaglelab run PROMPT --record run.jsonl; for a vLLM or SGLang log use --log FILE",
            )
    return {"record": path, "follow": args.follow, "speed": 0.0 if args.speed is None else args.speed}
