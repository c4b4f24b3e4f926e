"""Follow a server's log: vLLM's periodic statistics lines and SGLang's Decode lines, as updates.

vLLM (``vllm/v1/metrics/loggers.py``, ``vllm/v1/spec_decode/metrics.py``,
``vllm/compilation/cuda_graph.py``) prints every log interval (10 s by default)::

    INFO 06-06 14:20:34 [loggers.py:116] Engine 000: Avg prompt throughput: 11.2 tokens/s,
        Avg generation throughput: 267.6 tokens/s, Running: 3 reqs, Waiting: 0 reqs, ...
    INFO 06-06 14:20:34 [metrics.py:86] SpecDecoding metrics: Mean acceptance length: 2.16,
        Accepted throughput: 15.0 tokens/s, Drafted throughput: 38.7 tokens/s, Accepted: 150 tokens,
        Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264,
        Avg Draft acceptance rate: 38.8%

(earlier versions: ``Draft acceptance rate: 38.8%, Mean acceptance length: 2.16, Accepted: ..,
Drafted: .., Per-position acceptance rate: ..``; the first ones only ``Draft acceptance rate``,
``Accepted`` and ``Drafted``), and with ``--cudagraph-metrics`` a table whose rows are
``| unpadded | padded | paddings | runtime mode | count |``.

SGLang's Decode lines are read by :mod:`eaglelab.probes.sglang_log` (the parser ``report`` uses).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from eaglelab.probes.server_readings import ServerReading, ServerUpdate
from eaglelab.probes.sglang_log import BatchLine, parse_line

_SPEC = re.compile(r"SpecDecoding metrics:\s*(.*)$")
_ENGINE = re.compile(
    r"Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s"
    r"(?:, Running: (\d+) reqs)?"
)
_MEAN_LEN = re.compile(r"Mean acceptance length:\s*([\d.]+|nan)")
_ACCEPTED = re.compile(r"\bAccepted:\s*(\d+) tokens")
_DRAFTED = re.compile(r"\bDrafted:\s*(\d+) tokens")
_RATE = re.compile(r"Draft acceptance rate:\s*([\d.]+|nan)%")
_PER_POS = re.compile(r"Per-position acceptance rate:\s*((?:[\d.]+|nan)(?:,\s*(?:[\d.]+|nan))*)")
_GRAPH_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([A-Za-z_.]+)\s*\|\s*(\d+)\s*\|\s*$")


@dataclass(frozen=True)
class VllmSpecLine:
    """One ``SpecDecoding metrics`` line; a figure the line lacks is None."""

    mean_accept_len: float | None
    accepted: int | None
    drafted: int | None
    draft_accept_rate: float | None  # a fraction (the line prints a percentage)
    per_position: tuple[float, ...]


def parse_vllm_spec(text: str) -> VllmSpecLine | None:
    """Read a ``SpecDecoding metrics`` line; None for any other line."""
    head = _SPEC.search(text)
    if head is None:
        return None
    body = head.group(1)
    mean, accepted, drafted, rate, per_pos = (
        p.search(body) for p in (_MEAN_LEN, _ACCEPTED, _DRAFTED, _RATE, _PER_POS)
    )
    positions = tuple(_float(v) for v in per_pos.group(1).split(",")) if per_pos else ()
    rate_value = _float(rate.group(1)) if rate else None
    return VllmSpecLine(
        mean_accept_len=_float(mean.group(1)) if mean else None,
        accepted=int(accepted.group(1)) if accepted else None,
        drafted=int(drafted.group(1)) if drafted else None,
        draft_accept_rate=rate_value / 100.0 if rate_value is not None else None,
        per_position=tuple(p for p in positions if p is not None),
    )


def _float(text: str) -> float | None:
    """A printed figure, or None for ``nan`` (vLLM's idle interval) and anything not a finite number
    (``1.2.3`` matches the digits-and-dots pattern, ``1e999`` is infinite)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def vllm_spec_reading(line: VllmSpecLine, rank: str) -> ServerReading | None:
    """Our figures from a vLLM spec line; None for an idle interval (nothing drafted).

    vLLM's "Mean acceptance length" is ``1 + accepted / drafts``: the bonus token included, as
    ours. The line has no draft count, so ``drafts = accepted / (mean - 1)`` (to the precision of
    the two printed decimals) weighs it against other lines; accept rate = accepted / drafted.
    """
    if line.drafted == 0 or (line.mean_accept_len is None and line.draft_accept_rate is None):
        return None
    mean = line.mean_accept_len if line.mean_accept_len is not None and line.mean_accept_len >= 1.0 else None
    drafts = line.accepted / (mean - 1.0) if mean is not None and mean > 1.0 and line.accepted else None
    rate = line.accepted / line.drafted if line.accepted is not None and line.drafted else line.draft_accept_rate
    return ServerReading(
        rank=rank, accept_len=mean, accept_rate=rate, per_position=line.per_position,
        drafts=drafts, draft_tokens=float(line.drafted) if line.drafted is not None else None,
    )


def sglang_reading(line: BatchLine) -> ServerReading | None:
    """Our figures from an SGLang Decode line; None for a Prefill line.

    SGLang's "accept len" is accepted tokens plus one per request, over verifies: the bonus token
    included, as ours. "cuda graph" says whether this batch ran its decode (or verify) on a graph.
    """
    if line.kind != "decode":
        return None
    graph = None if line.cuda_graph is None else float(line.cuda_graph)
    return ServerReading(
        rank=" ".join(f"{k}{v}" for k, v in line.ranks.items()) or "TP0",
        accept_len=line.accept_len if line.accept_len is not None and line.accept_len >= 1.0 else None,
        accept_rate=line.accept_rate,
        gen_tokens_per_s=line.gen_throughput,
        cuda_graph_passes=graph,
        eager_passes=None if graph is None else 1.0 - graph,
        running_reqs=line.running_req,
    )


class ServerLogWatch:
    """Turns log lines of a vLLM or SGLang server into updates (``feed`` returns None for other lines)."""

    def __init__(self) -> None:
        self.engine_index = 0  # the engine of the last "Engine NNN:" line (vLLM logs its spec line after it)
        self.lines = 0
        self.engine: str | None = None  # "vllm" | "sglang" once a line said which

    def feed(self, text: str, t: float) -> ServerUpdate | None:
        """Read one line (arrived at ``t`` on the watcher's clock)."""
        self.lines += 1
        reading, engine = self._vllm(text)
        if engine is None:
            item = parse_line(text, self.lines)
            if isinstance(item, BatchLine):
                reading, engine = sglang_reading(item), "sglang"
        if engine is None:
            return None
        self.engine = engine
        return ServerUpdate(engine=engine, t=t, readings=(reading,) if reading is not None else ())

    def _vllm(self, text: str) -> tuple[ServerReading | None, str | None]:
        rank = f"engine {self.engine_index}"
        spec = parse_vllm_spec(text)
        if spec is not None:
            return vllm_spec_reading(spec, rank), "vllm"
        engine = _ENGINE.search(text)
        if engine is not None:
            self.engine_index = int(engine.group(1))
            running = float(engine.group(4)) if engine.group(4) is not None else None
            return ServerReading(f"engine {self.engine_index}", gen_tokens_per_s=_float(engine.group(3)),
                                 running_reqs=running), "vllm"
        row = _GRAPH_ROW.match(text.strip())
        if row is not None and self.engine != "sglang":
            mode = row.group(4).rsplit(".", 1)[-1].upper()  # "FULL" or "CUDAGraphMode.FULL"
            count = float(row.group(5))
            on_graph = mode != "NONE"
            return ServerReading(rank, graph_mode=mode, cuda_graph_passes=count if on_graph else 0.0,
                                 eager_passes=0.0 if on_graph else count), "vllm"
        return None, None
