"""The files of an EAGLE-3 drafter directory: ``config.json`` in either format normalised to one set
of field names, and the safetensors headers indexed (names in SGLang's spelling, no data read).

:func:`~eaglelab.engine.formats.draft_checkpoint.read_draft_checkpoint` builds its frozen
``DraftCheckpoint`` from these; the checks of what was read live there, the writing in
:mod:`eaglelab.engine.formats.draft_export`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from eaglelab.engine.core.fields import check_real, check_rope_scaling, real_number
from eaglelab.engine.errors import CheckpointError, ConfigError, read_json_object
from eaglelab.engine.formats.conventions import IDS_FIELD_EAGLE_CONFIG, IDS_FIELD_TOP
from eaglelab.engine.formats.validate import (
    INDEX_NAME,
    check_regular_file,
    check_safetensors_size,
    check_tensor_dtype,
    file_kind,
    listed_weight_files,
    read_weight_map,
    stale_copy,
)

FORMATS: tuple[str, ...] = ("sglang", "speculators")
DEFAULT_DRAFT_VOCAB = 32000  # SGLang's default when the config names none


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what shape it has; no data."""

    name: str  # normalised (SGLang) name
    source_name: str  # name inside the file
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: "BF16", "F32", "I64", "BOOL", ...


def torch_bool() -> Any:
    """``torch.bool``, imported on use (reading a config needs no torch)."""
    import torch

    return torch.bool


def read_config(config_file: Path) -> dict[str, Any]:
    """The drafter's config.json as a dict; a missing file names the directory's expected contents."""
    if file_kind(config_file) == "missing":
        raise ConfigError("no config.json in the drafter directory", file=config_file,
                          hint="a drafter directory holds config.json and its *.safetensors")
    check_regular_file(config_file, "a drafter config", error=ConfigError, hint="put the drafter's config.json itself there")
    return read_json_object(config_file)


def detect_format(raw: Mapping[str, Any], config_file: str | Path = "config.json") -> str:
    """"speculators" (speculators_model_type / transformer_layer_config) or "sglang" (an Eagle3
    architecture, eagle_config or draft_vocab_size); anything else is not an EAGLE-3 drafter."""
    if raw.get("speculators_model_type") is not None or "transformer_layer_config" in raw:
        kind = raw.get("speculators_model_type")
        if kind not in (None, "eagle3"):
            raise ConfigError("not an EAGLE-3 speculator", file=config_file, field="speculators_model_type",
                              found=kind, expected="eagle3")
        return "speculators"
    archs = raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    if any("eagle3" in str(a).lower() for a in archs) or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "sglang"
    raise ConfigError(
        "not an EAGLE-3 drafter config",
        file=config_file,
        field="architectures",
        found=archs or None,
        expected='"LlamaForCausalLMEagle3" (SGLang/SpecForge) or speculators_model_type "eagle3"',
        hint="point check-wiring at the drafter's directory, not the target's",
    )


def normalised_fields(raw: dict[str, Any], config_file: Path, fmt: str) -> dict[str, Any]:
    """The config's fields under :class:`~eaglelab.engine.formats.draft_checkpoint.DraftCheckpoint`'s
    names, read from either format (``fmt``: "sglang" | "speculators")."""
    return _normalise_sglang(raw, config_file) if fmt == "sglang" else _normalise_speculators(raw, config_file)


def _get_int(d: Mapping[str, Any], key: str, source: Path, *, default: int | None = None, prefix: str = "") -> int:
    value = d.get(key, default)
    if value is None:
        raise ConfigError("missing field", file=source, field=prefix + key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError("must be a positive integer", file=source, field=prefix + key, found=value)
    return value


def _ids_from(value: Any, source: Path, field_name: str) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError("must be a list of integers", file=source, field=field_name, found=value)
    return tuple(value)


def _llama_fields(d: Mapping[str, Any], source: Path, prefix: str = "") -> dict[str, Any]:
    """Fields shared by both formats, read from a Llama-style config dict."""
    hidden = _get_int(d, "hidden_size", source, prefix=prefix)
    heads = _get_int(d, "num_attention_heads", source, prefix=prefix)
    kv_heads = _get_int(d, "num_key_value_heads", source, default=heads, prefix=prefix)
    rope_scaling = check_rope_scaling(d.get("rope_scaling"), source, prefix + "rope_scaling")
    mpe = d.get("max_position_embeddings")
    if mpe is not None and (isinstance(mpe, bool) or not isinstance(mpe, int) or mpe <= 0):
        raise ConfigError("must be a positive integer", file=source, field=prefix + "max_position_embeddings", found=mpe)
    return dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_get_int(d, "head_dim", source, default=hidden // heads, prefix=prefix),
        intermediate_size=_get_int(d, "intermediate_size", source, prefix=prefix),
        num_hidden_layers=_get_int(d, "num_hidden_layers", source, default=1, prefix=prefix),
        rms_norm_eps=real_number(d, "rms_norm_eps", source, default=1e-6, low=0.0, high=1.0, low_open=True, prefix=prefix),
        rope_theta=_rope_theta(d, source, prefix),
        rope_scaling=MappingProxyType(dict(rope_scaling)) if rope_scaling else None,
        max_position_embeddings=mpe,
        vocab_size=_get_int(d, "vocab_size", source, prefix=prefix),
    )


def _rope_theta(d: Mapping[str, Any], source: Path, prefix: str) -> float:
    params = d.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    value = d.get("rope_theta") if d.get("rope_theta") is not None else nested
    return check_real(10000.0 if value is None else value, source, prefix + "rope_theta", low=0.0, low_open=True)


def _draft_vocab(raw: Mapping[str, Any], source: Path, vocab_size: int) -> int:
    size = _get_int(raw, "draft_vocab_size", source, default=DEFAULT_DRAFT_VOCAB)
    if raw.get("draft_vocab_size") is not None and size > vocab_size:
        raise ConfigError("larger than the vocabulary it is drawn from", file=source, field="draft_vocab_size",
                          found=size, expected=f"<= vocab_size ({vocab_size})",
                          hint="the draft vocabulary is a subset of the target's: fix draft_vocab_size or vocab_size")
    return size


def _normalise_sglang(raw: dict[str, Any], source: Path) -> dict[str, Any]:
    fields = _llama_fields(raw, source)
    eagle = raw.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        raise ConfigError("must be an object", file=source, field="eagle_config", found=eagle)
    ids = _ids_from((eagle or {}).get("eagle_aux_hidden_state_layer_ids"), source, IDS_FIELD_EAGLE_CONFIG)
    ids_field = IDS_FIELD_EAGLE_CONFIG if ids is not None else None
    if ids is None:
        ids = _ids_from(raw.get(IDS_FIELD_TOP), source, IDS_FIELD_TOP)
        ids_field = IDS_FIELD_TOP if ids is not None else None
    return _with_draft_fields(fields, raw, source, ids, ids_field, "sglang", eagle_config_present=eagle is not None,
                              norm_before_residual=None, verifier=None)


def _with_draft_fields(fields: dict[str, Any], raw: dict[str, Any], source: Path, ids, ids_field: str | None,
                       convention: str, **extra: Any) -> dict[str, Any]:
    """The drafter-level fields both formats share (the Llama layer fields are already in ``fields``):
    target width, draft vocabulary, the aux ids with the convention their format counts them in."""
    fields.update(
        target_hidden_size=_opt_int(raw, "target_hidden_size", source),
        draft_vocab_size=_draft_vocab(raw, source, fields["vocab_size"]),
        draft_vocab_size_given=raw.get("draft_vocab_size") is not None,
        aux_layer_ids=ids,
        aux_convention=convention if ids is not None else None,
        aux_ids_field=ids_field,
        **extra,
    )
    return fields


def _normalise_speculators(raw: dict[str, Any], source: Path) -> dict[str, Any]:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError("missing or not an object", file=source, field="transformer_layer_config",
                          hint="a speculators Eagle3 config nests the Llama layer config there")
    fields = _llama_fields(layer, source, prefix="transformer_layer_config.")
    ids = _ids_from(raw.get(IDS_FIELD_TOP), source, IDS_FIELD_TOP)
    ids_field = IDS_FIELD_TOP if ids is not None else None
    eagle = raw.get("eagle_config")
    if ids is None and isinstance(eagle, dict):
        ids = _ids_from(eagle.get("eagle_aux_hidden_state_layer_ids"), source, IDS_FIELD_EAGLE_CONFIG)
        ids_field = IDS_FIELD_EAGLE_CONFIG if ids is not None else None
    verifier = _object(_object(raw.get("speculators_config")).get("verifier")).get("name_or_path")
    nbr = raw.get("norm_before_residual")
    return _with_draft_fields(fields, raw, source, ids, ids_field, "vllm", eagle_config_present=isinstance(eagle, dict),
                              norm_before_residual=bool(nbr) if nbr is not None else None,
                              verifier=str(verifier) if verifier else None)


def _object(value: Any) -> Mapping[str, Any]:
    """An optional nested object; anything else reads as empty (its fields then count as absent)."""
    return value if isinstance(value, dict) else {}


def _opt_int(raw: Mapping[str, Any], key: str, source: Path) -> int | None:
    return None if raw.get(key) is None else _get_int(raw, key, source)


# ---- weights --------------------------------------------------------------------------------------

_SPECULATORS_RENAMES = ((re.compile(r"^(model\.)?layers\.0\."), "midlayer."),)


def normalise_tensor_name(name: str, fmt: str) -> str:
    """SGLang spelling of a tensor name: speculators ``layers.0.x`` -> ``midlayer.x``; a leading
    ``model.`` (some exports) is dropped."""
    for pattern, repl in _SPECULATORS_RENAMES:
        name = pattern.sub(repl, name)
    if name.startswith("model."):
        name = name[len("model."):]
    return name


def weight_files(path: Path) -> list[Path]:
    """The safetensors files to read (an index's shards only, when there is one); pickled weights are refused."""
    files, _stale = listed_weight_files(path, path.glob("*.safetensors"))  # shards the index does not list are not read
    if not files and any(path.glob("*.bin")):
        raise CheckpointError(
            "only pickled *.bin weights found",
            file=path,
            expected="*.safetensors",
            hint="eaglelab reads drafter weights from safetensors only; convert with safetensors' torch helpers",
        )
    return files


def scan_weights(path: Path, fmt: str) -> tuple[dict[str, TensorInfo], tuple[Path, ...]]:
    """Read every safetensors header in ``path``; no tensor data is loaded. With an index, each tensor is
    read from the shard its ``weight_map`` names (a stale copy in another listed shard is not read, and a
    tensor the index names but its shard lacks is refused); without one, a tensor in two files is refused."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, TensorInfo] = {}
    files = weight_files(path)
    weight_map = read_weight_map(path)
    for file in files:
        check_regular_file(file, "drafter weights (safetensors)")
        check_safetensors_size(file)
        try:
            with safe_open(str(file), framework="pt") as handle:
                for source_name in handle.keys():
                    if stale_copy(weight_map, source_name, file):
                        continue
                    piece = handle.get_slice(source_name)
                    name = normalise_tensor_name(source_name, fmt)
                    _refuse_second_copy(tensors.get(name), file, source_name, weight_map is not None)
                    dtype = str(piece.get_dtype())
                    check_tensor_dtype(name, dtype, file, source_name)
                    tensors[name] = TensorInfo(name, source_name, file, tuple(piece.get_shape()), dtype)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"cannot read the safetensors header ({exc})", file=file,
                                  hint="the file is truncated or not safetensors; re-download or re-save it") from None
    if weight_map is not None:
        read = {info.source_name for info in tensors.values()}
        absent = sorted(name for name in weight_map if name not in read)
        if absent:
            raise CheckpointError("names tensors its shards do not hold", file=path / INDEX_NAME, field="weight_map",
                                  found=", ".join(f"{n} (in {weight_map[n]})" for n in absent[:4]),
                                  expected="each tensor in the shard the index names",
                                  hint="the index and the shards come from different saves: re-save the checkpoint")
    return tensors, tuple(files)


def _refuse_second_copy(first: TensorInfo | None, file: Path, source_name: str, indexed: bool) -> None:
    """Two copies of one tensor and nothing saying which is current: refused, never "the last file read wins"."""
    if first is None:
        return
    raise CheckpointError(
        "the tensor is stored twice", file=file, field=source_name,
        found=f"{first.file.name} ({first.source_name}) and {file.name} ({source_name})", expected="one copy",
        hint="delete the stale file" + ("" if indexed else ", or add the model.safetensors.index.json saved with the shards"))


def read_tensor(info: TensorInfo, device: str) -> "torch.Tensor":  # noqa: F821
    """One tensor's data, read from its file onto ``device``."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(info.file), framework="pt", device=device) as handle:
            return handle.get_tensor(info.source_name)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read tensor ({exc})", file=info.file, field=info.source_name,
                              hint="the file is truncated; re-download or re-save it") from None
