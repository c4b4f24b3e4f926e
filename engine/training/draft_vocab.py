"""The draft vocabulary: the most frequent target tokens under the loss mask.

An EAGLE-3 drafter predicts over ``draft_vocab_size`` ids; ``d2t`` maps them back to target ids
(target id = draft id + d2t[draft id]) and ``t2d`` marks which target ids are in it. The choice
is by frequency of the *assistant* tokens (loss mask 1) in the training data, ties broken by the
lower target id, and the kept ids are listed in ascending order (so d2t is non-decreasing).

Coverage is the share of assistant tokens whose id is in the draft vocabulary: the ceiling of the
drafter's per-token accuracy, since it can never propose a token outside it.

Worked example: counts ``[5, 0, 9, 1]`` and a draft vocabulary of 2 keep target ids ``[0, 2]``:
``d2t = [0, 1]`` (0 -> 0, 1 -> 2), ``t2d = [T, F, T, F]``, coverage 14 / 15.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.specforge_data import VocabMapping, ids_and_mask, list_samples, read_sample


@dataclass(frozen=True)
class DraftVocab:
    """A vocab mapping with the statistics it was chosen from."""

    mapping: VocabMapping
    coverage: float  # share of assistant tokens inside the draft vocabulary
    assistant_tokens: int  # tokens counted (loss mask 1)
    distinct_tokens: int  # distinct ids among them

    @property
    def size(self) -> int:
        return int(self.mapping.d2t.numel())

    @property
    def target_ids(self) -> torch.Tensor:
        """Target id of each draft id, ascending, [V_draft]."""
        return draft_target_ids(self.mapping)


def draft_target_ids(mapping: VocabMapping) -> torch.Tensor:
    """Target id of each draft id: ``arange + d2t`` [V_draft]."""
    return torch.arange(mapping.d2t.numel()) + mapping.d2t


def count_tokens(samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """Counts [vocab] int64 of the ids where the loss mask is set, over (input_ids, loss_mask) pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in samples:
        ids = ids.reshape(-1).long()
        kept = ids[mask.reshape(-1) != 0]
        if kept.numel() and (int(kept.max()) >= vocab_size or int(kept.min()) < 0):
            raise ConfigError("token id outside the target vocabulary", field="input_ids",
                              found=int(kept.max()), expected=f"< {vocab_size}",
                              hint="the data was captured with another tokenizer than the target's")
        counts += torch.bincount(kept, minlength=vocab_size)
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """Keep the ``draft_vocab_size`` most frequent ids (ties: lower id first; unseen ids fill up)."""
    vocab_size = counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ConfigError("draft vocabulary size out of range", field="--draft-vocab-size",
                          found=draft_vocab_size, expected=f"1..{vocab_size} (the target's vocab_size)")
    ids = torch.arange(vocab_size)
    # stable sort by count descending; equal counts keep ascending id order
    order = torch.sort(counts, descending=True, stable=True).indices
    keep = torch.sort(ids[order[:draft_vocab_size]]).values  # [V_draft] ascending target ids
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[keep] = True
    d2t = keep - torch.arange(draft_vocab_size)
    total = int(counts.sum())
    covered = int(counts[keep].sum())
    return DraftVocab(
        mapping=VocabMapping(d2t=d2t.long(), t2d=t2d),
        coverage=covered / total if total else 0.0,
        assistant_tokens=total,
        distinct_tokens=int((counts > 0).sum()),
    )


def coverage(counts: torch.Tensor, mapping: VocabMapping) -> float:
    """Share of the counted tokens inside ``mapping``'s draft vocabulary."""
    total = int(counts.sum())
    return int(counts[mapping.t2d].sum()) / total if total else 0.0


def read_ids_and_mask(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``loss_mask`` of one sample, memory-mapping plain files (the hidden states
    are not read)."""
    if path.name.endswith(".gz"):
        s = read_sample(path)
        return s.input_ids, s.loss_mask
    try:
        obj = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - any bad file: the full reader explains what is wrong, naming it
        s = read_sample(path)
        return s.input_ids, s.loss_mask
    if not isinstance(obj, dict):
        raise CheckpointError("expected a dict of tensors", file=path, found=type(obj).__name__)
    ids, mask = ids_and_mask(obj, path)  # checked as read_sample checks them
    return ids.clone(), mask.clone()


def scan_data(data_dir: str | Path, vocab_size: int) -> tuple[torch.Tensor, list[int]]:
    """Token counts under the loss mask [vocab] and the length of every sample, in index order."""
    lengths: list[int] = []

    def pairs():
        for path in list_samples(data_dir):
            ids, mask = read_ids_and_mask(path)
            if int(ids.max()) >= vocab_size:  # every id is embedded in training, masked or not
                raise ConfigError("token id outside the target vocabulary", file=path, field="input_ids",
                                  found=int(ids.max()), expected=f"< {vocab_size} (the target's vocab_size)",
                                  hint="the data was captured with another tokenizer than the target's")
            lengths.append(int(ids.numel()))
            yield ids, mask

    counts = count_tokens(pairs(), vocab_size)
    return counts, lengths
