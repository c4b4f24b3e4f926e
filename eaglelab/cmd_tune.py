"""``eaglelab tune``: the fastest (steps, topk, draft tokens) for a drafter on this hardware, in the regime
``eaglelab run`` decodes in, predicted from one measuring pass, confirmed by real runs, and saved as the device
profile that run, bench, the TUI and the pytest fixtures then use.

The measuring pass records the drafter's acceptance on a wide tree (per depth and sibling rank) and, per batch
size, plain decoding's step and each candidate tree's whole cycle in run's regime (on CUDA: graphs of compiled
phases, the one-graph cycle, our kernels as run picks them); the model (``eaglelab.probes.tuning``) predicts each
candidate; the best few and plain decoding then run for real, interleaved, predicted against measured; the fastest
measured per batch size goes into the profile. ``--from RECORD`` predicts from a record such a pass wrote
(``--record``), running nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from eaglelab.bench.tune_predict import DEFAULT_DRAFT_TOKENS
from eaglelab.flags import int_list
from eaglelab.session import add_kernel_args, add_pdl_arg

GPU = {"steps": "1,2,3,4,5,6", "topk": "1,2,4,8", "draft_tokens": DEFAULT_DRAFT_TOKENS,
       "batch_sizes": "1,8,32", "prompts": 16, "max_new_tokens": 128, "cost_tokens": 32}
CPU = {"steps": "1,2,3,4,5", "topk": "1,2,4", "draft_tokens": "2,3,4,5,6,8",
       "batch_sizes": "1", "prompts": 4, "max_new_tokens": 48, "cost_tokens": 16}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="measure, confirm and save the fastest speculative tree for a drafter here",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf file")
    m.add_argument("--draft", default="default", help="default | PATH of an EAGLE-3 drafter")
    m.add_argument("--serving", choices=("sglang", "vllm"), default=None, help="aux-id convention for the drafter")
    m.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    m.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16")
    g = p.add_argument_group("candidates (default: a few trees per batch size around the device profile's)")
    g.add_argument("--candidates", default=None, metavar="S/K/N,...",
                   help="the trees tried at every batch size, as steps/topk/draft tokens (a chain: S/1/S+1); each "
                        "compiles once per batch size on CUDA the first time")
    g.add_argument("--steps", default=None, help=f"a grid instead: draft steps (with --topk / --draft-tokens; "
                                                 f"defaults {GPU['steps']} / {CPU['steps']}); every point compiles")
    g.add_argument("--topk", default=None, help=f"a grid instead: topk (default {GPU['topk']} / {CPU['topk']})")
    g.add_argument("--draft-tokens", default=None,
                   help=f"a grid instead: N for trees; a chain verifies steps + 1 (default {GPU['draft_tokens']} / "
                        f"{CPU['draft_tokens']})")
    g.add_argument("--batch-sizes", default=None, help=f"(default {GPU['batch_sizes']} / {CPU['batch_sizes']})")
    g.add_argument("--lookup-tokens", default=None, metavar="K,...",
                   help="prompt-lookup branches measured beside each confirmed tree at every batch size (0: "
                        "none); the fastest measured may take one (default on CUDA: 16 at batch 1, 8 at 8 and more; "
                        "on a CPU none)")
    r = p.add_argument_group("regime (default: what `eaglelab run` uses on this device)")
    r.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA graphs of torch.compile'd phases (default on CUDA: on, as run; the first use of a shape "
                        "compiles, cached on disk)")
    add_kernel_args(r, "the runs measured: ")
    add_pdl_arg(r, "the runs measured, and the profile written: ", dest="bench_pdl")
    w = p.add_argument_group("workload")
    w.add_argument("--questions", default=None, metavar="FILE", help="an MT-bench question.jsonl (default: the packaged one)")
    w.add_argument("--prompts", type=int, default=None, help=f"questions used (default {GPU['prompts']} / {CPU['prompts']})")
    w.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens per row, EOS ignored (default {GPU['max_new_tokens']} / {CPU['max_new_tokens']})")
    w.add_argument("--max-prompt-tokens", type=int, default=512, help="cut longer prompts")
    w.add_argument("--cost-tokens", type=int, default=None,
                   help=f"tokens per row in the shorter of each cost's two calls (default {GPU['cost_tokens']} / "
                        f"{CPU['cost_tokens']})")
    w.add_argument("--confirm", type=int, default=2,
                   help="best predictions run for real per batch size (default 2; 0: none); with --screen the "
                        "ones compiled")
    w.add_argument("--passes", type=int, default=3, help="interleaved timed passes of the confirmation, after one "
                                                         "untimed pass (default 3)")
    w.add_argument("--screen", action=argparse.BooleanOptionalAction, default=True,
                   help="under compile, time every candidate with CUDA graphs but uncompiled first, and compile only "
                        "the best max(--confirm, 1) per batch size (default: on; --no-screen compiles every one)")
    w.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("input and output")
    o.add_argument("--from", dest="from_record", default=None, metavar="RECORD",
                   help="predict from a record written by `eaglelab tune --record`, running nothing")
    o.add_argument("--record", default=None, metavar="FILE", help="write the measuring pass as a run record")
    o.add_argument("--save", action=argparse.BooleanOptionalAction, default=True,
                   help="write the confirmed winners as this drafter's device profile in the eaglelab cache (default: "
                        "on; the drafter's own files are never touched)")
    o.add_argument("--top", type=int, default=8, help="predictions shown per batch size")
    o.add_argument("--json", default=None, metavar="OUT", help="write every prediction (and the measurements) as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    import sys

    from eaglelab.bench.timing import quiet_torch_notices

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # tables stay whole in a pipe
    if args.from_record:
        from eaglelab.bench.tune_predict import from_record

        report = from_record(args.from_record, args.steps, args.topk, args.draft_tokens or GPU["draft_tokens"], args.top)
    else:
        with quiet_torch_notices():
            report = _measure_and_confirm(args, console)
    _print(console, report)
    if args.json:
        from eaglelab.bench.harness import write_json

        write_json(args.json, report)
        console.print(f"[dim]wrote {args.json}[/]")
    return 0


# ---- inputs -----------------------------------------------------------------------------------
def parse_candidates(text: str) -> tuple[tuple[int, int, int], ...]:
    """``"3/1/4,5/4/24"`` -> ((3, 1, 4), (5, 4, 24)), each checked (a user error names the one that is not a tree)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.tuning import max_draft_tokens

    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            s, k, n = (int(x) for x in item.split("/"))
        except ValueError:
            raise EagleLabError("not a tree", field="--candidates", found=item, expected="steps/topk/draft tokens, "
                                "e.g. 3/1/4 (a chain) or 5/4/24") from None
        if s < 1 or k < 1 or not 2 <= n <= max_draft_tokens(s, k) or (k == 1 and n != s + 1):
            raise EagleLabError("not a tree", field="--candidates", found=item,
                                expected=f"steps >= 1, topk >= 1, a chain S/1/S+1, a tree 2 <= N <= 1 + K + (S - 1) * K^2")
        out.append((s, k, n))
    if not out:
        raise EagleLabError("no candidate", field="--candidates", found=text, expected="e.g. 3/1/4,5/4/24")
    return tuple(sorted(set(out)))


def _flag_candidates(args, cuda: bool) -> tuple[tuple[int, ...], dict | None, tuple[int, ...] | None]:
    """The flags checked before anything loads: (batch sizes, the trees the flags name per batch size, or None for
    the defaults around the device profile's, the lookup branches --lookup-tokens names, or None for the
    defaults)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.tuning import grid_configs

    d = GPU if cuda else CPU
    for name in ("max_new_tokens", "cost_tokens", "prompts"):
        value = getattr(args, name)
        if value is not None and value < 2:
            raise EagleLabError("must be >= 2", field="--" + name.replace("_", "-"), found=value)
    if args.confirm < 0:
        raise EagleLabError("must be >= 0", field="--confirm", found=args.confirm)
    if args.passes < 1:
        raise EagleLabError("must be >= 1", field="--passes", found=args.passes)
    batch_sizes = int_list(args.batch_sizes or d["batch_sizes"], "--batch-sizes")
    lookup = None  # the branches --lookup-tokens names (0 dropped: the tree alone runs anyway), None: the defaults
    if args.lookup_tokens is not None:
        from eaglelab.engine.runtime.spec_config import SpecConfig

        lookup = tuple(k for k in int_list(args.lookup_tokens, "--lookup-tokens", least=0) if k > 0)
        for k in lookup:
            SpecConfig("eagle3", lookup_tokens=k)  # the engine's own range check, said before the model loads
    if args.candidates:
        if args.steps or args.topk or args.draft_tokens:
            raise EagleLabError("--candidates names the trees; --steps/--topk/--draft-tokens make a grid: not both",
                                field="--candidates", found=args.candidates, hint="drop one of them")
        candidates = {b: parse_candidates(args.candidates) for b in batch_sizes}
    elif args.steps or args.topk or args.draft_tokens:
        grid = tuple(grid_configs(int_list(args.steps or d["steps"], "--steps"), int_list(args.topk or d["topk"], "--topk"),
                                  int_list(args.draft_tokens or d["draft_tokens"], "--draft-tokens", least=2)))
        candidates = {b: grid for b in batch_sizes}
    else:
        candidates = None
    return batch_sizes, candidates, lookup


def _settings(args, cuda: bool, regime, tree_for, flagged: tuple):
    """The candidates per batch size (``flagged``: :func:`_flag_candidates`) and the workload, from the flags and
    the device's defaults."""
    from eaglelab.bench.tune import TuneSettings, default_candidates, default_lookup, in_use

    d = GPU if cuda else CPU
    batch_sizes, candidates, branches = flagged
    incumbent = {}  # with the default candidates: what run takes now at each batch size, confirmed whatever it predicts
    if candidates is None:
        candidates = default_candidates(batch_sizes, cuda, tree_for)
        if args.confirm and tree_for is not None:
            incumbent = {b: in_use(tree_for, b) for b in batch_sizes}
    if branches is None:
        lookup = default_lookup(batch_sizes, cuda)
    else:
        lookup = {b: branches for b in batch_sizes} if branches else {}
    return TuneSettings(candidates=candidates, new_tokens=args.max_new_tokens or d["max_new_tokens"],
                        cost_tokens=args.cost_tokens or d["cost_tokens"], confirm=args.confirm, regime=regime,
                        passes=args.passes, screen=args.screen, lookup=lookup, incumbent=incumbent)


# ---- the live pass ------------------------------------------------------------------------------
def _measure_and_confirm(args, console) -> dict[str, Any]:
    import time
    from dataclasses import replace

    import torch
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from eaglelab.bench import harness as H
    from eaglelab.bench import tune as TP
    from eaglelab.bench.setup import run_regime
    from eaglelab.bench.tune_predict import predict
    from eaglelab.devices import pick_device

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    device, _ = pick_device(args.device)
    cuda = device.type == "cuda"
    d = GPU if cuda else CPU
    log = lambda m: console.print(f"[dim]{m}[/]")  # noqa: E731
    flagged = _flag_candidates(args, cuda)  # a flag's mistake is said before the model loads
    tt = TP.load_tune_target(args.prompts or d["prompts"], args.max_new_tokens or d["max_new_tokens"],
                             model=args.model, draft=args.draft, device=args.device, dtype=args.dtype, seed=args.seed,
                             cuda=cuda, gemv=args.gemv, serving=args.serving, questions=args.questions,
                             max_prompt_tokens=args.max_prompt_tokens, log=log)
    regime = run_regime(args, device.type, tt.draft.profile, compile_asked=args.compile)
    settings = _settings(args, cuda, regime, tt.draft.tree_for, flagged)
    ctx = replace(tt.ctx, batch_sizes=settings.batch_sizes)
    systems = TP.Systems(ctx, settings)
    notes = [*tt.notes, f"regime: {regime.label} (as `eaglelab run` decodes here)", *regime.reasons,
             _candidates_note(settings)]
    for n in notes[len(tt.notes):]:
        log(n)
    seconds = {"set-up": time.perf_counter() - t_start}
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*cols, console=console, transient=True) as bar:
        steps, costs, measured = TP.measuring_pass(ctx, settings, tt.model, args.record, _progress(bar), systems)
    seconds.update(measured["seconds"])
    wide = settings.wide
    report = predict(steps, costs, (), (), (), args.top, configs=list(settings.all_candidates),
                     wide=(wide.num_steps, wide.topk, wide.draft_tokens))
    report.update(model=tt.model, notes=notes, hardware=H.hardware(ctx.device, next(ctx.target.parameters()).dtype),
                  settings=TP.settings_dict(settings, len(ctx.prompts)), record=args.record, draft_path=tt.draft_path,
                  screens=measured["screens"])
    report["confirmation"] = []
    replaced: dict[str, Any] = {}  # the profile this tune replaces, as read by its first save
    gemv = ctx.gemv_of(settings.regime.pdl)  # the tilings of the regime the profile records
    if settings.confirm:
        t0 = time.perf_counter()
        with Progress(*cols, console=console, transient=True) as bar:
            on_batch = _saving_each_batch(args, report, settings, tt, device, gemv, log, replaced)
            report["confirmation"] = TP.confirm(ctx, settings, report, _progress(bar), systems, on_batch=on_batch)
        seconds["confirmation"] = time.perf_counter() - t0
    report["profile"] = (_save_profile(args, report, settings, tt, device, gemv, replaced)
                         if report["confirmation"] else None)
    seconds["total"] = time.perf_counter() - t_start
    report["seconds"] = seconds
    report["compiled_shapes"] = systems.compiled_shapes if regime.compile and regime.graphs else 0
    return report


def _candidates_note(settings) -> str:
    """How many tree shapes are tried, and how many of them compile."""
    shapes = sum(len(cs) for cs in settings.candidates.values())
    text = f"candidates: {shapes} tree shapes over batch sizes {', '.join(map(str, settings.batch_sizes))}"
    if settings.screening:
        best = sum(min(max(settings.confirm, 1), len(cs)) for cs in settings.candidates.values())
        return (text + f"; each timed with CUDA graphs uncompiled first, the best {best} (per batch size "
                f"{max(settings.confirm, 1)}) compiled and timed again, plain decoding compiled at each batch size "
                "(cached on disk after)")
    if settings.regime.compile and settings.regime.graphs:
        return text + " (each compiles once per batch size the first time, then comes from the disk cache)"
    return text


def _saving_each_batch(args, report: dict, settings, tt, device, gemv: Any, log,
                       replaced: dict[str, Any] | None = None) -> Any:
    """The confirmation's hook: the profile saved after each batch size but the last (which the end of the run
    saves), so a tune stopped later (a time limit, Ctrl-C) keeps every batch size it finished. A cold tune at batch
    8 and 32 ran past nine minutes on an H100 and, stopped in batch 32's confirmation, kept nothing
    (benchmarks/results/h100_2026-12-05c/V)."""
    if not args.save or len(settings.batch_sizes) < 2:
        return None

    def save(rows: list[dict]) -> None:
        done = sorted({r["batch"] for r in rows})
        if done[-1] == settings.batch_sizes[-1]:
            return
        saved = _save_profile(args, {**report, "confirmation": rows}, settings, tt, device, gemv, replaced)
        if saved is not None and saved.get("saved"):
            log(f"profile: saved the winners of batch {', '.join(map(str, done))} to {saved['path']} "
                "(the rest when their runs end)")

    return save


def _save_profile(args, report: dict, settings, tt, device, gemv: Any = None,
                  replaced: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The confirmed winners as this drafter's device profile, written to the eaglelab cache unless --no-save, with
    the tilings ``gemv`` (the run's Triton GEMV) chose: a later run on the same GPU, dtype, torch and Triton takes
    them untimed. ``replaced``: a dict one tune's saves share, so that each merges into the profile as it was
    before the tune's first save (the last save's kept and dropped buckets are the tune's, not the earlier save's)."""
    import datetime
    from dataclasses import replace

    from eaglelab.bench.tune import tuned_profile
    from eaglelab.devices import profile_device
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.assets import cache_dir
    from eaglelab.profiles import (cache_profile_path, drafter_digest, gemv_tilings_of, merge_tuned, read_profiles,
                                   write_profile)

    sha = drafter_digest(tt.draft_path)
    when = datetime.date.today().isoformat()
    profile = tuned_profile(report, settings, profile_device(device), tt.dtype, sha, when)
    if not profile.buckets:
        return None
    profile = replace(profile, gemv_tilings=gemv_tilings_of(gemv, device, tt.dtype))
    path = cache_profile_path(cache_dir(), sha)
    try:  # the profile this tune replaces: its buckets for batch sizes not tuned now stay
        if replaced is not None and "old" in replaced:
            old = replaced["old"]
        else:
            old = next((p for p in read_profiles(path) if (p.device, p.dtype) == (profile.device, profile.dtype)),
                       None) if path.is_file() else None
            if replaced is not None:
                replaced["old"] = old
    except EagleLabError as exc:  # a damaged file loses nothing of this run: the report still prints and saves
        return {"path": str(path), "saved": False, "error": str(exc), "kept": [], **profile.to_json()}
    profile, kept = merge_tuned(old, profile)
    tuned = {b.max_batch for b in profile.buckets}
    dropped = [b.max_batch for b in old.buckets if b.max_batch not in tuned] if old is not None else []
    if args.save:
        write_profile(path, profile)
    return {"path": str(path), "saved": bool(args.save), "kept": [b.max_batch for b in kept], "dropped": dropped,
            **profile.to_json()}
def _progress(bar):
    """(what, done, total) -> a task of ``bar`` per ``what``, updated."""
    tasks: dict[str, Any] = {}

    def update(what: str, done: int, total: int | None) -> None:
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=total)
        bar.update(tasks[what], completed=done, total=total)

    return update


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
    for line in _screen_lines(report.get("screens") or {}):
        console.print(line)
    if report.get("confirmation"):
        _show(console, _confirm_table(report["confirmation"]))
        for line in _error_lines(report["confirmation"]):
            console.print(line)
    best = _winner(report)
    if best is None:
        for line in _timing_lines(report):
            console.print(line)
        return
    s, k, n, lookup = best
    how = "measured fastest" if report.get("confirmation") else "predicted fastest"
    branch = f", a lookup branch of {lookup} beside it" if lookup else ""
    console.print(f"[bold]winner[/] ({how}{', batch ' + str(report['confirmation'][0]['batch']) if report.get('confirmation') else ''}): "
                  f"{s} step{'s' if s != 1 else ''}, topk {k}, {n} draft tokens{branch}")
    path = report.get("draft_path") or "DRAFTER"
    sglang_note = ("  [dim](the tree alone: SGLang runs no lookup branch beside an EAGLE-3 tree)[/]" if lookup
                   else "")
    console.print(f"  SGLang: {sglang_flags(s, k, n, path)}{sglang_note}")
    chain = s if k == 1 else _best_chain(report)
    if chain is not None:
        plural = "s" if chain != 1 else ""
        note = "" if k == 1 else f"  [dim](vLLM's EAGLE drafts a chain: the best predicted chain, {chain} step{plural})[/]"
        if k == 1 and lookup:
            note = "  [dim](the chain alone: vLLM runs no lookup branch beside EAGLE-3)[/]"
        console.print(f"  vLLM:   {vllm_speculative_config(chain, path)}{note}")
    for line in _profile_lines(report.get("profile")) + _timing_lines(report):
        console.print(line)


def _error_lines(confirmation) -> list[str]:
    """The largest prediction error at each batch size, flagged past 10%; then each tree whose passes disagree."""
    from eaglelab.bench.tune import disagreements

    out = []
    for b in sorted({r["batch"] for r in confirmation}):
        errs = [(r["predicted_tok_per_s"] - r["measured_tok_per_s"]) / r["measured_tok_per_s"]
                for r in confirmation if r["batch"] == b and r["measured_tok_per_s"]
                and r["predicted_tok_per_s"] is not None]  # a tree beside a lookup branch is not predicted
        if errs:
            worst = max(errs, key=abs)
            mark = "[yellow]" if abs(worst) > 0.10 else "[dim]"
            out.append(f"{mark}  batch {b}: tok/s predicted within {abs(worst):.0%} of measured (worst {worst:+.1%})[/]")
    for d in disagreements(confirmation):
        out.append(f"[bold red]  WARNING batch {d['batch']}, {_tree_name(d)}: its passes "
                   f"read {d['low']:.2f}x .. {d['high']:.2f}x over plain (more than 10% apart, after an untimed pass "
                   "over every prompt): the machine is busy or the run too short; these figures (and a profile "
                   "written from them) are uncertain: run again, or with more --prompts / --passes[/]")
    return out


def _screen_lines(screens: dict) -> list[str]:
    """Per batch size: which trees were compiled, and the compiled/uncompiled ratios the others were scaled by."""
    out = []
    for b, sc in screens.items():
        plain = f"; plain decoding {sc['plain_ratio']:.2f}x" if sc.get("plain_ratio") else ""
        trees = ", ".join("/".join(map(str, c)) for c in sc["compiled"])
        out.append(f"[dim]  batch {b}: compiled {trees}; compiled/uncompiled cycle ms {sc['ratio']:.2f}x{plain} "
                   "(the other trees' uncompiled cycles scaled by it)[/]")
    return out


def _timing_lines(report) -> list[str]:
    """Wall time per phase of the run and in total, and the shapes compiled."""
    sec = report.get("seconds")
    if not sec:
        return []
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in sec.items() if k != "total")
    shapes = report.get("compiled_shapes")
    compiled = f"; {shapes} graph sets compiled (plain decoding and trees, per batch size)" if shapes else ""
    return [f"[bold]time[/]: {sec['total']:.1f} s in total ({parts}){compiled}"]


def _profile_lines(profile) -> list[str]:
    """Where the profile went (or would have), and what now uses it."""
    from rich.markup import escape

    if not profile:
        return []
    trees = "; ".join(f"batch <= {b['max_batch']}: {_tree_name(b)} ({b['measured']})" for b in profile["buckets"])
    if profile.get("error"):
        return [f"[bold red]profile not saved[/]: the file it would replace cannot be read: {escape(profile['error'])}",
                f"  what it would hold: {trees}"]
    kept = profile.get("kept") or []
    if kept:
        trees += (f"  [dim](batch <= {', <= '.join(map(str, kept))}: kept from the profile tuned before, in the same "
                  "regime; not tuned now)[/]")
    dropped = profile.get("dropped") or []
    if dropped:
        trees += (f"  [yellow](the profile tuned before also held batch <= {', <= '.join(map(str, dropped))}, "
                  "measured in another regime (compile, GEMV, decode attention): replaced whole; tune those batch "
                  "sizes again)[/]")
    if not profile["saved"]:
        return [f"[dim]profile not saved (--no-save); it would go to {profile['path']}: {trees}[/]"]
    return [f"[bold]profile[/]: wrote {profile['path']} ({profile['device']}, {profile['dtype']})",
            f"  {trees}",
            "  `eaglelab run`, `eaglelab bench`, the TUI and the pytest fixtures now take this drafter's tree (and "
            "kernels) on this device from it; tree flags still win; delete the file to go back to the shipped profile"]


def _tree_name(r: dict) -> str:
    """A tree row (confirmation, profile bucket, disagreement) as steps/topk/N, "+ lookup K" with a branch."""
    lookup = r.get("lookup_tokens", 0)
    return f"{r['steps']}/{r['topk']}/{r['draft_tokens']}" + (f" + lookup {lookup}" if lookup else "")


def _winner(report) -> tuple[int, int, int, int] | None:
    """The measured winner at the first batch size confirmed (steps, topk, draft tokens, lookup branch), else the
    predicted one (no branch: a branch is never predicted)."""
    from eaglelab.bench.tune import winners

    won = winners(report.get("confirmation") or [])
    if won:
        w = next(iter(won.values()))
        return w["steps"], w["topk"], w["draft_tokens"], w.get("lookup_tokens", 0)
    if report["predictions"]:
        first = next(iter(report["predictions"].values()))
        return (first[0]["steps"], first[0]["topk"], first[0]["draft_tokens"], 0) if first else None
    rows = report["by_accept_len"]
    return (rows[0]["steps"], rows[0]["topk"], rows[0]["draft_tokens"], 0) if rows else None


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
        whole = p.get("whole_cycle_ms") is not None  # a whole cycle timed as one: no phases apart
        phases = ("-",) * 4 if whole else (_ms(p["draft_ms"]), _ms(p["verify_ms"]), _ms(p["extend_ms"]), _ms(p["accept_ms"]))
        t.add_row(str(p["steps"]), str(p["topk"]), str(p["draft_tokens"]), f"{p['accept_len']:.2f}", *phases,
                  _ms(p["cycle_ms"]), f"{p['break_even_accept_len']:.2f}", f"{p['tok_per_s']:.1f}",
                  f"{p['speedup']:.2f}x")
    return t


def _by_len_table(rows) -> Any:
    t = _table_of("expected accepted length (no costs in the record)", ("steps", "topk", "N", "E\\[a]"))
    for r in rows:
        t.add_row(str(r["steps"]), str(r["topk"]), str(r["draft_tokens"]), f"{r['accept_len']:.2f}")
    return t


def _confirm_table(rows) -> Any:
    from eaglelab.bench.tune import pass_ratios

    t = _table_of("predicted vs measured, real runs (end to end, prefill included; the same prompts; one untimed "
                  "pass, then the timed passes interleaved)",
                  ("batch", "steps/topk/N", "E\\[a] pred", "measured", "error", "tok/s pred", "measured", "error",
                   "passes over plain"))
    for r in rows:
        name = "plain" if r["steps"] == 0 else _tree_name(r) + (" (in use)" if r.get("incumbent") else "")
        a_p, a_m = r["predicted_accept_len"], r["measured_accept_len"]
        a_err = f"{(a_p - a_m) / a_m:+.1%}" if a_p is not None and a_m else "-"
        t_p, t_m = r["predicted_tok_per_s"], r["measured_tok_per_s"]  # t_p None: a branch, measured only
        ratios = pass_ratios(rows, r)
        spread = f"{min(ratios):.2f}x .. {max(ratios):.2f}x" if ratios else "-"
        t.add_row(str(r["batch"]), name, f"{a_p:.2f}" if a_p is not None else "-", f"{a_m:.2f}" if a_m else "-", a_err,
                  f"{t_p:.1f}" if t_p is not None else "-", f"{t_m:.1f}",
                  f"{(t_p - t_m) / t_m:+.1%}" if t_m and t_p is not None else "-", spread)
    return t
