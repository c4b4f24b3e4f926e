"""Read an EAGLE-3 drafter directory (SGLang/SpecForge format or speculators format) into one
frozen :class:`DraftCheckpoint`, without loading tensor data.

Both formats are normalised to one view:

* config fields under one set of names (``hidden_size``, ``target_hidden_size``, ``vocab_size``,
  ``draft_vocab_size``, the aux layer ids with the convention their format writes them in, ...);
* tensor names in SGLang's spelling (speculators' ``layers.0.*`` becomes ``midlayer.*``), each
  with its shape and dtype read from the safetensors header; :meth:`DraftCheckpoint.load_tensor`
  reads the data on demand.

The file reading itself is :mod:`eaglelab.engine.formats.draft_files`; writing a drafter directory is
:mod:`eaglelab.engine.formats.draft_export`; building the network from one is
:mod:`eaglelab.engine.formats.drafter_loader`.

A directory holding only ``config.json`` is allowed (``has_weights`` is False): the config-level
checks of :meth:`DraftCheckpoint.validate` still run, so a config can be checked before launch.

Worked example, a SpecForge drafter for SmolLM2-135M (hidden 576, 30 layers)::

    ckpt = read_draft_checkpoint("drafter/")
    ckpt.format                -> "sglang"
    ckpt.aux_layer_ids         -> (1, 14, 26)      # convention "sglang": hs[2], hs[15], hs[27]
    ckpt.tensors["fc.weight"].shape -> (576, 1728)  # [H, 3 * H_target]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Protocol

from eaglelab.engine.formats.conventions import (
    IDS_FIELD_TOP,
    default_hf_indices,
    default_ids,
    ids_to_hf_indices,
    tappable_hf_range,
)
from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.drafter_layouts import LLAMA_LAYOUT, DrafterLayout, layout_problems, layout_shapes, read_layout
from eaglelab.engine.formats.draft_files import (
    DEFAULT_DRAFT_VOCAB,
    TensorInfo,
    detect_format,
    normalised_fields,
    read_config,
    read_tensor,
    scan_weights,
    torch_bool,
)
from eaglelab.engine.formats.validate import check_finite_tensor, check_integer_tensor

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")
SMALL_MAX_POSITIONS = 4096  # below this, long prompts fall outside the drafter's trained positions


@dataclass(frozen=True)
class Finding:
    """One result of a static check. ``severity``: "error" | "warning" | "info"."""

    severity: str
    field: str  # the config field or tensor name concerned
    message: str
    hint: str | None = None
    code: str = ""  # stable short name for tests and JSON ("fc_width", "embedding_capture", ...)
    found: object = None  # what the checkpoint holds (a shape, a value), when the check knows it
    expected: object = None
    file: Path | None = None  # the file holding ``field`` (a tensor's shard, or config.json); None: config.json

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "field": self.field, "message": self.message, "hint": self.hint}

    def error(self, config_file: Path) -> CheckpointError | ConfigError:
        """This finding as the loader's error: a tensor's finding names its weight file (CheckpointError),
        a config field's names ``config_file`` (ConfigError)."""
        file = self.file or config_file
        kind = CheckpointError if file.suffix == ".safetensors" or file.is_dir() else ConfigError
        return kind(self.message, file=file, field=self.field, found=self.found, expected=self.expected,
                    hint=self.hint)


class TargetShape(Protocol):
    """What validation needs to know about the target (``ModelConfig`` satisfies it)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int


@dataclass(frozen=True)
class DraftCheckpoint:
    """An EAGLE-3 drafter directory, read: normalised config plus a lazy view of its tensors."""

    path: Path
    format: str  # "sglang" | "speculators"
    config_file: Path
    raw_config: Mapping[str, Any] = field(repr=False)
    hidden_size: int
    target_hidden_size: int | None  # as written; None = not in the config (then = hidden_size)
    vocab_size: int
    draft_vocab_size: int
    draft_vocab_size_given: bool  # False when the config omits it and the default applies
    aux_layer_ids: tuple[int, ...] | None  # None when the config names no ids
    aux_convention: str | None  # "sglang" | "vllm"; None when no ids
    aux_ids_field: str | None  # where the ids were read from
    eagle_config_present: bool
    max_position_embeddings: int | None
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    rms_norm_eps: float
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    norm_before_residual: bool | None  # speculators only
    verifier: str | None  # speculators' verifier name_or_path
    tensors: Mapping[str, TensorInfo] = field(repr=False)
    weight_files: tuple[Path, ...] = ()
    layout: DrafterLayout = LLAMA_LAYOUT  # Llama or MLA attention, EAGLE-3.1 flags (formats/drafter_layouts.py)
    values_checked: bool = False  # check_values passed at read; False: load_state_dict checks each tensor it reads

    # ---- derived --------------------------------------------------------------------------------
    @property
    def aux_hidden_size(self) -> int:
        """Width of one target hidden state as the drafter sees it (target_hidden_size or hidden_size)."""
        return self.target_hidden_size if self.target_hidden_size is not None else self.hidden_size

    @property
    def has_weights(self) -> bool:
        return bool(self.tensors)

    @property
    def default_serving(self) -> str:
        """The serving engine whose convention this format follows: sglang -> "sglang", speculators -> "vllm"."""
        return "sglang" if self.format == "sglang" else "vllm"

    @property
    def num_aux_from_fc(self) -> int | None:
        """How many target hidden states ``fc`` takes (its input width / aux_hidden_size), if known."""
        info = self.tensors.get("fc.weight")
        if info is None or len(info.shape) != 2 or info.shape[1] % self.aux_hidden_size:
            return None
        return info.shape[1] // self.aux_hidden_size

    def shape(self, name: str) -> tuple[int, ...] | None:
        """Shape of a tensor by its normalised name, or None when absent."""
        info = self.tensors.get(name)
        return info.shape if info is not None else None

    # ---- data ----------------------------------------------------------------------------------
    def load_tensor(self, name: str, *, device: str = "cpu") -> "torch.Tensor":  # noqa: F821
        """Read one tensor (normalised name) from its file."""
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError("tensor not in the checkpoint", file=self.path, field=name,
                                  expected=sorted(self.tensors)[:20])
        return read_tensor(info, device)

    def load_state_dict(self, *, device: str = "cpu") -> dict[str, "torch.Tensor"]:  # noqa: F821
        """All tensors under their normalised names; each checked as :meth:`check_values` does as it is
        read, unless the values were checked at read (so a loader reads every tensor once)."""
        state = {}
        for name, info in self.tensors.items():
            state[name] = read_tensor(info, device)
            if not self.values_checked:
                _check_value(info, state[name])
        return state

    def check_values(self) -> None:
        """Every tensor finite; d2t integer offsets, t2d a bool (or 0/1) mask. Raises CheckpointError."""
        for info in self.tensors.values():
            _check_value(info, read_tensor(info, "cpu"))

    def expected_shapes(self, num_aux: int | None = None) -> dict[str, tuple[int, ...]]:
        """Tensor shapes this config implies (``num_aux``: the ids' count, 3 when none are given)."""
        if num_aux is None:
            num_aux = len(self.aux_layer_ids) if self.aux_layer_ids is not None else 3
        llama = expected_tensor_shapes(
            hidden_size=self.hidden_size, aux_hidden_size=self.aux_hidden_size, num_aux=num_aux,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size, draft_vocab_size=self.draft_vocab_size,
        )
        return layout_shapes(self.layout, llama, self.hidden_size, self.num_attention_heads)

    def validate(self, target: TargetShape | None = None) -> list[Finding]:
        """Static checks of config and tensor shapes, against ``target`` when given."""
        return _validate(self, target)


# ======================================================================================================
# reading
# ======================================================================================================


def _check_value(info: TensorInfo, tensor: "torch.Tensor") -> None:  # noqa: F821
    """One tensor's values: d2t integer offsets, t2d a bool (or 0/1) mask, any other finite."""
    if info.name == "d2t":
        check_integer_tensor(tensor, info.file, info.source_name)
    elif info.name == "t2d" and tensor.dtype != torch_bool():
        check_integer_tensor(tensor, info.file, info.source_name, low=0, high=1)
    else:
        check_finite_tensor(tensor, info.file, info.source_name)


def read_draft_checkpoint(path: str | Path, *, check_values: bool = True) -> DraftCheckpoint:
    """Read a drafter directory (or its config.json). Raises ConfigError / CheckpointError.

    ``check_values``: read every tensor now and check its values; False leaves that to
    :meth:`DraftCheckpoint.load_state_dict` (a loader then reads each tensor once, not twice)."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".json"):
        path = path.parent
    if not path.exists():
        raise ConfigError("no such directory", file=path, hint="pass the drafter's directory (config.json + *.safetensors)")
    config_file = path / "config.json"
    raw = read_config(config_file)
    fmt = detect_format(raw, config_file)
    tensors, files = scan_weights(path, fmt)
    fields = normalised_fields(raw, config_file, fmt)
    ck = DraftCheckpoint(
        path=path,
        format=fmt,
        config_file=config_file,
        raw_config=MappingProxyType(raw),
        tensors=MappingProxyType(tensors),
        weight_files=files,
        layout=read_layout(raw, config_file, fmt),
        values_checked=check_values,
        **fields,
    )
    if check_values:
        ck.check_values()
    return ck


# ======================================================================================================
# validation
# ======================================================================================================


def _validate(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    out: list[Finding] = [
        Finding("info", "config.json", f"format: {ck.format} ({'SGLang/SpecForge' if ck.format == 'sglang' else 'speculators (vLLM)'}); "
                f"ids convention: {ck.aux_convention or 'none given'}", code="format"),
    ]
    out += _check_ids_present(ck, target)
    out += _check_ids_values(ck, target)
    out += _check_fc(ck, target)
    out += _check_vocab(ck, target)
    out += [Finding(p.severity, p.field, p.text(), p.hint, code=p.code, found=p.found, expected=p.expected, file=p.file)
            for p in layout_problems(ck, target)]
    out += _check_layer_shapes(ck)
    out += _check_positions(ck, target)
    if not ck.has_weights:
        out.append(Finding("info", "weights", "no *.safetensors in the directory: config-level checks only", code="config_only"))
    return out


def _tensor_file(ck: DraftCheckpoint, name: str) -> Path:
    """The weight file holding tensor ``name``; for an absent one, the only weight file (the directory when sharded)."""
    info = ck.tensors.get(name)
    if info is not None:
        return info.file
    return ck.weight_files[0] if len(ck.weight_files) == 1 else ck.path


ANOTHER_TARGET = "pass the drafter trained for this target, or the target it was trained for"
UNFIT_CODES = {  # findings that mean: this drafter cannot run on the target (code -> what to do)
    "target_hidden": ANOTHER_TARGET,
    "vocab_size": ANOTHER_TARGET,
    "draft_vocab": "re-export the drafter: its config and weights come from different runs",
}


def check_fits_target(ck: DraftCheckpoint, target: TargetShape, target_name: str) -> None:
    """Raise when the drafter cannot run on ``target`` at all (nothing to check numerically): its aux width
    is not the target's hidden size, its vocabulary is not the target's, its draft-vocabulary tensors
    disagree with ``draft_vocab_size``, or a tap id names no layer (>= ``num_layers`` in either convention)."""
    for f in _validate(ck, target):
        if f.severity == "error" and f.code in UNFIT_CODES:
            info = ck.tensors.get(f.field)
            error = CheckpointError if info is not None else ConfigError
            lead = "the drafter cannot run" if f.code == "draft_vocab" else f"the drafter does not fit the target {target_name}"
            raise error(f"{lead}: {f.message}", file=info.file if info is not None else ck.config_file, field=f.field,
                        found=_unfit_found(ck, f), expected=_unfit_expected(target, f),
                        hint=f"{f.hint}: {UNFIT_CODES[f.code]}")
    beyond = [i for i in ck.aux_layer_ids or () if i >= target.num_layers]
    if beyond:
        conv = ck.aux_convention or "sglang"
        raise ConfigError(
            f"the drafter's tap ids name no layer of the target {target_name} ({target.num_layers} layers)",
            file=ck.config_file, field=ck.aux_ids_field or IDS_FIELD_TOP, found=f"{list(ck.aux_layer_ids or ())} ({conv} convention)",
            expected=f"ids below {target.num_layers} (SGLang ids 0..{target.num_layers - 2}, vLLM ids 1..{target.num_layers - 1})",
            hint=f"the drafter was made for a deeper target: {ANOTHER_TARGET}")


def _unfit_found(ck: DraftCheckpoint, f: Finding) -> object:
    if f.code == "target_hidden":
        return ck.aux_hidden_size
    if f.code == "vocab_size":
        return ck.vocab_size
    return f"shape {list(ck.shape(f.field) or ())}"


def _unfit_expected(target: TargetShape, f: Finding) -> object:
    if f.code == "target_hidden":
        return f"the target's hidden size, {target.hidden_size}"
    if f.code == "vocab_size":
        return f"the target's vocab_size, {target.vocab_size}"
    return f.message.split("expected ", 1)[-1]


def _check_ids_present(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    if ck.aux_layer_ids is not None:
        if ck.format == "sglang" and ck.aux_ids_field == IDS_FIELD_TOP:
            return [Finding("warning", IDS_FIELD_TOP, "SGLang-format config holds the ids at the top level, not in "
                            "eagle_config: SGLang reads them only in recent versions; older ones apply defaults",
                            "move them into eagle_config.eagle_aux_hidden_state_layer_ids", code="ids_top_level")]
        return []
    where = "eagle_config.eagle_aux_hidden_state_layer_ids" if ck.format == "sglang" else IDS_FIELD_TOP
    if target is not None:
        dflt = list(default_hf_indices(target.num_layers))
        detail = f"SGLang and vLLM then tap their defaults hs{dflt} (SGLang ids {list(default_ids(target.num_layers, 'sglang'))}, vLLM ids {dflt})"
    else:
        detail = "SGLang and vLLM then tap their defaults hs[2, L//2, L-3]"
    msg = ("no eagle_config: " if ck.format == "sglang" and not ck.eagle_config_present else "no aux layer ids: ") + detail
    hint = (f"write the ids the drafter was trained on into {where}; run with --data to find them"
            if ck.format == "sglang" else
            f"write them into {where} (`speculators convert` drops them); run with --data to find them")
    return [Finding("warning", where, msg + "; right only if training used the same defaults", hint, code="missing_ids")]


def _check_ids_values(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    ids = ck.aux_layer_ids
    if ids is None:
        return []
    field_name = ck.aux_ids_field or IDS_FIELD_TOP
    conv = ck.aux_convention or "sglang"
    out: list[Finding] = []
    if len(set(ids)) != len(ids):
        out.append(Finding("error", field_name, f"duplicated ids {list(ids)}: engines tap each layer once",
                           "remove the duplicates", code="duplicate_ids",
                           found=list(ids), expected="each id once"))
    if list(ids) != sorted(ids):
        out.append(Finding("warning", field_name, f"ids {list(ids)} are not in ascending order: serving engines concatenate "
                           "aux states in layer order, while training data follows the order its capture used",
                           "list them in ascending order, and check with --data which order the drafter was trained on",
                           code="unordered_ids"))
    hf = ids_to_hf_indices(ids, conv)
    if 0 in hf:
        emb = [i for i, h in zip(ids, hf) if h == 0]
        out.append(Finding("error", field_name, f"id {emb[0]} captures the embedding output (hs[0]) in the {conv} convention; "
                           "no SpecForge-trained drafter saw it", "remove it from the list", code="embedding_capture",
                           found=list(ids), expected="ids of decoder layers, not the embedding"))
    negative = [i for i, h in zip(ids, hf) if h < 0]
    if negative:
        out.append(Finding("error", field_name, f"ids {negative} name no layer in the {conv} convention",
                           "ids count decoder layers from 0", code="ids_out_of_range",
                           found=list(ids), expected="ids >= 0"))
    if target is not None:
        out += _check_ids_range(ids, hf, conv, field_name, target.num_layers)
    return out


def _check_ids_range(ids: tuple[int, ...], hf: tuple[int, ...], conv: str, field_name: str, num_layers: int) -> list[Finding]:
    out: list[Finding] = []
    tappable = tappable_hf_range(num_layers)
    beyond = [i for i, h in zip(ids, hf) if h >= tappable.stop]
    if beyond:
        top = num_layers - 2 if conv == "sglang" else num_layers - 1
        out.append(Finding("error", field_name, f"ids {beyond} are out of range for a {num_layers}-layer target in the {conv} "
                           f"convention (largest tappable id: {top}); engines silently tap fewer states",
                           "use the target's layer count", code="ids_out_of_range",
                           found=list(ids), expected=f"ids <= {top}"))
    other = "vllm" if conv == "sglang" else "sglang"
    if tuple(ids) == default_ids(num_layers, other) and default_ids(num_layers, conv) != tuple(ids):
        out.append(Finding("warning", field_name, f"ids {list(ids)} are the {other} defaults written in a {conv}-convention "
                           f"config: here they tap hs{list(hf)}, one layer off the defaults hs{list(default_hf_indices(num_layers))}",
                           f"if the drafter was trained on the defaults, write {list(default_ids(num_layers, conv))}; "
                           "run with --data to be sure", code="other_convention"))
    return out


def _check_fc(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    out: list[Finding] = []
    aux = ck.aux_hidden_size
    if target is not None and aux != target.hidden_size:
        which = "target_hidden_size" if ck.target_hidden_size is not None else "hidden_size (no target_hidden_size)"
        out.append(Finding("error", "target_hidden_size", f"the drafter expects target states of width {aux} ({which}), "
                           f"the target's hidden size is {target.hidden_size}",
                           "this drafter was trained for another target, or target_hidden_size is wrong", code="target_hidden",
                           found=aux, expected=target.hidden_size))
    fc = ck.shape("fc.weight")
    n_ids = len(ck.aux_layer_ids) if ck.aux_layer_ids is not None else 3
    expect = (ck.hidden_size, n_ids * aux)
    where = dict(file=_tensor_file(ck, "fc.weight"), expected=list(expect))
    if fc is None:
        if ck.has_weights:
            out.append(Finding("error", "fc.weight", "no fc.weight: an EAGLE-3 drafter projects the aux states with it",
                               "copy the complete drafter", code="fc_missing", found="absent", **where))
        return out
    if tuple(fc) == expect:
        return out
    if len(fc) != 2 or fc[0] != ck.hidden_size:
        out.append(Finding("error", "fc.weight", f"shape {list(fc)}, expected [hidden_size={ck.hidden_size}, ...]",
                           "config.json hidden_size and the weights disagree: re-export the drafter",
                           code="fc_shape", found=list(fc), **where))
        return out
    if fc[1] % aux:
        out.append(Finding("error", "fc.weight", f"input width {fc[1]} is not a multiple of the target hidden size {aux}",
                           "target_hidden_size disagrees with the weights: this drafter was trained for another target",
                           code="fc_width", found=list(fc), **where))
        return out
    src = "ids in the config" if ck.aux_layer_ids is not None else "default ids (none in the config)"
    out.append(Finding("error", "fc.weight", f"fc takes {fc[1] // aux} target states ({fc[1]} = {fc[1] // aux} x {aux}), "
                       f"but the config names {n_ids} ({src}): the engine would feed {n_ids * aux} features",
                       f"the config must list exactly {fc[1] // aux} ids, the ones the drafter was trained on", code="fc_width",
                       found=list(fc), **where))
    return out


def _check_vocab(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    out: list[Finding] = []
    if target is not None and ck.vocab_size != target.vocab_size:
        out.append(Finding("error", "vocab_size", f"drafter vocab_size {ck.vocab_size}, target's {target.vocab_size}",
                           "the drafter was made for another tokenizer", code="vocab_size",
                           found=ck.vocab_size, expected=target.vocab_size))
    checks = (
        ("lm_head.weight", (ck.draft_vocab_size, ck.hidden_size), "[draft_vocab_size, hidden_size]"),
        ("d2t", (ck.draft_vocab_size,), "[draft_vocab_size]"),
        ("t2d", (ck.vocab_size,), "[vocab_size]"),
    )
    for name, expected, text in checks:
        shape = ck.shape(name)
        if shape is not None and tuple(shape) != expected:
            where = "draft_vocab_size" if name != "t2d" else "vocab_size"
            out.append(Finding("error", name, f"shape {list(shape)}, expected {text} = {list(expected)}",
                               f"config {where} and the weights disagree", code="draft_vocab",
                               found=list(shape), expected=list(expected), file=_tensor_file(ck, name)))
    if not out and ck.shape("d2t") is not None and ck.shape("t2d") is not None:
        out += _check_vocab_maps(ck)
    if ck.has_weights and ck.shape("lm_head.weight") is None:
        out.append(Finding("error", "lm_head.weight", "missing from the weights: the drafter has no head to propose "
                           "tokens with", "copy the complete drafter (or re-export it: lm_head is saved with it)",
                           code="tensor_missing", found="absent", expected=[ck.draft_vocab_size, ck.hidden_size],
                           file=_tensor_file(ck, "lm_head.weight")))
    if ck.has_weights and ck.draft_vocab_size < ck.vocab_size and ck.shape("d2t") is None:
        out.append(Finding("error", "d2t", f"draft vocab {ck.draft_vocab_size} < vocab {ck.vocab_size} but no d2t map",
                           "the draft ids cannot be mapped to target ids", code="d2t_missing",
                           found="absent", expected=[ck.draft_vocab_size], file=_tensor_file(ck, "d2t")))
    if not ck.draft_vocab_size_given:
        out.append(Finding("info", "draft_vocab_size", f"not in the config: engines assume {DEFAULT_DRAFT_VOCAB}", code="draft_vocab_default"))
    return out


def expected_tensor_shapes(
    *,
    hidden_size: int,
    aux_hidden_size: int,
    num_aux: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
    draft_vocab_size: int,
) -> dict[str, tuple[int, ...]]:
    """Shapes of an EAGLE-3 drafter's tensors (SGLang names), from its sizes.

    Example (SmolLM2-sized drafter): hidden 576, 3 aux states of 576 -> ``fc.weight`` (576, 1728);
    q/k/v take ``2 * hidden`` inputs (embedding and fc output concatenated).
    """
    h, q, kv, ff = hidden_size, num_attention_heads * head_dim, num_key_value_heads * head_dim, intermediate_size
    return {
        "fc.weight": (h, num_aux * aux_hidden_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (ff, h),
        "midlayer.mlp.up_proj.weight": (ff, h),
        "midlayer.mlp.down_proj.weight": (h, ff),
        "norm.weight": (h,),
        "lm_head.weight": (draft_vocab_size, h),
        "d2t": (draft_vocab_size,),
        "t2d": (vocab_size,),
    }


_CHECKED_ELSEWHERE = ("fc.weight", "lm_head.weight", "d2t", "t2d")


def _check_vocab_maps(ck: DraftCheckpoint) -> list[Finding]:
    """d2t and t2d describe the same draft vocabulary (small tensors: read them)."""
    from eaglelab.engine.formats.specforge_data import vocab_map_problem

    d2t, t2d = ck.load_tensor("d2t"), ck.load_tensor("t2d")
    if not ck.values_checked:  # the maps' values come before what they map
        _check_value(ck.tensors["d2t"], d2t)
        _check_value(ck.tensors["t2d"], t2d)
    problem = vocab_map_problem(d2t.long(), t2d.bool())  # [draft_vocab], [vocab]
    if problem is None:
        return []
    hint = ("d2t holds offsets (target id = draft id + d2t[draft id]), not target ids" if problem.field == "d2t"
            else "d2t and t2d come from different vocab mappings")
    return [Finding("error", problem.field, problem.message, hint, code="vocab_map",
                    found=problem.found, expected=problem.expected, file=_tensor_file(ck, problem.field))]


def _check_layer_shapes(ck: DraftCheckpoint) -> list[Finding]:
    """The decoder layer's tensors agree with hidden_size, heads, head_dim and intermediate_size."""
    out: list[Finding] = []
    for name, shape in ck.expected_shapes().items():
        if name in _CHECKED_ELSEWHERE:
            continue
        found = ck.shape(name)
        if found is not None and tuple(found) != shape:
            out.append(Finding("error", name, f"shape {list(found)}, the config implies {list(shape)}",
                               "config.json and the weights disagree (hidden_size, heads, head_dim or intermediate_size)",
                               code="layer_shape", found=list(found), expected=list(shape), file=_tensor_file(ck, name)))
        elif found is None and ck.has_weights:
            out.append(Finding("error", name, "missing from the weights", "copy the complete drafter (every shard)",
                               code="tensor_missing", found="absent", expected=list(shape), file=_tensor_file(ck, name)))
    if ck.num_hidden_layers != 1:
        out.append(Finding("warning", "num_hidden_layers", f"{ck.num_hidden_layers}; EAGLE-3 drafters have 1 layer",
                           code="num_layers"))
    return out


def _check_positions(ck: DraftCheckpoint, target: TargetShape | None) -> list[Finding]:
    mpe = ck.max_position_embeddings
    if mpe is None:
        return [Finding("warning", "max_position_embeddings", "not in the config: engines fall back to a default",
                        "set it to the target's value", code="max_positions")]
    if target is not None and mpe < target.max_position_embeddings:
        return [Finding("warning", "max_position_embeddings", f"{mpe} < the target's {target.max_position_embeddings}: "
                        "positions beyond it ruin acceptance on long contexts (SpecForge issue #271)",
                        f"set it to {target.max_position_embeddings}", code="max_positions")]
    if target is None and mpe < SMALL_MAX_POSITIONS:
        return [Finding("warning", "max_position_embeddings", f"{mpe} is small: long contexts lose acceptance "
                        "(SpecForge issue #271)", "set it to the target's value", code="max_positions")]
    return []


