"""Simulated acceptance while training: what a chain of draft steps would get accepted.

On held-out sequences, TTT step i at anchor p proposes the drafter's greedy token for position
p+i+2 (mapped to a target id through d2t); greedy verification accepts it when it equals the
target's own greedy token there, ``argmax(lm_head(h_{p+i+1}))``. A chain of k steps accepts the
longest run of consecutive hits, plus the bonus token::

    accept_len_k(p) = 1 + sum_{i<k} prod_{j<=i} hit_j(p)

Step i's input token is the data's ``x_{p+i+1}``; on self-distilled (greedy) data it is the
target's greedy token, so while every earlier step hit, the drafter saw exactly what the engine
would feed it: the simulation equals the engine's chain on those anchors. Anchors count when the
k drafted positions are all answer tokens (loss mask 1).

Per-position acceptance is conditional, as the engine reports it: ``rate_i = P(hit_i | hit_<i)``, over every
anchor (``per_position``) and over the engine's cycles of the longest chain (``cycle_per_position``, the figure a
benchmark's per-position acceptance compares with). The accepted length a set of rates implies is
``1 + sum_{i<k} prod_{j<=i} rate_j`` (:func:`implied_len`); over every anchor it equals ``accept_len``.

Two averages: ``accept_len`` is over EVERY valid anchor; ``cycle_len`` walks each answer the way the
engine does (first anchor: the last prompt position; next: + the accepted length) and averages over
those cycles only, the engine's own figure. Cycles land more often where drafting is hard (a cycle
there covers fewer tokens), so ``cycle_len`` < ``accept_len`` on the same data; compare a benchmark's
accepted length with ``cycle_len``.

Worked example, k = 3, hits at one anchor (1, 1, 0): accept_len = 1 + 1 + 1 + 0 = 3; hits
(0, 1, 1): accept_len = 1 (a miss ends the chain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class AcceptanceEval:
    """The simulated acceptance of one evaluation."""

    step: int  # the optimizer step it was taken at
    anchors: int
    accept_len: tuple[float, ...]  # [k-1] mean accepted length (bonus included) of a chain of k = 1..K steps
    per_position: tuple[float, ...]  # [K] P(draft i accepted | drafts < i accepted)
    cycle_len: tuple[float, ...] = ()  # [K] mean accepted length over the engine's cycles, chain of k = 1..K
    cycle_per_position: tuple[float, ...] = ()  # [K] P(draft i accepted | drafts < i) over the chain-K cycles

    def chain(self, k: int) -> float:
        """Mean accepted length of a chain of ``k`` draft steps."""
        return self.accept_len[k - 1]


def implied_len(rates: Iterable[float], k: int | None = None) -> float:
    """The mean accepted length (bonus included) that conditional per-position rates imply for a chain of ``k``
    (default: all of them). Example: rates (0.8, 0.5) -> 1 + 0.8 + 0.8 * 0.5 = 2.2."""
    total, alive = 1.0, 1.0
    for r in list(rates)[:k]:
        alive *= r
        total += alive
    return total


def cycle_rates(lens: list[int], k: int) -> tuple[float, ...]:
    """Per-position rates over cycles of a chain of ``k``: a cycle of accepted length L accepted L-1 drafts, so
    it tried position i when L-1 >= i and passed it when L-1 > i. Example: lens (1, 3, 4), k 3 -> drafts accepted
    0, 2, 3: position 0 passed 2 of 3, position 1 2 of 2, position 2 1 of 2."""
    got = [min(n - 1, k) for n in lens]
    out = []
    for i in range(k):
        tried = sum(1 for a in got if a >= i)
        out.append(sum(1 for a in got if a > i) / tried if tried else 0.0)
    return tuple(out)


def chain_hits(hits: torch.Tensor) -> torch.Tensor:
    """hits bool [N, K] -> alive float [N, K]: 1 while every step so far hit (cumulative product)."""
    return hits.float().cumprod(dim=1)


def summarise(step: int, hits: torch.Tensor, cycles: list[list[int]] | None = None) -> AcceptanceEval:
    """Accepted lengths for every chain length and conditional per-position rates from hits [N, K];
    ``cycles[k-1]``: the accepted lengths of the engine-like walk with a chain of k (see :func:`walk`)."""
    alive = chain_hits(hits)  # [N, K]
    N, K = alive.shape
    cycle = tuple(sum(c) / len(c) if c else 1.0 for c in cycles) if cycles is not None else ()
    cycle_pos = cycle_rates(cycles[-1], K) if cycles else ()
    if N == 0:
        return AcceptanceEval(step, 0, tuple([1.0] * K), tuple([0.0] * K), cycle, cycle_pos)
    reach = alive.sum(0)  # [K] anchors whose chain got past step i
    before = torch.cat([torch.tensor([float(N)]), reach[:-1]])  # [K] anchors that tried step i
    lens = 1.0 + alive.cumsum(dim=1).mean(0)  # [K] chain of k = i+1 steps
    rates = reach / before.clamp(min=1.0)
    return AcceptanceEval(step, N, tuple(lens.tolist()), tuple(rates.tolist()), cycle, cycle_pos)


def walk(hits: torch.Tensor, valid: torch.Tensor, start: int, k: int) -> list[int]:
    """Accepted lengths of the engine's cycles with a chain of ``k`` over one answer: anchor ``start``
    (the last prompt position), then + each accepted length, while the anchor is valid.
    hits bool [n, K], valid bool [n]."""
    alive = chain_hits(hits[:, :k]).sum(1).long().tolist()  # [n] accepted drafts at each anchor
    ok = valid.tolist()
    lens, p = [], start
    while 0 <= p < len(ok) and ok[p]:
        lens.append(1 + alive[p])
        p += lens[-1]
    return lens


def batch_cycles(hit: torch.Tensor, valid: torch.Tensor, loss_mask: torch.Tensor) -> list[list[int]]:
    """Per chain length k = 1..K, the engine-like cycles' accepted lengths over every row of a batch.
    hit [B, n, K], valid [B, n], loss_mask [B, T] (the answer starts at its first 1)."""
    B, _, K = hit.shape
    hit, valid, lm = hit.cpu(), valid.cpu(), loss_mask.cpu()
    out: list[list[int]] = [[] for _ in range(K)]
    for b in range(B):
        answer = torch.nonzero(lm[b] > 0)
        if answer.numel() == 0:
            continue
        start = int(answer[0]) - 1  # the last prompt position: the engine's first anchor
        for k in range(1, K + 1):
            out[k - 1] += walk(hit[b], valid[b], start, k)
    return out


@torch.no_grad()
def anchor_hits(net, batch, head_weight: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hits bool [B, n, steps], valid bool [B, n]) at anchors p = 0..n-1 of ``batch`` (a TrainBatch
    with states), n = T - steps - 1; valid where the drafted positions p+2..p+steps+1 are all answer
    tokens. ``head_weight`` [V, H]: the target's full lm_head."""
    from eaglelab.engine.training.ttt import ttt_hidden

    ids, lm = batch.input_ids, batch.loss_mask  # [B, T]
    B, T = ids.shape
    n = max(0, T - steps - 1)
    if n == 0:
        return torch.zeros(B, 0, steps, dtype=torch.bool, device=ids.device), torch.zeros(B, 0, dtype=torch.bool, device=ids.device)
    target_tok = _greedy(batch.hidden, head_weight)  # [B, T]: the target's next token after each position
    token_map = net.token_map()  # [V_draft] target ids
    hits = []
    for i, out in enumerate(ttt_hidden(net, ids, batch.aux, steps)):
        draft = token_map[net.lm_head(net.norm(out[:, :n])).argmax(-1)]  # [B, n] target ids
        hits.append(draft == target_tok[:, i + 1: i + 1 + n])
    window = torch.stack([lm[:, i + 2: i + 2 + n] for i in range(steps)], dim=-1)  # [B, n, steps]
    return torch.stack(hits, dim=-1), window.bool().all(-1)


def batch_hits(net, batch, head_weight: torch.Tensor, steps: int) -> torch.Tensor:
    """Hits bool [N, steps] at the valid anchors of ``batch`` (see :func:`anchor_hits`)."""
    hit, valid = anchor_hits(net, batch, head_weight, steps)
    return hit[valid]


def _greedy(hidden: torch.Tensor, head_weight: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """argmax over the full vocabulary of hidden [B, T, H] @ head_weight.T, a few rows at a time."""
    out = []
    for b in range(0, hidden.shape[0], rows):
        logits = hidden[b: b + rows].to(head_weight.dtype) @ head_weight.t()  # [r, T, V]
        out.append(logits.argmax(-1))
    return torch.cat(out)


def simulate(net, batches: Iterable, head_weight: torch.Tensor, steps: int, step: int) -> AcceptanceEval:
    """The simulated acceptance over ``batches`` (TrainBatches with states) for chains up to ``steps``."""
    was = net.training
    net.eval()
    hits, cycles = [], [[] for _ in range(steps)]
    try:
        for b in batches:
            hit, valid = anchor_hits(net, b, head_weight, steps)
            hits.append(hit[valid].cpu())
            for k, lens in enumerate(batch_cycles(hit, valid, b.loss_mask)):
                cycles[k] += lens
    finally:
        net.train(was)
    return summarise(step, torch.cat(hits) if hits else torch.zeros(0, steps, dtype=torch.bool), cycles)
