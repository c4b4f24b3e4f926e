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
from eaglelab.engine.runtime.loop_state import Batch, move_row, read_rows

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
        self.slot_of: list[int] = list(range(st.root.shape[0]))  # row -> slot (meaningless once in ``ended``)
        self.ended: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # row -> (out, n_out, hit_eos)
        self.stale = 0  # views launched before the last move, not yet read
        self.widths: list[int] = []  # the rows each shrink left, in order

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
        live = [s for s in range(cur) if not bool(done[s])]
        k = len(live)
        if k == 0 or runner.padded_batch(k) >= runner.padded_batch(cur):
            return None
        full, drafter = self.full, self.engine.drafter
        state = full.state()
        owner = {s: r for r, s in enumerate(self.slot_of) if r not in self.ended}  # slot -> row
        movers = [s for s in live if s >= k]
        free = [s for s in range(k) if s not in live]
        for src, dst in zip(movers, free):  # as many of each: k live rows, k slots below k
            gone = owner[dst]
            self.ended[gone] = (full.out[dst].clone(), full.n_out[dst].clone(), full.hit_eos[dst].clone())
            full.cache.copy_row(src, dst)
            move_row(state, src, dst)
            if drafter is not None:
                drafter.move_row(src, dst)
            full.prompts[dst] = full.prompts[src]
            full.prompt_lens[dst] = full.prompt_lens[src]
            full.done[src] = True  # the copy left behind: an ended row, which a bucket's pad rows may include
            self.slot_of[owner[src]] = dst
        if drafter is not None:
            drafter.keep_rows(k)
        self.widths.append(k)
        return Batch(full.cache, *(t[:k] for t in (full.lengths, full.root, full.out, full.n_out, full.done,
                                                     full.hit_eos, full.limit)),
                     prompts=full.prompts[:k], prompt_lens=full.prompt_lens[:k])

    def rows(self) -> tuple[list[list[int]], list[str]]:
        """Every row's tokens and stop reason, in the order the prompts came (after the run has finished)."""
        if not self.ended:
            return read_rows(self.full.out, self.full.n_out, self.full.hit_eos)
        full = self.full
        kept = [self.ended.get(r) or (full.out[s], full.n_out[s], full.hit_eos[s]) for r, s in enumerate(self.slot_of)]
        return read_rows(*(torch.stack([row[i] for row in kept]) for i in range(3)))
