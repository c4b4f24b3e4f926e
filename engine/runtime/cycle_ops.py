"""A speculative cycle's small integer work as Triton kernels, for compiled phases on CUDA: greedy acceptance with
its KV compaction (``greedy_commit``), emitting the committed tokens with the move of lengths and roots
(``emit_advance``), and a draft step's expansion of the tree (``tree_expand``).

Compiled, the reference functions (``verification.greedy_accept`` with ``Engine._compact``, ``loop_state.emit_and_advance``
and ``tree.expand_step``) became 7, 6 and ~6 small kernels on the H200 (SmolLM2, 5/4/24, one row), each a few
microseconds of launch and ramp for well under a microsecond of work (``benchmarks/results/h200_2026-12-01l``:
accept and advance 38 -> 22 us replayed, the draft phase 260 -> 223 us; a cycle's phases ~1.31 -> ~1.27 ms). Each
op here is one launch (the expansion two). They compute what the reference does: the same integers, the scores
up to float32 rounding (``tests/engine/runtime/interpreted_cycle_ops.py`` checks them against it under Triton's
interpreter, ``test_cycle_ops.py`` on CUDA, compiled and captured).

They are PyTorch custom ops whose in-place writes are declared (the KV cache; the loop state), so a compiled phase
keeps each as a call writing the runner's buffers in place, and CUDA graphs capture them. Triton is imported by
:func:`load` only (``cycle_kernels.py``); where it cannot be, the reference runs.
"""

from __future__ import annotations

from typing import Protocol

import torch

class TreeTensors(Protocol):
    """What :func:`greedy_commit` reads of a draft tree (``tree.DraftTree`` has it). A protocol, not an import:
    tree.py calls this module's expansion, so this module does not import tree.py back."""

    tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]
    depth: torch.Tensor  # [B, N]
    mask: torch.Tensor  # [B, N, N]
    max_depth: int


def applies(x: torch.Tensor) -> bool:
    """Whether a phase's bookkeeping on ``x``'s device takes the kernels: compiled on CUDA, the ops loaded
    (:func:`load`, called where an engine is made: a traced function must not import or register). As
    ``tree.top_k``, eager phases keep the reference: it is what the kernels are checked against."""
    return torch.compiler.is_compiling() and x.is_cuda and _loaded


_loaded = False
reason: str | None = None  # why the ops did not load (None: they did, or load() was not called)


def load() -> bool:
    """Import Triton and our kernels and register the three ops, once per process. -> whether they loaded (a
    failure, e.g. no Triton, leaves the reference in use and says why in :data:`reason`)."""
    global _loaded, reason
    if not _loaded and reason is None:
        try:
            from eaglelab.engine.runtime import cycle_kernels  # imports triton: ImportError without it

            cycle_kernels.register()
            _loaded = True
        except Exception as exc:  # noqa: BLE001 - any import or registration failure: the reference runs
            reason = f"the cycle's kernels unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return _loaded


def untold_reason() -> str | None:
    """:data:`reason`, the first time it is asked for (a compiler's log says it once per process), else None."""
    global _told
    if reason is None or _told:
        return None
    _told = True
    return reason


_told = False


def greedy_commit(tree: TreeTensors, pred: torch.Tensor, lengths: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor | None, compact: bool) -> tuple[torch.Tensor, ...]:
    """Greedy acceptance of ``tree`` against the target's picks ``pred [B, N]`` (its next token after each node), as
    ``verification.greedy_accept``: -> (accept_len [B], path [B, D+1], committed tokens [B, D+1], bonus [B]). With
    ``compact``, the accepted path's K/V (tree node i at slot lengths + i) moved onto slots lengths..lengths + D in
    ``k`` and ``v`` ``[L, B, KVH, S, D]`` (``v`` None: a K-only cache), as ``KVCache.compact_path``."""
    return torch.ops.eaglelab.greedy_commit(pred, tree.tokens, tree.parents, tree.depth, tree.mask, lengths, k, v,
                                            tree.max_depth, compact)


def emit_advance(state: dict[str, torch.Tensor], toks: torch.Tensor, count: torch.Tensor | None, root: torch.Tensor,
                 eos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``loop_state.emit_and_advance`` in one kernel (``count`` None: one token a row; ``toks`` past a row's count, a
    path's -1 padding, never emitted). -> (emitted [B], active [B])."""
    return torch.ops.eaglelab.emit_advance(toks, count, root, eos, state["out"], state["n_out"], state["done"],
                                           state["hit_eos"], state["limit"], state["lengths"], state["root"])


def tree_expand(scores: torch.Tensor, logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, ...]:
    """A draft step's expansion (``tree.expand_step``) in two kernels: the drafter's ``logits [B, F, V]`` ranked in
    blocks of 256 entries, then per batch row each frontier node's ``topk`` most likely tokens, their cumulative
    scores (``scores [B, F]`` plus the log-probability) and the ``topk`` best of those F * topk candidates.
    -> (tokens [B, F*topk] (drafter ids), scores [B, F*topk] float32, selected [B, topk])."""
    return torch.ops.eaglelab.tree_expand(scores, logits, topk)
