"""``eaglelab tune``: the fastest (steps, topk, draft tokens) for a drafter on this hardware,
predicted from one measuring pass and confirmed by real runs.

The measuring pass records the drafter's acceptance on a wide tree (per depth and sibling rank)
and the phase costs per batch size; the model (``eaglelab.probes.tuning``) predicts every grid
point; the best few and plain decoding then run for real, predicted against measured.
``--from RECORD`` predicts from a record such a pass wrote (``--record``), running nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

GPU = {"steps": "1,2,3,4,5,6", "topk": "1,2,4,8", "draft_tokens": "2,3,4,5,6,7,8,10,12,16",
       "batch_sizes": "1,8,32", "prompts": 16, "max_new_tokens": 128, "cost_tokens": 32}
CPU = {"steps": "1,2,3,4,5", "topk": "1,2,4", "draft_tokens": "2,3,4,5,6,8",
       "batch_sizes": "1", "prompts": 4, "max_new_tokens": 48, "cost_tokens": 16}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="predict and confirm the fastest speculative settings for a drafter",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf file")
    m.add_argument("--draft", default="default", help="default | PATH of an EAGLE-3 drafter")
    m.add_argument("--serving", choices=("sglang", "vllm"), default=None, help="aux-id convention for the drafter")
    m.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    m.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16")
    g = p.add_argument_group("grid (defaults: CUDA / CPU)")
    g.add_argument("--steps", default=None, help=f"draft steps tried (default {GPU['steps']} / {CPU['steps']})")
    g.add_argument("--topk", default=None, help=f"topk tried (default {GPU['topk']} / {CPU['topk']})")
    g.add_argument("--draft-tokens", default=None,
                   help=f"N tried for trees; a chain verifies steps + 1 (default {GPU['draft_tokens']} / {CPU['draft_tokens']})")
    g.add_argument("--batch-sizes", default=None, help=f"(default {GPU['batch_sizes']} / {CPU['batch_sizes']})")
    w = p.add_argument_group("workload")
    w.add_argument("--questions", default=None, metavar="FILE", help="an MT-bench question.jsonl (default: the packaged one)")
    w.add_argument("--prompts", type=int, default=None, help=f"questions used (default {GPU['prompts']} / {CPU['prompts']})")
    w.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens per row, EOS ignored (default {GPU['max_new_tokens']} / {CPU['max_new_tokens']})")
    w.add_argument("--max-prompt-tokens", type=int, default=512, help="cut longer prompts")
    w.add_argument("--cost-tokens", type=int, default=None, help="tokens per row in each cost run")
    w.add_argument("--confirm", type=int, default=3, help="best predictions run for real per batch size (0: none)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="measure CUDA graphs of torch.compile'd phases, as bench's *-compile configs (CUDA only; "
                        "the first run compiles, cached on disk; the verify micro-measure stays uncompiled)")
    o = p.add_argument_group("input and output")
    o.add_argument("--from", dest="from_record", default=None, metavar="RECORD",
                   help="predict from a record written by `eaglelab tune --record`, running nothing")
    o.add_argument("--record", default=None, metavar="FILE", help="write the measuring pass as a run record")
    o.add_argument("--top", type=int, default=8, help="predictions shown per batch size")
    o.add_argument("--json", default=None, metavar="OUT", help="write every prediction (and the measurements) as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    import sys

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # tables stay whole in a pipe
    if args.from_record:
        report = _from_record(args)
    else:
        report = _measure_and_confirm(args, console)
    _print(console, report)
    if args.json:
        from eaglelab.bench.harness import write_json

        write_json(args.json, report)
        console.print(f"[dim]wrote {args.json}[/]")
    return 0


# ---- inputs -----------------------------------------------------------------------------------
def _ints(text: str, field: str, least: int = 1) -> tuple[int, ...]:
    from eaglelab.engine.errors import EagleLabError

    try:
        vals = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise EagleLabError("expected a comma list of integers", field=field, found=text) from None
    if not vals or vals[0] < least:
        raise EagleLabError(f"values must be >= {least}", field=field, found=text)
    return vals


def _settings(args, cuda: bool):
    from eaglelab.bench.tune import TuneSettings
    from eaglelab.engine.errors import EagleLabError

    d = GPU if cuda else CPU
    for name in ("max_new_tokens", "cost_tokens", "prompts"):
        value = getattr(args, name)
        if value is not None and value < 2:
            raise EagleLabError("must be >= 2", field="--" + name.replace("_", "-"), found=value)
    if args.confirm < 0:
        raise EagleLabError("must be >= 0", field="--confirm", found=args.confirm)
    return TuneSettings(
        steps=_ints(args.steps or d["steps"], "--steps"), topks=_ints(args.topk or d["topk"], "--topk"),
        draft_tokens=_ints(args.draft_tokens or d["draft_tokens"], "--draft-tokens", least=2),
        batch_sizes=_ints(args.batch_sizes or d["batch_sizes"], "--batch-sizes"),
        new_tokens=args.max_new_tokens or d["max_new_tokens"], cost_tokens=args.cost_tokens or d["cost_tokens"],
        confirm=args.confirm, compile=args.compile and cuda,
    ), (args.prompts or d["prompts"])


def _context(args, settings, n_prompts: int, log=lambda m: None):
    """Target, drafter and prompts, as the bench loads them. -> (BenchContext, notes, model name)."""
    from eaglelab.bench import harness as H
    from eaglelab.cmd_bench import _drafter_factory
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.session import add_engine_args, build_session

    # The session's own flags, parsed (not a forged Namespace): a flag added there gets its default here too.
    engine_flags = argparse.ArgumentParser(add_help=False)
    add_engine_args(engine_flags)
    ns = engine_flags.parse_args(
        ["--model", args.model, "--device", args.device, "--dtype", args.dtype, "--seed", str(args.seed),
         "--max-new-tokens", str(settings.new_tokens), "--draft", args.draft, "--no-cuda-graphs", "--no-compile"]
        + (["--serving", args.serving] if args.serving else []))
    if args.draft in ("ngram", "none"):
        raise EagleLabError("tune measures a tree drafter", field="--draft", found=args.draft,
                            expected="default | PATH of an EAGLE-3 drafter")
    s = build_session(ns, log=lambda m: None)
    if not isinstance(s.drafter, Eagle3Drafter):
        raise EagleLabError("tune measures a tree drafter, and no EAGLE-3 drafter ships for this model",
                            field="--draft", found=args.draft, hint="pass --draft PATH of an EAGLE-3 drafter")
    texts = H.mtbench_first_turns(n_prompts, args.questions)
    target = s.target
    prompts, how = H.tokenize_prompts(texts, target.tokenizer, target.config.vocab_size, args.max_prompt_tokens)
    ctx = H.BenchContext(target=target.model, spec=s.spec, make_drafter=_drafter_factory(s.drafter), prompts=prompts,
                         max_new_tokens=settings.new_tokens, batch_sizes=settings.batch_sizes, log=log)
    notes = list(s.notes) + [f"prompts: {len(prompts)} MT-bench first turns, {how}; "
                             f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens",
                             f"generation: {settings.new_tokens} tokens per row, EOS ignored, greedy"]
    if args.compile and not settings.compile:
        notes.append("--compile: ignored on CPU (it compiles the phases of CUDA graphs)")
    elif settings.compile:
        notes.append("phases: CUDA graphs of torch.compile'd phases (the verify micro-measure: uncompiled graphs)")
    return ctx, notes, f"{target.name} ({target.config.num_layers} layers)", _draft_path(args)


# ---- the live pass ------------------------------------------------------------------------------
def _measure_and_confirm(args, console) -> dict[str, Any]:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from eaglelab.bench import harness as H
    from eaglelab.bench import tune as TP
    from eaglelab.probes.bus import ProbeBus
    from eaglelab.probes.events import PhaseCost, Step

    torch.manual_seed(args.seed)
    from eaglelab.session import _pick_device

    device, _ = _pick_device(args.device)
    settings, n_prompts = _settings(args, device.type == "cuda")
    ctx, notes, model, draft_path = _context(args, settings, n_prompts, log=lambda m: console.print(f"[dim]{m}[/]"))
    bus, steps, costs = ProbeBus(aggregate=False), [], []
    bus.subscribe(lambda e: steps.append(e) if isinstance(e, Step) else costs.append(e) if isinstance(e, PhaseCost) else None)
    close = _record_sink(bus, args.record)
    wide = settings.wide
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*cols, console=console, transient=True) as bar:
            task = bar.add_task(f"acceptance: wide tree, {wide.num_steps} steps, topk {wide.topk}, "
                                f"{wide.draft_tokens} tokens", total=None)
            TP.acceptance_run(ctx, settings, bus, model, lambda done, total: bar.update(task, completed=done, total=total))
            pairs = [(s, k) for k in settings.topks for s in settings.steps]
            task = bar.add_task("phase costs", total=2 * len(settings.batch_sizes) + len(pairs))
            prefill = {}
            for b in settings.batch_sizes:
                prefill[b] = TP.plain_costs(ctx, settings, b, bus.publish)
                bar.advance(task)
                TP.verify_costs(ctx, settings, b, bus.publish)
                bar.advance(task)
            for s, k in pairs:
                TP.draft_costs(ctx, settings, s, k, bus.publish, prefill)
                bar.advance(task)
    finally:
        close()
    report = _predict(steps, costs, settings.steps, settings.topks, settings.draft_tokens, args.top)
    report.update(model=model, notes=notes, hardware=H.hardware(ctx.device, next(ctx.target.parameters()).dtype),
                  settings=_settings_dict(settings, len(ctx.prompts)), record=args.record, draft_path=draft_path)
    report["confirmation"] = _confirm(ctx, settings, report, console) if settings.confirm else []
    return report


def _draft_path(args) -> str:
    from eaglelab.session import shipped_drafter_dir

    shipped = shipped_drafter_dir()
    return str(shipped) if args.draft == "default" and shipped is not None else str(args.draft)


def _record_sink(bus, path: str | None):
    if not path:
        return lambda: None
    from eaglelab.probes.record import RecordWriter

    writer = RecordWriter(path)
    bus.subscribe(writer)
    return writer.close


def _settings_dict(settings, prompts: int) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(settings)
    d.update(prompts=prompts, wide_tree=settings.wide.to_dict())
    return d


def _confirm(ctx, settings, report, console) -> list[dict[str, Any]]:
    """Run the best predictions and plain decoding for real; predicted end to end against measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from eaglelab.bench import tune as TP
    from eaglelab.probes.tuning import Prediction, plain_end_to_end_tok_per_s

    out = []
    jobs = [(b, p) for b in settings.batch_sizes
            for p in [None] + report["predictions"][str(b)][: settings.confirm]]
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, transient=True) as bar:
        task = bar.add_task("confirming: real runs", total=len(jobs))
        for b, p in jobs:
            costs = report["costs"][str(b)]
            config = None if p is None else (p["steps"], p["topk"], p["draft_tokens"])
            got = TP.confirm_run(ctx, settings, config, b)
            if p is None:
                pred_tps, pred_a = plain_end_to_end_tok_per_s(_costs_obj(costs), settings.new_tokens), None
            else:
                pred = Prediction(**{k: p[k] for k in Prediction.__dataclass_fields__})
                pred_tps = pred.end_to_end_tok_per_s(settings.new_tokens, costs["prefill_ms"] + costs["begin_ms"])
                pred_a = pred.accept_len
            out.append(dict(batch=b, steps=got.steps, topk=got.topk, draft_tokens=got.draft_tokens,
                            predicted_tok_per_s=pred_tps, measured_tok_per_s=got.tok_per_s,
                            predicted_accept_len=pred_a, measured_accept_len=got.accept_len))
            bar.advance(task)
    return out


def _costs_obj(d: dict[str, Any]):
    from eaglelab.probes.tuning import PhaseCosts

    return PhaseCosts(batch=d["batch"], decode_ms=d["decode_ms"], verify_ms={}, draft_ms={}, extend_ms={},
                      accept_ms={}, prefill_ms=d["prefill_ms"], begin_ms=d["begin_ms"])


# ---- from a record ------------------------------------------------------------------------------
def _from_record(args) -> dict[str, Any]:
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.events import PhaseCost, RunStarted, Step
    from eaglelab.probes.record import read_record

    result = read_record(args.from_record)
    steps = [e for e in result.events if isinstance(e, Step)]
    costs = [e for e in result.events if isinstance(e, PhaseCost)]
    if not any(s.kind == "spec" and s.accepted_ranks for s in steps):
        raise EagleLabError("no speculative cycle with accepted ranks in this record", file=args.from_record,
                            expected="a record of a wide-tree run by this eaglelab (eaglelab tune --record FILE)")
    table = _table(steps)
    started = next((e for e in result.events if isinstance(e, RunStarted)), None)
    wide = started.spec if started else {}
    depth, width = int(wide.get("num_steps", table.max_depth)), int(wide.get("topk", table.max_rank))
    grid_steps = _ints(args.steps, "--steps") if args.steps else tuple(range(1, depth + 1))
    grid_topk = _ints(args.topk, "--topk") if args.topk else tuple(k for k in (1, 2, 4, 8) if k <= width)
    grid_n = _ints(args.draft_tokens or GPU["draft_tokens"], "--draft-tokens", least=2)
    if costs:
        grid_steps = tuple(sorted({e.steps for e in costs if e.phase == "draft"} & set(grid_steps)))
        grid_topk = tuple(sorted({e.topk for e in costs if e.phase == "draft"} & set(grid_topk)))
        grid_n = tuple(sorted({e.tokens for e in costs if e.phase == "verify"} & set(grid_n)))
    report = _predict(steps, costs, grid_steps, grid_topk, grid_n, args.top)
    report.update(model=started.model if started else "?", record=args.from_record, confirmation=[],
                  hardware={"device": started.device if started else "?", "dtype": started.dtype if started else "?"},
                  notes=[f"from the record {args.from_record}: nothing was run"]
                  + ([] if costs else ["no phase costs in this record (only `eaglelab tune --record` writes them): "
                                       "ranked by expected accepted length alone"]))
    return report


def _table(steps):
    from eaglelab.probes.tuning import table_from_steps

    return table_from_steps(steps).table()


# ---- the model's side -------------------------------------------------------------------------
def _predict(steps, costs, grid_steps, grid_topk, grid_n, top: int) -> dict[str, Any]:
    """The acceptance table, costs and ranked predictions, as plain data."""
    from dataclasses import asdict

    from eaglelab.probes import tuning as T

    counts = T.table_from_steps(steps)
    table = counts.table()
    configs = [c for c in T.grid_configs(grid_steps, grid_topk, grid_n) if c[0] <= max(table.max_depth, 1)]
    by_batch = T.costs_from_events(costs)
    preds = {str(b): [dict(asdict(p), cycle_ms=p.cycle_ms, tok_per_s=p.tok_per_s, speedup=p.speedup,
                           break_even_accept_len=p.break_even_accept_len, plain_tok_per_s=p.plain_tok_per_s)
                      for p in T.rank_configs(table, c, configs)]
             for b, c in by_batch.items()}
    by_len = [dict(steps=c[0], topk=c[1], draft_tokens=c[2], accept_len=a) for c, a in T.rank_by_accept_len(table, configs)]
    return {
        "schema": "eaglelab.tune/1",
        "acceptance": {"rates": [list(r) for r in table.rates], "offered": list(table.offered),
                       "row_cycles": counts.row_cycles, "wide_mean_accept_len": counts.mean_accept_len},
        "costs": {str(b): {"batch": b, "decode_ms": c.decode_ms, "prefill_ms": c.prefill_ms, "begin_ms": c.begin_ms,
                           "verify_ms": {str(n): v for n, v in sorted(c.verify_ms.items())},
                           "draft_ms": {f"{s},{k}": v for (s, k), v in sorted(c.draft_ms.items())},
                           "extend_ms": {f"{s},{k}": v for (s, k), v in sorted(c.extend_ms.items())},
                           "accept_ms": {f"{s},{k}": v for (s, k), v in sorted(c.accept_ms.items())}}
                  for b, c in by_batch.items()},
        "predictions": preds,
        "by_accept_len": by_len,
        "shown": top,
    }


# ---- printing ---------------------------------------------------------------------------------
def _print(console, report) -> None:
    from eaglelab.probes.tuning import sglang_flags, vllm_speculative_config

    hw = report["hardware"]
    where = hw.get("gpu") or hw.get("cpu") or ""
    where = f" ({where})" if where else ""
    console.print(f"[bold]eaglelab tune[/]  {report['model']}  on {hw['device']}{where}, {hw['dtype']}")
    for n in report.get("notes", []):
        console.print(f"[dim]  {n}[/]")
    _show(console, _acceptance_table(report["acceptance"]))
    if report["predictions"]:
        for b, preds in report["predictions"].items():
            _show(console, _prediction_table(b, preds[: report["shown"]]))
    else:
        _show(console, _by_len_table(report["by_accept_len"][: report["shown"]]))
    if report.get("confirmation"):
        _show(console, _confirm_table(report["confirmation"]))
    best = _winner(report)
    if best is None:
        return
    s, k, n = best
    console.print(f"[bold]winner[/]: {s} step{'s' if s != 1 else ''}, topk {k}, {n} draft tokens")
    path = report.get("draft_path") or "DRAFTER"
    console.print(f"  SGLang: {sglang_flags(s, k, n, path)}")
    chain = _best_chain(report)
    if chain is not None:
        plural = "s" if chain != 1 else ""
        note = "" if k == 1 else f"  [dim](vLLM's EAGLE drafts a chain: the best predicted chain, {chain} step{plural})[/]"
        console.print(f"  vLLM:   {vllm_speculative_config(chain, path)}{note}")


def _winner(report) -> tuple[int, int, int] | None:
    if report["predictions"]:
        first = next(iter(report["predictions"].values()))
        return (first[0]["steps"], first[0]["topk"], first[0]["draft_tokens"]) if first else None
    rows = report["by_accept_len"]
    return (rows[0]["steps"], rows[0]["topk"], rows[0]["draft_tokens"]) if rows else None


def _best_chain(report) -> int | None:
    rows = next(iter(report["predictions"].values()), None) if report["predictions"] else report["by_accept_len"]
    chains = [r["steps"] for r in rows or [] if r["topk"] == 1]
    return chains[0] if chains else None


def _ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _show(console, table) -> None:
    console.print(f"[bold]{table.heading}[/]")
    console.print(table)


def _table_of(title: str, columns: tuple[str, ...]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="right")
    t.heading = title  # printed above the table on its own line: a title would wrap at the table's width
    return t


def _acceptance_table(acc) -> Any:
    rates = acc["rates"]
    ranks = max((len(r) for r in rates), default=0)
    mean = acc["wide_mean_accept_len"]
    head = f", mean accepted length {mean:.2f}" if mean else ""
    t = _table_of(f"acceptance on the wide tree ({acc['row_cycles']} row-cycles{head}): "
                  "P(target's token = the drafter's rank r | depth d offered)",
                  ("depth", "offered", *(f"rank {r}" for r in range(1, ranks + 1)), "any"))
    for d, (row, n) in enumerate(zip(rates, acc["offered"]), 1):
        t.add_row(str(d), str(n), *(f"{p:.1%}" for p in row), f"{sum(row):.1%}")
    return t


def _prediction_table(batch: str, preds) -> Any:
    plain = preds[0]["plain_tok_per_s"] if preds else 0.0
    t = _table_of(f"batch {batch}: best predictions (ms per cycle; plain decoding {plain:.1f} tok/s, "
                  f"{_ms(preds[0]['decode_ms'])} ms per token)" if preds else f"batch {batch}",
                  ("steps", "topk", "N", "E\\[a]", "draft", "verify", "extend", "accept", "cycle", "break-even",
                   "tok/s", "speedup"))
    for p in preds:
        t.add_row(str(p["steps"]), str(p["topk"]), str(p["draft_tokens"]), f"{p['accept_len']:.2f}",
                  _ms(p["draft_ms"]), _ms(p["verify_ms"]), _ms(p["extend_ms"]), _ms(p["accept_ms"]),
                  _ms(p["cycle_ms"]), f"{p['break_even_accept_len']:.2f}", f"{p['tok_per_s']:.1f}",
                  f"{p['speedup']:.2f}x")
    return t


def _by_len_table(rows) -> Any:
    t = _table_of("expected accepted length (no costs in the record)", ("steps", "topk", "N", "E\\[a]"))
    for r in rows:
        t.add_row(str(r["steps"]), str(r["topk"]), str(r["draft_tokens"]), f"{r['accept_len']:.2f}")
    return t


def _confirm_table(rows) -> Any:
    t = _table_of("predicted vs measured, real runs (end to end, prefill included; the same prompts)",
                  ("batch", "steps/topk/N", "E\\[a] pred", "measured", "error", "tok/s pred", "measured", "error"))
    for r in rows:
        name = "plain" if r["steps"] == 0 else f"{r['steps']}/{r['topk']}/{r['draft_tokens']}"
        a_p, a_m = r["predicted_accept_len"], r["measured_accept_len"]
        a_err = f"{(a_p - a_m) / a_m:+.1%}" if a_p is not None and a_m else "-"
        t_p, t_m = r["predicted_tok_per_s"], r["measured_tok_per_s"]
        t.add_row(str(r["batch"]), name, f"{a_p:.2f}" if a_p is not None else "-", f"{a_m:.2f}" if a_m else "-", a_err,
                  f"{t_p:.1f}", f"{t_m:.1f}", f"{(t_p - t_m) / t_m:+.1%}" if t_m else "-")
    return t

