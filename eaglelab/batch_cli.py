"""What the commands that generate with the target in large batches (``distill``, ``synthesize``) share: their
device and graph flags, a progress bar's columns, and running out of memory
said as the user's --batch-size."""

from __future__ import annotations

import argparse
from typing import Any, Callable


def add_batch_generation_args(p: argparse.ArgumentParser) -> None:
    """--time-limit, --system, --no-cuda-graphs, --device, --dtype."""
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="stop before a batch would overrun S seconds")
    p.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16")


def progress_columns() -> tuple:
    """A bar, done/total, elapsed and remaining time, and a ``rate`` field the caller fills."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[rate]}"))


def out_of_memory_is_batch_size(fn: Callable[[], Any], rows: int, what: str, hint: str) -> Any:
    """``fn()``; an allocation that fails in it is the user's ``--batch-size`` (``what`` names the batch, ``hint``
    says what a batch holds), said without a traceback. Any other command gets the CLI's general message."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.errors import is_out_of_memory

    try:
        return fn()
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        first = next((line for line in str(exc).splitlines() if line.strip()), "")[:200]
        raise EagleLabError(f"out of memory {what} ({first})", field="--batch-size", found=rows, hint=hint) from None
