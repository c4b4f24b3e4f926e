"""The report of ``eaglelab bench`` as plain data: the headline figures (batch 1 against the HF peer and the
weight-bandwidth bound, verify/decode ratios, speculative speedups) and the JSON document ``--json`` writes."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from eaglelab.bench.harness import SCHEMA, BenchRow, baseline_name, hardware
from eaglelab.bench.micro import MicroRow


DISAGREE = 0.10  # passes whose ratios differ by more than this (max / min - 1) give no headline ratio


def bench_report(setup: Any, rows: list[BenchRow], micro: list[MicroRow], captures: dict[str, Any],
                 hbm_tbps: float, micro_context: int, scale_model: str | None, baseline: str | None = None,
                 loads: dict[str, Any] | None = None, configs: list[Any] = (),
                 headline_only: bool = False) -> dict[str, Any]:
    """The whole report of what is measured so far (``setup``: a :class:`~eaglelab.bench.setup.BenchSetup`;
    ``baseline``: the plain configuration speedups read against when it ran; ``loads``: the machine's load at the
    start and the end, :class:`~eaglelab.bench.timing.MachineLoad` or None)."""
    ctx = setup.ctx
    loads = {k: v for k, v in (loads or {}).items()}
    head = headline(rows, micro, setup.weight_bytes, hbm_tbps, baseline)
    head["warnings"] = trust_warnings(rows, loads, head["baseline"])
    trees = {b: ctx.spec_at(b).to_dict() for b in ctx.batch_sizes} if ctx.spec is not None else {}
    return {
        "schema": SCHEMA,
        "hardware": hardware(ctx.device, next(ctx.target.parameters()).dtype),
        "settings": {
            "model": setup.model, "scale_model": scale_model, "spec": ctx.spec.to_dict(),
            "batch_sizes": list(ctx.batch_sizes), "prompts": len(ctx.prompts), "max_new_tokens": ctx.max_new_tokens,
            "repeats": ctx.repeats, "static_cache_slots": ctx.max_len, "micro_context": micro_context,
            "continuous": ctx.continuous, "refill_rows": {b: ctx.refill_at(b) for b in ctx.batch_sizes},
            "eos_token_ids": list(ctx.eos_token_ids),
            "device_reason": setup.device_reason, "dtype_reason": setup.dtype_reason,
            "speedup_baseline": baseline_name(rows, baseline), "trees": trees,
            "measured": "the headline" if headline_only else "the configurations named" if configs else "none",
            "configs": [c.name for c in configs], "regime": setup.regime.label if setup.regime is not None else None,
            "load": {k: (asdict(v) | {"other_per_core": v.other_per_core}) if v is not None else None
                     for k, v in loads.items()},
        },
        "notes": list(setup.notes),
        "rows": [asdict(r) for r in rows],
        "micro": [asdict(m) for m in micro],
        "captures": captures,
        "not_run": not_run(rows),
        "headline": head,
        **({"gemv_tilings": gemv_tilings(ctx.gemv)} if ctx.gemv is not None else {}),
        **({"gemv_tilings_pdl": gemv_tilings(ctx.gemv_pdl)} if ctx.gemv_pdl is not None else {}),
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


def not_run(rows: list[BenchRow]) -> dict[str, str]:
    """Each configuration that could not run here, once, with why (its rows at every batch size say the same)."""
    return {r.config: r.skipped for r in rows if r.skipped is not None}


def trust_warnings(rows: list[BenchRow], loads: dict[str, Any], base: str | None) -> list[str]:
    """Why the headline ratios are not to be trusted, if they are not: passes of a configuration whose ratios to the
    baseline disagree by more than :data:`DISAGREE`, or other work loading the machine at the start or the end."""
    out = []
    for r in rows:
        p = r.pass_speedups
        if r.config != base and len(p) > 1 and min(p) > 0 and max(p) / min(p) - 1 > DISAGREE:
            out.append(f"{r.config} at batch {r.batch}: its passes read {min(p):.2f}x .. {max(p):.2f}x over {base} "
                       f"({max(p) / min(p) - 1:.0%} apart, more than {DISAGREE:.0%})")
    for when, load in loads.items():
        if load is not None and load.busy:
            out.append(f"the machine was busy at the {when}: {load.describe()}")
    return out


def headline(rows: list[BenchRow], micro: list[MicroRow], weight_bytes: int, hbm_tbps: float,
             prefer: str | None = None) -> dict[str, Any]:
    """The figures the issue asks for, at batch 1 (and the speedup per batch size, with its spread over passes)."""
    by = {(r.config, r.batch): r for r in rows if r.skipped is None}
    base = baseline_name(rows, prefer)
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
    spec = list(dict.fromkeys(r.config for r in rows if r.config.startswith("spec") and r.speedup))
    h["spec_speedup"] = {c: {r.batch: r.speedup for r in rows if r.config == c and r.speedup is not None}
                         for c in spec}
    h["spec_speedup_passes"] = {c: {r.batch: {"passes": len(r.pass_speedups), "min": min(r.pass_speedups),
                                              "max": max(r.pass_speedups)}
                                    for r in rows if r.config == c and r.pass_speedups}
                                for c in spec}
    h["spec_speedup_spread"] = {c: {r.batch: _spread(r) for r in rows if r.config == c and len(r.group_speedups) > 1}
                                for c in h["spec_speedup"]}
    return h


def _spread(r: BenchRow) -> dict[str, Any]:
    """A speculative row's group-by-group speedups (min, median, max) and its interval over the prompts drawn."""
    return {"groups": len(r.group_speedups), "min": min(r.group_speedups),
            "median": statistics.median(r.group_speedups), "max": max(r.group_speedups),
            "interval": list(r.speedup_interval) if r.speedup_interval else None}


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
