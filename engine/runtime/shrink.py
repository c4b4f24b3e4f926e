"""A batch that sheds its ended rows: once the rows still running fit a smaller batch bucket, they move into the
first rows and the phases run on that many rows (the smaller bucket's graphs: fewer rows to draft, verify and extend).

Rows of one batch end at different steps: under speculation each row accepts at its own rate, and with EOS honoured
plain rows end at their own length too. A batch runs until its last row ends; its ended rows make nothing, yet a
phase of B rows costs what B rows cost. So, as a server drops its finished requests, the loop moves the live rows
into rows 0..k-1 when a phase of k rows would run on a smaller bucket than the batch's (``runner.padded_batch``; on
the eager runner each row counts: every ended row is shed). Worked example, 8 rows, buckets 1, 2, 4, 8: rows 1, 4, 6
live, the rest ended -> row 4 moves to row 0, row 6 to row 2 (their KV rows, loop state and the drafter's row
copied on the device, as continuous batching moves a request), row 1 stays; rows 3..7 are marked ended, and the
phases run 3 rows on bucket 4's graphs. Each row's tokens are read where the row ends up, or, for a row whose slot
was taken, from the copy made just before.

The loop decides from its lagged view of the step before the one in flight (:class:`~.readback.StepReader`); the
moves are queued behind that step, so a row the view saw live may have ended meanwhile (it moves, ended: nothing
changes). Views launched before a move show the old rows: the loop decides only from a view launched after the
last move (:meth:`Shrinker.read_one`).

Not with a stream (its rows are the prompts' indices, read from the slots each step), tensor parallelism (each
rank would move its rows alone) or a drafter that cannot move a row (:class:`~.contracts.RefillableDrafter`).
"""

from __future__ import annotations

from typing import Any

import torch

from eaglelab.engine.runtime.contracts import RefillableDrafter
from eaglelab.engine.runtime.loop_state import Batch, read_kept, read_rows

# Off: every batch runs all its rows until the last one ends, in every engine (an A/B's other side across processes:
# benchmarks/ab_constants.py; one engine: ``Engine(shed_rows=False)``, bench's ``spec-compile-gemv-attn-whole``).
SHRINK = True

Engine = Any  # eaglelab.engine.runtime.generate.Engine, which imports this module


def applies(engine: Engine, stream) -> bool:
    """Whether ``engine``'s one-batch loop sheds ended rows (see the module's docstring)."""
    drafter = engine.drafter
    return (SHRINK and engine.shed_rows and stream is None and engine.target.tp is None
            and (drafter is None or isinstance(drafter, RefillableDrafter)))


class Shrinker:
    """Which slot holds each of a batch's rows, and the outputs of the rows whose slots were taken."""

    def __init__(self, engine: Engine, st: Batch) -> None:
        self.engine, self.full = engine, st  # ``full``: the batch as prefilled, all B rows (its tensors' owners)
        st.prompts = list(st.prompts)  # rows move: never in the caller's list
        self.row_at: list[int | None] = list(range(st.root.shape[0]))  # slot -> the row it holds (None: a copy)
        self.ended: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # row -> (out, n_out, hit_eos)
        self.stale = 0  # views launched before the last move, not yet read

    def moved(self, views_in_flight: int) -> None:
        """Rows moved just now; the loop's ``views_in_flight`` views, launched before, show the old slots."""
        self.stale = views_in_flight

    def read_one(self) -> bool:
        """The loop read its oldest view: -> whether that view was launched after the last move."""
        fresh = self.stale == 0
        self.stale = max(self.stale - 1, 0)
        return fresh

    def shrink(self, st: Batch, done: torch.Tensor) -> Batch | None:
        """``done`` [B]: a fresh view's ended flags over the prefilled batch's slots. -> the batch of the live rows
        alone, moved into the first slots, when a phase of that many runs on a smaller bucket than ``st``'s; else
        None (nothing moved)."""
        runner, cur = self.engine.runner, st.root.shape[0]
        live = [s for s, ended in enumerate(done.tolist()[:cur]) if not ended]
        k = len(live)
        if k == 0 or runner.padded_batch(k) >= runner.padded_batch(cur):
            return None
        full = self.full
        free = [s for s in range(k) if s not in live]
        for src, dst in zip((s for s in live if s >= k), free):  # as many of each: k live rows, k slots below k
            self.ended[self.row_at[dst]] = full.row_output(dst)
            full.move_request(src, dst, self.engine.drafter)
            full.done[src] = True  # the copy left behind: an ended row, which a bucket's pad rows may include
            self.row_at[dst], self.row_at[src] = self.row_at[src], None
        if self.engine.drafter is not None:
            self.engine.drafter.keep_rows(k)
        return Batch(full.cache, *(t[:k] for t in (full.lengths, full.root, full.out, full.n_out, full.done,
                                                     full.hit_eos, full.limit)),
                     prompts=full.prompts[:k], prompt_lens=full.prompt_lens[:k])

    def rows(self) -> tuple[list[list[int]], list[str]]:
        """Every row's tokens and stop reason, in the order the prompts came (after the run has finished)."""
        full = self.full
        if not self.ended:
            return read_rows(full.out, full.n_out, full.hit_eos)
        at = {row: s for s, row in enumerate(self.row_at) if row is not None}  # the rows never displaced
        return read_kept([self.ended.get(r) or (full.out[at[r]], full.n_out[at[r]], full.hit_eos[at[r]])
                          for r in range(len(self.row_at))])
