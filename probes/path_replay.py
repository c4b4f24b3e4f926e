"""Expected accepted length of a smaller tree, replayed from the accepted paths of a wide one.

The acceptance table (:mod:`eaglelab.probes.tuning`) scores a tree as if it were the same rank paths in every
cycle. The engine's tree is not: it keeps the ``N - 1`` candidates the drafter scores best *in that cycle*, so
where the drafter is sure the tree runs deep along its top choice and where it is unsure it spreads out. The
drafter's confidence and the target's agreement go together, so a fixed-shape model underrates every pruned
tree (measured on the H200: E[a] 2.6-9.8% low on every configuration confirmed).

A wide run that keeps every node records, per row-cycle, the accepted path's sibling ranks and its nodes'
positions. The engine orders a tree's nodes by (depth, the drafter's score), so a position gives the node's
rank ``q`` by score among the candidates at its depth. A smaller tree drafted by the same drafter would have
kept that node when:

* its sibling rank is <= ``topk`` and its parent was on the frontier (``q`` of the parent <= ``topk``: each
  step expands the ``topk`` best of its depth), and its depth is <= ``steps``;
* it is among the ``N - 1`` best candidates overall. Every node at a shallower depth ranked ahead of an
  ancestor, and every node at its own depth ranked ahead of it, scores above it (a child never outscores its
  parent), so its overall rank is at least ``q_1 + ... + q_d``; the replay keeps it when that sum is <= ``N - 1``.

A narrower tree (``topk`` k below the wide tree's) holds fewer candidates at a depth than the wide one did, so
the wide ``q`` overstates a node's rank there: ahead of a node of sibling rank ``r`` the narrower tree can have
only its ``r - 1`` better siblings and the at most ``k`` children of each of the other ``k - 1`` frontier nodes.
The replay takes ``q = min(q_wide, r + (k - 1) * k)``: for a chain (``k = 1``) exactly ``r``, so a chain keeps
a path exactly as far as its sibling ranks are 1; for ``k`` equal to the wide ``topk`` the bound never binds
(the wide tree had those same slots). Measured on the H200 records of 2026-12-03 (E[a] of every confirmed topk-1
and topk-2 tree): 0.7 to 1.2 points closer to the confirmation, topk-4 trees unchanged.

E[a] (bonus included) is then the mean over row-cycles of ``1 +`` the longest kept prefix of the accepted path.
It equals the wide run's observed mean on the wide tree itself, never exceeds ``steps + 1``, and grows with
``N``. Two approximations remain: the overall rank is a lower bound (slightly optimistic for a full-topk tree
pruned hard), and for a smaller ``topk`` the capped wide rank is still an upper bound of the narrower tree's
(slightly pessimistic there).

Worked example (wide tree 2 steps, topk 2, all 7 nodes): a row-cycle accepts ranks (1, 2) at positions
(1, 4): depth-1 rank 1, depth-2 position 4 - 3 + 1 = 2nd best of the 4 depth-2 candidates; a chain (topk 1)
keeps depth 1 only (sibling rank 2 > 1 at depth 2): 2 tokens; steps 2, topk 2, N 4 keeps both
(1 + 2 = 3 <= 3): 3 tokens; N 3 only depth 1 (3 > 2): 2 tokens. Ranks (1, 1) at positions (1, 4) (the depth-1
rank-2 node's top child outscored this one): the chain keeps both (its depth-2 rank is min(2, 1 + 0) = 1), 3
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from eaglelab.probes.tuning import max_draft_tokens


class _PathStep(Protocol):
    """What :func:`path_replay` reads: an events ``Step`` or the engine's ``CycleStats``."""

    kind: str
    accepted_ranks: Sequence[Sequence[int]]
    accepted_positions: Sequence[Sequence[int]]


def depth_start(depth: int, topk: int) -> int:
    """Position of the first depth-``depth`` node in a tree that keeps every node (root at 0).

    Example: topk 4: depth 1 starts at 1, depth 2 at 5, depth 3 at 21.
    """
    return 1 if depth == 1 else max_draft_tokens(depth - 1, topk)


@dataclass(frozen=True)
class PathReplay:
    """The wide run's accepted paths: ``paths[i] = ((r_1, q_1), ..., (r_d, q_d))`` (sibling rank, rank by
    score at its depth), one per row-cycle; ``steps`` and ``topk`` of the wide tree."""

    paths: tuple[tuple[tuple[int, int], ...], ...]
    steps: int
    topk: int

    @property
    def observed_mean(self) -> float:
        """The wide run's mean accepted length (bonus included)."""
        return 1.0 + sum(len(p) for p in self.paths) / len(self.paths)

    def kept_prefix(self, path: Sequence[tuple[int, int]], steps: int, topk: int, draft_tokens: int,
                    rank_cap: bool = True) -> int:
        """How many of ``path``'s nodes the tree (steps, topk, draft_tokens) would have kept and accepted; a node's
        rank at its depth is the wide one capped by the candidates the narrower tree holds there (``rank_cap``
        False: the wide rank as it is, the rule before the cap, kept to measure what the cap changes)."""
        overall, kept, parent_q = 0, 0, 1
        for d, (r, q) in enumerate(path[:steps], 1):
            if rank_cap:
                q = min(q, r + (topk - 1) * topk)  # the narrower tree's candidates at this depth bound the rank
            overall += q
            if r > topk or overall > draft_tokens - 1 or parent_q > topk:
                break
            kept, parent_q = d, q
        return kept

    def accept_len(self, steps: int, topk: int, draft_tokens: int, rank_cap: bool = True) -> float:
        """E[accept len] (bonus included) of that tree, replayed (a chain verifies ``steps + 1`` tokens);
        ``rank_cap`` as in :meth:`kept_prefix`."""
        if steps > self.steps or topk > self.topk:
            raise ValueError(f"steps {steps}, topk {topk} is outside the wide tree replayed "
                             f"(steps {self.steps}, topk {self.topk})")
        n = steps + 1 if topk == 1 else draft_tokens
        return 1.0 + sum(self.kept_prefix(p, steps, topk, n, rank_cap) for p in self.paths) / len(self.paths)


def path_replay(steps: Iterable[_PathStep], wide_steps: int, wide_topk: int, wide_tokens: int) -> PathReplay | None:
    """The replay of a wide run's cycles, or None when it cannot be made: the tree did not keep every node
    (``wide_tokens`` below ``1 + topk + (steps - 1) * topk^2``; a chain always keeps every node), or no cycle
    carries accepted positions (a record from an eaglelab before them), or they do not fit a full tree's layout."""
    if wide_topk > 1 and wide_tokens < max_draft_tokens(wide_steps, wide_topk):
        return None
    paths = []
    for s in steps:
        if s.kind != "spec" or not s.accepted_ranks:
            continue
        if len(s.accepted_positions) != len(s.accepted_ranks):
            return None
        for ranks, pos in zip(s.accepted_ranks, s.accepted_positions):
            if len(pos) != len(ranks):
                return None
            node = tuple((int(r), int(p) - depth_start(d, wide_topk) + 1) for d, (r, p) in enumerate(zip(ranks, pos), 1))
            if not all(1 <= q <= wide_topk ** min(d, 2) for d, (_, q) in enumerate(node, 1)):
                return None  # not a full tree's layout (a record written by other means): no replay
            paths.append(node)
    return PathReplay(tuple(paths), wide_steps, wide_topk) if paths else None
