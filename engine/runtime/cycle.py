"""The speculative cycle, written once: draft -> verify -> accept -> draft_extend -> advance.

:func:`speculative_cycle` lists the five phases; how each one runs is the caller's:

* phase by phase (any drafter, any verify mode, TP): the :class:`EagerPhases` below, each phase its own
  ``runner.phase`` (a CUDA graph per phase under the graph runner), timed by the engine's ``PhaseClock``;
* one graph (an EAGLE-3 drafter, decode-mode verify, no TP): :class:`GraphParts`, the same phases' functions
  called directly inside the cycle's single phase, timed from inside by ``PartMarks``.

Either way the values handed from phase to phase are the runner's tensors; nothing here reads them on the
host, and nothing is allocated beyond what the phases themselves allocate.

Worked example, one greedy cycle of a 2-step chain at one row (lengths [10], root 7)::

    draft         tree of 3 nodes: tokens [[7, 4, 9]]
    verify        the target at slots 10..12: logits [1, 3, V]
    accept        the target agrees on 4, not on 9: accept_len [2] (4 and the bonus), path [[0, 1, -1]]
    draft_extend  the drafter catches up on [7, 4] at slots 10..11
    advance       4 and the bonus emitted, lengths [12], root = the bonus
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

if TYPE_CHECKING:  # EagerPhases' annotations
    from eaglelab.engine.runtime.loop_state import Batch
    from eaglelab.engine.runtime.sampling import SamplingParams
    from eaglelab.engine.runtime.tree import DraftTree
    from eaglelab.engine.runtime.verification import Acceptance

PHASES = ("draft", "verify", "accept", "draft_extend", "advance")  # the cycle's order
Timed = Callable[[str], AbstractContextManager]  # phase name -> the context that times it


class CycleSteps(Protocol):
    """The five phases of one cycle, as one way of running them provides them. What a phase returns is
    whatever the next takes (a ``DraftTree`` phase by phase, the tree's tensors inside the one graph)."""

    def draft(self) -> Any: ...

    def verify(self, tree: Any) -> Any: ...

    def accept(self, tree: Any, verified: Any) -> Any: ...

    def draft_extend(self, verified: Any, accepted: Any) -> None: ...

    def advance(self, accepted: Any) -> tuple[torch.Tensor, torch.Tensor]: ...


def speculative_cycle(steps: CycleSteps, timed: Timed) -> tuple[Any, Any, tuple[torch.Tensor, torch.Tensor]]:
    """One cycle: the phases of :data:`PHASES` in order, each timed under its name (advance as "accept").

    -> (the tree, the acceptance, (committed [B], active [B]): the accepted length of each row, the rows that
    ran). Positions move in advance only, after draft_extend, which reads the cycle's start lengths.
    """
    with timed("draft"):
        tree = steps.draft()
    with timed("verify"):
        verified = steps.verify(tree)  # the target's logits over the tree, and its aux features
    with timed("accept"):
        accepted = steps.accept(tree, verified)
    with timed("draft_extend"):  # before advance: it reads the cycle's start lengths
        steps.draft_extend(verified, accepted)
    with timed("accept"):  # emit the accepted tokens, move the positions: timed as acceptance
        advanced = steps.advance(accepted)
    return tree, accepted, advanced


@dataclass(frozen=True)
class GraphParts:
    """The phases inside the one-graph cycle: the drafter's and the engine's phase functions (``parts``, by
    the names of :data:`PHASES`) called directly on the runner's tensors, in place, with no host work.

    The tree is ``(tokens, parents, depth, mask, rank)`` [B, N] (mask [B, N, N]); the acceptance
    ``(accept_len [B], path [B, D+1], tokens [B, D+1], bonus [B], *ranks)``; the drafter's root hidden state
    and logits, handed to the next cycle, are written into ``draft_hidden`` and ``draft_logits``.
    """

    parts: dict[str, Callable[..., Any]]
    state: dict[str, torch.Tensor]  # the loop's per-row state (lengths, root, out, ...), updated in place
    draft_hidden: torch.Tensor
    draft_logits: torch.Tensor
    uniform: torch.Tensor | None  # rejection sampling's draws (None: greedy)
    race: torch.Tensor | None
    observed: bool  # the accept phase also ranks the accepted path (for the observer)

    def draft(self) -> tuple[torch.Tensor, ...]:
        return self.parts["draft"](self.state["root"], self.state["lengths"], self.draft_hidden, self.draft_logits)

    def verify(self, tree: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Any]:
        return self.parts["verify"](self.state["lengths"], *tree[:4])

    def accept(self, tree: tuple[torch.Tensor, ...], verified: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, ...]:
        rank = tree[4] if self.observed else None
        return self.parts["accept"](self.state["lengths"], verified[0], *tree[:4], self.uniform, self.race, rank)

    def draft_extend(self, verified: tuple[torch.Tensor, Any], accepted: tuple[torch.Tensor, ...]) -> None:
        accept_len, path, tokens = accepted[:3]
        hidden, root_logits = self.parts["draft_extend"](tokens, path, verified[1], self.state["lengths"], accept_len)
        self.draft_hidden.copy_(hidden)
        self.draft_logits.copy_(root_logits)

    def advance(self, accepted: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        accept_len, _, tokens, bonus = accepted[:4]
        return self.parts["advance"](tokens, accept_len, bonus, **self.state)


@dataclass(frozen=True)
class EagerPhases:
    """The phases of :func:`speculative_cycle` one by one, each its own ``runner.phase`` (one graph per batch
    bucket under the graph runner, so a cycle is five graph launches and the stop check): any drafter, either
    verify mode, TP. The tree is a :class:`DraftTree`, the acceptance ``(Acceptance, ranks)``."""

    engine: Any  # the generate.Engine running the cycle (its runner, drafter, phases' functions)
    st: Batch
    sampling: SamplingParams
    generator: torch.Generator | None

    def draft(self) -> DraftTree:
        e = self.engine
        tree = e.drafter.propose(self.st.view(), e.runner)  # type: ignore[union-attr]
        if e.target.tp is not None and e.target.tp.check_replicas:  # debug: the replicated drafter agrees
            e.target.tp.assert_same(tree.tokens, f"draft tokens of cycle {e._cycle}")
        return tree

    def verify(self, tree: DraftTree) -> tuple[torch.Tensor, object]:
        return self.engine._verify(self.st, tree)  # [B, N, V], aux

    def accept(self, tree: DraftTree, verified: tuple) -> tuple[Acceptance, dict[str, torch.Tensor]]:
        return self.engine._accept(self.st, tree, verified[0], self.sampling, self.generator)

    def draft_extend(self, verified: tuple, accepted: tuple[Acceptance, dict]) -> None:
        self.engine.drafter.commit(self.st.view(), accepted[0], verified[1], self.engine.runner)  # type: ignore[union-attr]

    def advance(self, accepted: tuple[Acceptance, dict]) -> tuple[torch.Tensor, torch.Tensor]:
        acc, e = accepted[0], self.engine
        ins = {"tokens": acc.tokens, "accept_len": acc.accept_len, "bonus": acc.bonus}
        return e.runner.phase("advance", e._advance_fn, ins, (), e._eos_key, state=self.st.state())
