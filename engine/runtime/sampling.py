"""Turning logits into probabilities (temperature, top-k, top-p) and drawing tokens from them.

Everything here is pure tensor code with fixed shapes and no host synchronisation, so it can
run inside a captured CUDA graph. The same :class:`SamplingParams` drive plain decoding, the
target's distribution in rejection sampling, and the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    ``temperature == 0`` means greedy (argmax). ``top_k == 0`` keeps every token; ``top_p == 1``
    disables nucleus filtering. Top-k is applied first, then top-p on the renormalised result.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables nucleus sampling), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0


def probs_from_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Float32 next-token probabilities ``[..., V]`` from logits ``[..., V]``.

    Greedy params give a one-hot of the argmax. Otherwise: divide by the temperature, keep the
    ``top_k`` largest logits, then keep the smallest set of most likely tokens whose mass reaches
    ``top_p`` (the top token is always kept), and renormalise.
    """
    if params.greedy:
        return _one_hot_argmax(logits)
    scaled = logits.float() / params.temperature  # [..., V]
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        scaled = _keep_top_k(scaled, params.top_k)
    probs = torch.softmax(scaled, dim=-1)  # [..., V]
    if params.top_p < 1.0:
        probs = _keep_top_p(probs, params.top_p)
    return probs


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row: LongTensor ``[...]`` drawn from ``probs [..., V]``.

    ``probs`` need not be normalised (zero rows are invalid). The draw is the exponential race
    ``argmax(p / E)``, ``E ~ Exp(1)`` i.i.d., which picks index i with probability p_i / sum(p);
    it is the algorithm ``torch.multinomial`` runs for a single sample, without the validation
    step that some torch versions do on the host (a sync). ``generator`` must live on
    ``probs.device``.
    """
    return sample_with(probs, exponential_noise(probs.shape, probs.device, generator))


def exponential_noise(shape, device, generator: torch.Generator | None = None) -> Tensor:
    """Float32 Exp(1) draws of ``shape`` (kept > 0): the randomness :func:`sample_with` consumes.
    Drawn outside captured graphs, so a graph replays deterministically on whatever was drawn."""
    race = torch.empty(shape, dtype=torch.float32, device=device).exponential_(1.0, generator=generator)
    return race.clamp_(min=torch.finfo(torch.float32).tiny)  # never divide by an exact zero draw


def sample_with(probs: Tensor, race: Tensor) -> Tensor:
    """The exponential race ``argmax(p / E)`` over given draws ``race`` (see :func:`sample`)."""
    return torch.argmax(probs.float() / race, dim=-1)


def _one_hot_argmax(logits: Tensor) -> Tensor:
    """Float32 one-hot ``[..., V]`` of the argmax of ``logits [..., V]``."""
    top = torch.argmax(logits, dim=-1, keepdim=True)  # [..., 1]
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(-1, top, 1.0)


def _keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Set every logit outside the k largest (exactly k, ties broken by torch.topk) to -inf."""
    top = torch.topk(logits, k, dim=-1).indices  # [..., k]
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, top, True)
    return logits.masked_fill(~keep, float("-inf"))


def _keep_top_p(probs: Tensor, top_p: float) -> Tensor:
    """Zero every token outside the minimal nucleus of mass >= top_p, then renormalise."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)  # [..., V]
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of strictly more likely tokens
    keep_sorted = mass_before < top_p  # the top token has mass_before 0 < top_p: always kept
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)
