"""Runners: how each forward of the loop is executed (the :class:`~eaglelab.engine.runtime.contracts.Runner`
protocol). The eager runner calls the modules directly; the CUDA-graph runner (``cuda_graphs.py``)
replays captured graphs where it can and falls back to these eager calls, saying why.
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch

from torch import nn

from eaglelab.engine.model.layers import EAGER_KERNELS, Kernels, prepare_fused
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.runtime.compile import compile_report
from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.runtime.observer import Observer
from eaglelab.engine.runtime.reasons import EAGER_OFF

# The forwards each kind of cycle runs, as graph_status reports them.
FORWARD_PHASES: dict[str, tuple[str, ...]] = {
    "prefill": ("prefill",), "decode": ("decode",), "spec": ("draft", "verify", "draft_extend"),
    "cycle": ("cycle",),  # the one-graph speculative cycle: every forward of "spec" in one phase
}


class EagerRunner:
    """Every forward runs eagerly; ``reason`` is the graph status it reports (why no graphs)."""

    def __init__(self, target: Transformer, drafter: nn.Module | None = None, reason: str = EAGER_OFF,
                 kernels: Kernels = EAGER_KERNELS) -> None:
        self.target, self.drafter, self.reason, self.kernels = target, drafter, reason, kernels
        self._prepare_s = prepare_fused(target, drafter, gemv=kernels.gemv)  # weight copies: set-up, not the first prefill

    @property
    def prompt_kernels(self) -> Kernels:
        """The prompt's kernels: the phases' own (an eager run already takes the compiled pieces)."""
        return self.kernels

    def make_cache(self, batch: int, max_len: int, observer: Observer | None = None) -> KVCache | None:
        """No static cache: the engine allocates one per run."""
        return None

    @property
    def setup_seconds(self) -> float:
        """Seconds spent building fused weights and compiling so far (nothing is captured here); kept out of tok/s."""
        return self._prepare_s + compile_report(self.kernels)[0]

    def padded_batch(self, batch: int) -> int:
        """The rows a phase of ``batch`` rows runs on: those rows, nothing padded."""
        return batch

    def make_state(self, values: dict[str, torch.Tensor], cache: KVCache) -> dict[str, torch.Tensor]:
        """The loop's per-row state for phases to update in place: here ``values`` themselves."""
        return values

    def phase(self, name: str, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
              caches: tuple[KVCache, ...] = (), variant: Hashable = None,
              state: dict[str, torch.Tensor] | None = None, eager: str | None = None,
              compile: bool = True) -> tuple:
        """A whole phase of the cycle: here simply ``fn(**inputs, **state)`` (the graph runner captures it)."""
        return tuple(fn(**inputs, **(state or {})))

    def prefill_width(self, batch: int, prompt_len: int, cache: KVCache) -> tuple[int, str | None]:
        """No padding: an eager prefill attends over exactly the prompt."""
        return prompt_len, self.reason

    def make_draft_cache(self, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                         history: bool = False) -> KVCache:
        """A drafter KV cache (one layer) of this shape, on the target's device."""
        device = next(self.target.parameters()).device
        return KVCache(1, batch, kv_heads, max_len, head_dim, dtype=dtype, device=device, history=history)

    def prefill(self, cache: KVCache, ids, positions, mask, taps):
        """Prompt forward: ids/positions [B, T] at slots = positions. -> (hidden, aux)."""
        return self.target(ids, positions, cache, positions, mask, taps)

    def decode(self, cache: KVCache, tokens, slots, mask):
        """One token per row at slot = position. -> hidden [B, 1, H]."""
        hidden, _ = self.target(tokens, slots, cache, slots, mask)
        return hidden

    def verify(self, cache: KVCache, tokens, positions, slots, mask, taps):
        """Fixed-shape tree verify over the whole cache (attention mode ``decode``)."""
        return self.target(tokens, positions, cache, slots, mask, taps)

    def verify_extend(self, cache: KVCache, tokens, positions, slots, mask, taps, kv_len: int):
        """Extend-style verify over the used prefix only (attention mode ``prefill``); never captured."""
        return self.target(tokens, positions, cache, slots, mask, taps, kv_len=kv_len)

    def draft(self, name: str, cache: KVCache, tokens, feats, positions, slots, mask):
        """A drafter forward (``name``: "draft" or "draft_extend"). -> (hidden, draft logits)."""
        return self.drafter(tokens, feats, positions, cache, slots, mask)

    def graph_status(self, kind: str, attention_mode: str, batch: int) -> dict[str, str]:
        """Per phase of this cycle: "replay" or "eager: <reason>"."""
        return {p: self.reason for p in FORWARD_PHASES[kind]}
