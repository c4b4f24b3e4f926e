"""A static, preallocated KV cache: fixed buffers written at explicit slots.

Layout per layer: ``k[layer]`` and ``v[layer]`` are ``[B, KVH, S, D]`` (batch slots x KV heads x
max length x head dim). Writes go to explicit cache slots ``[B, T]`` chosen by the caller;
nothing here tracks lengths, so "rolling back" rejected tokens is just not counting them: the
next write lands on the same slots and the attention mask never shows slots past a row's length.

A drafter's cache keeps the token at each position as well when a lookup branch runs (``history=True``,
``tokens [B, S]``): what the branch searches. A cache built with ``with_v=False`` holds ``k`` only: multi-head
latent attention caches one compressed row per token (``engine/model/mla.py``) that serves as both key and value.
"""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated K/V buffers for ``num_layers`` layers."""

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        with_v: bool = True,
        history: bool = False,
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, KVH, S, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device) if with_v else None
        # Per-layer views [B, KVH, S, D] of the same storage. Writes and reads go through them, so a
        # torch.compile'd forward mutates each layer's buffer in place (a write through
        # ``k[layer]`` compiles to a copy of the whole layer and a copy back of the whole cache).
        self.k_layers = self.k.unbind(0)
        self.v_layers = self.v.unbind(0) if self.v is not None else None
        self.batch_size = batch_size
        self.max_len = max_len
        # ``history=True``: the token at each position too, [B, S] (a drafter cache: a lookup branch reads it)
        self.tokens = torch.zeros(batch_size, max_len, dtype=torch.long, device=device) if history else None
        self._rows = torch.arange(batch_size, device=device)[:, None]  # [B, 1]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
        """Store ``k``/``v`` [B, T, KVH, D] at cache slots ``slots`` [B, T] of ``layer`` (``v`` None
        without a V buffer, or to leave it unwritten: an MLA drafter's latent rows in a drafter cache)."""
        rows = self._rows[: slots.shape[0]]
        self.k_layers[layer][rows, :, slots] = k
        if self.v_layers is not None and v is not None:
            self.v_layers[layer][rows, :, slots] = v

    def layer(self, layer: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The full buffers of one layer, ``[B, KVH, S, D]`` each (first ``batch`` rows; V None
        without a V buffer)."""
        b = self.k.shape[1] if batch is None else batch
        return self.k_layers[layer][:b], (None if self.v_layers is None else self.v_layers[layer][:b])

    def compact_path(self, lengths: torch.Tensor, path: torch.Tensor) -> None:
        """After a tree verify (tree node i at slot ``lengths[b] + i``), move the accepted ``path [B, D+1]``'s
        entries (node ids, -1 past its end) onto slots ``lengths[b]``, ``lengths[b] + 1``, ..., for all layers.
        Example: lengths [5], path [[0, 2, 3, -1]] -> slot 7 to 6, slot 8 to 7 (5 stays; past the path, nothing)."""
        steps = torch.arange(path.shape[1], device=path.device)
        base = lengths[:, None]
        self.copy_slots(base + torch.where(path >= 0, path, steps), base + steps)

    def copy_row(self, src: int, dst: int) -> None:
        """Row ``src``'s every slot of every layer onto row ``dst`` (continuous batching moves a running request
        out of the rows new prompts' prefill writes: phases of k rows use rows 0..k-1). Example: rows 0 and 3 of a
        4-row cache; ``copy_row(0, 3)`` leaves row 3 a copy of row 0, which may then be overwritten."""
        for buf in (self.k, self.v) if self.v is not None else (self.k,):
            buf[:, dst].copy_(buf[:, src])
        if self.tokens is not None:
            self.tokens[dst].copy_(self.tokens[src])

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move entries within each row, for all layers: slot ``src[b, i]`` -> ``dst[b, i]``.
        ``src``/``dst`` are [B, N]; pairs with src == dst are harmless.
        """
        rows = self._rows[: src.shape[0]]
        for buf in (self.k, self.v) if self.v is not None else (self.k,):
            moved = buf[:, rows, :, src]  # [B, N, L, KVH, D]
            buf[:, rows, :, dst] = moved
