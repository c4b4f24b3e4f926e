"""``eaglelab bench --figures``: speculative against plain decoding, both as ``run`` decodes on this device, on every
MT-bench first turn (one line per category, and MT-bench as a whole) and on held-out code prompts, at each batch
size; beside each figure the goal it answers (issue 40's) marked met or not met. JSON and a markdown table.

Each prompt set is measured as the bench measures (:func:`eaglelab.bench.harness.run_batch`: both configurations
warmed up, then interleaved pass by pass; a set's speedup is the median pass's ratio), the model and its captured
graphs shared by every set. MT-bench as a whole is the eight categories' passes added up: per pass, every
category's tokens over every category's seconds, so a slow category weighs as it would in one run over all 80;
its accepted length is tokens per verify over all of them (each category's tokens over its cycles, added up).
After each set at each batch size the report so far is written, marked partial: there MT-bench as a whole shows
only at a batch size where every category is in, and a goal waiting on a missing figure reads "not measured".
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from eaglelab.bench import harness as B
from eaglelab.bench.prompt_sets import CODE_SET, PromptSet, figure_sets

SCHEMA = "eaglelab.bench/figures/1"  # bench --json may replace it, as a bench report
MTBENCH = "mt-bench"  # the line of MT-bench as a whole


@dataclass(frozen=True)
class Goal:
    """A speedup a set must reach at a batch size: ``target`` is a set name, MTBENCH, or "every category"."""

    target: str
    batch: int
    minimum: float

    @property
    def label(self) -> str:
        return f">= {self.minimum:g}x at batch {self.batch}: {self.target}"


GOALS = (Goal(MTBENCH, 1, 2.5), Goal("every category", 1, 2.0), Goal(CODE_SET, 1, 2.8),
         Goal(MTBENCH, 8, 1.8), Goal(MTBENCH, 32, 1.3))  # issue 40


@dataclass(frozen=True)
class SetFigure:
    """One prompt set at one batch size: plain and speculative tok/s (median pass), the speedup, tokens per verify."""

    name: str
    kind: str  # "category" | "code" | "mt-bench"
    batch: int
    prompts: int
    tokens: int  # per pass, each side
    plain_tok_per_s: float
    spec_tok_per_s: float
    speedup: float
    pass_speedups: tuple[float, ...]  # per interleaved pass: speculative tok/s over plain's in the same pass
    plain_passes: tuple[float, ...]  # tok/s per pass
    spec_passes: tuple[float, ...]
    accept_len: float | None
    same_tokens: float | None  # share of rows identical to plain's (exact in float32)
    goal: float | None = None
    met: bool | None = None
    # per prompt group, the first pass: (plain tokens, plain tok/s, speculative tokens, speculative tok/s)
    groups: tuple[tuple[int, float, int, float], ...] = ()
    interval: tuple[float, float] | None = None  # the speedup's 95% over the prompts drawn (B.paired_interval)
    # per side (plain, speculative), the first pass's rows x cycles that made tokens, a share of the rows x cycles
    # run (B.BenchRow.busy_rows): in a batch a row idles from its end until the live rows fit a smaller bucket and
    # move onto it, which plain decoding's rows, all ending at one step, never do; and the rows x cycles run (weight)
    busy_rows: tuple[float | None, float | None] = (None, None)
    row_slots: tuple[int | None, int | None] = (None, None)


def run_figures(args: argparse.Namespace, log: Callable[[str], None] = lambda m: None,
                write: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Measure every set at every batch size -> the report (as ``--json`` writes it). ``write`` gets the report so
    far, marked ``"partial": true``, after each set at each batch size (None: nothing written), so a run cut short
    keeps what it measured."""
    import torch

    from eaglelab.bench.configs import regime_config
    from eaglelab.bench.setup import setup_bench
    from eaglelab.engine.errors import EagleLabError

    if args.code_prompts < 0:
        raise EagleLabError("a count of prompts cannot be negative", field="--code-prompts", found=args.code_prompts,
                            expected=">= 0")
    if getattr(args, "continuous", False):
        raise EagleLabError("--figures measures each category's ten prompts on their own: too few to keep 8 or 32 "
                            "rows served continuously", field="--continuous", found="with --figures",
                            hint="serve every MT-bench first turn as one queue: eaglelab bench --continuous "
                                 "--prompts 80 --batch-sizes 8,32")
    torch.manual_seed(args.seed)
    sets = figure_sets(args.questions, args.code_prompts, args.humaneval)
    args.batch_sizes = args.batch_sizes or "1,8,32"
    texts = [t for s in sets for t in s.texts]
    setup = setup_bench(args, log, texts=texts, what="prompts (MT-bench first turns and code)")
    ctx = setup.ctx
    if ctx.make_drafter is None:
        raise EagleLabError("--figures compares speculative with plain decoding: it needs a drafter", field="--draft",
                            found="none", hint="name a drafter, or leave --draft out for the default")
    plain, spec = regime_config(False, setup.regime), regime_config(True, setup.regime)
    head = {"schema": SCHEMA, "hardware": B.hardware(ctx.device, next(ctx.target.parameters()).dtype),
            "settings": {"model": setup.model, "plain": plain.name, "speculative": spec.name,
                         "regime": setup.regime.label, "batch_sizes": list(ctx.batch_sizes),
                         "max_new_tokens": ctx.max_new_tokens, "eos_token_ids": list(ctx.eos_token_ids),
                         "repeats": ctx.repeats,
                         "trees": {b: ctx.spec_at(b).to_dict() for b in ctx.batch_sizes},
                         "sets": {s.name: len(s.texts) for s in sets}},
            "notes": list(setup.notes)}
    categories = [s.name for s in sets if s.kind == "category"]

    def report(measured: list[SetFigure]) -> dict[str, Any]:
        figs = [with_goal(f) for f in measured + wholes(measured, ctx.batch_sizes, categories)]
        return {**head, "figures": [asdict(f) for f in figs], "goals": goal_lines(figs, len(categories))}

    all_prompts, systems, figures = ctx.prompts, {}, []
    for b in ctx.batch_sizes:  # systems built while every prompt is in: their caches hold the longest
        for cfg in (plain, spec):
            B.contender(cfg, ctx, b, systems)
    at = 0
    for s in sets:
        n = len(s.texts)
        prompts, at = all_prompts[at:at + n], at + n
        for b in ctx.batch_sizes:
            ctx.prompts = prompts
            rows, outs = B.run_batch([plain, spec], ctx, b, systems)
            rows = B.finish_rows(rows, {k: {b: v} for k, v in outs.items()}, plain.name)
            figures.append(set_figure(s, b, *(next(r for r in rows if r.config == c.name) for c in (plain, spec)),
                                      same=_same(outs, plain.name, spec.name)))
            log(f"{s.name}, batch {b}: {figures[-1].speedup:.2f}x")
            if write is not None:
                write({**report(figures), "partial": True})
    ctx.prompts = all_prompts
    return report(figures)


def wholes(figures: list[SetFigure], batch_sizes: Iterable[int], categories: list[str]) -> list[SetFigure]:
    """MT-bench as a whole at each batch size where every one of ``categories`` is measured; none at a batch size
    still missing one (a run cut short): a whole over some of the categories would read as all of MT-bench."""
    out = []
    for b in batch_sizes:
        have = {f.name for f in figures if f.kind == "category" and f.batch == b}
        if categories and have >= set(categories):
            out.append(whole(figures, b))
    return out


def _same(outs: dict[str, list[list[int]]], plain: str, spec: str) -> float | None:
    a, b = outs.get(plain), outs.get(spec)
    return sum(x == y for x, y in zip(a, b)) / len(a) if a and b else None


def set_figure(s: PromptSet, batch: int, plain: B.BenchRow, spec: B.BenchRow, same: float | None) -> SetFigure:
    """One set's line from its plain and speculative rows (speedup: the median pass's ratio, as the bench's)."""
    groups = tuple(zip(plain.group_tokens, plain.group_tok_per_s, spec.group_tokens, spec.group_tok_per_s))
    return SetFigure(s.name, s.kind, batch, len(s.texts), spec.tokens, plain.tok_per_s, spec.tok_per_s,
                     spec.speedup, spec.pass_speedups, plain.sweeps_tok_per_s, spec.sweeps_tok_per_s,
                     spec.mean_accept_len, same, groups=groups, interval=_interval(groups),
                     busy_rows=(plain.busy_rows, spec.busy_rows), row_slots=(plain.row_slots, spec.row_slots))


def _interval(groups: tuple[tuple[int, float, int, float], ...]) -> tuple[float, float] | None:
    """:func:`B.paired_interval` over these prompt groups (plain tokens, tok/s, speculative tokens, tok/s)."""
    if not groups:
        return None
    pt, pr, st, sr = zip(*groups)
    return B.paired_interval(st, sr, pt, pr)


def whole(figures: list[SetFigure], batch: int) -> SetFigure:
    """MT-bench as a whole at ``batch``: per pass, every category's tokens over every category's seconds (each side),
    the median pass's tok/s and ratio kept; tokens per verify: every category's tokens over its cycles, added up."""
    cats = [f for f in figures if f.kind == "category" and f.batch == batch]
    assert cats, f"no MT-bench category was measured at batch {batch}"
    tokens = sum(f.tokens for f in cats)
    n = min(len(f.plain_passes) for f in cats)
    plain = [tokens / sum(f.tokens / f.plain_passes[p] for f in cats) for p in range(n)]
    spec = [tokens / sum(f.tokens / f.spec_passes[p] for f in cats) for p in range(n)]
    ratios = tuple(a / b for a, b in zip(spec, plain))
    cycles = [f.tokens / f.accept_len for f in cats if f.accept_len]
    same = [f.same_tokens for f in cats if f.same_tokens is not None]
    groups = tuple(g for f in cats for g in f.groups)
    (plain_busy, plain_slots), (spec_busy, spec_slots) = _busy_side(cats, 0), _busy_side(cats, 1)
    return SetFigure(MTBENCH, MTBENCH, batch, sum(f.prompts for f in cats), tokens, statistics.median(plain),
                     statistics.median(spec), statistics.median(ratios), ratios, tuple(plain), tuple(spec),
                     tokens / sum(cycles) if len(cycles) == len(cats) else None,
                     sum(same) / len(same) if same else None, groups=groups, interval=_interval(groups),
                     busy_rows=(plain_busy, spec_busy), row_slots=(plain_slots, spec_slots))


def _busy_side(cats: list[SetFigure], side: int) -> tuple[float | None, int | None]:
    """One side's (0 plain, 1 speculative) busy share over ``cats``: their busy rows x cycles over their rows x
    cycles run, and that sum; (None, None) where a set lacks either."""
    got = [(f.busy_rows[side], f.row_slots[side]) for f in cats]
    if any(b is None or not n for b, n in got):
        return None, None
    slots = sum(n for _, n in got)
    return sum(b * n for b, n in got) / slots, slots


def with_goal(f: SetFigure) -> SetFigure:
    """``f`` with the goal that applies to it (if any) and whether it is met."""
    from dataclasses import replace

    for g in GOALS:
        if g.batch == f.batch and (g.target == f.name or (g.target == "every category" and f.kind == "category")):
            return replace(f, goal=g.minimum, met=f.speedup >= g.minimum)
    return f


def goal_lines(figures: list[SetFigure], categories: int) -> list[dict[str, Any]]:
    """Each goal of :data:`GOALS`: met, not met, or not measured (its batch size or set did not run). "Every
    category" needs all ``categories`` measured to be met; one measured below the goal already makes it not met."""
    out = []
    for g in GOALS:
        hit = [f for f in figures if f.goal == g.minimum and f.batch == g.batch
               and (f.name == g.target or (g.target == "every category" and f.kind == "category"))]
        worst = min(hit, key=lambda f: f.speedup) if hit else None
        if worst is not None and worst.met:  # every measured one met: met only when none is missing
            complete = g.target != "every category" or len(hit) >= categories
            worst = worst if complete else None
        out.append({"goal": g.label, "batch": g.batch, "minimum": g.minimum,
                    "status": "not measured" if worst is None else "met" if all(f.met for f in hit) else "not met",
                    "speedup": worst.speedup if worst else None, "where": worst.name if worst else None,
                    "interval": list(worst.interval) if worst and worst.interval else None,
                    "within_noise": _within_noise(worst, g.minimum)})
    return out


def _within_noise(f: SetFigure | None, minimum: float) -> bool | None:
    """Whether the goal lies inside the figure's interval over the prompts: another draw of as many prompts could
    read the other verdict (None: no interval)."""
    if f is None or not f.interval:
        return None
    return f.interval[0] <= minimum <= f.interval[1]


def _noise_note(goal: dict[str, Any]) -> str:
    """The goal line's words on the figure's interval over the prompts."""
    if not goal.get("interval"):
        return ""
    lo, hi = goal["interval"]
    said = "; the goal is within it: another draw of prompts could read the other verdict"
    return f"; 95% over the prompts {lo:.2f}x .. {hi:.2f}x{said if goal['within_noise'] else ''}"


def row_length(settings: dict[str, Any]) -> str:
    """How long a row ran: ``max_new_tokens`` always, or (``--eos``) up to it, ending at the model's EOS."""
    if settings.get("eos_token_ids"):
        return f"up to {settings['max_new_tokens']} tokens a row, each ending at the model's EOS"
    return f"{settings['max_new_tokens']} tokens a row"


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table per batch size, then the goals."""
    s = report["settings"]
    lines = [f"# Speculative vs plain decoding: {s['model']}", "",
             f"{s['speculative']} over {s['plain']} ({s['regime']}), {row_length(s)}, "
             f"{s['repeats']} interleaved passes (speedup: the median pass's ratio).", ""]
    if report.get("partial"):
        lines += [f"**Partial**: cut short after {progress(report)}; MT-bench as a whole shows only at a batch size "
                  "where every category was measured.", ""]
    busy_cols = False
    for b in s["batch_sizes"]:
        figs = [f for f in report["figures"] if f["batch"] == b]
        busy = b > 1 and any(_busy_cell(f) != "-" for f in figs)  # a batch's idle rows (reports before: none)
        busy_cols |= busy
        lines += [f"## Batch {b}", "", "| prompts | n | plain tok/s | speculative tok/s | speedup "
                  "| 95% over the prompts | accepted |" + (" rows busy, plain / speculative |" if busy else "")
                  + " goal |", "|---|---|---|---|---|---|---|" + ("---|" if busy else "") + "---|"]
        for f in figs:
            goal = "" if f["goal"] is None else f">= {f['goal']:g}x {'met' if f['met'] else '**not met**'}"
            acc = "-" if f["accept_len"] is None else f"{f['accept_len']:.2f}"
            name = f"**MT-bench as a whole**" if f["kind"] == MTBENCH else f["name"]
            spread = "-" if not f.get("interval") else f"{f['interval'][0]:.2f}x .. {f['interval'][1]:.2f}x"
            lines.append(f"| {name} | {f['prompts']} | {f['plain_tok_per_s']:,.1f} | {f['spec_tok_per_s']:,.1f} | "
                         f"{f['speedup']:.2f}x | {spread} | {acc} |" + (f" {_busy_cell(f)} |" if busy else "")
                         + f" {goal} |")
        lines.append("")
    if any(f.get("interval") for f in report["figures"]):
        lines += ["95% over the prompts: the speedup another draw of as many prompts would read, by a paired "
                  "bootstrap over these prompts' first pass (the passes' spread is only the clock's).", ""]
    if busy_cols:
        lines += ["Rows busy: the rows x cycles (decode steps, speculative cycles) that made tokens, a share of those "
                  "run (each cycle's batch bucket). In a batch a speculative row that reached its last token idles "
                  "until the rows still running fit a smaller bucket, onto which they move; plain decoding's rows "
                  "all end at one step.", ""]
    lines += ["## Goals", ""] + [f"- {g['goal']}: **{g['status']}**" + (
        f" ({g['speedup']:.2f}x, lowest: {g['where']}{_noise_note(g)})" if g["speedup"] is not None else "")
        for g in report["goals"]]
    return "\n".join(lines) + "\n"


def _busy_cell(f: dict[str, Any]) -> str:
    """A figure's rows busy, plain / speculative ("-" where either is unknown)."""
    plain, spec = f.get("busy_rows") or (None, None)
    return "-" if plain is None or spec is None else f"{plain:.2f} / {spec:.2f}"


def progress(report: dict[str, Any]) -> str:
    """"N of M figures": the set x batch size figures the report holds (MT-bench as a whole, made of them, not
    counted) of those the run was to measure."""
    s = report["settings"]
    return (f"{sum(f['kind'] != MTBENCH for f in report['figures'])} of {len(s['sets']) * len(s['batch_sizes'])} "
            "figures")


def figures_command(args: argparse.Namespace) -> int:
    """``eaglelab bench --figures``: measure, print the markdown, write --json OUT and OUT's .md beside it (the report
    so far after each figure, marked partial: a run interrupted or stopped says where it is and exits 130)."""
    from pathlib import Path

    from rich.console import Console

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.safe_write import write_atomic
    from eaglelab.errors import INTERRUPTED_EXIT, say_partial

    if args.tp not in (None, 1):
        raise EagleLabError("--figures measures on one device", field="--tp", found=args.tp, hint="drop --tp")
    err = Console(stderr=True, highlight=False)
    md, kept = Path(args.json).with_suffix(".md") if args.json else None, []

    def write(report: dict[str, Any]) -> None:
        B.write_json(args.json, report)
        text = markdown(report)
        write_atomic(md, lambda tmp: tmp.write_text(text, encoding="utf-8"), what="the figures table", flag="--json")
        kept[:] = [progress(report)]

    try:
        report = run_figures(args, log=lambda msg: err.print(f"[dim]{msg}[/]"), write=write if args.json else None)
    except KeyboardInterrupt:
        if not kept:
            raise
        say_partial(err, kept[0], args.json, md)
        return INTERRUPTED_EXIT
    print(markdown(report), end="")
    if args.json:
        write(report)
        err.print(f"[dim]wrote {args.json} and {md}[/]")
    return 0
