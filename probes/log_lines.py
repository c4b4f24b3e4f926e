"""A server log read one line at a time: SGLang and vLLM logs run to gigabytes, so no reader holds one whole.

The lines are exactly those of ``data.decode("utf-8", errors="replace").split("\\n")`` (a ``\\n`` byte is
never inside a UTF-8 sequence, so decoding line by line replaces the same bytes), with one bound: a line
longer than :data:`MAX_LINE_BYTES` keeps its first :data:`MAX_LINE_BYTES` bytes and the rest is skipped, so
a file without a single newline does not become one line in memory either.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

from eaglelab.engine.errors import EagleLabError

MAX_LINE_BYTES = 1 << 20  # no log line a parser reads comes near this; a longer one is cut here


def split_lines(f: BinaryIO) -> Iterator[str]:
    """The lines of the binary file ``f``, read with ``readline`` (never a whole-file ``read``)."""
    ended = True  # an empty file, or one ending in "\n", has an empty last line, as str.split gives it
    while raw := f.readline(MAX_LINE_BYTES):
        if raw.endswith(b"\n"):
            raw, ended = raw[:-1], True
        elif len(raw) == MAX_LINE_BYTES:
            ended = _skip_rest_of_line(f)
        else:
            ended = False
        yield raw.decode("utf-8", errors="replace")
    if ended:
        yield ""


def _skip_rest_of_line(f: BinaryIO) -> bool:
    """Read past the end of an overlong line; True if a newline ended it (False: the file did)."""
    while chunk := f.readline(MAX_LINE_BYTES):
        if chunk.endswith(b"\n"):
            return True
    return False


def read_lines(path: str | Path, *, what: str, hint: str) -> Iterator[str]:
    """The lines of the file at ``path``, streamed; :class:`EagleLabError` naming the file and ``what``
    it should be (e.g. "the SGLang log") if it cannot be opened or read part-way."""
    try:
        with open(path, "rb") as f:
            yield from split_lines(f)
    except OSError as exc:
        raise EagleLabError(f"cannot read {what}", file=path, found=exc.strerror or type(exc).__name__,
                            hint=hint) from exc
