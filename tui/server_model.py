"""The TUI's view of a server: :class:`ServerTotals` plus histories, as a frozen snapshot.

::

    model = ServerModel(baseline_tokens_per_s=82.0)
    model.apply_all(poller.drain())
    view = model.view()            # ServerView: .run feeds the run panels, .ranks the rank table

The acceptance histogram, per-position acceptance and CUDA-graph panels are the ones a run gets:
:attr:`ServerView.run` is a :class:`RunView` filled with what the server reports (and nothing else:
no phase times, no all-reduces, which servers do not expose).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

from eaglelab.probes.server_economics import LiveEconomics, live_economics
from eaglelab.probes.server_readings import ServerUpdate
from eaglelab.probes.server_totals import RankRow, ServerTotals
from eaglelab.tui.model import GraphRow, RunView


@dataclass(frozen=True)
class ServerView:
    """Everything the server screen shows, as numbers."""

    run: RunView
    engine: str | None
    model: str | None
    updates: int
    ranks: tuple[RankRow, ...]
    economics: LiveEconomics | None
    statuses: tuple[str, ...]  # every different status line so far
    status: str | None  # the latest update's status line
    resets: int
    graph_modes: tuple[tuple[str, float], ...]  # (runtime mode, passes), most first


class ServerModel:
    """Folds server updates; ``history`` is how many points the sparklines keep."""

    def __init__(
        self, *, baseline_tokens_per_s: float | None = None, expected_accept_len: float = 2.0, history: int = 240
    ) -> None:
        self.baseline_tokens_per_s = baseline_tokens_per_s
        self.expected_accept_len = expected_accept_len
        self.totals = ServerTotals()
        self._accept: deque[float] = deque(maxlen=history)
        self._tokens: deque[float] = deque(maxlen=history)

    def apply(self, update: ServerUpdate) -> None:
        """Fold one update."""
        if update.reset:
            self._accept.clear()
            self._tokens.clear()
        self.totals.observe(update)
        if any(r.accept_len is not None for r in update.readings) and self.totals.recent_accept_len is not None:
            self._accept.append(self.totals.recent_accept_len)
        if (update.gen_tokens_per_s is not None or any(r.gen_tokens_per_s is not None for r in update.readings)) \
                and self.totals.recent_tokens_per_s is not None:
            self._tokens.append(self.totals.recent_tokens_per_s)

    def apply_all(self, updates: Iterable[ServerUpdate]) -> int:
        """Fold many updates; returns how many."""
        n = 0
        for update in updates:
            self.apply(update)
            n += 1
        return n

    def view(self) -> ServerView:
        """A frozen snapshot."""
        t = self.totals
        on, off = t.graph_passes
        graphs = (GraphRow("decode", int(on), int(off), _mode_reasons(t)),) if on + off > 0 else ()
        run = RunView(
            mean_accept_len=t.accept_len,
            recent_accept_len=t.recent_accept_len,
            accept_rate=t.accept_rate,
            accept_len_trend=tuple(self._accept),
            accept_histogram=tuple((a, round(n)) for a, n in t.histogram),
            per_position=t.per_position,
            tokens_per_s=t.tokens_per_s,
            recent_tokens_per_s=t.recent_tokens_per_s,
            tokens_per_s_history=tuple(self._tokens),
            graphs=graphs,
            replay_fraction=t.cuda_graph_share,
        )
        return ServerView(
            run=run,
            engine=t.engine,
            model=t.model,
            updates=t.updates,
            ranks=t.rank_rows(),
            economics=self._economics(),
            statuses=tuple(t.statuses),
            status=t.last_status,
            resets=t.resets,
            graph_modes=tuple(t.graph_modes.most_common()),
        )

    def _economics(self) -> LiveEconomics | None:
        t = self.totals
        if t.recent_accept_len is None:
            return None
        # Judged on the latest figures: a live screen answers "does it pay now".
        return live_economics(
            max(t.recent_accept_len, 1.0), t.recent_tokens_per_s,
            baseline_tokens_per_s=self.baseline_tokens_per_s, expected_accept_len=self.expected_accept_len,
            cuda_graph_share=t.cuda_graph_share, engine=t.engine,
        )


def _mode_reasons(t: ServerTotals) -> tuple[tuple[str, int], ...]:
    """Eager passes by runtime mode (vLLM's table says NONE for them), for the graph panel."""
    none = t.graph_modes.get("NONE", 0.0)
    return (("runtime mode NONE", int(none)),) if none else ()
