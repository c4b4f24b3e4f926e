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
    "eaglelab.cmd_capture",
    "eaglelab.cmd_distill",
    "eaglelab.cmd_train",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglelab",
        description="A workbench for EAGLE-3 speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from eaglelab.errors import run_guarded

    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
