"""Drafter layouts: which network a drafter config describes, and its EAGLE-3.1 flags.

Two layouts, told apart by ``architectures`` (as the engines dispatch):

* ``"llama"``: ``LlamaForCausalLMEagle3`` (SGLang/SpecForge), ``Eagle3LlamaForCausalLM``, speculators'
  ``Eagle3Speculator``: q/k/v/o attention over the 2H input;
* ``"mla"``: ``Eagle3DeepseekV2ForCausalLM`` (SGLang ``kimi_k25_eagle3.py``, vLLM ``deepseek_eagle3.py``;
  e.g. ``lightseekorg/kimi-k2.5-eagle3-mla``): DeepSeek latent attention, fields ``q_lora_rank``,
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; tensors
  ``layers.0.self_attn.{q_a_proj [Q, 2H], q_a_layernorm, q_b_proj, kv_a_proj_with_mqa [R + Dr, 2H],
  kv_a_layernorm, kv_b_proj, o_proj}``.

EAGLE-3.1 (either layout): ``fc_norm`` (legacy ``use_aux_norm``, SGLang only) adds ``fc_norm.{i}.weight``
[target_hidden_size], one RMSNorm per aux state before ``fc``; ``norm_output`` feeds the post-norm state
to the next draft step. Both are read at the top level of config.json (see
:func:`~eaglelab.engine.formats.conventions.eagle31_notes` for which engine versions read them).

:func:`read_layout` runs while the checkpoint is read; :func:`layout_problems` (given a read
``DraftCheckpoint``; this module imports nothing of draft_checkpoint) are the checks that
:meth:`DraftCheckpoint.validate` reports and :func:`raise_first` turns into the loader's errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.conventions import FC_NORM_FIELDS, NORM_OUTPUT_FIELD, eagle31_notes
from eaglelab.engine.model.config import MLAConfig, ModelConfig

MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
A_PROJECTIONS = ("midlayer.self_attn.q_a_proj.weight", "midlayer.self_attn.kv_a_proj_with_mqa.weight",
                 "midlayer.self_attn.q_proj.weight")
UNSUPPORTED_FLAGS = {  # config flags eaglelab does not compute: loading them would silently change the math
    "norm_before_fc": "one RMSNorm over the whole concatenated aux vector before fc (speculators, gpt-oss drafters)",
}


@dataclass(frozen=True)
class DrafterLayout:
    """What network a drafter config describes. ``kind``: "llama" | "mla"."""

    kind: str = "llama"
    architecture: str | None = None
    mla: MLAConfig | None = None
    fc_norm_field: str | None = None  # "fc_norm" | "use_aux_norm" when fc_norm is on, else None
    norm_output: bool = False
    misplaced: tuple[str, ...] = ()  # EAGLE-3.1 flags found inside eagle_config, where no engine reads them
    unsupported: tuple[str, ...] = ()  # UNSUPPORTED_FLAGS set true

    @property
    def fc_norm(self) -> bool:
        return self.fc_norm_field is not None

    @property
    def eagle31(self) -> bool:
        return self.fc_norm or self.norm_output

    def describe(self) -> str:
        arch = "MLA (DeepSeek latent attention)" if self.kind == "mla" else "Llama (q/k/v attention)"
        flags = [f for f, on in (("fc_norm", self.fc_norm), ("norm_output", self.norm_output)) if on]
        return f"layout {arch}, " + (f"EAGLE-3.1 ({', '.join(flags)})" if flags else "EAGLE-3")


LLAMA_LAYOUT = DrafterLayout()


# ---- reading ---------------------------------------------------------------------------------------


def read_layout(raw: Mapping[str, Any], config_file: Path, fmt: str) -> DrafterLayout:
    """The layout of a drafter ``config.json`` dict (``fmt``: "sglang" | "speculators")."""
    archs = raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    arch = next((a for a in archs if isinstance(a, str)), None)
    mla = _mla_fields(raw, config_file) if fmt == "sglang" and arch in MLA_ARCHITECTURES else None
    fc_norm_field = next((f for f in FC_NORM_FIELDS["sglang"] if _flag(raw, f, config_file)), None)
    eagle = raw.get("eagle_config")
    nested = eagle if isinstance(eagle, dict) else {}
    misplaced = tuple(f"eagle_config.{f}" for f in (*FC_NORM_FIELDS["sglang"], NORM_OUTPUT_FIELD) if nested.get(f))
    return DrafterLayout(
        kind="mla" if mla is not None else "llama", architecture=arch, mla=mla, fc_norm_field=fc_norm_field,
        norm_output=_flag(raw, NORM_OUTPUT_FIELD, config_file), misplaced=misplaced,
        unsupported=tuple(f for f in UNSUPPORTED_FLAGS if _flag(raw, f, config_file)),
    )


def _flag(raw: Mapping[str, Any], name: str, source: Path) -> bool:
    value = raw.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError("must be true or false", file=source, field=name, found=value,
                          hint=f"write {name}: true only if the drafter was trained with it")
    return value


def _mla_fields(raw: Mapping[str, Any], source: Path) -> MLAConfig:
    for key in MLA_FIELDS:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError("missing or not a positive integer (the MLA drafter layout needs it)", file=source,
                              field=key, found=value, expected="a positive integer, the MLA size the drafter was trained with",
                              hint="copy it from the drafter's original config.json (an Eagle3DeepseekV2ForCausalLM config has all five MLA sizes)")
    if raw["qk_rope_head_dim"] % 2:
        raise ConfigError("must be even (rotary turns pairs)", file=source, field="qk_rope_head_dim",
                          found=raw["qk_rope_head_dim"], expected="an even number")
    q_rank = raw.get("q_lora_rank")
    if q_rank is not None and (isinstance(q_rank, bool) or not isinstance(q_rank, int) or q_rank <= 0):
        raise ConfigError("must be a positive integer or null", file=source, field="q_lora_rank", found=q_rank)
    interleave = raw.get("rope_interleave", True)
    return MLAConfig(kv_lora_rank=raw["kv_lora_rank"], qk_nope_head_dim=raw["qk_nope_head_dim"],
                     qk_rope_head_dim=raw["qk_rope_head_dim"], v_head_dim=raw["v_head_dim"], q_lora_rank=q_rank,
                     rope_interleave=bool(interleave))


# ---- shapes ----------------------------------------------------------------------------------------


def mla_attention_shapes(hidden: int, heads: int, m: MLAConfig) -> dict[str, tuple[int, ...]]:
    """The MLA drafter's attention tensors (SGLang names) and shapes; the a-projections read 2H."""
    p, qk = "midlayer.self_attn.", heads * m.qk_head_dim
    out: dict[str, tuple[int, ...]] = {}
    if m.q_lora_rank is None:
        out[p + "q_proj.weight"] = (qk, 2 * hidden)
    else:
        out.update({p + "q_a_proj.weight": (m.q_lora_rank, 2 * hidden), p + "q_a_layernorm.weight": (m.q_lora_rank,),
                    p + "q_b_proj.weight": (qk, m.q_lora_rank)})
    out.update({
        p + "kv_a_proj_with_mqa.weight": (m.cache_dim, 2 * hidden), p + "kv_a_layernorm.weight": (m.kv_lora_rank,),
        p + "kv_b_proj.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        p + "o_proj.weight": (hidden, heads * m.v_head_dim),
    })
    return out


def layout_shapes(layout: DrafterLayout, llama_shapes: dict[str, tuple[int, ...]], hidden: int,
                  heads: int) -> dict[str, tuple[int, ...]]:
    """``llama_shapes`` (the Llama layout's, from :func:`expected_tensor_shapes`) for ``layout``: the MLA
    attention in place of q/k/v/o. The a-projections and fc_norm are checked by :func:`layout_problems`."""
    if layout.mla is None:
        return llama_shapes
    out = {k: v for k, v in llama_shapes.items() if ".self_attn." not in k}
    out.update({k: v for k, v in mla_attention_shapes(hidden, heads, layout.mla).items() if k not in A_PROJECTIONS})
    return out


# ---- checks ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One layout finding, with what the loader's error needs (file, found, expected)."""

    severity: str
    code: str
    field: str
    message: str
    hint: str | None = None
    found: object = None
    expected: object = None
    file: Path | None = None

    def text(self) -> str:
        """The message with found / expected appended (a check-wiring finding's message)."""
        detail = "".join(f"; {k} {v}" for k, v in (("found", self.found), ("expected", self.expected)) if v is not None)
        return self.message + detail

    def error(self) -> CheckpointError | ConfigError:
        kind = CheckpointError if self.file is not None and self.file.suffix == ".safetensors" else ConfigError
        return kind(self.message, file=self.file, field=self.field, found=self.found, expected=self.expected,
                    hint=self.hint)


def layout_problems(ck: Any, target: Any = None) -> list[Problem]:
    """The layout's checks: EAGLE-3.1 flags against the weights and the engines, MLA sizes against the
    weights and the target (``target``: any TargetShape; the MLA fit is checked against a ModelConfig)."""
    lay: DrafterLayout = ck.layout
    out = [Problem("info", "layout", "architectures", f"{lay.describe()} ({lay.architecture or 'no architectures'})")]
    out += _fc_norm_problems(ck, lay)
    notes = eagle31_notes(ck.format, lay.kind, lay.fc_norm_field, lay.norm_output)
    if notes:
        out.append(Problem("warning", "eagle31_engines", lay.fc_norm_field or NORM_OUTPUT_FIELD,
                           "EAGLE-3.1 flags: engines that do not read them run the drafter as EAGLE-3: " + " | ".join(notes),
                           "serve with an engine version named here", file=ck.config_file))
    for name in lay.misplaced:
        out.append(Problem("warning", "eagle31_misplaced", name, "no engine reads EAGLE-3.1 flags inside eagle_config",
                           f"move it to the top level ({name.split('.', 1)[1]})", file=ck.config_file))
    if lay.fc_norm_field == "use_aux_norm":
        out.append(Problem("warning", "eagle31_legacy", "use_aux_norm", "the legacy name: SGLang reads it, vLLM does not",
                           "write fc_norm: true instead", file=ck.config_file))
    for name in lay.unsupported:
        out.append(Problem("error", "unsupported_flag", name, f"eaglelab does not compute {UNSUPPORTED_FLAGS[name]}",
                           found=True, expected="false or absent", file=ck.config_file,
                           hint="serve this drafter with vLLM; eaglelab would draft with different math"))
    if lay.mla is not None:
        out += _mla_problems(ck, lay.mla, target)
    return out


def _fc_norm_problems(ck: Any, lay: DrafterLayout) -> list[Problem]:
    present = sorted(n for n in ck.tensors if n.startswith("fc_norm."))
    n_aux = ck.num_aux_from_fc or (len(ck.aux_layer_ids) if ck.aux_layer_ids else 3)
    width = ck.aux_hidden_size
    if not lay.fc_norm:
        if present:
            return [Problem("error", "fc_norm_unused", "fc_norm", f"the weights hold {', '.join(present[:3])} but the "
                            "config does not set fc_norm: the drafter was trained with a norm per aux state",
                            found="fc_norm absent or false", expected="fc_norm: true", file=ck.config_file,
                            hint="set fc_norm: true at the top level of config.json (vLLM refuses these weights "
                                 "without it; SGLang skips them and drafts with different math)")]
        return []
    if not ck.has_weights:
        return []
    wanted = [f"fc_norm.{i}.weight" for i in range(n_aux)]
    missing = [n for n in wanted if n not in ck.tensors]
    if missing:
        return [Problem("error", "fc_norm_missing", missing[0], f"{lay.fc_norm_field} is set but the weights hold no "
                        f"{missing[0]} (one RMSNorm [{width}] per aux state: {len(wanted)})",
                        found=present or "no fc_norm.* tensors", expected=wanted, file=ck.weight_files[0],
                        hint=f"use the checkpoint's full weights, or remove {lay.fc_norm_field} if the drafter "
                             "was trained without it")]
    out = []
    for name in wanted:
        info = ck.tensors[name]
        if tuple(info.shape) != (width,):
            out.append(Problem("error", "fc_norm_shape", name, "an fc_norm weight is one RMSNorm over one aux state",
                               found=list(info.shape), expected=[width], file=info.file,
                               hint="target_hidden_size and the weights disagree: the drafter was made for another target"))
    return out


def _mla_problems(ck: Any, m: MLAConfig, target: Any) -> list[Problem]:
    out: list[Problem] = []
    H, heads = ck.hidden_size, ck.num_attention_heads
    expect = mla_attention_shapes(H, heads, m)
    for name in A_PROJECTIONS:
        info = ck.tensors.get(name)
        if name not in expect:
            continue
        if info is None:
            if ck.has_weights:
                out.append(Problem("error", "tensor_missing", name, "missing from the MLA drafter's weights",
                                   expected=list(expect[name]), file=ck.weight_files[0],
                                   hint="q_lora_rank decides q_a_proj/q_b_proj (set) or q_proj (null): check it against the weights"))
            continue
        if tuple(info.shape) == expect[name]:
            continue
        if len(info.shape) == 2 and info.shape[1] == H:
            msg = (f"reads width {H} (hidden_size), not 2H = {2 * H}: an EAGLE-3 drafter's a-projections read "
                   "cat(input_layernorm(embed), hidden_norm(fc(aux))); this is a plain MLA layer's weight "
                   "(a target layer or an MTP/EAGLE-1 head), not an EAGLE-3 drafter's")
            hint = "pass the EAGLE-3 MLA drafter's checkpoint (its a-projections are [rank, 2 x hidden_size])"
        else:
            msg = "the MLA sizes in config.json and the weights disagree"
            hint = "check q_lora_rank, kv_lora_rank and qk_rope_head_dim against the weights"
        out.append(Problem("error", "a_proj_width", name, msg, found=list(info.shape), expected=list(expect[name]),
                           file=info.file, hint=hint))
    if m.q_lora_rank is None:
        out.append(Problem("warning", "mla_q_lora", "q_lora_rank", "null: SGLang refuses this drafter "
                           "('Eagle3 MLA layer requires q_lora_rank'); vLLM and eaglelab build q_proj [heads x "
                           f"{m.qk_head_dim}, {2 * H}]", file=ck.config_file))
    if not isinstance(target, ModelConfig):  # a bare TargetShape says nothing of its attention
        return out
    tm = target.mla
    if tm is None:
        out.append(Problem("error", "mla_target", "architectures", "an MLA-layout drafter on a target without "
                           "multi-head latent attention: it shares the target's MLA cache layout",
                           found=f"target {target.architecture} (no kv_lora_rank)",
                           expected="a DeepSeek-V3 / Kimi-K2 style target", file=ck.config_file,
                           hint="pass the target the drafter was trained for"))
    elif (tm.kv_lora_rank, tm.qk_rope_head_dim) != (m.kv_lora_rank, m.qk_rope_head_dim):
        field = "kv_lora_rank" if tm.kv_lora_rank != m.kv_lora_rank else "qk_rope_head_dim"
        out.append(Problem("error", "mla_dims", field, "the drafter's MLA cache row does not fit the target's: "
                           "engines keep the drafter's latent rows in the target's MLA cache layout",
                           found=f"kv_lora_rank {m.kv_lora_rank} + qk_rope_head_dim {m.qk_rope_head_dim}",
                           expected=f"the target's kv_lora_rank {tm.kv_lora_rank} + qk_rope_head_dim {tm.qk_rope_head_dim}",
                           file=ck.config_file, hint="pass the drafter trained for this target, or the target it was trained for"))
    return out


def raise_first(problems: list[Problem]) -> None:
    """Raise the first error among ``problems`` (the loader's exit 2: file, field, found, expected, fix)."""
    for p in problems:
        if p.severity == "error":
            raise p.error()
