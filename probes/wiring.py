"""Is a drafter fed the target layers it was trained on? Static checks, numerical matching, live check.

Three levels, each adding evidence:

1. **Static** (:func:`check_wiring` without data): the drafter directory's config and tensor shapes
   (:meth:`DraftCheckpoint.validate`), and which target layers each serving engine would tap with
   that config (:func:`eaglelab.engine.formats.conventions.engine_taps`).
2. **Numerical** (with SpecForge data and the target): run the target over the samples' tokens,
   collect every HF hidden state and find, for each aux slot of the data, the layer it equals.
   That gives the ids the config must hold, in each engine's convention, whatever the config says.
3. **Live** (:func:`live_check`): compare what a running engine actually feeds the drafter with the
   training data for the same tokens, slot by slot.

Matching works on token rows: for a data slot ``a`` [N, H] and a candidate ``b`` [N, H], the
per-token cosine similarity (mean over tokens) ranks candidates; a slot *matches* its best
candidate when the similarity is at least ``min_similarity`` and the median per-token relative
error ``|a - b| / |b|`` at most ``max_rel_error``. On SmolLM2-135M, bf16 data against a float32
recompute stays below 0.02 relative error (similarity > 0.9997) while neighbouring layers differ by
more than 0.2 (similarity < 0.98).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglelab.engine.formats.conventions import (
    IDS_FIELD_EAGLE_CONFIG,
    IDS_FIELD_TOP,
    IDS_FIELDS_READ,
    EngineTaps,
    engine_taps,
    hf_indices_to_ids,
    ids_for_engine,
    tappable_hf_range,
)
from eaglelab.engine.formats.draft_checkpoint import DraftCheckpoint, Finding, TargetShape, read_draft_checkpoint
from eaglelab.engine.formats.specforge_data import Sample, list_samples, read_sample, read_vocab_mapping

HiddenStatesFn = Callable[[torch.Tensor], Sequence[torch.Tensor]]  # [B, T] -> L+1 x [B, T, H]
TapsFn = Callable[[torch.Tensor], torch.Tensor]  # [1, T] -> [1, T, n*H]

VERDICTS: tuple[str, ...] = ("ok", "mismatch", "error", "inconclusive")
# 0 only for a numerical OK; 3 is the CLI's internal error; 4: nothing found wrong, nothing shown right
# (static checks only, or a tap search whose texts do not separate the candidates)
EXIT_CODES: dict[str, int] = {"ok": 0, "mismatch": 1, "error": 2, "inconclusive": 4}


@dataclass(frozen=True)
class Tolerance:
    """When a data slot counts as reproduced by a candidate state."""

    min_similarity: float = 0.999
    max_rel_error: float = 0.05


# ======================================================================================================
# matching
# ======================================================================================================


@dataclass(frozen=True)
class Score:
    """How close one data slot is to one candidate state."""

    label: int  # HF index (target) or engine slot (live)
    similarity: float  # mean per-token cosine similarity
    rel_error: float  # median per-token |a - b| / |b|


@dataclass(frozen=True)
class SlotMatch:
    """The best candidate for one data slot; ``matched`` None when none reproduces it."""

    slot: int
    matched: int | None
    best: Score
    runner_up: Score | None

    @property
    def margin(self) -> float | None:
        """Similarity of the best candidate minus the runner-up's."""
        return None if self.runner_up is None else self.best.similarity - self.runner_up.similarity


def score(a: torch.Tensor, b: torch.Tensor, label: int) -> Score:
    """Compare token rows a, b [N, H] (computed in float64)."""
    a, b = a.double(), b.double()
    dot = (a * b).sum(-1)  # [N]
    na, nb = a.norm(dim=-1), b.norm(dim=-1)  # [N]
    cos = dot / (na * nb).clamp_min(1e-30)
    rel = (a - b).norm(dim=-1) / nb.clamp_min(1e-30)
    return Score(label, float(cos.mean()), float(rel.median()))


def match_slots(
    aux: torch.Tensor,
    candidates: Sequence[torch.Tensor],
    hidden_size: int,
    *,
    labels: Sequence[int] | None = None,
    tol: Tolerance = Tolerance(),
) -> list[SlotMatch]:
    """Match each H-wide slot of ``aux`` [N, n*H] to the candidate [N, H] it equals.

    Example: aux built as cat(hs[2], hs[15], hs[27]) over the same tokens, candidates = all 31
    hidden states of a 30-layer target -> matched (2, 15, 27), each with similarity ~1.
    """
    assert aux.shape[-1] % hidden_size == 0, f"aux width {aux.shape[-1]} is not a multiple of {hidden_size}"
    labels = list(labels) if labels is not None else list(range(len(candidates)))
    out = []
    for slot, a in enumerate(aux.split(hidden_size, dim=-1)):
        scores = sorted((score(a, c, lab) for c, lab in zip(candidates, labels)), key=lambda s: -s.similarity)
        best = scores[0]
        ok = best.similarity >= tol.min_similarity and best.rel_error <= tol.max_rel_error
        out.append(SlotMatch(slot, best.label if ok else None, best, scores[1] if len(scores) > 1 else None))
    return out


# ======================================================================================================
# report data
# ======================================================================================================


@dataclass(frozen=True)
class SlotReport:
    """One row of the report: a data slot, the layer it came from, what the serving config taps."""

    slot: int
    matched_hf_index: int | None
    similarity: float
    rel_error: float
    best_hf_index: int  # the closest layer even when it does not match
    runner_up_hf_index: int | None
    margin: float | None
    config_hf_index: int | None  # what the serving engine taps in this slot; None = nothing
    verdict: str  # "ok" | "wrong layer" | "no layer matches" | "not tapped"


@dataclass(frozen=True)
class FinalStateReport:
    """The data's stored final ``hidden_state`` against the target's last (normed) state."""

    similarity: float
    rel_error: float
    matches: bool
    best_hf_index: int


@dataclass(frozen=True)
class Fix:
    """One concrete change: set ``field`` in ``file`` from ``current`` to ``new``."""

    file: str
    field: str
    current: Any
    new: Any
    reason: str

    def text(self) -> str:
        return f"{self.file}: {self.field}: {self.current} -> {self.new}  ({self.reason})"


@dataclass(frozen=True)
class DataSummary:
    path: str
    samples: int
    tokens: int
    dtype: str
    num_slots: int
    hidden_size: int


@dataclass(frozen=True)
class WiringReport:
    """Everything ``eaglelab check-wiring`` found. ``verdict``: "ok" (numerically right) | "mismatch" |
    "inconclusive" (static checks passed, nothing checked numerically: ``conclusion`` says why)."""

    draft_dir: str
    format: str
    serving: str
    serving_reason: str
    config_ids: tuple[int, ...] | None
    config_convention: str | None
    config_field: str | None
    target: dict[str, Any] | None
    findings: tuple[Finding, ...]
    engines: tuple[EngineTaps, ...]
    data: DataSummary | None = None
    slots: tuple[SlotReport, ...] = ()
    final_state: FinalStateReport | None = None
    expected_hf_indices: tuple[int, ...] | None = None
    expected_ids: dict[str, list[int]] | None = None
    fixes: tuple[Fix, ...] = ()
    conclusion: str = ""
    verdict: str = "ok"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready dict (the ``--json`` output)."""
        d = {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "conclusion": self.conclusion,
            "draft_dir": self.draft_dir,
            "format": self.format,
            "serving": self.serving,
            "serving_reason": self.serving_reason,
            "config": {"aux_layer_ids": _list(self.config_ids), "convention": self.config_convention, "field": self.config_field},
            "target": self.target,
            "findings": [f.to_dict() for f in self.findings],
            "engines": {t.engine: _taps_json(t) for t in self.engines},
            "data": asdict(self.data) if self.data else None,
            "slots": [asdict(s) for s in self.slots],
            "final_hidden_state": asdict(self.final_state) if self.final_state else None,
            "expected_hf_indices": _list(self.expected_hf_indices),
            "expected_ids": self.expected_ids,
            "fixes": [asdict(f) | {"text": f.text()} for f in self.fixes],
        }
        return d


def _list(x: Sequence[int] | None) -> list[int] | None:
    return list(x) if x is not None else None


def _taps_json(t: EngineTaps) -> dict[str, Any]:
    return {
        "config_ids": _list(t.config_ids), "convention": t.convention, "hf_indices": list(t.hf_indices),
        "used_defaults": t.used_defaults, "dropped_ids": list(t.dropped_ids),
        "graph_hf_indices": _list(t.graph_hf_indices), "notes": list(t.notes),
    }


# ======================================================================================================
# the check
# ======================================================================================================


def check_wiring(
    draft: str | Path | DraftCheckpoint,
    *,
    target_config: TargetShape | None = None,
    hidden_states_fn: HiddenStatesFn | None = None,
    data_dir: str | Path | None = None,
    serving: str | None = None,
    sglang_version: str | None = None,
    max_samples: int = 8,
    max_tokens: int = 64,
    tol: Tolerance = Tolerance(),
    unchecked_because: str = "no training data given",
) -> WiringReport:
    """Check a drafter's wiring: statically, and numerically when ``data_dir`` and
    ``hidden_states_fn`` (the target's ``all_hidden_states``) are given. Without data a clean static
    check is "inconclusive", never "ok"; ``unchecked_because`` is the reason shown.

    ``serving``: "sglang" | "vllm"; None follows the checkpoint's format. Raises
    EagleLabError subclasses for files that cannot be read.
    """
    ck = draft if isinstance(draft, DraftCheckpoint) else read_draft_checkpoint(draft)
    serving, reason = _serving(ck, serving)
    findings = list(ck.validate(target_config))
    engines = _engines(ck, target_config, sglang_version)
    ids, field_name = ids_for_engine(dict(ck.raw_config), serving)  # type: ignore[arg-type]
    base = dict(
        draft_dir=str(ck.path), format=ck.format, serving=serving, serving_reason=reason,
        config_ids=ids, config_convention=("sglang" if serving == "sglang" else "vllm") if ids else None,
        config_field=field_name, target=_target_json(target_config), engines=engines,
    )
    if data_dir is None:
        return _static_report(base, findings, target_config, unchecked_because)
    assert hidden_states_fn is not None and target_config is not None, "the numerical check needs the target"
    samples = load_samples(data_dir, max_samples=max_samples, max_tokens=max_tokens)
    findings += _data_findings(ck, samples, data_dir, target_config)
    return _numerical_report(ck, base, findings, samples, data_dir, target_config, hidden_states_fn, tol)


def _serving(ck: DraftCheckpoint, serving: str | None) -> tuple[str, str]:
    if serving is None:
        src = "SGLang/SpecForge" if ck.format == "sglang" else "speculators"
        return ck.default_serving, f"follows the checkpoint's {src} format; --serving overrides"
    assert serving in ("sglang", "vllm"), f"serving must be sglang or vllm, got {serving!r}"
    return serving, "chosen with --serving"


def _engines(ck: DraftCheckpoint, target: TargetShape | None, sglang_version: str | None) -> tuple[EngineTaps, ...]:
    if target is None:
        return ()
    family = getattr(target, "family", "llama")
    out = []
    for eng in ("sglang", "vllm"):
        ids, _ = ids_for_engine(dict(ck.raw_config), eng)  # type: ignore[arg-type]
        out.append(engine_taps(eng, ids, target.num_layers, family=family, sglang_version=sglang_version))  # type: ignore[arg-type]
    return tuple(out)


def _target_json(target: TargetShape | None) -> dict[str, Any] | None:
    if target is None:
        return None
    return {"num_layers": target.num_layers, "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "family": getattr(target, "family", None), "architecture": getattr(target, "architecture", None)}


def _static_report(base: dict, findings: list[Finding], target: TargetShape | None, because: str) -> WiringReport:
    errors = [f for f in findings if f.severity == "error"]
    verdict = "mismatch" if errors else "inconclusive"
    if errors:
        conclusion = f"{len(errors)} error(s) in the drafter's config or weights: " + "; ".join(f.message for f in errors[:3])
    else:
        conclusion = (f"static checks passed; wiring NOT checked numerically ({because}): config and weights are "
                      "consistent" + ("" if target else " (no --target: no layer-range checks either)"))
    return WiringReport(findings=tuple(findings), conclusion=conclusion, verdict=verdict, **base)


# ---- data --------------------------------------------------------------------------------------------


def load_samples(data_dir: str | Path, *, max_samples: int, max_tokens: int) -> list[Sample]:
    """The first ``max_samples`` samples, each cut to ``max_tokens`` tokens."""
    return [read_sample(p).truncated(max_tokens) for p in list_samples(data_dir)[:max_samples]]


def _data_findings(ck: DraftCheckpoint, samples: list[Sample], data_dir: str | Path, target: TargetShape) -> list[Finding]:
    out: list[Finding] = []
    width = samples[0].aux_hidden_state.shape[-1]
    for s in samples:
        if s.aux_hidden_state.shape[-1] != width:
            out.append(Finding("error", "aux_hidden_state", f"{s.path}: width {s.aux_hidden_state.shape[-1]}, "
                               f"the first sample's is {width}", "the directory mixes data from different runs", code="data_width"))
            break
    fc_n = ck.num_aux_from_fc
    if fc_n is not None and width % target.hidden_size == 0 and width // target.hidden_size != fc_n:
        out.append(Finding("error", "fc.weight", f"the data holds {width // target.hidden_size} aux states per token, the "
                           f"drafter's fc takes {fc_n}: this drafter was not trained on this data", code="data_vs_fc"))
    mapping = read_vocab_mapping(data_dir)
    if mapping is not None and ck.shape("d2t") == tuple(mapping.d2t.shape):
        if not torch.equal(ck.load_tensor("d2t").long(), mapping.d2t):
            out.append(Finding("warning", "d2t", "the drafter's d2t differs from the data's vocab_mapping.pt",
                               "the drafter was trained with another draft vocabulary", code="data_vocab_map"))
    return out


def _stack_tokens(samples: list[Sample], hidden_states_fn: HiddenStatesFn) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """One batched target pass (right-padded: causal, so padding never touches real tokens).

    Returns the L+1 candidate states [N, H] over all real tokens, the data's aux [N, n*H] and
    final hidden state [N, H] (None if any sample lacks it).
    """
    lengths = [s.num_tokens for s in samples]
    ids = torch.zeros(len(samples), max(lengths), dtype=torch.long)  # [B, T]
    for b, s in enumerate(samples):
        ids[b, : s.num_tokens] = s.input_ids
    with torch.inference_mode():
        hs = hidden_states_fn(ids)  # L+1 x [B, T, H]
    keep = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]  # [B, T]
    candidates = [h.float()[keep] for h in hs]  # L+1 x [N, H]
    aux = torch.cat([s.aux_hidden_state[0].float() for s in samples])  # [N, n*H]
    final = None
    if all(s.hidden_state is not None for s in samples):
        final = torch.cat([s.hidden_state[0].float() for s in samples])  # [N, H]
    return candidates, aux, final


def _numerical_report(
    ck: DraftCheckpoint, base: dict, findings: list[Finding], samples: list[Sample], data_dir: str | Path,
    target: TargetShape, hidden_states_fn: HiddenStatesFn, tol: Tolerance,
) -> WiringReport:
    h = target.hidden_size
    width = samples[0].aux_hidden_state.shape[-1]
    summary = DataSummary(str(data_dir), len(samples), sum(s.num_tokens for s in samples),
                          str(samples[0].aux_hidden_state.dtype).replace("torch.", ""), width // h if width % h == 0 else 0,
                          samples[0].hidden_state.shape[-1] if samples[0].hidden_state is not None else width)
    if width % h or (samples[0].hidden_state is not None and samples[0].hidden_state.shape[-1] != h):
        text = (f"the data's hidden width ({summary.hidden_size}, aux {width}) does not fit the target's hidden size {h}: "
                "the data did not come from this target (another model)")
        return WiringReport(findings=tuple(findings), data=summary, conclusion=text, verdict="mismatch", **base)
    top = max(int(s.input_ids.max()) for s in samples)
    if top >= target.vocab_size or min(int(s.input_ids.min()) for s in samples) < 0:
        text = (f"the data holds token id {top}, outside the target's vocabulary ({target.vocab_size}): the data did not "
                "come from this target (another tokenizer)")
        return WiringReport(findings=tuple(findings), data=summary, conclusion=text, verdict="mismatch", **base)
    if any(f.code == "data_width" for f in findings):
        return WiringReport(findings=tuple(findings), data=summary, conclusion="the data directory mixes widths", verdict="mismatch", **base)
    candidates, aux, final = _stack_tokens(samples, hidden_states_fn)
    matches = match_slots(aux, candidates, h, tol=tol)
    final_rep = _final_state(final, candidates, tol)
    if final_rep is not None and not final_rep.matches:
        findings.append(Finding("warning", "hidden_state", f"the data's final hidden_state does not equal the target's last "
                                f"(normed) state (similarity {final_rep.similarity:.4f}; closest hs[{final_rep.best_hf_index}])",
                                "the training targets were computed from another state or model", code="final_state"))
    return _conclude(ck, base, findings, summary, matches, final_rep, target)


def _final_state(final: torch.Tensor | None, candidates: list[torch.Tensor], tol: Tolerance) -> FinalStateReport | None:
    if final is None:
        return None
    last = score(final, candidates[-1], len(candidates) - 1)
    best = max((score(final, c, i) for i, c in enumerate(candidates)), key=lambda s: s.similarity)
    ok = last.similarity >= tol.min_similarity and last.rel_error <= tol.max_rel_error
    return FinalStateReport(last.similarity, last.rel_error, ok, best.label)


def _conclude(
    ck: DraftCheckpoint, base: dict, findings: list[Finding], summary: DataSummary, matches: list[SlotMatch],
    final_rep: FinalStateReport | None, target: TargetShape,
) -> WiringReport:
    serving_taps = next(t for t in base["engines"] if t.engine == base["serving"])
    slots = tuple(_slot_report(m, serving_taps.hf_indices) for m in matches)
    common = dict(findings=tuple(findings), data=summary, slots=slots, final_state=final_rep, **base)
    if any(m.matched is None for m in matches):
        return WiringReport(conclusion=_no_match_text(matches, final_rep), verdict="mismatch", **common)
    expected = tuple(m.matched for m in matches)  # type: ignore[misc]
    expected_ids = {"sglang": list(hf_indices_to_ids(expected, "sglang")), "vllm": list(hf_indices_to_ids(expected, "vllm"))}
    fixes = _fixes(ck, base, expected, expected_ids, target)
    wired = all(s.verdict == "ok" for s in slots) and len(serving_taps.hf_indices) == len(slots)
    errors = [f for f in findings if f.severity == "error"]
    verdict = "ok" if wired and not errors and serving_taps.graph_hf_indices in (None, serving_taps.hf_indices) else "mismatch"
    text = _conclusion_text(base, serving_taps, expected, expected_ids, verdict, errors, wired)
    return WiringReport(expected_hf_indices=expected, expected_ids=expected_ids, fixes=tuple(fixes),
                        conclusion=text, verdict=verdict, **common)


def _slot_report(m: SlotMatch, tapped: tuple[int, ...]) -> SlotReport:
    config = tapped[m.slot] if m.slot < len(tapped) else None
    if m.matched is None:
        verdict = "no layer matches"
    elif config is None:
        verdict = "not tapped"
    else:
        verdict = "ok" if config == m.matched else "wrong layer"
    ru = m.runner_up
    return SlotReport(m.slot, m.matched, m.best.similarity, m.best.rel_error, m.best.label,
                      ru.label if ru else None, m.margin, config, verdict)


def _no_match_text(matches: list[SlotMatch], final_rep: FinalStateReport | None) -> str:
    missing = [m for m in matches if m.matched is None]
    detail = ", ".join(f"slot {m.slot}: closest hs[{m.best.label}] similarity {m.best.similarity:.4f}, "
                       f"rel. error {m.best.rel_error:.3f}" for m in missing)
    text = (f"no layer of this target reproduces {len(missing)} of {len(matches)} data slot(s) ({detail}): the data did not come "
            "from this target (another model, other weights, or a different dtype/precision)")
    if final_rep is not None and not final_rep.matches:
        text += "; the stored final hidden_state does not match either"
    return text


def _conclusion_text(base: dict, taps: EngineTaps, expected: tuple[int, ...], expected_ids: dict, verdict: str,
                     errors: list[Finding], wired: bool) -> str:
    data_part = f"the data's aux slots are hs{list(expected)} (SGLang ids {expected_ids['sglang']}, vLLM ids {expected_ids['vllm']})"
    engine_part = f"{base['serving']} taps hs{list(taps.hf_indices)} with this config"
    if verdict == "ok":
        return f"wiring right: {data_part}; {engine_part}"
    if list(expected) != sorted(expected):
        return (f"{data_part}, not in layer order: serving engines concatenate in layer order, so no config reproduces it; "
                f"permute fc.weight's input blocks (see fixes) or recapture the data")
    if not wired:
        return f"wiring wrong: {data_part}, but {engine_part}"
    if taps.graph_hf_indices not in (None, taps.hf_indices):
        return f"wiring wrong in CUDA graphs: {data_part}; eager runs tap them but graph replays tap hs{list(taps.graph_hf_indices)}"
    return f"the taps match the data, but the drafter has {len(errors)} error(s): " + "; ".join(f.message for f in errors[:3])


def _fixes(ck: DraftCheckpoint, base: dict, expected: tuple[int, ...], expected_ids: dict, target: TargetShape) -> list[Fix]:
    serving = base["serving"]
    conv = "sglang" if serving == "sglang" else "vllm"
    fixes: list[Fix] = []
    not_tappable = [i for i in expected if i not in tappable_hf_range(target.num_layers)]
    if not_tappable:
        return [Fix("(serving engine)", "aux taps", None, list(expected), f"hs{not_tappable} is the target's final normed "
                    "state, which no serving engine taps: the drafter cannot be served as trained")]
    sorted_ids = list(hf_indices_to_ids(sorted(expected), conv))
    if list(expected) != sorted(expected):
        order = sorted(range(len(expected)), key=lambda s: expected[s])
        fixes.append(Fix(str(ck.config_file.parent / "model.safetensors"), "fc.weight", "input blocks in data order",
                         f"input blocks reordered to slots {order}", "engines concatenate aux states in layer order"))
    field_name = IDS_FIELDS_READ[serving][0]  # the field the engine reads first decides alone
    current = _current_value(ck, field_name)
    if current != sorted_ids:
        reason = f"{serving} reads this field first and counts ids in the {conv} convention"
        fixes.append(Fix(str(ck.config_file), field_name, current, sorted_ids, reason))
    return fixes


def _current_value(ck: DraftCheckpoint, field_name: str) -> Any:
    if field_name == IDS_FIELD_TOP:
        return ck.raw_config.get(IDS_FIELD_TOP)
    assert field_name == IDS_FIELD_EAGLE_CONFIG
    return (ck.raw_config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")


# ======================================================================================================
# live check
# ======================================================================================================


@dataclass(frozen=True)
class LiveSlot:
    data_slot: int
    engine_slot: int | None  # the engine slot that reproduces this data slot
    similarity: float  # best similarity (even without a match)
    rel_error: float
    verdict: str  # "ok" | "wrong slot" | "no engine slot matches"


@dataclass(frozen=True)
class LiveReport:
    """What a running engine feeds the drafter, against the training data for the same tokens."""

    verdict: str  # "ok" | "mismatch"
    data_slots: int
    engine_slots: int
    slots: tuple[LiveSlot, ...]
    samples: int
    tokens: int
    conclusion: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def live_check(
    engine_taps_fn: TapsFn,
    data_dir: str | Path,
    *,
    hidden_size: int | None = None,
    max_samples: int = 8,
    max_tokens: int = 64,
    tol: Tolerance = Tolerance(),
) -> LiveReport:
    """Feed the data's tokens to ``engine_taps_fn`` ([1, T] -> [1, T, m*H], what the engine gives
    the drafter) and match every data slot to the engine slot that reproduces it.

    The wiring is right when the engine gives as many slots as the data holds and slot i of the
    data equals slot i of the engine for every i. ``hidden_size`` defaults to the data's
    ``hidden_state`` width.
    """
    samples = load_samples(data_dir, max_samples=max_samples, max_tokens=max_tokens)
    h = hidden_size or (samples[0].hidden_state.shape[-1] if samples[0].hidden_state is not None else None)
    assert h is not None, "the data has no hidden_state: pass hidden_size"
    with torch.inference_mode():
        fed = torch.cat([engine_taps_fn(s.input_ids[None])[0].float() for s in samples])  # [N, m*H]
    aux = torch.cat([s.aux_hidden_state[0].float() for s in samples])  # [N, n*H]
    n, m = aux.shape[-1] // h, fed.shape[-1] // h
    matches = match_slots(aux, list(fed.split(h, dim=-1)), h, tol=tol)
    slots = tuple(_live_slot(x) for x in matches)
    ok = n == m and all(s.verdict == "ok" for s in slots)
    return LiveReport("ok" if ok else "mismatch", n, m, slots, len(samples), aux.shape[0], _live_text(slots, n, m, ok))


def _live_slot(x: SlotMatch) -> LiveSlot:
    if x.matched is None:
        verdict = "no engine slot matches"
    else:
        verdict = "ok" if x.matched == x.slot else "wrong slot"
    return LiveSlot(x.slot, x.matched, x.best.similarity, x.best.rel_error, verdict)


def _live_text(slots: tuple[LiveSlot, ...], n: int, m: int, ok: bool) -> str:
    if ok:
        return f"the engine feeds the drafter exactly the {n} states it was trained on, in order"
    parts = []
    if n != m:
        parts.append(f"the engine feeds {m} states, the data holds {n}")
    for s in slots:
        if s.verdict == "wrong slot":
            parts.append(f"data slot {s.data_slot} arrives in engine slot {s.engine_slot}")
        elif s.verdict != "ok":
            parts.append(f"data slot {s.data_slot} is in no engine slot (best similarity {s.similarity:.4f})")
    return "live wiring wrong: " + "; ".join(parts)
