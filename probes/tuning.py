"""Which (steps, topk, draft tokens) is fastest: expected accepted length and cycle cost, predicted.

Pure Python (no torch), so a record from a GPU deployment can be tuned anywhere.

**Acceptance table.** ``p(d, r)``: the probability that the target's next token at depth ``d``
(1-based) is the drafter's rank-``r`` child (1 = its top-1) of the node the accepted path reached
at depth ``d - 1``, given that node was expanded. Measured on a wide tree (:func:`table_from_steps`
reads it from the engine's cycles: the sibling ranks of each accepted path, and whether its last
node had drafted children).

**Tree.** A node is a rank path ``(r1, ..., rd)``. The model builds the tree with SGLang's rule
(the engine's :class:`~eaglelab.engine.runtime.tree.TreeBuilder`): step 1 takes the root's
``topk`` children; each later step expands the ``topk`` best frontier nodes into ``topk`` children
each and keeps the best ``topk`` as the new frontier; at the end the best ``draft_tokens - 1`` of
all candidates are kept. A node's score is its cumulative ``sum log p(d_i, r_i)``: the acceptance
table stands in for the drafter's confidence (equal for a calibrated drafter), ties go to the
older candidate, so a node never outranks its parent and the kept set is closed under ancestors.

**Expected accepted length** (bonus included, SGLang's "accept len")::

    E[a] = 1 + sum over kept nodes v of  prod_i p(d_i, r_i)

since the accepted nodes form one path from the root and P(v accepted) is the product along its
rank path. For a chain (topk 1) this is ``1 + sum_{d<=S} prod_{i<=d} p(i, 1)``; with a constant
``p`` it is the closed form ``(1 - p^(S+1)) / (1 - p)``.

**Cycle cost** at batch B: ``draft(S, K) + verify(N) + accept(S, K) + extend(S, K)`` from measured
phase costs (:class:`PhaseCosts`), or a whole cycle's measured time for (S, K, N) where it was measured as one
(``eaglelab tune`` times whole cycles of the regime ``run`` uses: a one-graph cycle has no phases to add). Predicted throughput ``B * E[a] / cycle``; plain decoding
``B / decode``; break-even accepted length ``cycle / decode`` (speculation pays above it).

Worked example: ``p(1, 1) = 0.6, p(2, 1) = 0.5``, chain of 2 steps: E[a] = 1 + 0.6 + 0.3 = 1.9.
Decode 10 ms, draft 3, verify 14, accept 0.5, extend 2.5 (cycle 20 ms): 95 tok/s against 100 plain,
0.95x; break-even accepted length 2.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterable, Protocol, Sequence

from eaglelab.engine.runtime.spec_config import expansion_nodes

RankPath = tuple[int, ...]


# ---- acceptance -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AcceptanceTable:
    """``rates[d - 1][r - 1] = p(d, r)``; ``offered[d - 1]``: row-cycles that offered depth d.

    Example: ``AcceptanceTable(((0.6, 0.2), (0.5, 0.1)))``: at depth 1 the target's token is the
    drafter's top-1 60% of the time and its second 20%; at depth 2 (after an expanded depth-1
    node on the target's path) 50% and 10%.
    """

    rates: tuple[tuple[float, ...], ...]
    offered: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for d, row in enumerate(self.rates, 1):
            for r, p in enumerate(row, 1):
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"p(depth {d}, rank {r}) = {p} is not a probability")
            if sum(row) > 1.0 + 1e-9:
                raise ValueError(f"depth {d}: ranks sum to {sum(row):.4f} > 1 (one token per depth)")

    @property
    def max_depth(self) -> int:
        return len(self.rates)

    @property
    def max_rank(self) -> int:
        return max((len(r) for r in self.rates), default=0)

    def p(self, depth: int, rank: int) -> float:
        """``p(depth, rank)``; 0 outside the measured table (never assumed accepted)."""
        if 1 <= depth <= len(self.rates) and 1 <= rank <= len(self.rates[depth - 1]):
            return self.rates[depth - 1][rank - 1]
        return 0.0

    def path_prob(self, path: RankPath) -> float:
        """P(the target's path runs through ``path``) = product of ``p`` along it."""
        prob = 1.0
        for d, r in enumerate(path, 1):
            prob *= self.p(d, r)
        return prob

    @classmethod
    def constant(cls, p: float, depths: int, ranks: int = 1) -> "AcceptanceTable":
        """Every depth alike: ``p`` for the top-1, 0 for lower ranks (a synthetic table)."""
        return cls(tuple((p,) + (0.0,) * (ranks - 1) for _ in range(depths)))


class _StepLike(Protocol):
    """What :func:`table_from_steps` reads: an events ``Step`` or engine ``CycleStats``."""

    kind: str
    accepted_ranks: Sequence[Sequence[int]]
    path_open: Sequence[bool]


@dataclass
class AcceptanceCounts:
    """Counts behind an :class:`AcceptanceTable`; feed with :meth:`observe`."""

    hits: dict[tuple[int, int], int] = field(default_factory=dict)  # (depth, rank) -> row-cycles
    offered: dict[int, int] = field(default_factory=dict)  # depth -> row-cycles that offered it
    row_cycles: int = 0
    accept_len_sum: int = 0

    def observe(self, ranks: Sequence[int], last_open: bool) -> None:
        """One row-cycle: the accepted path's sibling ranks (1-based) and whether its last node had children."""
        self.row_cycles += 1
        self.accept_len_sum += len(ranks) + 1
        for d, r in enumerate(ranks, 1):
            self.hits[(d, r)] = self.hits.get((d, r), 0) + 1
            self.offered[d] = self.offered.get(d, 0) + 1
        if last_open:
            nxt = len(ranks) + 1
            self.offered[nxt] = self.offered.get(nxt, 0) + 1

    def table(self) -> AcceptanceTable:
        """``p(d, r) = hits(d, r) / offered(d)`` up to the deepest offered depth."""
        depth = max(self.offered, default=0)
        rank = max((r for _, r in self.hits), default=1)
        rates, offered = [], []
        for d in range(1, depth + 1):
            n = self.offered.get(d, 0)
            rates.append(tuple(self.hits.get((d, r), 0) / n if n else 0.0 for r in range(1, rank + 1)))
            offered.append(n)
        return AcceptanceTable(tuple(rates), tuple(offered))

    @property
    def mean_accept_len(self) -> float | None:
        return self.accept_len_sum / self.row_cycles if self.row_cycles else None


def table_from_steps(steps: Iterable[_StepLike]) -> AcceptanceCounts:
    """Acceptance counts from speculative cycles that carry accepted ranks (other kinds ignored)."""
    counts = AcceptanceCounts()
    for s in steps:
        if s.kind != "spec" or not s.accepted_ranks:
            continue
        for ranks, is_open in zip(s.accepted_ranks, s.path_open):
            counts.observe(tuple(ranks), bool(is_open))
    return counts


# ---- the tree -----------------------------------------------------------------------------------
max_draft_tokens = expansion_nodes  # the most nodes a tree can keep, root included: 1 + topk + (steps - 1) * topk^2


def _score(table: AcceptanceTable, path: RankPath) -> float:
    prob = table.path_prob(path)
    return math.log(prob) if prob > 0 else -math.inf


def _best(paths: list[RankPath], scores: dict[RankPath, float], count: int) -> list[RankPath]:
    """The ``count`` best by score, ties to the earlier (a stable sort, as the engine's)."""
    order = sorted(range(len(paths)), key=lambda i: -scores[paths[i]])
    return [paths[i] for i in order[:count]]


def sglang_tree(table: AcceptanceTable, steps: int, topk: int, draft_tokens: int) -> list[RankPath]:
    """The kept nodes (root excluded) of SGLang's tree, ordered by (depth, score).

    Example: p(1, .) = (0.6, 0.2), p(2, .) = (0.5, 0.1); steps 2, topk 2, 4 tokens:
    candidates (1,) (2,) then (1,1) (1,2) (2,1) (2,2); scores 0.6, 0.2, 0.3, 0.06, 0.1, 0.02;
    keep the best 3: (1,), (1, 1), (2,).
    """
    if steps < 1 or topk < 1 or not 1 <= draft_tokens <= max_draft_tokens(steps, topk):
        raise ValueError(f"no tree with steps {steps}, topk {topk}, draft tokens {draft_tokens} "
                         f"(1 <= draft tokens <= {max_draft_tokens(steps, topk)})")
    frontier: list[RankPath] = [()]
    candidates: list[RankPath] = []
    scores: dict[RankPath, float] = {}
    for _ in range(steps):
        step = [f + (r,) for f in frontier for r in range(1, topk + 1)]  # frontier-major
        for path in step:
            scores[path] = _score(table, path)
        candidates += step
        frontier = _best(step, scores, topk)
    kept = _best(candidates, scores, draft_tokens - 1)
    return sorted(kept, key=lambda p: (len(p), -scores[p]))


def expected_accept_len(table: AcceptanceTable, steps: int, topk: int, draft_tokens: int) -> float:
    """E[accept len] (bonus included) of SGLang's tree for these settings."""
    return 1.0 + sum(table.path_prob(p) for p in sglang_tree(table, steps, topk, draft_tokens))


def chain_closed_form(p: float, steps: int) -> float:
    """E[accept len] of a chain of ``steps`` with a constant acceptance ``p``: ``(1 - p^(S+1)) / (1 - p)``."""
    if p == 1.0:
        return float(steps + 1)
    return (1.0 - p ** (steps + 1)) / (1.0 - p)


# ---- costs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseCosts:
    """Measured milliseconds at one batch size.

    ``verify_ms[N]``: one verify of N tokens per row. ``draft_ms[(S, K)]``, ``extend_ms[(S, K)]``,
    ``accept_ms[(S, K)]``: one cycle's draft, draft-extend and acceptance with S steps and topk K.
    ``prefill_ms``: the target's prefill of one prompt group; ``begin_ms`` the drafter's extend over it.
    ``cycle_ms[(S, K, N)]``: one whole cycle of that configuration, measured as one (used before the phases).
    """

    batch: int
    decode_ms: float
    verify_ms: dict[int, float]
    draft_ms: dict[tuple[int, int], float]
    extend_ms: dict[tuple[int, int], float]
    accept_ms: dict[tuple[int, int], float]
    prefill_ms: float = 0.0
    begin_ms: float = 0.0
    cycle_ms: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.decode_ms > 0:
            raise ValueError(f"batch {self.batch}: decode_ms must be > 0, got {self.decode_ms}")

    def covers(self, steps: int, topk: int, draft_tokens: int) -> bool:
        """This configuration's whole cycle, or every phase of it, was measured."""
        key = (steps, topk)
        return (steps, topk, draft_tokens) in self.cycle_ms or (
            draft_tokens in self.verify_ms and key in self.draft_ms and key in self.extend_ms and key in self.accept_ms)


# ---- predictions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """The model's figures for one configuration at one batch size."""

    steps: int
    topk: int
    draft_tokens: int
    batch: int
    accept_len: float
    decode_ms: float
    draft_ms: float
    verify_ms: float
    accept_ms: float
    extend_ms: float
    whole_cycle_ms: float | None = None  # measured as one cycle (the phases above are then 0: not measured apart)

    @property
    def cycle_ms(self) -> float:
        if self.whole_cycle_ms is not None:
            return self.whole_cycle_ms
        return self.draft_ms + self.verify_ms + self.accept_ms + self.extend_ms

    @property
    def tok_per_s(self) -> float:
        """Steady-state tokens per second over the batch."""
        return self.batch * self.accept_len * 1e3 / self.cycle_ms

    @property
    def plain_tok_per_s(self) -> float:
        return self.batch * 1e3 / self.decode_ms

    @property
    def speedup(self) -> float:
        return self.tok_per_s / self.plain_tok_per_s

    @property
    def break_even_accept_len(self) -> float:
        """The accepted length at which this cycle matches plain decoding."""
        return self.cycle_ms / self.decode_ms

    def end_to_end_tok_per_s(self, new_tokens: int, prefill_ms: float) -> float:
        """Throughput of a whole call: prefill (first token), then ``(new_tokens - 1) / E[a]`` cycles."""
        ms = prefill_ms + (new_tokens - 1) / self.accept_len * self.cycle_ms
        return self.batch * new_tokens * 1e3 / ms


def plain_end_to_end_tok_per_s(costs: PhaseCosts, new_tokens: int) -> float:
    """Plain decoding over a whole call: prefill, then ``new_tokens - 1`` decode steps."""
    ms = costs.prefill_ms + (new_tokens - 1) * costs.decode_ms
    return costs.batch * new_tokens * 1e3 / ms


def grid_configs(steps: Iterable[int], topks: Iterable[int], draft_tokens: Iterable[int]) -> list[tuple[int, int, int]]:
    """Every valid (steps, topk, N): a chain verifies S + 1 tokens; a tree any N in 2..its maximum."""
    out = []
    ns = sorted(set(draft_tokens))
    for k in sorted(set(topks)):
        for s in sorted(set(steps)):
            if k == 1:
                out.append((s, 1, s + 1))
            else:
                out += [(s, k, n) for n in ns if 2 <= n <= max_draft_tokens(s, k)]
    return out


AcceptLen = Callable[[int, int, int], float]  # (steps, topk, draft tokens) -> E[accept len]


def predict(table: AcceptanceTable, costs: PhaseCosts, steps: int, topk: int, draft_tokens: int,
            accept: AcceptLen | None = None) -> Prediction:
    """Predict one configuration (its whole cycle, else its phases, must be in ``costs``); E[a] from ``accept``
    (a :class:`~eaglelab.probes.path_replay.PathReplay`'s) when given, else from ``table``."""
    key = (steps, topk)
    accept_len = (accept or partial(expected_accept_len, table))(steps, topk, draft_tokens)
    whole = costs.cycle_ms.get((steps, topk, draft_tokens))
    if whole is not None:
        return Prediction(steps=steps, topk=topk, draft_tokens=draft_tokens, batch=costs.batch, accept_len=accept_len,
                          decode_ms=costs.decode_ms, draft_ms=0.0, verify_ms=0.0, accept_ms=0.0, extend_ms=0.0,
                          whole_cycle_ms=whole)
    return Prediction(
        steps=steps, topk=topk, draft_tokens=draft_tokens, batch=costs.batch,
        accept_len=accept_len, decode_ms=costs.decode_ms,
        draft_ms=costs.draft_ms[key], verify_ms=costs.verify_ms[draft_tokens], accept_ms=costs.accept_ms[key],
        extend_ms=costs.extend_ms[key],
    )


def distinct_configs(table: AcceptanceTable, configs: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The configurations left once those that draft the same steps and keep the same tree as one
    with a smaller topk are dropped: (1 step, topk 2, 2 tokens) keeps only the root's top-1, as
    the 1-step chain does, at the same cost; only measurement noise could tell them apart."""
    seen: dict[tuple[int, int, tuple[RankPath, ...]], tuple[int, int, int]] = {}
    for c in sorted(set(configs), key=lambda c: (c[1], c[0], c[2])):
        key = (c[0], c[2], tuple(sglang_tree(table, *c)))
        seen.setdefault(key, c)
    return sorted(seen.values(), key=lambda c: (c[1], c[0], c[2]))


def rank_configs(table: AcceptanceTable, costs: PhaseCosts, configs: Iterable[tuple[int, int, int]],
                 accept: AcceptLen | None = None) -> list[Prediction]:
    """Predictions for every measured, distinct configuration, fastest first (ties: fewer draft tokens first)."""
    preds = [predict(table, costs, *c, accept=accept) for c in distinct_configs(table, configs) if costs.covers(*c)]
    return sorted(preds, key=lambda p: (-p.tok_per_s, p.draft_tokens, p.steps, p.topk))


def rank_by_accept_len(table: AcceptanceTable, configs: Iterable[tuple[int, int, int]],
                       accept: AcceptLen | None = None) -> list[tuple[tuple[int, int, int], float]]:
    """Without costs: expected accepted length per configuration, highest first."""
    accept = accept or partial(expected_accept_len, table)
    got = [(c, accept(*c)) for c in distinct_configs(table, configs)]
    return sorted(got, key=lambda x: (-x[1], x[0][2]))


# ---- what to paste ----------------------------------------------------------------------------
def sglang_flags(steps: int, topk: int, draft_tokens: int, draft_path: str = "DRAFTER") -> str:
    """SGLang server flags for this configuration."""
    return (f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {draft_path} "
            f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} --speculative-num-draft-tokens {draft_tokens}")


def vllm_speculative_config(steps: int, draft_path: str = "DRAFTER") -> str:
    """vLLM's ``--speculative-config`` (its EAGLE proposer drafts a chain of ``steps`` tokens)."""
    return ("--speculative-config '{\"method\": \"eagle3\", \"model\": \"" + draft_path
            + "\", \"num_speculative_tokens\": " + str(steps) + "}'")


class _CostLike(Protocol):
    """What :func:`costs_from_events` reads: an events ``PhaseCost``."""

    phase: str
    batch: int
    ms: float
    tokens: int
    steps: int
    topk: int


def costs_from_events(events: Iterable[_CostLike]) -> dict[int, PhaseCosts]:
    """Per batch size, the :class:`PhaseCosts` that ``PhaseCost`` events describe (a later event
    for the same phase and key wins; a ``cycle`` event is a whole cycle of (steps, topk, tokens)). Batch sizes
    without a decode cost are left out."""
    by: dict[int, dict[str, dict]] = {}
    for e in events:
        slot = by.setdefault(e.batch, {"verify": {}, "draft": {}, "draft_extend": {}, "accept": {}, "single": {},
                                       "cycle": {}})
        if e.phase == "cycle":
            slot["cycle"][(e.steps, e.topk, e.tokens)] = e.ms
        elif e.phase == "verify":
            slot["verify"][e.tokens] = e.ms
        elif e.phase in ("draft", "draft_extend", "accept"):
            slot[e.phase][(e.steps, e.topk)] = e.ms
        else:
            slot["single"][e.phase] = e.ms
    out = {}
    for batch, s in sorted(by.items()):
        if s["single"].get("decode", 0) > 0:
            out[batch] = PhaseCosts(
                batch=batch, decode_ms=s["single"]["decode"], verify_ms=s["verify"], draft_ms=s["draft"],
                extend_ms=s["draft_extend"], accept_ms=s["accept"], prefill_ms=s["single"].get("prefill", 0.0),
                begin_ms=s["single"].get("begin", 0.0), cycle_ms=s["cycle"],
            )
    return out
