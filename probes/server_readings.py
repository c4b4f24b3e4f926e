"""What a serving engine says about its speculative decoding, in eaglelab's own definitions.

Both ways of watching a server end here: polling its ``/metrics``
(:mod:`eaglelab.probes.server_metrics`) and following its log (:mod:`eaglelab.probes.server_log`).
Each makes :class:`ServerUpdate` objects: one per poll or log line, with a
:class:`ServerReading` per rank that spoke.

Definitions (the same as :mod:`eaglelab.probes.acceptance`):

- ``accept_len``: tokens committed per request per verify, the bonus token included.
- ``accept_rate``: accepted draft tokens over draft tokens offered.
- ``per_position[d-1]``: share of drafts whose accepted run reached depth ``d``.

Each source's conversion into these is written next to the code that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerReading:
    """One rank's figures over one interval (between two polls, or one log line's interval).

    A figure the source does not give is None (never 0). ``drafts`` is the number of verifies
    (one per request per step) the figures cover, when the source says; it weighs averages.
    """

    rank: str  # e.g. "engine 0" (vLLM), "TP0" or "DP1 TP1" (SGLang)
    accept_len: float | None = None
    accept_rate: float | None = None
    per_position: tuple[float, ...] = ()
    drafts: float | None = None
    draft_tokens: float | None = None
    gen_tokens_per_s: float | None = None
    cuda_graph_passes: float | None = None  # decode passes that replayed a CUDA graph
    eager_passes: float | None = None  # decode passes that did not
    graph_mode: str | None = None  # e.g. vLLM's runtime mode "FULL" / "PIECEWISE" / "NONE"
    running_reqs: float | None = None

    @property
    def cuda_graph_share(self) -> float | None:
        """Share of this interval's decode passes that replayed a CUDA graph."""
        if self.cuda_graph_passes is None or self.eager_passes is None:
            return None
        total = self.cuda_graph_passes + self.eager_passes
        return self.cuda_graph_passes / total if total > 0 else None


@dataclass(frozen=True)
class ServerUpdate:
    """What one poll or one log line brought.

    ``engine`` is ``"vllm"`` or ``"sglang"``; ``gen_tokens_per_s`` is the whole server's
    generation throughput when the source gives one figure for it (else the ranks' figures are
    summed). ``status`` is a line for the user when something is off (no speculative metrics, a
    restart); ``reset`` says the server restarted, so totals start over with this update.
    """

    engine: str
    t: float  # seconds, on the watcher's clock
    readings: tuple[ServerReading, ...] = ()
    gen_tokens_per_s: float | None = None
    model: str | None = None
    status: str | None = None
    reset: bool = False


def histogram_from_reach(drafts: float, reached: tuple[float, ...]) -> tuple[float, ...]:
    """Drafts per accepted length ``1 .. len(reached) + 1`` from how many drafts reached each depth.

    ``reached[d-1]`` drafts accepted at least ``d`` draft tokens, so exactly ``a`` tokens were
    committed (bonus included) by ``reached[a-2] - reached[a-1]`` drafts, with
    ``reached[-1] = drafts``. Example: 10 drafts, reached (6, 2) -> (4, 4, 2) for lengths 1, 2, 3.
    """
    reach = (drafts, *reached, 0.0)
    return tuple(max(reach[i] - reach[i + 1], 0.0) for i in range(len(reach) - 1))
