"""The report of ``eaglelab bench`` as plain data: the headline figures (batch 1 against the HF peer and the
weight-bandwidth bound, verify/decode ratios, speculative speedups) and the JSON document ``--json`` writes."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from eaglelab.bench.configs import CONFIGS
from eaglelab.bench.harness import SCHEMA, BenchRow, baseline_name, hardware
from eaglelab.bench.micro import MicroRow


def bench_report(setup: Any, rows: list[BenchRow], micro: list[MicroRow], captures: dict[str, Any],
                 hbm_tbps: float, micro_context: int, scale_model: str | None) -> dict[str, Any]:
    """The whole report of what is measured so far (``setup``: a :class:`~eaglelab.bench.setup.BenchSetup`)."""
    ctx = setup.ctx
    return {
        "schema": SCHEMA,
        "hardware": hardware(ctx.device, next(ctx.target.parameters()).dtype),
        "settings": {
            "model": setup.model, "scale_model": scale_model, "spec": ctx.spec.to_dict(),
            "batch_sizes": list(ctx.batch_sizes), "prompts": len(ctx.prompts), "max_new_tokens": ctx.max_new_tokens,
            "repeats": ctx.repeats, "static_cache_slots": ctx.max_len, "micro_context": micro_context,
            "device_reason": setup.device_reason, "dtype_reason": setup.dtype_reason,
            "speedup_baseline": baseline_name(rows),
        },
        "notes": list(setup.notes),
        "rows": [asdict(r) for r in rows],
        "micro": [asdict(m) for m in micro],
        "captures": captures,
        "headline": headline(rows, micro, setup.weight_bytes, hbm_tbps),
        **({"gemv_tilings": gemv_tilings(ctx.gemv)} if ctx.gemv is not None else {}),
        **({"decode_attention": decode_attention_state(ctx.attention)} if ctx.attention is not None else {}),
    }


def gemv_tilings(gemv: Any) -> dict[str, Any]:
    """The Triton GEMV's state: why it is off (if it is), tuning time, the tiling chosen per shape."""
    from eaglelab.engine.model.gemv import describe

    return {"reason": gemv.reason, "tune_seconds": gemv.setup_seconds,
            "chosen": [{"n": n, "k": k, "rows_bucket": m, "choice": describe(cfg), **cfg._asdict()}
                       for (n, k, m), cfg in gemv.chosen.items()]}


def decode_attention_state(attention: Any) -> dict[str, Any]:
    """The Triton decode attention's state: why it is off (if it is), checking time, the shapes checked."""
    return {"reason": attention.reason, "check_seconds": attention.setup_seconds, "sms": attention.sms,
            "checked": [{"query_rows": t, "head_dim": d, "group": g} for t, d, g in sorted(attention.checked)]}


def headline(rows: list[BenchRow], micro: list[MicroRow], weight_bytes: int, hbm_tbps: float) -> dict[str, Any]:
    """The figures the issue asks for, at batch 1 (and the speedup per batch size)."""
    by = {(r.config, r.batch): r for r in rows if r.skipped is None}
    base = baseline_name(rows)
    h: dict[str, Any] = {"baseline": base}
    plain = by.get((base, 1)) if base else None
    hf = by.get(("hf", 1))
    if plain and hf and hf.tok_per_s:
        h["plain_vs_hf_batch1"] = {"ours": plain.tok_per_s, "hf": hf.tok_per_s, "ratio": plain.tok_per_s / hf.tok_per_s}
    bound = hbm_tbps * 1e12 / weight_bytes if weight_bytes else None
    if plain and bound:
        step = 1000.0 / plain.decode_ms if plain.decode_ms else None
        h["bandwidth_bound_batch1"] = {"weight_bytes": weight_bytes, "hbm_tbps": hbm_tbps, "bound_tok_per_s": bound,
                                       "ours_tok_per_s": plain.tok_per_s, "fraction": plain.tok_per_s / bound,
                                       "decode_step_tok_per_s": step, "decode_step_fraction": step / bound if step else None,
                                       "plain_configs": _bound_fractions(rows, bound)}
    h["verify_over_decode_batch1"] = _micro_ratios(micro, 1)
    h["spec_speedup"] = {c: {r.batch: r.speedup for r in rows if r.config == c and r.speedup is not None}
                         for c in CONFIGS if c.startswith("spec") and any(r.config == c and r.speedup for r in rows)}
    h["spec_speedup_spread"] = {c: {r.batch: {"groups": len(r.group_speedups), "min": min(r.group_speedups),
                                              "median": statistics.median(r.group_speedups), "max": max(r.group_speedups)}
                                    for r in rows if r.config == c and len(r.group_speedups) > 1}
                                for c in h["spec_speedup"]}
    return h


def _bound_fractions(rows: list[BenchRow], bound: float) -> dict[str, dict[str, float | None]]:
    """Every plain configuration at batch 1 as a share of the weight-bandwidth bound (end to end, and
    per decode step), so compile and GEMV variants read against the bound in one run."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        if r.batch == 1 and r.skipped is None and r.config.startswith("plain") and r.tok_per_s:
            step = 1000.0 / r.decode_ms if r.decode_ms else None
            out[r.config] = {"tok_per_s": r.tok_per_s, "fraction": r.tok_per_s / bound,
                             "decode_step_tok_per_s": step, "decode_step_fraction": step / bound if step else None}
    return out


def _micro_ratios(micro: list[MicroRow], batch: int) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for m in micro:
        if m.batch == batch and m.tokens > 1 and m.over_decode is not None:
            key = f"{m.attention_mode}-{'graphs' if m.graphs else 'eager'}"
            out.setdefault(key, {})[m.tokens] = m.over_decode
    return out
