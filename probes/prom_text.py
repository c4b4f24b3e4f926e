"""Read Prometheus text exposition (what a server's ``/metrics`` answers) into plain samples.

The format, one sample per line::

    # HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
    # TYPE vllm:spec_decode_num_drafts counter
    vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 120.0
    vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09

A sample is ``name``, optional ``{label="value",...}`` (values escape ``\\\\``, ``\\"`` and ``\\n``),
a value (a float, ``NaN``, ``+Inf``, ``-Inf``) and an optional millisecond timestamp. Lines starting
with ``#`` are comments; ``# TYPE`` ones are kept. A line that is none of these is counted in
:attr:`Exposition.bad_lines` instead of failing the whole page, so one odd exporter line does not
hide the rest; a page with no sample at all is for the caller to call garbage.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_SPECIAL = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class Sample:
    """One exposed sample; ``labels`` sorted by name."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None when the sample has no such label."""
        return next((v for k, v in self.labels if k == key), None)


@dataclass(frozen=True)
class Exposition:
    """A parsed ``/metrics`` page."""

    samples: tuple[Sample, ...]
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter | gauge | histogram ...
    bad_lines: tuple[int, ...] = ()  # 1-based numbers of lines that are not Prometheus text

    def named(self, name: str) -> list[Sample]:
        """The samples called exactly ``name``."""
        return [s for s in self.samples if s.name == name]


class _BadLine(ValueError):
    pass


def parse_exposition(text: str) -> Exposition:
    """Parse a text exposition page; lines that cannot be read are listed, not raised."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    bad: list[int] = []
    for number, raw in enumerate(text.split("\n"), start=1):  # only \n ends a line (not \x1e, \u2028 ...)
        line = raw.strip(" \t\r")
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        try:
            samples.append(_sample(line))
        except _BadLine:
            bad.append(number)
    return Exposition(tuple(samples), types, tuple(bad))


def _sample(line: str) -> Sample:
    name = _NAME.match(line)
    if name is None:
        raise _BadLine(line)
    at = name.end()
    labels: tuple[tuple[str, str], ...] = ()
    if at < len(line) and line[at] == "{":
        labels, at = _labels(line, at + 1)
    rest = line[at:].split()
    if not rest or len(rest) > 2 or (at < len(line) and not line[at].isspace()):
        raise _BadLine(line)
    return Sample(name.group(0), labels, _number(rest[0]))


def _labels(line: str, at: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Labels from just after ``{``; returns them sorted and the index after ``}``."""
    out: dict[str, str] = {}
    while True:
        while at < len(line) and line[at] in " ,":
            at += 1
        if at < len(line) and line[at] == "}":
            return tuple(sorted(out.items())), at + 1
        key = _LABEL_NAME.match(line, at)
        if key is None or line[key.end() : key.end() + 2] != '="':
            raise _BadLine(line)
        value, at = _quoted(line, key.end() + 2)
        out[key.group(0)] = value


def _quoted(line: str, at: int) -> tuple[str, int]:
    """A label value from just after its opening quote; returns it and the index after the quote."""
    chars: list[str] = []
    while at < len(line):
        c = line[at]
        if c == '"':
            return "".join(chars), at + 1
        if c == "\\" and at + 1 < len(line):
            chars.append(_ESCAPES.get(line[at + 1], "\\" + line[at + 1]))
            at += 2
            continue
        chars.append(c)
        at += 1
    raise _BadLine(line)


def _number(text: str) -> float:
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    try:
        return float(text)
    except ValueError as exc:
        raise _BadLine(text) from exc
