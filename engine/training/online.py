"""Online training data: token ids on disk, the target's hidden states computed per batch.

:class:`TokenData` reads the shards ``eaglelab distill`` writes (prompt + answer ids, where the
answer starts) and serves padded :class:`~eaglelab.engine.training.train.TrainBatch` es with no
states; :class:`TargetStates` fills in the aux states [B, T, n*H] at the chosen taps and the final
hidden state [B, T, H] with one no-grad causal forward of the target on the training device, so a
50k-sample run stores ~100 MB of ids instead of ~2 TB of states. Right padding never changes an
earlier position's states (causal attention).

:func:`split_heldout` sets aside a fixed, seeded set of samples for the acceptance evaluation;
:class:`Subset` is the rest, the training set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eaglelab.engine.errors import CheckpointError


class TokenData:
    """Every row of every distill shard under ``data_dir``, held in memory (int32 ids), ordered by
    prompt index (not by shard: shards follow prompt length)."""

    def __init__(self, data_dir: str | Path) -> None:
        from eaglelab.engine.training.distill import read_shard, shard_paths

        paths = shard_paths(data_dir)
        if not paths:
            raise CheckpointError("no distill shards", file=Path(data_dir) / "shards",
                                  hint="make them with `eaglelab distill --out DIR`")
        found: dict[int, tuple[torch.Tensor, int]] = {}  # prompt index -> (ids [T] int32, prompt length)
        for path in paths:
            t = read_shard(path)
            off = t["offsets"].tolist()
            for r, (idx, plen) in enumerate(zip(t["indices"].tolist(), t["prompt_lens"].tolist())):
                found[idx] = (t["tokens"][off[r]: off[r + 1]], plen)
        order = sorted(found)  # row i answers the i-th prompt present: the same order on every machine
        self.indices = order
        self.rows = [found[i][0].to(torch.int32) for i in order]
        self.prompt_lens = [found[i][1] for i in order]
        self.lengths = [int(r.numel()) for r in self.rows]
        self.paths = paths

    def __len__(self) -> int:
        return len(self.rows)

    def ids_and_mask(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [T] (int64) and loss_mask [T] (1 on the answer) of row ``i``."""
        ids = self.rows[i].long()
        mask = torch.zeros_like(ids)
        mask[self.prompt_lens[i]:] = 1
        return ids, mask

    def load(self, indices: list[int], max_length: int, pad_multiple: int = 1):
        """Rows -> a right-padded TrainBatch without states (T padded to ``pad_multiple``)."""
        from eaglelab.engine.training.ttt import TrainBatch

        pairs = [self.ids_and_mask(i) for i in indices]
        T = max(min(int(ids.numel()), max_length) for ids, _ in pairs)
        T = -(-T // pad_multiple) * pad_multiple
        ids = torch.zeros(len(pairs), T, dtype=torch.long)
        mask = torch.zeros(len(pairs), T, dtype=torch.float32)
        for b, (x, m) in enumerate(pairs):
            t = min(int(x.numel()), max_length)
            ids[b, :t], mask[b, :t] = x[:t], m[:t].float()
        if torch.cuda.is_available():  # page-locked: the step's copy to the GPU is asynchronous, not a stream sync
            ids, mask = ids.pin_memory(), mask.pin_memory()
        return TrainBatch(ids, mask, None, None)

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id appears as an answer token: [vocab_size] int64 (the draft vocabulary)."""
        answers = torch.cat([row[p:] for row, p in zip(self.rows, self.prompt_lens)]).long()
        return torch.bincount(answers, minlength=vocab_size)[:vocab_size]


@dataclass
class Subset:
    """Some samples of a data set (SampleSet or TokenData) under new indices 0..n-1."""

    base: object
    indices: list[int]

    def __post_init__(self) -> None:
        self.lengths = [self.base.lengths[i] for i in self.indices]  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.indices)

    def load(self, indices: list[int], max_length: int, pad_multiple: int = 1):
        return self.base.load([self.indices[i] for i in indices], max_length, pad_multiple)  # type: ignore[attr-defined]


def split_heldout(n: int, heldout: int, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): ``heldout`` samples drawn with ``seed``, the rest in order."""
    if heldout <= 0:
        return list(range(n)), []
    assert heldout < n, f"cannot hold out {heldout} of {n} samples"
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    held = sorted(torch.randperm(n, generator=gen)[:heldout].tolist())
    keep = set(held)
    return [i for i in range(n) if i not in keep], held


class TargetStates:
    """The target, frozen, computing a batch's aux and final hidden states on the training device."""

    def __init__(self, model, hf_taps: tuple[int, ...]) -> None:
        self.model, self.taps = model, tuple(hf_taps)
        for p in model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def fill(self, batch):
        """A TrainBatch with ``aux`` [B, T, n*H] and ``hidden`` [B, T, H] (the target's dtype)."""
        from eaglelab.engine.training.ttt import TrainBatch

        ids = batch.input_ids  # [B, T], on the target's device
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        hidden, aux = self.model(ids, positions, taps=self.taps)  # causal, no cache
        return TrainBatch(batch.input_ids, batch.loss_mask, aux, hidden)
