"""Build an EAGLE-3 drafter network from a drafter directory: read and check the checkpoint, pick the
target's taps from its aux ids, copy its weights into an :class:`~eaglelab.engine.model.eagle3.Eagle3Network`
(Llama layout) or :class:`~eaglelab.engine.model.eagle3_mla.Eagle3MLANetwork` (MLA layout), with the
EAGLE-3.1 flags the config sets (:mod:`eaglelab.engine.formats.drafter_layouts`).

Loading builds models, so it lives in ``formats`` above ``model``; the network itself reads no file.
"""

from __future__ import annotations

import torch

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.formats.conventions import default_hf_indices, ids_to_hf_indices
from eaglelab.engine.formats.draft_checkpoint import DraftCheckpoint, read_draft_checkpoint
from eaglelab.engine.formats.drafter_layouts import layout_problems, raise_first
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.model.eagle3_mla import eagle3_network


def config_from_checkpoint(ck: DraftCheckpoint, target_hidden: int) -> Eagle3Config:
    """An :class:`Eagle3Config` from a read :class:`DraftCheckpoint` (its layout and EAGLE-3.1 flags included)."""
    num_aux = ck.num_aux_from_fc or (len(ck.aux_layer_ids) if ck.aux_layer_ids else 3)
    mla = ck.layout.mla
    return Eagle3Config(
        hidden_size=ck.hidden_size,
        target_hidden_size=ck.target_hidden_size or target_hidden,
        num_aux=num_aux,
        num_heads=ck.num_attention_heads,
        num_kv_heads=ck.num_key_value_heads if mla is None else 1,  # MLA caches one latent row per token
        head_dim=ck.head_dim if mla is None else mla.cache_dim,
        intermediate_size=ck.intermediate_size,
        vocab_size=ck.vocab_size,
        draft_vocab_size=ck.draft_vocab_size,
        rms_norm_eps=ck.rms_norm_eps,
        rope_theta=ck.rope_theta,
        rope_scaling=tuple(sorted(ck.rope_scaling.items())) if ck.rope_scaling else None,
        norm_before_residual=bool(ck.norm_before_residual),
        fc_norm=ck.layout.fc_norm,
        norm_output=ck.layout.norm_output,
        mla=mla,
    )


def build_drafter(ck: DraftCheckpoint, embed, target_hidden: int, cfg: Eagle3Config | None = None) -> Eagle3Network:
    """A float32 network of ``ck``'s layout holding its weights (``embed``: the target's embedding);
    ``cfg``: the config already built from ``ck`` (None: built here)."""
    cfg = cfg or config_from_checkpoint(ck, target_hidden)
    net = eagle3_network(cfg, embed).float()
    load_drafter_weights(net, ck)
    return net


def load_drafter_weights(drafter: Eagle3Network, ck: DraftCheckpoint) -> None:
    """Copy a checkpoint's tensors into ``drafter``, checking every name and shape."""
    state = ck.load_state_dict()
    own = dict(drafter.named_parameters())
    own.update({"d2t": drafter.d2t, "t2d": drafter.t2d})
    for name, param in own.items():
        if name not in state:
            if name == "t2d" and "d2t" in state:
                continue  # derivable from d2t; filled below
            raise CheckpointError("missing tensor", file=ck.weight_files[0] if ck.weight_files else ck.path, field=name,
                                  found="absent", expected=list(param.shape),
                                  hint=f"an EAGLE-3 checkpoint of this layout needs it ({ck.layout.describe()})")
        src = state[name]
        if tuple(src.shape) != tuple(param.shape):
            raise CheckpointError(
                "wrong tensor shape", file=ck.tensors[name].file, field=name, found=list(src.shape),
                expected=list(param.shape), hint="config.json and the weights disagree: re-export the drafter",
            )
        with torch.no_grad():
            param.copy_(src.to(param.dtype))
    if "t2d" not in state:
        with torch.no_grad():
            drafter.t2d.zero_()
            drafter.t2d[drafter.token_map()] = True


def load_eagle3(path, target_model, *, device=None, dtype=None, serving: str | None = None, warn=None):
    """Load an EAGLE-3 drafter directory for ``target_model`` (a :class:`Transformer`).

    Returns ``(drafter, hf_taps, reason)``: the network, the HF ``output_hidden_states`` indices
    the target must feed it, and how those indices were chosen (shown to the user).
    """
    ck = read_draft_checkpoint(path, check_values=False)  # values are checked as build_drafter reads each tensor
    tcfg = target_model.config
    raise_first(layout_problems(ck, tcfg))  # layout errors first: they name found, expected and the file
    errors = [f for f in ck.validate(tcfg) if f.severity == "error"]
    if errors:
        raise errors[0].error(ck.config_file)  # names the tensor's weight file, or config.json for a config field
    if not ck.has_weights:
        raise CheckpointError("no weights (*.safetensors) in the drafter directory", file=ck.path)
    cfg = config_from_checkpoint(ck, tcfg.hidden_size)
    if ck.aux_layer_ids is None:
        taps = default_hf_indices(tcfg.num_layers)
        reason = f"config names no aux ids: using the serving engines' default taps hs{list(taps)}"
        if warn:
            warn(reason)
    else:
        conv = serving or ck.aux_convention or ck.default_serving
        # Serving engines capture in layer order whatever order the config lists, so do we.
        taps = tuple(sorted(ids_to_hf_indices(ck.aux_layer_ids, conv)))
        reason = f"ids {list(ck.aux_layer_ids)} read in the {conv} convention = hs{list(taps)}"
    if len(taps) != cfg.num_aux:
        raise CheckpointError(
            "aux ids disagree with the fc width", file=ck.config_file, field="eagle_aux_hidden_state_layer_ids",
            found=len(taps), expected=cfg.num_aux,
        )
    emb = target_model.embed_tokens
    net = build_drafter(ck, emb, tcfg.hidden_size, cfg)
    net = net.to(device=device or emb.weight.device, dtype=dtype or emb.weight.dtype).eval()
    net.d2t = net.d2t.long()
    net.reset_buffers()
    return net, tuple(taps), reason
