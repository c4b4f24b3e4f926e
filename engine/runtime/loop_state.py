"""The loop's per-row state and the one place positions move.

:class:`Batch` holds a batch's device state; :func:`loop_state` makes the per-row tensors the phases update
in place (bound to the runner's graphs, never copied in or out); :func:`emit_tokens` and
:func:`emit_and_advance` are the bookkeeping of a decode step or a speculative cycle's advance: fixed
shapes, no host sync (compiled on CUDA, one kernel: :func:`cycle_ops.emit_advance`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.runtime import cycle_ops
from eaglelab.engine.runtime.contracts import DraftView


@dataclass
class Batch:
    """Device state of a batch being generated; the [B] tensors and ``out`` are updated in place."""

    cache: KVCache
    lengths: torch.Tensor  # [B] tokens in the target cache
    root: torch.Tensor  # [B] last emitted token (not yet in the cache)
    out: torch.Tensor  # [B, S] emitted tokens (S = the cache's slots >= max_new + N + 1: fixed per runner)
    n_out: torch.Tensor  # [B]
    done: torch.Tensor  # [B] bool
    hit_eos: torch.Tensor  # [B] bool
    limit: torch.Tensor  # [B] tokens a row may emit (max_new): a tensor, so graphs do not bake it in
    prompts: list[list[int]]
    prompt_lens: torch.Tensor  # [B]

    def view(self) -> DraftView:
        """What a drafter may read of this batch (the same tensors; drafters never write them)."""
        return DraftView(self.root, self.lengths, self.out, self.n_out, self.prompts, self.cache.max_len)

    def state(self) -> dict[str, torch.Tensor]:
        """What the phases update in place (the graph runner binds these buffers)."""
        return {"lengths": self.lengths, "root": self.root, "out": self.out, "n_out": self.n_out,
                "done": self.done, "hit_eos": self.hit_eos, "limit": self.limit}

    def move_request(self, src: int, dst: int, drafter) -> None:
        """Row ``src``'s request onto row ``dst``: its KV cache row, loop state, prompt and, with a ``drafter``
        (:class:`~.contracts.RefillableDrafter`), the drafter's row, copied on the device. Row ``src`` is left a
        copy (continuous batching refills it; a shrinking batch marks it ended)."""
        self.cache.copy_row(src, dst)
        move_row(self.state(), src, dst)
        if drafter is not None:
            drafter.move_row(src, dst)
        self.prompts[dst] = self.prompts[src]
        self.prompt_lens[dst] = self.prompt_lens[src]

    def row_output(self, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row ``r``'s (out, n_out, hit_eos), copied on the device: what :func:`read_kept` reads once the row's
        slot may be reused."""
        return self.out[r].clone(), self.n_out[r].clone(), self.hit_eos[r].clone()


def loop_state(lengths: torch.Tensor, root: torch.Tensor, slots: int, max_new: int,
               done: bool = False) -> dict[str, torch.Tensor]:
    """The per-row state the phases update (:meth:`Batch.state`) for rows holding ``lengths`` [B] cached
    tokens with ``root`` [B] next: nothing emitted yet into ``out`` [B, slots], ``max_new`` tokens
    allowed; ``done`` rows emit nothing and never move (a profiled step repeated as it is)."""
    B, dev = lengths.shape[0], lengths.device
    return {
        "lengths": lengths, "root": root,
        "out": torch.full((B, slots), -1, dtype=torch.long, device=dev),
        "n_out": torch.zeros(B, dtype=torch.long, device=dev),
        "done": torch.full((B,), done, dtype=torch.bool, device=dev),
        "hit_eos": torch.zeros(B, dtype=torch.bool, device=dev),
        "limit": torch.full((B,), max_new, dtype=torch.long, device=dev),
    }


def emit_tokens(state: dict[str, torch.Tensor], toks: torch.Tensor, count: torch.Tensor,
                eos: torch.Tensor) -> torch.Tensor:
    """Emit up to count[b] tokens of toks [B, K] per row not done, stopping after EOS and at ``limit``.

    Updates ``out``, ``n_out``, ``hit_eos``, ``done`` of ``state`` in place (fixed shapes, no host
    sync: it runs inside the phases' graphs). Returns the tokens emitted per row [B]: for a verify
    step this is the *accepted length* (bonus included, cut after the first EOS or at max_new, as
    SGLang counts it). Example: toks [[5, 2, 7]], count [3], eos [2], n_out [0], limit [8] ->
    out[0, :2] = [5, 2], emitted [2], hit_eos and done [True].
    """
    out, n_out, done = state["out"], state["n_out"], state["done"]
    k = torch.arange(toks.shape[1], device=toks.device)  # [K]
    valid = (k < count[:, None]) & ~done[:, None] & (k < (state["limit"] - n_out)[:, None])  # [B, K]
    is_eos = (toks[..., None] == eos).any(-1) & valid  # not isin: its sorting path syncs with the host
    keep = valid & ((is_eos.long().cumsum(1) - is_eos.long()) == 0)  # up to the first EOS
    pos = (n_out[:, None] + k).clamp(max=out.shape[1] - 1)  # [B, K]; kept tokens never reach the clamp
    out.scatter_(1, pos, torch.where(keep, toks, out.gather(1, pos)))
    emitted = keep.sum(1)  # [B]
    n_out += emitted
    state["hit_eos"] |= (is_eos & keep).any(1)
    done |= state["hit_eos"] | (n_out >= state["limit"])
    return emitted


def emit_and_advance(state: dict[str, torch.Tensor], toks: torch.Tensor, count: torch.Tensor | None, root: torch.Tensor,
                     eos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's bookkeeping, in place: :func:`emit_tokens`, then the one place positions move:
    rows that were not done gain ``count`` [B] cached tokens (None: one each) and the new ``root`` [B].
    ``toks`` past a row's count may be -1 (a speculative path's padding: never emitted, nor taken for an EOS, since
    only tokens within the count are). Compiled on CUDA, one kernel
    (:func:`cycle_ops.emit_advance`). -> (emitted [B], active [B]: the rows not done before this step)."""
    if cycle_ops.applies(toks):
        return cycle_ops.emit_advance(state, toks, count, root, eos)
    count = torch.ones_like(root) if count is None else count
    active = ~state["done"]
    emitted = emit_tokens(state, toks, count, eos)
    state["lengths"] += torch.where(active, count, 0)
    state["root"].copy_(torch.where(active, root, state["root"]))
    return emitted, active


def move_row(state: dict[str, torch.Tensor], src: int, dst: int) -> None:
    """Row ``src`` of every per-row tensor onto row ``dst``, in place (continuous batching: a running request
    leaves the first rows to new prompts, whose phases of k rows use rows 0..k-1)."""
    for t in state.values():
        t[dst].copy_(t[src])


def start_rows(state: dict[str, torch.Tensor], lengths: torch.Tensor, first: torch.Tensor, max_new: int,
               eos: torch.Tensor) -> None:
    """Rows 0..k-1 take new requests, in place (k = ``lengths.shape[0]``): ``lengths`` [k] prompt tokens cached,
    ``first`` [k] (the prefill's tokens) their roots, each emitted as its row's first token (which may end it: an
    EOS, or ``max_new`` 1). The other rows are left as they are: they emit nothing here. Example: rows [done, live]
    with lengths [9] and first [42] -> lengths[0] 9, root[0] 42, out[0] [42, -1, ...], n_out[0] 1, done[0] False."""
    k = lengths.shape[0]
    for name, fresh in loop_state(lengths, first, state["out"].shape[1], max_new).items():  # a new run's rows
        state[name][:k].copy_(fresh)
    count = torch.zeros_like(state["n_out"])
    count[:k] = 1
    emit_tokens(state, state["root"][:, None], count, eos)


def read_kept(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> tuple[list[list[int]], list[str]]:
    """:func:`read_rows` of rows kept apart: each one row's (out, n_out, hit_eos), e.g. :meth:`Batch.row_output`."""
    return read_rows(*(torch.stack([row[i] for row in rows]) for i in range(3)))


def read_rows(out: torch.Tensor, n_out: torch.Tensor, hit_eos: torch.Tensor) -> tuple[list[list[int]], list[str]]:
    """Rows' emitted tokens (``out`` [R, S], the first ``n_out`` [R] of each) and stop reasons, in three copies."""
    counts = n_out.tolist()
    rows = out[:, : max(counts)].tolist()
    return [row[:n] for row, n in zip(rows, counts)], ["eos" if e else "length" for e in hit_eos.tolist()]
