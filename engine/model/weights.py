"""Which checkpoint tensor fills which parameter: HF tensor names, full shapes and the TP slice.

A Transformer's parameters carry their HF checkpoint names (``model.`` dropped); a module with
``shard_of(attr, full)`` (the TP linears, the MoE experts) keeps its rank's slice of a full tensor,
one with ``checkpoint_names(attr)`` (the stacked MoE experts) stacks several. Nothing here reads a
file: a reader (:mod:`eaglelab.engine.formats.loader`, the streamed target, random weights) passes a
``read(name)`` callable, so both ``formats`` and the random scale models fill a model the same way.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.model import Transformer

TensorSource = Callable[[str], "tuple[torch.Tensor, str] | None"]  # name -> (full tensor, where) or None


def copy_sharded(model: nn.Module, read: TensorSource, source: str) -> None:
    """Fill every parameter of ``model`` from full (unsharded) tensors named as in HF checkpoints.

    A module with ``shard_of(attr, full)`` (the TP linears, the MoE experts) gets its rank's slice;
    one with ``checkpoint_names(attr)`` (the stacked MoE experts) gets those tensors sliced and
    stacked. A missing name or a wrong shape raises :class:`CheckpointError` naming ``source``.
    """
    modules = dict(model.named_modules())
    for name, param in model.named_parameters(remove_duplicate=True):
        mod_name, _, attr = name.rpartition(".")
        owner = modules.get(mod_name)
        parts = getattr(owner, "checkpoint_names", None)
        names = [f"{mod_name}.{p}" for p in parts(attr)] if parts is not None else [name]
        tensors = []
        for part in names:
            got = read(part)
            tied = name == "lm_head.weight" and getattr(model, "config", None) is not None and model.config.tie_word_embeddings
            if got is None and tied:  # a head not shared with the (replicated, TP) embedding: the same table's rows
                got = read("embed_tokens.weight")
            if got is None:
                if tied:
                    break
                raise CheckpointError(
                    "missing tensor", file=source, field=part, hint="the checkpoint does not match config.json"
                )
            full, where = got
            shard = getattr(owner, "shard_of", None)
            tensors.append(shard(attr, full) if shard is not None else full)
        if not tensors:
            continue
        full = torch.stack(tensors) if parts is not None else tensors[0]
        if tuple(full.shape) != tuple(param.shape):
            raise CheckpointError(
                "wrong tensor shape", file=source, field=where if parts is None else f"{names[0]} ... {names[-1]}",
                found=list(full.shape), expected=list(param.shape),
                hint="the weights do not match config.json (hidden_size, heads, vocab_size, experts ...)",
            )
        with torch.no_grad():
            param.copy_(full.to(param.dtype))


def checkpoint_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> full shape of every tensor an HF checkpoint of ``cfg`` holds (``model.`` prefix
    dropped; MoE experts per expert; a tied head not listed)."""
    with torch.device("meta"):
        full_model = Transformer(cfg, None)
    shapes: dict[str, tuple[int, ...]] = {}
    for mod_name, mod in full_model.named_modules():
        parts = getattr(mod, "checkpoint_names", None)
        for attr, p in mod.named_parameters(recurse=False):
            if parts is None:
                shapes[f"{mod_name}.{attr}" if mod_name else attr] = tuple(p.shape)
            else:
                shapes.update({f"{mod_name}.{part}": tuple(p.shape[1:]) for part in parts(attr)})
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes
