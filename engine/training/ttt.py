"""The training-time test (TTT) step of an EAGLE-3 drafter: its unrolled forward and loss over every anchor.

What the drafter sees matches :class:`eaglelab.engine.runtime.drafters.Eagle3Drafter` exactly. For an
anchor position p of a sequence x_0..x_{T-1} (aux features a_p, target final hidden h_p):

* step 0 (the draft-extend): features ``fc(a_p)``, token ``x_{p+1}``, RoPE position ``p``;
* step i > 0 (draft step i): features = the state the drafter hands on from step i-1 at the same
  anchor (its pre-norm output; ``norm`` of it under EAGLE-3.1's ``norm_output``, as
  :meth:`Eagle3Network.hidden`), token ``x_{p+i+1}``, position ``p + i``;
* step i predicts ``x_{p+i+2}``; its target is the target's distribution at position ``p+i+1``
  (``softmax(lm_head(h_{p+i+1}))`` restricted to the draft vocabulary, renormalised), counted where
  ``loss_mask[p+i+2]`` is set (the predicted token is the assistant's);
* attention of step i at anchor p: the step-0 keys of every position <= p (the committed context)
  and the keys of steps 1..i at anchor p (its own draft chain), as in the engine's draft cache.
  Implemented with the keys of all steps concatenated, [B, KVH, (i+1)T, D] (:class:`StepKeys`, which
  the network's own attention reads as its cache: Llama q/k/v or MLA latent rows), and an explicit mask.

The loss is ``sum_i decay^i * CE_i`` (decay 0.8, 7 steps by default; the target's distribution optionally
sharpened, ``--target-temperature``), AdamW, cosine schedule with
warm-up, gradient clipping. Checkpoints hold model, optimizer, scheduler, data position and RNG
states; resuming continues to the same state as a run that never stopped.

Worked mask example, T = 3, step 1 (keys: step 0 at 0..2, then step 1 at 0..2)::

    anchor 0: [1 0 0 | 1 0 0]
    anchor 1: [1 1 0 | 0 1 0]
    anchor 2: [1 1 1 | 0 0 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from eaglelab.engine.model.eagle3 import Eagle3Network


@dataclass(frozen=True)
class TrainBatch:
    """Padded batch (right padding; padded positions have loss_mask 0). Online data comes without
    states (``aux``/``hidden`` None); :class:`~eaglelab.engine.training.online.TargetStates` fills them."""

    input_ids: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] float
    aux: torch.Tensor | None  # [B, T, n*H_t]
    hidden: torch.Tensor | None  # [B, T, H_t]

    def to(self, device: torch.device) -> "TrainBatch":
        nb = device.type == "cuda"
        move = lambda t: None if t is None else t.to(device, non_blocking=nb)  # noqa: E731
        return TrainBatch(*(move(t) for t in (self.input_ids, self.loss_mask, self.aux, self.hidden)))


def ttt_mask(T: int, steps: int, device: torch.device | str) -> torch.Tensor:
    """Bool [T, steps * T]: causal over the step-0 keys, then the diagonal for each later step."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (steps - 1), dim=1)


@dataclass(frozen=True)
class TTTResult:
    """Per TTT step: loss (mean over counted positions), accuracy and count; all device tensors."""

    step_loss: torch.Tensor  # [L]
    step_correct: torch.Tensor  # [L]
    step_count: torch.Tensor  # [L]


def target_probs(head_rows: torch.Tensor, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Target distribution restricted to the draft vocabulary, renormalised: [B, T, V_draft] float32.

    ``head_rows`` [V_draft, H]: the target's lm_head rows of the draft ids; hidden [B, T, H]. ``temperature``
    below 1 sharpens it (``softmax(logits / temperature)``: at 0.5 each probability squared, renormalised), so
    that a drafter too small to match the whole distribution spends its capacity on the target's first choices,
    which are what greedy verification accepts; the argmax, and so the accuracy counted, is the same.
    """
    logits = hidden.float() @ head_rows.float().t()  # [B, T, V_draft]
    if temperature != 1.0:
        logits = logits / temperature
    return torch.softmax(logits, dim=-1)


class StepKeys:
    """The keys of every TTT step so far, as the drafter attention's cache: ``write`` appends one step's
    [B, T, KVH, D] keys/values, ``layer`` hands back all steps concatenated, [B, KVH, (i+1)T, D]. Either
    attention (Llama q/k/v; MLA's latent rows, values None) runs its own cached code path against it, so
    a TTT step computes exactly what the network's own multi-step cached forward computes."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def write(self, layer: int, slots, k: torch.Tensor, v: torch.Tensor | None) -> None:
        self.k.append(k.transpose(1, 2))
        if v is not None:
            self.v.append(v.transpose(1, 2))

    def layer(self, layer: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return torch.cat(self.k, dim=2), (torch.cat(self.v, dim=2) if self.v else None)


def _drafter_step(net: Eagle3Network, embeds, feats, positions, keys: StepKeys, mask):
    """One drafter layer forward over all anchors, attending to the keys of every step so far (the
    network's own midlayer; either attention layout)."""
    B, T, _ = feats.shape
    cos, sin = net.rotary(positions, feats.dtype)
    step_mask = mask[:, : (len(keys.k) + 1) * T].expand(B, -1, -1)  # [B, T, (i+1)T]
    return net.midlayer(embeds, feats, cos, sin, keys, None, step_mask)  # [B, T, H] pre-norm output


def _shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[:, p + k] at p, zero past the end: [B, T] -> [B, T]."""
    out = torch.zeros_like(x)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def ttt_hidden(net: Eagle3Network, input_ids: torch.Tensor, aux: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """The drafter's pre-norm outputs [B, T, H] of TTT steps 0..steps-1, one per step, at every
    anchor p (step i at anchor p is draft step i of a chain grown from position p); logits are
    ``lm_head(norm(out))`` either way. The next step reads ``out``, or ``norm(out)`` when the network
    has ``norm_output`` (EAGLE-3.1), the state :meth:`Eagle3Network.hidden` hands on."""
    B, T = input_ids.shape
    dev = input_ids.device
    mask = ttt_mask(T, steps, dev)
    feats = net.fuse(aux)  # [B, T, H]
    pos = torch.arange(T, device=dev)
    keys = StepKeys()
    for i in range(steps):
        nxt = _shift_left(input_ids, i + 1)  # [B, T] token x_{p+i+1}
        with torch.no_grad():
            embeds = net.embed(nxt).to(feats.dtype)  # [B, T, H]; the target's, frozen
        out = _drafter_step(net, embeds, feats, (pos + i).expand(B, T), keys, mask)
        yield out
        feats = net.norm(out) if net.config.norm_output else out


def ttt_forward(net: Eagle3Network, batch: TrainBatch, probs: torch.Tensor, steps: int) -> TTTResult:
    """Unroll ``steps`` drafter steps over every anchor of ``batch``; ``probs`` [B, T, V_draft]
    is the target's restricted distribution at each position (see :func:`target_probs`)."""
    lm = batch.loss_mask
    T = lm.shape[1]
    losses, correct, counts = [], [], []
    for i, out in enumerate(ttt_hidden(net, batch.input_ids, batch.aux, steps)):
        n = T - i - 2  # anchors with a token x_{p+i+2} to predict
        if n <= 0:
            zero = out.sum().float() * 0.0
            losses.append(zero), correct.append(zero.detach()), counts.append(zero.detach())
            continue
        logits = net.lm_head(net.norm(out[:, :n])).float()  # [B, n, V_draft]
        tgt = probs[:, i + 1: i + 1 + n]  # [B, n, V_draft] target at p+i+1
        w = lm[:, i + 2: i + 2 + n]  # [B, n] predicted token is the assistant's
        ce = -(tgt * torch.log_softmax(logits, dim=-1)).sum(-1)  # [B, n]
        cnt = w.sum()
        losses.append((ce * w).sum() / cnt.clamp(min=1.0))
        correct.append(((logits.argmax(-1) == tgt.argmax(-1)).float() * w).sum().detach())
        counts.append(cnt.detach())
    return TTTResult(torch.stack(losses), torch.stack(correct), torch.stack(counts))
