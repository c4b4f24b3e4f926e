"""The ``eaglelab`` command line. Each subcommand lives in its own ``eaglelab/cmd_*.py`` module
exposing ``register(subparsers)``; the module is imported only when it is listed here, and heavy
imports (torch) happen inside the command functions, so ``eaglelab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "eaglelab.cmd_run",
    "eaglelab.cmd_trace",
    "eaglelab.cmd_wait_ready",
    "eaglelab.cmd_report",
    "eaglelab.cmd_bench",
    "eaglelab.cmd_tune",
    "eaglelab.cmd_check_wiring",
    "eaglelab.cmd_tui",
    "eaglelab.cmd_prompts",
    "eaglelab.cmd_synthesize",
    "eaglelab.cmd_capture",
    "eaglelab.cmd_distill",
    "eaglelab.cmd_train",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglelab",
        description="A workbench for EAGLE-3 speculative decoding.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an internal error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():  # `eaglelab run ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from eaglelab.errors import run_guarded
    from eaglelab.flags import validate

    def checked(a: argparse.Namespace) -> int | None:  # flags first: nothing loads before they pass
        validate(a)
        return a.func(a)

    return run_guarded(checked, args, argv)


if __name__ == "__main__":
    sys.exit(main())
