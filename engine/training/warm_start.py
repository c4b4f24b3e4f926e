"""Warm start: a new drafter begins from a trained one (``eaglelab train --init-from DIR``).

Every tensor but the draft head is copied as is; shapes must match (same target, same number of
aux states), except the MLP's, which may widen (below). The draft vocabulary may differ between the
two (new data, another size): the head's row of a draft token is then taken from the old drafter
when the old vocabulary has that target token; a token the old vocabulary lacks gets the target's
lm_head row mapped into the drafter's space by the least-squares linear map M [H, H] that takes the
target's rows of the shared tokens to the old drafter's rows::

    new draft id j -> target id t = j + d2t_new[j]
    old has t (t2d_old[t]) -> lm_head_new[j] = lm_head_old[old draft id of t]
    else                   -> lm_head_new[j] = lm_head_target[t] @ M,
                              M = argmin ||lm_head_target[shared] @ M - lm_head_old[shared]||

Why the map: a trained drafter's final norm and rows drift from the target's, so the target's rows as
they are give the new tokens huge logits. Measured on two of SmolLM2-135M's answers (CPU), the shipped
drafter warm-started into a 12,288-token vocabulary: TTT loss 132 with the target's rows, 47 with zero rows, 19.0
with the mapped rows, against 18.1 for the shipped drafter itself (the rows it has fit the map to 14%).

The aux ids must be the same in both: ``fc`` was trained on the features of those layers.

The MLP may be wider than the old one's (``--intermediate-size``; never narrower): the widening keeps
the function. With I_old units widened to I::

    gate/up [I_old, H] -> [I, H]: rows 0..I_old-1 the old ones, rows I_old.. N(0, std) (seeded)
    down    [H, I_old] -> [H, I]: columns 0..I_old-1 the old ones, columns I_old.. zero

so a new unit's output silu(g) * u meets a zero column: the widened drafter computes what the old
one did until the first optimizer step, and the new units' gradients start at their down columns.

The layout is the old drafter's (:func:`init_layout`, :func:`init_config`): an MLA drafter
(``Eagle3DeepseekV2ForCausalLM``, e.g. ``lightseekorg/kimi-k2.5-eagle3-mla``) continues as one, with its own
MLA sizes, heads and rope, which need only fit the target's MLA cache row (kv_lora_rank + qk_rope_head_dim);
``--layout`` naming the other layout, or an MLA drafter on a target without MLA, is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from eaglelab.engine.errors import CheckpointError


@dataclass(frozen=True)
class WarmStart:
    """What a warm start copied."""

    path: str
    tensors: int  # tensors copied whole
    head_rows_copied: int  # draft-head rows taken from the old drafter
    head_rows_new: int  # rows of draft tokens the old vocabulary lacks (the target's rows, mapped)
    map_rel_error: float | None  # ||T M - old|| / ||old|| over the shared rows (None: no new rows)
    intermediate_from: int  # the old drafter's MLP width
    intermediate_size: int  # this drafter's (larger: widened, function-preserving)
    widen_seed: int | None = None  # seed of the new gate/up rows (None: not widened)
    widen_std: float | None = None  # their standard deviation

    @property
    def widened(self) -> bool:
        return self.intermediate_size > self.intermediate_from


GATE, UP, DOWN = (f"midlayer.mlp.{n}_proj.weight" for n in ("gate", "up", "down"))
WIDEN_STD = 0.02  # a fresh drafter's init (new_drafter)


def head_rows(old_token_map: torch.Tensor, new_token_map: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(new draft ids, old draft ids) of the target tokens both vocabularies hold, in new-id order.
    token maps: [V_draft] target ids of each draft id."""
    old_of = torch.full((vocab_size,), -1, dtype=torch.long)
    old_of[old_token_map.long()] = torch.arange(old_token_map.numel())
    src = old_of[new_token_map.long()]  # [V_new] old draft id or -1
    keep = src >= 0
    return torch.nonzero(keep).squeeze(1), src[keep]


def row_map(target_rows: torch.Tensor, old_rows: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The least-squares M [H, H] with target_rows @ M ~ old_rows (both [n, H]), and its relative error."""
    a, b = target_rows.double(), old_rows.double()
    m = torch.linalg.lstsq(a, b).solution
    return m, float((a @ m - b).norm() / b.norm().clamp(min=1e-12))


def widen_mlp(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, width: int, *, seed: int,
              std: float = WIDEN_STD) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gate, up [I_old, H] and down [H, I_old] -> float32 [width, H], [width, H], [H, width]: the old
    units first, new gate/up rows N(0, std) from a generator seeded by ``seed``, new down columns 0.

    Example: I_old 2, width 3 -> gate rows (g0, g1, r0), up rows (u0, u1, r1), down columns (d0, d1, 0).
    """
    extra, H = width - gate.shape[0], gate.shape[1]
    assert extra >= 0, f"widen_mlp narrows {gate.shape[0]} -> {width}"
    gen = torch.Generator().manual_seed(seed)
    new_gate = torch.randn(extra, H, generator=gen) * std  # [extra, H]
    new_up = torch.randn(extra, H, generator=gen) * std
    zeros = torch.zeros(down.shape[0], extra)  # [H, extra]
    return (torch.cat([gate.float(), new_gate]), torch.cat([up.float(), new_up]),
            torch.cat([down.float(), zeros], dim=1))


def _mlp_width(ck, state: dict[str, torch.Tensor]) -> int | None:
    """The old drafter's MLP width when gate, up and down agree on one ([I, H], [I, H], [H, I]); None
    otherwise (the shape check that follows names the tensor)."""
    if not all(n in state and state[n].dim() == 2 for n in (GATE, UP, DOWN)):
        return None
    width = state[GATE].shape[0]
    if state[UP].shape[0] != width or state[DOWN].shape[1] != width:
        return None
    return width


def _widen(net, ck, state: dict[str, torch.Tensor], seed: int) -> tuple[int, bool]:
    """Widen ``state``'s MLP in place to ``net``'s width; (old width, widened?). Narrowing is refused."""
    old = _mlp_width(ck, state)
    width = net.config.intermediate_size
    if old is None or old == width:
        return (width if old is None else old), False
    if old > width:
        raise CheckpointError("the drafter's MLP is wider than the one to train: a warm start widens, never narrows",
                              file=ck.config_file, field="intermediate_size", found=old,
                              expected=f"<= {width} (--intermediate-size)",
                              hint=f"pass --intermediate-size {old} or more, or train from scratch without --init-from")
    state[GATE], state[UP], state[DOWN] = widen_mlp(state[GATE], state[UP], state[DOWN], width, seed=seed)
    return old, True


def init_layout(ck, target, requested: str | None) -> str:
    """The layout ("llama" | "mla") a run warm-started from ``ck`` (a read drafter checkpoint) trains on
    ``target`` (a ModelConfig): the checkpoint's own. ``requested`` (``--layout``; None: not given) must name
    it; an MLA checkpoint must fit the target's MLA (the layout checks of check-wiring, errors raised)."""
    from eaglelab.engine.formats.drafter_layouts import layout_problems, raise_first

    lay = ck.layout
    kind = "mla" if lay.mla is not None else "llama"
    if requested is not None and requested != kind:
        names = {"mla": "Eagle3DeepseekV2ForCausalLM (MLA attention)", "llama": "LlamaForCausalLMEagle3 (q/k/v attention)"}
        raise CheckpointError(f"--layout {requested} cannot warm-start from a drafter of the {kind} layout: its "
                              "attention tensors are another network's", file=ck.config_file, field="architectures",
                              found=f"{lay.architecture or 'no architectures'}: {lay.describe()}",
                              expected=f"{names[requested]} for --layout {requested}",
                              hint=f"drop --layout (or pass --layout {kind}) to continue in the drafter's own layout, "
                                   "or train from scratch without --init-from")
    if kind == "mla":
        raise_first(layout_problems(ck, target))  # an MLA target, and its cache row; a-projections 2H wide
    return kind


def init_config(cfg, ck):
    """``cfg`` (the run's :class:`Eagle3Config`, built for the checkpoint's layout) with what the checkpoint
    decides: its EAGLE-3.1 flags and, for the MLA layout, its own MLA sizes, heads and rope (q_lora_rank,
    qk_nope_head_dim and v_head_dim need not be the target's)."""
    lay = ck.layout
    cfg = replace(cfg, fc_norm=lay.fc_norm, norm_output=lay.norm_output)
    if lay.mla is None:
        return cfg
    scaling = tuple(sorted(ck.rope_scaling.items())) if ck.rope_scaling else None
    return replace(cfg, mla=lay.mla, num_heads=ck.num_attention_heads, num_kv_heads=1, head_dim=lay.mla.cache_dim,
                   rope_theta=ck.rope_theta, rope_scaling=scaling)


def warm_start(net, path: str | Path, sglang_layer_ids: list[int], target_head: torch.Tensor, *,
               seed: int = 0) -> WarmStart:
    """Copy the drafter at ``path`` into ``net`` (a fresh :class:`Eagle3Network`, vocabulary set), its
    MLP widened to ``net``'s (new gate/up rows seeded by ``seed``); ``target_head`` [V, H]: the target's
    lm_head, for the rows of tokens the old vocabulary lacks."""
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint

    ck = read_draft_checkpoint(path)
    if not ck.has_weights:
        raise CheckpointError("no weights (*.safetensors) in the drafter directory", file=ck.path, field="--init-from")
    _check_taps(ck, sglang_layer_ids)
    state = ck.load_state_dict()
    old_width, widened = _widen(net, ck, state, seed)
    copied = _copy_body(net, ck, state)
    rows_copied, rows_new, err = _copy_head(net, ck, state, target_head)
    return WarmStart(str(path), copied, rows_copied, rows_new, err, old_width, net.config.intermediate_size,
                     seed if widened else None, WIDEN_STD if widened else None)


def _check_taps(ck, sglang_layer_ids: list[int]) -> None:
    from eaglelab.engine.formats.conventions import convert_ids

    if ck.aux_layer_ids is not None:
        old_ids = list(convert_ids(ck.aux_layer_ids, ck.aux_convention or "sglang", "sglang"))
        if sorted(old_ids) != sorted(sglang_layer_ids):
            raise CheckpointError("the drafter was trained on other aux layers", file=ck.config_file,
                                  field="eagle_aux_hidden_state_layer_ids", found=old_ids, expected=list(sglang_layer_ids),
                                  hint="warm-start only from a drafter of the same taps (or train from scratch)")


def _copy_body(net, ck, state: dict[str, torch.Tensor]) -> int:
    """Copy every parameter but the head, shapes checked; the number copied."""
    copied = 0
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name == "lm_head.weight":
                continue
            if name not in state:
                raise CheckpointError("missing tensor", file=ck.path, field=name, hint="an EAGLE-3 drafter needs it")
            if tuple(state[name].shape) != tuple(param.shape):
                raise CheckpointError("wrong tensor shape for a warm start", file=ck.path, field=name,
                                      found=list(state[name].shape), expected=list(param.shape),
                                      hint="warm-start from a drafter of the same target and shape")
            param.copy_(state[name].to(param.dtype))
            copied += 1
    return copied


def _copy_head(net, ck, state: dict[str, torch.Tensor], target_head: torch.Tensor) -> tuple[int, int, float | None]:
    """The draft head's rows: the old ones of shared tokens, the target's (mapped) of new ones;
    (rows copied, rows new, the map's relative error)."""
    if "lm_head.weight" not in state or "d2t" not in state:
        raise CheckpointError("missing tensor", file=ck.path, field="lm_head.weight" if "lm_head.weight" not in state else "d2t")
    old_head, old_d2t = state["lm_head.weight"], state["d2t"].long()
    if old_head.shape[0] != old_d2t.numel() or old_head.shape[1] != net.lm_head.weight.shape[1]:
        raise CheckpointError("wrong tensor shape for a warm start", file=ck.path, field="lm_head.weight",
                              found=list(old_head.shape), expected=[old_d2t.numel(), net.lm_head.weight.shape[1]])
    old_map = torch.arange(old_d2t.numel()) + old_d2t
    new_map = net.token_map().cpu()
    new_ids, old_ids = head_rows(old_map, new_map, net.config.vocab_size)
    head = net.lm_head.weight  # [V_new, H]
    fresh = torch.ones(head.shape[0], dtype=torch.bool)
    fresh[new_ids] = False
    err = None
    with torch.no_grad():
        if bool(fresh.any()):
            tgt = target_head.detach().float().cpu()  # [V, H]
            m, err = row_map(tgt[old_map], old_head.float())
            head[fresh.to(head.device)] = (tgt[new_map[fresh]].double() @ m).to(head)
        head[new_ids.to(head.device)] = old_head[old_ids].to(head)
    return int(new_ids.numel()), int(fresh.sum()), err
