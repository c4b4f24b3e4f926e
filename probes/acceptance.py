"""Acceptance statistics over speculative cycles: how many draft tokens the target kept.

Definitions (per row and cycle; ``a`` = accept length, ``n`` = draft-tree nodes per row with the
root included, the engine's ``num_draft_tokens``):

- **accept length** ``a``: tokens committed, the bonus (target-sampled) token included, so
  ``1 <= a <= depth + 1``. This is SGLang's "accept len" and Spec-Bench's "mean accepted tokens".
- **accept rate**: accepted draft tokens over draft tokens offered to verify,
  ``sum(a - 1) / sum(n - 1)``. For a chain (topk = 1) ``n - 1`` is the number of draft steps, so
  this is "fraction of drafted tokens accepted". It equals recent SGLang's "accept rate" (which
  subtracts the bonus token from both sides); SGLang versions before that printed
  ``sum(a) / sum(n)``, available here as :attr:`AcceptanceStats.legacy_sglang_accept_rate`.
- **per-position acceptance** at depth ``d`` (1-based): the fraction of row-cycles whose accepted
  path reached depth ``d``, i.e. ``a - 1 >= d``. It is non-increasing in ``d``.

Only cycles of kind ``"spec"`` are counted; rows with ``a == 0`` (finished, not taking part) are
skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class _StepLike(Protocol):
    """What :meth:`AcceptanceStats.observe_step` reads: an events ``Step`` or engine ``CycleStats``."""

    kind: str
    accept_len: Sequence[int]
    num_draft_tokens: int


@dataclass
class AcceptanceStats:
    """Running acceptance totals; feed with :meth:`observe_step`, read the properties.

    Example: two chain cycles (n = 4) with one row each, accept lengths 3 and 1:
    mean accept length 2.0, accept rate (2 + 0) / (3 + 3) = 1/3,
    per-position rates (0.5, 0.5, 0.0), histogram {3: 1, 1: 1}.
    """

    row_cycles: int = 0  # (cycle, row) pairs observed
    accepted_tokens: int = 0  # sum of a (bonus included)
    drafted_tokens: int = 0  # sum of n - 1 over row-cycles that drafted
    drafted_row_cycles: int = 0  # row-cycles counted in drafted_tokens
    drafted_nodes: int = 0  # sum of n over the same row-cycles (legacy SGLang denominator)
    accepted_in_drafting: int = 0  # sum of a over the same row-cycles
    histogram: dict[int, int] = field(default_factory=dict)  # a -> row-cycles
    reached_depth: list[int] = field(default_factory=list)  # [d-1] -> row-cycles with a - 1 >= d
    max_offered_depth: int = 0  # largest n - 1 seen

    def observe_step(self, step: _StepLike) -> None:
        """Count one cycle (an events ``Step`` or an engine ``CycleStats``); non-spec kinds are ignored."""
        if step.kind != "spec":
            return
        offered = max(int(step.num_draft_tokens) - 1, 0)
        self.max_offered_depth = max(self.max_offered_depth, offered)
        for a in step.accept_len:
            if a <= 0:
                continue
            self._observe_row(int(a), offered)

    def _observe_row(self, a: int, offered: int) -> None:
        self.row_cycles += 1
        self.accepted_tokens += a
        self.histogram[a] = self.histogram.get(a, 0) + 1
        depth = a - 1
        if depth > len(self.reached_depth):
            self.reached_depth.extend([0] * (depth - len(self.reached_depth)))
        for d in range(depth):
            self.reached_depth[d] += 1
        if offered > 0:
            self.drafted_row_cycles += 1
            self.drafted_tokens += offered
            self.drafted_nodes += offered + 1
            self.accepted_in_drafting += a

    @property
    def mean_accept_len(self) -> float | None:
        """Mean tokens committed per row-cycle, bonus included; None before any spec cycle."""
        return self.accepted_tokens / self.row_cycles if self.row_cycles else None

    @property
    def accept_rate(self) -> float | None:
        """Accepted draft tokens / draft tokens offered: ``sum(a - 1) / sum(n - 1)``."""
        if not self.drafted_tokens:
            return None
        return (self.accepted_in_drafting - self.drafted_row_cycles) / self.drafted_tokens

    @property
    def legacy_sglang_accept_rate(self) -> float | None:
        """``sum(a) / sum(n)``: what SGLang versions before the bonus-free definition printed."""
        return self.accepted_in_drafting / self.drafted_nodes if self.drafted_nodes else None

    def per_position_rate(self, depths: int | None = None) -> tuple[float, ...]:
        """Fraction of row-cycles whose accepted path reached depth 1, 2, ... ``depths``.

        ``depths`` defaults to the deepest position offered or reached.
        """
        n = depths if depths is not None else max(self.max_offered_depth, len(self.reached_depth))
        if not self.row_cycles:
            return tuple(0.0 for _ in range(n))
        padded = self.reached_depth + [0] * max(n - len(self.reached_depth), 0)
        return tuple(c / self.row_cycles for c in padded[:n])

    def histogram_fractions(self) -> dict[int, float]:
        """Share of row-cycles per accept length, keys ascending."""
        if not self.row_cycles:
            return {}
        return {a: self.histogram[a] / self.row_cycles for a in sorted(self.histogram)}
