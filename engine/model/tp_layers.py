"""Sharded layers for tensor parallelism (the group itself is ``engine/core/tp_group.py``).

With ``tp=None`` (a single process) every layer here is a plain linear and no collective runs.
Column-parallel linears split their output features over ranks, row-parallel ones their input
features; the model calls :meth:`TPGroup.all_reduce` visibly in its forward after each
row-parallel projection (attention output, MLP / MoE output): two all-reduces per layer and an
all-gather of the logits (the embedding is replicated: no collective).

What is sharded and what is not, and why:

- Attention heads (q/k/v column-parallel by head, o row-parallel), dense MLP and shared experts
  (gate/up column-parallel, down row-parallel), routed experts (each expert's intermediate width
  split, see ``engine/model/moe.py``).
- The embedding is **replicated** (no collective: see :class:`VocabParallelEmbedding`); a tied
  model's head then keeps its own vocab shard of the same table (loaded from the embedding's
  tensor), since the two no longer have one shape.
- The LM head is **sharded over the vocabulary** (as SGLang does), ceil(V / world)
  rows per rank. Replicating it was the alternative (no collective, bitwise head logits); it loses
  on time as soon as the head's weight read dominates its collective's latency. Measured with 2 gloo
  ranks on CPU, default model (V 49152, H 576), median of 50: one decode token, full head 25-28 ms,
  half head + logits all-gather 15-18 ms; 8 tokens (a verify), 85-87 ms against 55-56 ms. On an
  H200 (bf16, one token, the head matmul alone): default model 32 us full, 24 us half; Kimi-K2's
  head (V 163840, H 7168, 2.3 GB) 560 us full, 334 us half, 97 us an eighth, against an all-gather
  of a few tens of microseconds over NVLink (not measured here: one GPU was lent).
  Cost: the logits all-gather (B*T*V values per forward, site ``"head"``).
- The EAGLE-3 drafter is **replicated** (built per rank from the same weights, see
  ``session.py``): it is one decoder layer whose work is tiny next to the target's; sharding it
  would add two all-reduces per draft step (num_steps per cycle) whose latency exceeds the compute
  saved, and its inputs (token ids, the target's aux hidden states, which are full-width after the
  target's all-reduces) are already identical on every rank, so every rank drafts the same tree.
  With the replicated embedding it shares, a draft step runs no collective at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eaglelab.engine.core.tp_group import TPGroup
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.layers import EAGER_KERNELS, FusedLinear, Kernels


@dataclass(frozen=True)
class HeadSplit:
    """The attention heads one rank owns: query heads [q_start, q_start + q_len), KV likewise."""

    q_start: int
    q_len: int
    kv_start: int
    kv_len: int


def head_split(num_heads: int, num_kv_heads: int, tp: TPGroup | None) -> HeadSplit:
    """Split attention heads over ranks by whole GQA groups (a KV head with its query heads).

    With at least as many KV heads as ranks, each rank owns a near-even run of groups (9 heads /
    3 KV heads over 2 ranks: 6 + 3 query heads, 2 + 1 KV heads; uneven, but every head computes
    exactly once). With fewer KV heads than ranks, the query heads split evenly and each rank keeps
    a copy of the one KV head its query heads read (the world size must be a multiple of the KV
    head count).
    """
    if tp is None:
        return HeadSplit(0, num_heads, 0, num_kv_heads)
    group = num_heads // num_kv_heads
    if num_kv_heads >= tp.world_size:
        kv_start, kv_len = tp.split(num_kv_heads, "num_key_value_heads")
        return HeadSplit(kv_start * group, kv_len * group, kv_start, kv_len)
    assert tp.world_size % num_kv_heads == 0 and num_heads % tp.world_size == 0, (
        f"{num_heads} heads / {num_kv_heads} KV heads do not split over {tp.world_size} ranks"
    )
    q_len = num_heads // tp.world_size
    q_start = tp.rank * q_len
    return HeadSplit(q_start, q_len, q_start // group, 1)


EMBED_LAYER = -1  # the layer id the embedding's all-reduce reports; the head reports num_layers


def _vocab_shard(vocab: int, tp: TPGroup | None) -> int:
    """Rows per rank: ceil(V / world); the last rank's tail rows are zero padding."""
    return -(-vocab // tp.world_size) if tp else vocab


class VocabParallelEmbedding(nn.Module):
    """Token embedding under TP: replicated (the default) or split over the vocabulary.

    Replicated (``replicate=True``): every rank holds the whole [V, H] table and looks its ids up
    with no collective. The table is read one row per token, so its size costs memory, not time
    (Kimi-K2's 163840 x 7168 table: 2.3 GB per rank in bf16; Llama 3.1 8B's: 1.05 GB);
    the vocab-parallel lookup's all-reduce (site ``"embed"``, layer -1) was the first collective
    of every forward, the one that absorbed the ranks' arrival skew, and every draft step of the
    replicated drafter paid it too. Vocab-parallel (``replicate=False``): [ceil(V / world), H] per
    rank, each rank looks up the ids in its range (zero rows for the others) and the all-reduce
    assembles every row: exact, a sum of one row and zeros.
    """

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup | None, replicate: bool = True) -> None:
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.replicated = tp is not None and replicate
        self.local_vocab = vocab_size if self.replicated else _vocab_shard(vocab_size, tp)
        self.start = tp.rank * self.local_vocab if tp and not self.replicated else 0
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None or self.replicated:
            return nn.functional.embedding(ids, self.weight)  # [B, T, H]
        local = ids - self.start
        outside = (local < 0) | (local >= self.local_vocab)  # [B, T]
        x = nn.functional.embedding(local.clamp(0, self.local_vocab - 1), self.weight)  # [B, T, H]
        x = x.masked_fill(outside[..., None], 0.0)
        return self.tp.all_reduce(x, EMBED_LAYER, "embed")

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full [V, H] table (all of them when replicated; else zero-padded
        to world * local rows)."""
        return full if self.replicated else _vocab_rows(full, self.tp, self.local_vocab)


class ParallelLMHead(nn.Module):
    """LM head, vocabulary split over ranks; the logits are all-gathered (site ``"head"``).

    Each rank computes the logits of its vocabulary rows ([..., V / world]); sampling and
    acceptance need all of them on every rank, hence the all-gather, B*T*V values per forward.
    Shares its weight with :class:`VocabParallelEmbedding` when the model ties them.
    """

    def __init__(self, hidden_size: int, vocab_size: int, tp: TPGroup | None, layer: int) -> None:
        super().__init__()
        self.tp, self.vocab_size, self.layer = tp, vocab_size, layer
        self.local_vocab = _vocab_shard(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))
        self.bias = None  # what a linear offers (the fused matmul reads it)

    def forward(self, hidden: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] (in ``dtype``, default the weight's: the gather converts)."""
        y = nn.functional.linear(hidden, self.weight)  # [..., V_local]
        if self.tp:
            y = self.tp.all_gather(y, self.layer, "head", dtype)[..., : self.vocab_size]  # [..., V]
        return y if dtype is None else y.to(dtype)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return _vocab_rows(full, self.tp, self.local_vocab)


def _vocab_rows(full: torch.Tensor, tp: TPGroup | None, local_vocab: int) -> torch.Tensor:
    if tp is None:
        return full
    padded = torch.zeros(local_vocab * tp.world_size, *full.shape[1:], dtype=full.dtype)
    padded[: full.shape[0]] = full
    return padded.chunk(tp.world_size, dim=0)[tp.rank]


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's rows (output features) split over ranks: [local_out, in].

    ``rows`` = (start, length) picks this rank's rows (attention: whole heads); by default the
    output features split near-evenly.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup | None, what: str = "",
                 rows: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.full_out = out_features
        self.rows = rows or (tp.split(out_features, what or "out_features") if tp else (0, out_features))
        self.weight = nn.Parameter(torch.empty(self.rows[1], in_features))
        self.bias = nn.Parameter(torch.empty(self.rows[1])) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full checkpoint tensor (weight [out, in] or bias [out])."""
        return full if self.tp is None else full.narrow(0, *self.rows)


class RowParallelLinear(nn.Module):
    """y_partial = x_local W_local^T with W's columns (input features) split: [out, local_in].

    The caller all-reduces the result (visibly, in the model's forward). A bias is added once,
    after the reduction, by the caller; row-parallel projections in our models have none.
    ``cols`` = (start, length) picks this rank's columns (by default a near-even split).
    """

    def __init__(self, in_features: int, out_features: int, tp: TPGroup | None, what: str = "",
                 cols: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.cols = cols or (tp.split(in_features, what or "in_features") if tp else (0, in_features))
        self.weight = nn.Parameter(torch.empty(out_features, self.cols[1]))
        self.bias = None  # added by the caller after the reduction (none in our models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return full if self.tp is None else full.narrow(1, *self.cols)


class DenseMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); gate/up column-parallel, down row-parallel."""

    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup | None, intermediate: int | None = None) -> None:
        super().__init__()
        self.layer, self.tp = layer, tp
        inter = intermediate or cfg.intermediate_size
        self.gate_proj = ColumnParallelLinear(cfg.hidden_size, inter, False, tp, "gate_proj")
        self.up_proj = ColumnParallelLinear(cfg.hidden_size, inter, False, tp, "up_proj")
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, tp, "down_proj")
        self.gate_up = FusedLinear(self.gate_proj, self.up_proj, sums_fused=True)  # read by the SwiGLU
        self.down = FusedLinear(self.down_proj, sums_fused=tp is None)  # the residual add (under TP: all-reduced)

    def forward(self, x: torch.Tensor, reduce: bool = True, kernels: Kernels = EAGER_KERNELS) -> torch.Tensor:
        gate, up = self.gate_up(x, kernels.gemv)  # one matmul: [B, T, 2I] split
        (y,) = self.down(kernels.swiglu(gate, up), kernels.gemv)  # [B, T, H] (partial under TP)
        if self.tp and reduce:
            y = self.tp.all_reduce(y, self.layer, "mlp")
        return y
