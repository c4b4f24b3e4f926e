"""The engine's contracts with its collaborators, as types: :class:`Drafter` and :class:`Runner`
(the third, :class:`~eaglelab.engine.runtime.observer.Observer`, is in ``observer.py``).

A drafter proposes tokens and never touches the engine's state: it reads a :class:`DraftView`
(the few tensors it needs, read-only by contract) and runs its network through the runner. A runner
decides how each forward executes (eagerly, or by replaying a captured CUDA graph) and reports
which it did per phase (:mod:`eaglelab.engine.runtime.reasons`). The engine is written against
these protocols only; ``drafters.py`` (EAGLE-3, n-gram), ``runner.py`` (eager) and
``cuda_graphs.py`` hold the implementations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from eaglelab.engine.model.layers import Kernels
    from eaglelab.engine.runtime.verification import Acceptance
    from eaglelab.engine.core.kv_cache import KVCache
    from eaglelab.engine.runtime.observer import Observer
    from eaglelab.engine.runtime.tree import DraftTree


@dataclass(frozen=True)
class DraftView:
    """What a drafter may read of the batch being generated: the engine's own tensors, never written.

    Per row b: ``lengths[b]`` tokens are in the target's KV cache (``cache_len`` slots in all) and
    ``root[b]``, the last token emitted, is not yet; ``out[b, :n_out[b]]`` are the tokens emitted
    so far (the prompt not included; it is ``prompts[b]``).
    """

    root: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B]
    out: torch.Tensor  # [B, max_out]
    n_out: torch.Tensor  # [B]
    prompts: list[list[int]]
    cache_len: int


@runtime_checkable
class Drafter(Protocol):
    """Proposes a draft tree per cycle; driven by :class:`~eaglelab.engine.runtime.generate.Engine`.

    ``target_taps`` lists the HF ``output_hidden_states`` indices the target must return as aux
    features (empty for a drafter that needs none); ``net`` is the network ``runner.draft`` runs
    (None for a drafter that drafts on the host).
    """

    target_taps: tuple[int, ...]
    net: nn.Module | None

    def begin(self, view: DraftView, prompt_ids: torch.Tensor, aux: torch.Tensor | None, runner: Runner) -> None:
        """After the target's prefill of ``prompt_ids`` [B, T] (aux features [B, T, taps * H])."""

    def propose(self, view: DraftView, runner: Runner) -> DraftTree:
        """The draft steps: a tree of N tokens per row, node 0 the root."""

    def commit(self, view: DraftView, acc: Acceptance, aux: torch.Tensor | None, runner: Runner) -> None:
        """After acceptance, before the engine advances (``view.lengths`` is still the cycle's start);
        ``aux`` [B, N, taps * H] are the verify's aux features."""


@runtime_checkable
class RefillableDrafter(Protocol):
    """A drafter that serves continuous batching (``Engine.generate(max_batch=...)``): a row whose request ended
    takes the next prompt while the others keep running. New prompts enter at rows 0..k-1 (the phases of k rows use
    the first k rows of every cache), so requests running there first move to free rows."""

    def refill(self, view: DraftView, prompt_ids: torch.Tensor, aux: torch.Tensor | None, runner: Runner,
               eager: str | None = None) -> None:
        """As :meth:`Drafter.begin` for rows 0..k-1 alone, after the target's prefill of ``prompt_ids`` [k, W] there
        (``view``: the whole batch, those rows already the new requests'); the other rows are left as they are.
        ``eager``: why that prefill ran eagerly (the drafter's prompt phase then does too)."""

    def move_row(self, src: int, dst: int) -> None:
        """Everything the drafter keeps of row ``src`` (its KV cache row, the next root's state) onto row ``dst``."""

    def keep_rows(self, k: int) -> None:
        """From the next cycle the batch is its first ``k`` rows alone (a one-batch loop shedding its ended rows,
        :mod:`~eaglelab.engine.runtime.shrink`, after moving the live ones there with :meth:`move_row`)."""


@runtime_checkable
class FusableDrafter(Protocol):
    """A drafter whose draft and draft-extend are pure functions of tensors, so the engine can run a whole
    cycle as one phase (one CUDA graph): what one cycle hands the next lives in runner state."""

    def cycle_parts(self) -> dict[str, Callable[..., tuple]]:
        """``{"draft": f(root, lengths, hidden, logits) -> (tokens, parents, depth, mask, rank),
        "draft_extend": f(tokens, path, aux, lengths, accept_len) -> (hidden, logits)}``: the functions of
        :meth:`Drafter.propose` and :meth:`Drafter.commit` (hidden, logits: the next root's, [B, H], [B, V_draft])."""

    def carry(self, runner: Runner, cache: KVCache) -> dict[str, torch.Tensor]:
        """After :meth:`Drafter.begin`: ``{"draft_hidden", "draft_logits"}`` moved into ``runner`` state (on
        the run's ``cache``), which a one-graph cycle updates in place; the drafter keeps reading them."""


class PhaseParts:
    """A phase made of parts run in order: ``body(parts, **inputs)``, ``parts`` a dict of named callables.

    The engine's one-graph cycle is one (draft, verify, accept, draft_extend, advance: the functions of the
    phases it replaces). A runner that compiles phases compiles each part on its own
    (:meth:`with_parts`) rather than the whole: the body may do what a compiler cannot trace (record the
    observer's timing events between parts), and each part compiles as its own phase would.
    """

    def __init__(self, body: Callable[..., tuple], parts: dict[str, Callable[..., tuple]]) -> None:
        self.body, self.parts = body, parts

    def __call__(self, **inputs) -> tuple:
        return self.body(self.parts, **inputs)

    def with_parts(self, wrap: Callable[[str, Callable[..., tuple]], Callable[..., tuple]]) -> "PhaseParts":
        """The same phase with each part replaced by ``wrap(name, part)`` (a compiled part, say)."""
        return PhaseParts(self.body, {name: wrap(name, part) for name, part in self.parts.items()})


@runtime_checkable
class Runner(Protocol):
    """Executes the loop's forwards. Shapes: B rows, T prompt tokens, N tree nodes, S cache slots.

    ``kernels`` are the layers' elementwise kernels the phases run with (eager or compiled);
    ``prompt_kernels`` those of a prompt phase the runner does not compile whole (the compiled pieces where the
    session compiles: a prompt run uncompiled need not run every norm and rotary op by op);
    ``setup_seconds`` sums the time spent capturing graphs and compiling (kept out of tok/s).
    """

    kernels: Kernels
    prompt_kernels: Kernels
    setup_seconds: float

    def phase(self, name: str, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
              caches: tuple[KVCache, ...] = (), variant: Hashable = None,
              state: dict[str, torch.Tensor] | None = None, eager: str | None = None,
              compile: bool = True) -> tuple:
        """A whole phase of the cycle, ``fn(**inputs, **state)`` (batch-major tensors in and out), which
        may write only ``caches`` and ``state`` (from :meth:`make_state`, updated in place, never copied);
        the graph runner replays it as one CUDA graph per batch bucket (and per input shape), or runs it
        eagerly when ``eager`` gives the reason (``"eager: ..."``); under --compile it compiles the phase
        first unless ``compile`` is False (a phase run once per request: the prompt's); a :class:`PhaseParts`
        ``fn`` is compiled part by part."""

    def prefill_width(self, batch: int, prompt_len: int, cache: KVCache) -> tuple[int, str | None]:
        """The width [B, W] to pad a prompt batch to, W >= ``prompt_len``, and None when the prefill on
        ``cache`` replays a graph at that width, else why it runs eagerly (then W == ``prompt_len``)."""

    def make_state(self, values: dict[str, torch.Tensor], cache: KVCache) -> dict[str, torch.Tensor]:
        """Tensors holding ``values`` (each [B, ...]) of a run on ``cache`` that phases update in place:
        the graph runner's static buffers when ``cache`` is its static cache (graphs bind fixed
        addresses), else ``values`` themselves."""

    def padded_batch(self, batch: int) -> int:
        """The rows a phase of ``batch`` rows writes (the graph runner's batch bucket: it pads to one), so
        continuous batching knows which rows a prompt phase of k new prompts would write."""

    def make_draft_cache(self, batch: int, max_len: int, kv_heads: int, head_dim: int,
                         dtype: torch.dtype, history: bool = False) -> KVCache:
        """The drafter's KV cache for a run (the graph runner's static one when it fits); ``history``: keeping the
        token at each position too (a lookup branch's search)."""

    def make_cache(self, batch: int, max_len: int, observer: Observer | None) -> KVCache | None:
        """The runner's own static cache for a run (graphs bind fixed buffers), or None: the engine
        allocates one of exactly ``max_len`` slots."""

    def decode(self, cache: KVCache, tokens: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One token per row at slot = position. -> hidden [B, 1, H]."""

    def verify(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               mask: torch.Tensor, taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Fixed-shape tree verify over the whole cache (attention mode ``decode``): mask [B, N, S]."""

    def verify_extend(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      mask: torch.Tensor, taps: tuple[int, ...], kv_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Extend-style verify over the used prefix only (attention mode ``prefill``): mask [B, N, kv_len]."""

    def draft(self, name: str, cache: KVCache, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
              slots: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A drafter forward (``name``: "draft" or "draft_extend"). -> (hidden, draft logits)."""

    def graph_status(self, kind: str, attention_mode: str, batch: int) -> dict[str, str]:
        """Per forward of the cycle just run: :data:`~eaglelab.engine.runtime.reasons.REPLAY` or
        ``"eager: <reason>"``."""
