"""Continuous batching (``Engine.generate(max_batch=B)`` with more prompts than B): B rows run, and before each step
the rows whose requests ended take the next prompts, once enough of them are free to share one prefill
(:func:`refill_rows`).

The engine's phases of k rows use the first k rows of every cache and state buffer (a graph runner's: of its batch
bucket), so new prompts start in rows 0..k-1, all prefilled together (:func:`_take_rows`); the requests running
there first move to free rows (KV rows, loop state and the drafter's row copied on the device:
:class:`~eaglelab.engine.runtime.contracts.RefillableDrafter`). The stop check is the loop's own, lagged
(:class:`~eaglelab.engine.runtime.readback.StepReader`): a view launched before a refill never retires a row the
refill touched. Worked example, B = 2, prompts p0..p3, a graph runner with buckets 1 and 2: p0, p1 prefilled in
rows 0 and 1; p1 ends -> p0 moves from row 0 to row 1, p2 is prefilled alone in row 0; p0 and p2 end at the same
step -> p3 and nothing else (the queue's last) start in row 0, row 1 stays free; p3 ends -> the queue is empty and
every row has ended: done.

Functions of an :class:`~eaglelab.engine.runtime.generate.Engine` (its prefill, steps and observer), kept here so
the generation loop's module stays one sitting's read.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from eaglelab.engine.runtime.contracts import RefillableDrafter
from eaglelab.engine.runtime.loop_state import Batch, read_kept, start_rows
from eaglelab.engine.runtime.readback import StepReader, StepView

Engine = Any  # eaglelab.engine.runtime.generate.Engine, which imports this module


def refill_rows(max_batch: int) -> int:
    """The free rows that wait for each other before a refill, by default: ``max_batch // 4`` (at least 1).

    A prefill of a few short prompts costs about what one costs (it is latency, not work: ~1.5-2 ms for SmolLM2 on
    an H200, about a cycle of the whole batch), while a free row waiting costs 1/B of a step's tokens per step. With
    requests of L tokens at a tokens a step ending one every L/(a B) steps, waiting for m free rows costs about
    (m - 1) L / (2 a B) row-steps of 1/B each and saves (m - 1)/m of a prefill per request: the best m is about
    B sqrt(2 a P / (L c)) for a prefill of P and a step of c; at P ~ 1.4 c, a ~ 2-3 and L = 128 that is B/5-B/4.
    At batch 1-7 every free row refills at once."""
    return max(1, max_batch // 4)


def check_refill(max_batch: int | None, refill: int | None) -> None:
    """Why ``refill`` free rows cannot wait for each other in ``max_batch`` rows (ValueError), if they cannot: said
    whether or not this call's prompts outnumber the rows."""
    if refill is not None and (max_batch is None or not 1 <= refill <= max_batch):
        rows = "no max_batch (one batch, never refilled)" if max_batch is None else f"1..{max_batch} (max_batch)"
        raise ValueError(f"refill_rows {refill}: the free rows a refill waits for must be {rows}")


def check(engine: Engine, max_batch: int, stream: Callable | None) -> None:
    """Why this engine cannot serve a queue of prompts in ``max_batch`` rows (ValueError), if it cannot."""
    if engine.target.tp is not None:
        raise ValueError("continuous batching has not been tried under tensor parallelism (each rank would move "
                         "and refill its rows alone): run the prompts as one batch (max_batch None)")
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch}: at least one row is needed to serve a queue of prompts")
    if stream is not None:
        raise ValueError("a stream takes rows, and continuous batching hands a row to several requests: "
                         "stream one batch (max_batch None) instead")
    if engine.drafter is not None and not isinstance(engine.drafter, RefillableDrafter):
        raise ValueError(f"{type(engine.drafter).__name__} cannot take a new prompt into a running batch (it has "
                         "no refill/move_row): run its prompts as one batch (max_batch None)")


def serve(engine: Engine, prompts: list[list[int]], max_new: int, sampling, generator, max_batch: int,
          refill: int | None = None):
    """Continuous batching over ``prompts`` in ``max_batch`` rows: the first ``max_batch`` prefilled as one
    batch, then before each step, once ``refill`` rows (:func:`refill_rows` by default; fewer when the queue holds
    fewer, or no row is live) have ended as the lagged stop check sees it, the free rows take the next prompts,
    until the queue is empty and every row has ended. New prompts are prefilled together in the
    first rows (the phases of k rows use the first k rows of every cache and state buffer,
    :func:`_take_rows`), so requests running there first move to free rows: their cache rows, state and
    drafter state copied, a few MB per move on the device. Rows never change once ended (an ended row emits
    nothing and never moves), so an ended request's tokens are copied out on the device when the host sees it
    end, read once at the end.
    -> (tokens, stop reasons, per-cycle acceptance, prompts per prefill), tokens and reasons per prompt in the
    order given."""
    B = max_batch
    wait = refill_rows(B) if refill is None else refill
    st = engine._prefill(prompts[:B], max_new, sampling, generator, longest=max(len(p) for p in prompts))
    owner: list[int | None] = list(range(B))  # the request each row serves (None: ended, free)
    fresh = [0] * B  # per row: the first step whose view shows the row's current request
    queue = deque(range(B, len(prompts)))
    ended: dict[int, tuple[torch.Tensor, ...]] = {}  # request -> its row's (out, n_out, hit_eos), on device
    accepted: list[tuple[torch.Tensor, torch.Tensor]] = []
    prefills = [B]
    watched = {"done": st.done}
    reader = StepReader(engine.stop_lag, watched)
    launched: deque[tuple[StepView, int]] = deque([(reader.view(watched), 0)])
    step = 0
    while True:
        while launched and len(launched) > engine.stop_lag:
            view, index = launched.popleft()
            done = view.read()["done"].tolist()
            for r, request in enumerate(owner):
                if request is not None and done[r] and index >= fresh[r]:
                    ended[request] = st.row_output(r)
                    owner[r] = None
        while queue and owner.count(None) >= min(wait, len(queue)):
            prefills.append(_take_rows(engine, st, owner, fresh, queue, prompts, max_new, sampling, generator, step))
        if all(request is None for request in owner):
            break
        step += 1
        engine._cycle += 1
        if engine.spec.enabled:
            accepted.append(engine._spec_cycle(st, sampling, generator))
        else:
            engine._decode_step(st, sampling, generator)
        engine._rows_run.append(engine.runner.padded_batch(B))
        launched.append((reader.view(watched), step))
    engine._forget_extra(len(launched), accepted)
    order = range(len(prompts))
    tokens, reasons = read_kept([ended[q] for q in order])
    return tokens, reasons, accepted, prefills


def _take_rows(engine: Engine, st: Batch, owner: list, fresh: list[int], queue: deque, prompts, max_new: int,
               sampling, generator, step: int) -> int:
    """Start the next ``k`` queued prompts as one batch in rows 0..k-1, ``k`` as many as the free rows allow:
    a phase of ``k`` rows runs on ``runner.padded_batch(k)`` rows (its batch bucket), and every one of those
    must be free, so the requests running there first move to free rows past them. One prefill of ``k``
    prompts costs little more than one of a single prompt (a batch-1 prefill is latency, not work): serving
    every new request alone cost plain decoding 16-34% of its tok/s at batch 8-32 on the H200. Views of steps
    up to ``step`` (launched before this) no longer show the rows touched. -> ``k``."""
    free = owner.count(None)
    k = min(free, len(queue))
    while k > 1 and engine.runner.padded_batch(k) > free:
        k -= 1
    span, eager = engine.runner.padded_batch(k), None
    if span > free:  # no bucket small enough: a padded graph would write other requests' rows
        span, eager = k, f"eager: {k} new prompt(s) run on {span} rows in a graph, more than the {free} free"
    spare = [r for r in range(span, len(owner)) if owner[r] is None]
    for r in range(span):  # clear rows 0..span-1: their requests move on
        if owner[r] is not None:
            dst = spare.pop(0)
            st.move_request(r, dst, engine.drafter)
            owner[dst], fresh[dst] = owner[r], step + 1
    requests = [queue.popleft() for _ in range(k)]
    ids, lengths, first, aux, eager = engine._prompt_forward([prompts[q] for q in requests], st.cache, sampling,
                                                            generator, eager)
    for r, q in enumerate(requests):
        st.prompts[r], owner[r], fresh[r] = prompts[q], q, step + 1
    st.prompt_lens[:k].copy_(lengths)
    start_rows(st.state(), lengths, first, max_new, engine.eos)
    if engine.drafter is not None:
        with engine.clock.phase("draft_extend"):
            engine.drafter.refill(st.view(), ids, aux, engine.runner, eager)  # type: ignore[union-attr]
    engine._emit("prefill", st)
    return k

