"""What an "aux layer id" means to each engine, and which target layers an engine really taps.

Everything here speaks in **HF indices**: positions in HF transformers' ``output_hidden_states``
tuple ``hs`` for a target with ``L`` decoder layers. ``hs[0]`` is the embedding output, ``hs[i]``
(1 <= i <= L) the output of decoder layer ``i-1`` (``hs[L]`` after the final norm).

Conventions (from each project's model code: SGLang ``models/llama.py``, vLLM ``models/llama.py``,
the EAGLE reference ``modeling_llama_kv.py``):

* ``"sglang"`` (SGLang, SpecForge ``eagle_config``): id ``k`` = output of layer ``k`` = ``hs[k+1]``;
  ``-1`` is the embedding output ``hs[0]``.
* ``"vllm"`` (vLLM, speculators) and ``"eagle"`` (the EAGLE reference): id ``k`` = input of layer
  ``k`` = ``hs[k]``; ``0`` is the embedding output.

Worked example, SmolLM2-135M (L = 30): SpecForge's default ids ``[1, 14, 26]`` ("sglang") are
``hs[2], hs[15], hs[27]``, which vLLM writes ``[2, 15, 27]``.

Both serving engines tap the *inputs* of decoder layers 0..L-1 (HF indices 0..L-1), in layer
order, whatever order the config lists the ids in. Neither ever taps ``hs[L]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

Convention = Literal["sglang", "vllm", "eagle"]
ServingEngine = Literal["sglang", "vllm"]

CONVENTIONS: tuple[str, ...] = ("sglang", "vllm", "eagle")
SERVING_ENGINES: tuple[str, ...] = ("sglang", "vllm")

# Where each serving engine reads the ids in a drafter's config.json, first field first.
IDS_FIELD_TOP = "eagle_aux_hidden_state_layer_ids"
IDS_FIELD_EAGLE_CONFIG = "eagle_config.eagle_aux_hidden_state_layer_ids"
IDS_FIELDS_READ: dict[str, tuple[str, ...]] = {
    "sglang": (IDS_FIELD_EAGLE_CONFIG, IDS_FIELD_TOP),
    "vllm": (IDS_FIELD_TOP, IDS_FIELD_EAGLE_CONFIG),
}

# SGLang releases whose behaviour differs (see sglang_notes / engine_taps).
SGLANG_GRAPH_FIX_VERSION = (0, 5, 11)  # PR #22836: graphs used the default ids up to 0.5.10
SGLANG_DEEPSEEK_PLUS_ONE_VERSION = (0, 5, 13)  # PR #25454: deepseek_v2 adds +1 only if ids[0] == 1


def _offset(convention: str) -> int:
    if convention == "sglang":
        return 1
    if convention in ("vllm", "eagle"):
        return 0
    raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


def id_to_hf_index(layer_id: int, convention: Convention) -> int:
    """HF index named by ``layer_id`` in ``convention`` ("sglang": +1; "vllm"/"eagle": as is)."""
    return int(layer_id) + _offset(convention)


def hf_index_to_id(hf_index: int, convention: Convention) -> int:
    """The id that names ``hs[hf_index]`` in ``convention`` (inverse of :func:`id_to_hf_index`)."""
    return int(hf_index) - _offset(convention)


def ids_to_hf_indices(ids: Iterable[int], convention: Convention) -> tuple[int, ...]:
    """Map a list of ids to HF indices, keeping the order."""
    return tuple(id_to_hf_index(i, convention) for i in ids)


def hf_indices_to_ids(indices: Iterable[int], convention: Convention) -> tuple[int, ...]:
    """Map HF indices to ids in ``convention``, keeping the order."""
    return tuple(hf_index_to_id(i, convention) for i in indices)


def convert_ids(ids: Iterable[int], src: Convention, dst: Convention) -> tuple[int, ...]:
    """Rewrite ids from one convention to another so they name the same layers."""
    return hf_indices_to_ids(ids_to_hf_indices(ids, src), dst)


def default_hf_indices(num_layers: int) -> tuple[int, ...]:
    """HF indices both SGLang and vLLM tap when the drafter config names no ids: 2, L//2, L-3
    (the engines' formula, applied as is even to toy targets of fewer than 6 layers)."""
    return (2, num_layers // 2, num_layers - 3)


def default_ids(num_layers: int, convention: Convention) -> tuple[int, ...]:
    """The default taps written as ids of ``convention``.

    "sglang" gives SpecForge's default ``[1, L//2-1, L-4]``; "vllm"/"eagle" give ``[2, L//2, L-3]``.
    """
    return hf_indices_to_ids(default_hf_indices(num_layers), convention)


def tappable_hf_range(num_layers: int) -> range:
    """HF indices a serving engine can tap: the inputs of decoder layers 0..L-1."""
    return range(0, num_layers)


def parse_version(version: str | None) -> tuple[int, ...] | None:
    """``"0.5.10.post1"`` -> ``(0, 5, 10)``; None or unparsable -> None."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.lstrip("v").split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts) or None


@dataclass(frozen=True)
class EngineTaps:
    """Which target layers one serving engine taps for a given drafter config.

    ``hf_indices`` is what the engine concatenates, in the order it concatenates (layer order).
    ``dropped_ids`` are config ids the engine never reaches (it silently taps fewer states).
    ``graph_hf_indices`` differs from ``hf_indices`` when CUDA-graph replays tap other layers than
    eager runs (SGLang <= 0.5.10); None when they agree or when the version says they do.
    """

    engine: str
    config_ids: tuple[int, ...] | None  # ids as the engine reads them; None = not in the config
    convention: str  # how the engine reads them
    hf_indices: tuple[int, ...]
    used_defaults: bool
    dropped_ids: tuple[int, ...] = ()
    graph_hf_indices: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()

    @property
    def embedding_captured(self) -> bool:
        """True when ``hs[0]`` (the embedding output) is among the taps."""
        return 0 in self.hf_indices


def _explicit_hf_indices(
    engine: str, ids: Sequence[int], num_layers: int, family: str, version: tuple[int, ...] | None
) -> tuple[tuple[int, ...], list[str]]:
    """HF indices the engine maps explicit ids to (before range filtering), with notes."""
    notes: list[str] = []
    if engine == "vllm":
        return tuple(ids), notes
    deepseek = family.startswith("deepseek")
    plus_one = ids_to_hf_indices(ids, "sglang")
    if not deepseek:
        return plus_one, notes
    as_given = tuple(ids)
    new_rule = as_given if (ids and ids[0] != 1) else plus_one
    if version is None:
        if new_rule != plus_one:
            notes.append(
                f"SGLang >= 0.5.13 (deepseek_v2, PR #25454) adds +1 only when ids[0] == 1: it would tap "
                f"hs{list(new_rule)} instead of hs{list(plus_one)}; pass the SGLang version to decide"
            )
        return plus_one, notes
    if version >= SGLANG_DEEPSEEK_PLUS_ONE_VERSION:
        if new_rule != plus_one:
            notes.append("SGLang >= 0.5.13 deepseek_v2: ids[0] != 1, so the ids are used as given (no +1)")
        return new_rule, notes
    return plus_one, notes


def engine_taps(
    engine: ServingEngine,
    ids: Sequence[int] | None,
    num_layers: int,
    *,
    family: str = "llama",
    sglang_version: str | None = None,
) -> EngineTaps:
    """What ``engine`` taps on an ``num_layers``-layer target when the drafter config holds ``ids``.

    ``ids=None`` means the config names none: the engine applies its defaults (2, L//2, L-3).
    ``family`` is the target's ModelConfig family ("llama", "qwen2", "qwen3", "deepseek_v3"); it
    matters for SGLang's DeepSeek path. ``sglang_version`` (e.g. "0.5.10") resolves the
    version-dependent behaviour; without it the notes name both outcomes.
    """
    if engine not in SERVING_ENGINES:
        raise ValueError(f"unknown serving engine {engine!r}; expected one of {SERVING_ENGINES}")
    convention = "sglang" if engine == "sglang" else "vllm"
    defaults = default_hf_indices(num_layers)
    if ids is None or len(ids) == 0:
        note = f"no ids in the config: {engine} applies its defaults hs{list(defaults)}"
        return EngineTaps(engine, None, convention, defaults, True, notes=(note,))
    version = parse_version(sglang_version)
    wanted, notes = _explicit_hf_indices(engine, list(ids), num_layers, family, version)
    tappable = tappable_hf_range(num_layers)
    kept = sorted({i for i in wanted if i in tappable})
    dropped = tuple(i for i, h in zip(ids, wanted) if h not in tappable)
    if dropped:
        notes.append(
            f"{engine} never taps ids {list(dropped)} (outside the inputs of layers 0..{num_layers - 1}): "
            f"it silently concatenates {len(kept)} states instead of {len(ids)}"
        )
    if len(set(wanted)) != len(wanted):
        notes.append(f"duplicated ids: {engine} taps each layer once, so {len(kept)} states, not {len(ids)}")
    if list(wanted) != sorted(wanted):
        notes.append(f"{engine} concatenates in layer order, not in the order the config lists the ids")
    graph = None
    if engine == "sglang" and tuple(kept) != defaults:
        if version is None:
            notes.append(
                f"SGLang <= 0.5.10 tapped the defaults hs{list(defaults)} inside CUDA graphs whatever the "
                "config said (fixed in 0.5.11, PR #22836): eager and graph runs disagree on those versions"
            )
        elif version < SGLANG_GRAPH_FIX_VERSION:
            graph = defaults
            notes.append(
                f"SGLang {sglang_version} taps the defaults hs{list(defaults)} in CUDA-graph replays "
                "(fixed in 0.5.11, PR #22836): run with --disable-cuda-graph or upgrade"
            )
    return EngineTaps(engine, tuple(ids), convention, tuple(kept), False, dropped, graph, tuple(notes))


def ids_for_engine(config: dict, engine: ServingEngine) -> tuple[tuple[int, ...] | None, str | None]:
    """The ids ``engine`` reads from a drafter ``config.json`` dict, and the field it found them in.

    vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids`` first, then ``eagle_config``'s;
    SGLang reads ``eagle_config`` first, then the top level. Empty or null lists count as absent.
    """
    for name in IDS_FIELDS_READ[engine]:
        value = _lookup(config, name)
        valid = isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if valid and len(value) > 0:  # type: ignore[arg-type]
            return tuple(value), name  # type: ignore[arg-type]
    return None, None


def _lookup(config: dict, dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


# ---- EAGLE-3.1 flags ------------------------------------------------------------------------------
# Both engines read them with getattr on the drafter's config: the top level of config.json only
# (a flag inside eagle_config is read by none). Absent means off.
FC_NORM_FIELDS: dict[str, tuple[str, ...]] = {
    "sglang": ("fc_norm", "use_aux_norm"),  # llama_eagle3.py / kimi_k25_eagle3.py: fc_norm or the legacy name
    "vllm": ("fc_norm",),  # llama_eagle3.py / deepseek_eagle3.py
}
NORM_OUTPUT_FIELD = "norm_output"


def eagle31_notes(fmt: str, layout: str, fc_norm_field: str | None, norm_output: bool) -> tuple[str, ...]:
    """Which engine versions compute the EAGLE-3.1 math a drafter config asks for, one line each (empty
    when neither flag is set). ``fmt``: "sglang" | "speculators"; ``layout``: "llama" | "mla";
    ``fc_norm_field``: the field that set fc_norm ("fc_norm" | "use_aux_norm"), None when off.

    Versions older than the ones named load the weights and compute EAGLE-3 (no per-state norm, the
    pre-norm state fed back), which drafts worse tokens without an error, except where noted.
    """
    if fc_norm_field is None and not norm_output:
        return ()
    flags = " and ".join(f for f in (fc_norm_field, NORM_OUTPUT_FIELD if norm_output else None) if f)
    mla = layout == "mla"
    sglang = (f"SGLang reads {flags} from PR #26506 on (kimi_k25_eagle3.py, the MLA drafter); older releases run "
              "the MLA drafter as EAGLE-3 and skip the fc_norm weights with a warning" if mla else
              f"SGLang reads {flags} from PR #24663 on (llama_eagle3.py); older releases skip the fc_norm "
              "weights silently and run EAGLE-3")
    vllm = ("vLLM reads fc_norm and norm_output from PR #42764 on (llama_eagle3.py, deepseek_eagle3.py); "
            "older releases refuse the fc_norm weights at load")
    if mla and fc_norm_field is not None:
        vllm += "; deepseek_eagle3.py loads fc_norm but does not apply it until PR #43482"
    if fc_norm_field == "use_aux_norm":
        vllm += "; vLLM never reads the legacy use_aux_norm: write fc_norm: true"
    if fmt == "speculators":
        vllm += ("; from a speculators config vLLM passes the flags on only from PR #46488 on "
                 "(before it they are dropped and the drafter runs as EAGLE-3)")
    return sglang, vllm
