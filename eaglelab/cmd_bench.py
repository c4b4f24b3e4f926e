"""``eaglelab bench``: plain, speculative and HF decoding side by side on MT-bench prompts.

With no flags, the headline: plain decoding and the default speculative configuration, each exactly as ``eaglelab
run`` decodes on this device (CUDA graphs of compiled phases and our kernels as the device profile measured them,
the profile's tree for each batch size), and HF transformers, at batch 1 and 8 on CUDA (1 on a CPU), the passes
interleaved; ``--full`` sweeps every configuration below at six batch sizes (two on a CPU).

Configurations (``--configs``): plain-eager, plain-graphs, plain-compile, plain-graphs-gemv,
plain-compile-gemv, plain-compile-gemv-attn, spec-prefill, spec-prefill-graphs, spec-decode, spec-decode-graphs,
spec-compile, spec-compile-gemv, spec-compile-gemv-attn, hf (``*-compile``: graphs with torch.compile'd phases;
``*-gemv``: the projections of M <= 64 rows on our Triton GEMV kernel; ``*-attn``: also the attention of
<= 64 query rows on our Triton decode attention; these are skipped with the reason where Triton or CUDA is
missing or the model is float32, and run only when named). Graph configurations need CUDA (skipped on CPU, and
the speedup baseline is then plain-eager). ``--scale-model`` swaps the target for a random-weight
model of a named real shape (cost measurements only: acceptance on random weights means nothing).
``--tp N`` runs the same harness over N tensor-parallel ranks (launch with ``torchrun
--nproc-per-node N -m eaglelab bench --tp N ...``; rank 0 prints and writes the JSON) and adds where
the all-reduces go: their share of a decode and a verify step, per-site cost, arrival skew.
"""

from __future__ import annotations

import argparse
from typing import Any

from eaglelab.bench.prompt_sets import add_figures_args
from eaglelab.bench.setup import CPU_DEFAULTS, GPU_DEFAULTS, HEADLINE_CPU, HEADLINE_GPU
from eaglelab.session import add_kernel_args, add_model_args, add_pdl_arg

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark plain vs speculative decoding (graphs on/off, both verify modes) vs HF generate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_model_args(p, max_new_tokens=None, max_new_help="tokens per row (at most, with --eos; default CUDA 64, CPU 32)")
    p.add_argument("--scale-model", default=None, metavar="NAME",
                   help="random weights of a named shape instead of --model (--draft default: a random EAGLE-3 "
                        "drafter, for cost): llama3.1-8b | kimi-like | smollm2-135m | tiny")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="with --scale-model: the random drafter's draft vocabulary (default 32000; the shipped "
                        "SmolLM2 drafter has 12288): the tree's top-k runs over it every draft step")
    # Greedy, and each configuration chooses graphs, compile, the verify mode and the Triton kernels: not flags here
    # (gemv None: on CPU the session's few-row C kernel, as `run` has it; on CUDA the configs ask for the GEMV).
    p.set_defaults(temperature=0.0, top_k=0, top_p=1.0, attention_mode="decode", cuda_graphs=False, compile=False)
    w = p.add_argument_group("workload")
    w.add_argument("--full", action="store_true",
                   help="the full sweep: every configuration but the *-gemv and *-attn ones (and the headline's), at "
                        f"batch sizes {GPU_DEFAULTS['batch_sizes']} on CUDA ({CPU_DEFAULTS['batch_sizes']} on a CPU), "
                        "with phase costs and the micro-measure (default: the headline alone, batch sizes "
                        f"{HEADLINE_GPU['batch_sizes']} on CUDA, {HEADLINE_CPU['batch_sizes']} on a CPU)")
    add_kernel_args(w, "the headline's configurations: ")
    add_pdl_arg(w, "the headline's configurations (and --figures'), as `run --pdl` (the *-pdl columns): ",
                dest="bench_pdl")  # the configurations', not the session's
    w.add_argument("--phase-costs", action=argparse.BooleanOptionalAction, default=None,
                   help="after the timed passes, one observed pass per configuration for its phase costs (default: "
                        "on with --full, --configs or --profile; off for the headline, which times end to end)")
    w.add_argument("--compile-prefill", action="store_true", dest="bench_compile_prefill",  # the configs', not the session's
                   help="the *-compile configs compile the prompt's phases too (prefill, the drafter's extend over the "
                        "prompt), plain and speculative alike: each request then runs compiled kernels from its first "
                        "token (compiles once per padded prompt width; not in tok/s)")
    w.add_argument("--configs", default=None, help="comma list (default: the headline; with --full all but the *-gemv and "
                                                   "*-attn ones; graph configs only on CUDA; none: no configuration, "
                                                   "for --profile)")
    w.add_argument("--batch-sizes", default=None, help=f"comma list (default CUDA {HEADLINE_GPU['batch_sizes']}, CPU "
                                                        f"{HEADLINE_CPU['batch_sizes']}; with --full or --configs CUDA "
                                                        f"{GPU_DEFAULTS['batch_sizes']}, CPU {CPU_DEFAULTS['batch_sizes']})")
    w.add_argument("--prompts", type=int, default=None,
                   help=f"MT-bench questions used (first turns; default CUDA {HEADLINE_GPU['prompts']}, CPU "
                        f"{HEADLINE_CPU['prompts']}; with --full or --configs CPU {CPU_DEFAULTS['prompts']})")
    w.add_argument("--continuous", action="store_true",
                   help="serve the prompts through each batch size's rows with continuous batching: a row whose "
                        "request ends takes the next prompt at once, as a server keeps that many requests running "
                        "(default: the prompts in batches of that size, each running until its longest row ends, "
                        "the last batch filled by wrapping around)")
    w.add_argument("--refill-rows", type=int, default=None, metavar="N",
                   help="with --continuous: the free rows that wait for each other to be prefilled together, at most "
                        "the batch size (1: each row refills as soon as it is free; default a quarter of the batch, at "
                        "least 1)")
    w.add_argument("--eos", action=argparse.BooleanOptionalAction, default=None,
                   help="a row ends at the model's end-of-sequence token (at most --max-new-tokens), as a served "
                        "request does: rows end at different steps, plain and speculative alike (a real model only; "
                        "default: on with --continuous where the model names its EOS, else off: every row "
                        "--max-new-tokens long; --no-eos to ignore EOS when serving)")
    w.add_argument("--questions", default=None, metavar="FILE", help="an MT-bench question.jsonl (default: the packaged one)")
    w.add_argument("--max-prompt-tokens", type=int, default=512, help="cut longer prompts")
    w.add_argument("--repeats", type=int, default=None,
                   help="timed passes, each running every configuration once over every prompt (interleaved); a "
                        "speedup is the median pass's, the spread over passes shown (default 3; the HF peer: one pass "
                        "over the first batch of prompts)")
    w.add_argument("--micro", action=argparse.BooleanOptionalAction, default=None,
                   help="also time a 1-token decode against verifies of 2..8 tokens (default: on with --full or "
                        "--configs, off for the headline)")
    w.add_argument("--micro-only", action="store_true", help="only the micro-measure")
    w.add_argument("--compile-mode", default="default", choices=("default", "max-autotune-no-cudagraphs"),
                   help="torch.compile mode of the *-compile configs (max-autotune-no-cudagraphs: inductor tunes "
                        "its matmul and kernel choices per shape; longer first compile, cached)")
    w.add_argument("--micro-context", type=int, default=256, help="tokens in the cache during the micro-measure")
    w.add_argument("--micro-batch-sizes", default=None, help=f"comma list (default CUDA {GPU_DEFAULTS['micro_batch_sizes']}, "
                                                              f"CPU {CPU_DEFAULTS['micro_batch_sizes']})")
    w.add_argument("--hbm-tbps", type=float, default=None,
                   help="memory bandwidth for the weight-bandwidth bound (default: 4.3, an H200's, on CUDA; none on CPU)")
    add_figures_args(w)
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the full report as JSON (a report an earlier bench wrote there is replaced; any other "
                        "file is refused unless --force)")
    p.add_argument("--force", action="store_true", help="replace --json OUT even when it is not a bench report")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor-parallel ranks; launch as `torchrun --nproc-per-node N -m eaglelab bench --tp N ...` "
                        "(default configs then: plain-eager, plain-graphs, spec-decode-graphs; no HF peer). Any --tp, "
                        "1 included, seeds a scale model's weights per tensor, so --tp 1 and --tp N hold the same model")
    p.add_argument("--profile", action="store_true",
                   help="also profile one plain decode step per batch size (torch.profiler, rank 0 under --tp): "
                        "kernel names and microseconds per step, eager layers and (CUDA) compiled whole; and, when "
                        "a speculative configuration runs, each phase of a speculative cycle alike (its kernel set); "
                        "with --configs none only the decode step (and the --tp section)")
    p.add_argument("--tp-check", action="store_true",
                   help="debug: assert every cycle that the ranks' replicated drafters drafted the same tree")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    from eaglelab.bench.timing import quiet_torch_notices

    with quiet_torch_notices():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from eaglelab.errors import INTERRUPTED_EXIT, sigterm_as_interrupt

    if args.figures:
        from eaglelab.bench.figures import figures_command

        with sigterm_as_interrupt():  # a run stopped by `timeout` names its partial report, as Ctrl-C does
            return figures_command(args)
    if args.tp is None or args.tp == 1:
        with sigterm_as_interrupt():  # not under --tp: torchrun's agent stops its ranks with SIGTERM itself
            try:
                bench(args, None)
            except Interrupted:  # the partial report is named already
                return INTERRUPTED_EXIT
        return 0
    from eaglelab.cmd_run import join_tp

    tp = join_tp(args.tp, args.device)
    tp.check_replicas = args.tp_check
    try:
        with tp.guard("eaglelab bench"):  # a rank that fails makes every rank stop with its error
            bench(args, tp)
    finally:
        tp.close()
    return 0


class Interrupted(Exception):
    """An interrupted bench that has said where its partial report is (so no second "interrupted" line)."""


def bench(args: argparse.Namespace, tp=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the bench on this rank (``tp``: its group, or None). -> (report, outputs per config and
    batch). Under TP every rank measures; only rank 0 prints and writes the JSON."""
    from rich.console import Console

    from eaglelab.bench.harness import write_json
    from eaglelab.bench.suite import run_bench
    from eaglelab.errors import say_partial

    quiet = tp is not None and tp.rank != 0
    console, err = Console(highlight=False, quiet=quiet), Console(stderr=True, highlight=False, quiet=quiet)
    write, kept = bool(args.json) and not quiet, []

    def keep(report: dict[str, Any]) -> None:
        write_json(args.json, report)
        kept[:] = [len(report.get("rows", []))]

    try:
        res = run_bench(args, tp, log=lambda msg: err.print(f"[dim]{msg}[/]"), write=keep if write else None)
    except KeyboardInterrupt:
        if not kept or tp is not None:  # under TP the group's guard ends every rank
            raise
        say_partial(err, f"{kept[0]} rows", args.json)
        raise Interrupted from None
    _print(console, res.report, res.rows, res.micro)
    if res.profiles is not None:
        from eaglelab.bench.profile import print_profile

        print_profile(console, res.profiles, res.setup.ctx.device.type == "cuda")
    if res.tp_section is not None:
        from eaglelab.bench.tp import print_tp

        print_tp(console, res.tp_section, res.rows)
    if write:
        write_json(args.json, res.report)
        console.print(f"[dim]wrote {args.json}[/]")
    return res.report, res.outputs


# ---- printing --------------------------------------------------------------------------------------
def _f(v, pattern: str = "{:.2f}") -> str:
    return "-" if v is None else pattern.format(v)


def _print(console, report, rows, micro) -> None:
    hw = report["hardware"]
    where = hw.get("gpu") or hw.get("cpu")
    console.print(f"[bold]eaglelab bench[/]  {report['settings']['model']}  on {hw['device']} ({where}), "
                  f"{hw['dtype']}, torch {hw['torch']}, transformers {hw['transformers']}")
    for n in report["notes"]:
        console.print(f"[dim]  {n}[/]")
    ran = [r for r in rows if r.skipped is None]
    if ran:
        console.print(_rows_table(ran, report["settings"]["speedup_baseline"]))
        console.print("[dim]passes: the speedup of each interleaved pass (each configuration once per pass), min..max; "
                      "same tokens: rows identical to plain-eager's (in bf16 a verify of N tokens rounds differently "
                      "from 1-token decodes, so speculative rows may drift; float32 is exact)"
                      + ("; graphs: R = replayed from a CUDA graph, E = eager" if any(r.graph for r in ran) else "")
                      + "[/]")
        for line in _eager_reasons(ran):
            console.print(f"[dim]{line}[/]")
        for line in _compile_fallback_lines(ran):
            console.print(f"[yellow]{line}[/]")
    for line in _not_run_lines(report.get("not_run", {})):
        console.print(f"[dim]{line}[/]")
    if micro:
        console.print(_micro_table(micro))
    for line in _headline_lines(report["headline"]):
        console.print(line)
    console.print(f"[dim]{_what_ran(report['settings'], report.get('not_run', {}))}[/]")
    if "walltime" in report:
        from eaglelab.bench.walltime import describe

        console.print(describe(report["walltime"]))


def _not_run_lines(not_run: dict[str, str]) -> list[str]:
    """The configurations that cannot run here, once each, in one line per reason."""
    by: dict[str, list[str]] = {}
    for cfg, why in not_run.items():
        by.setdefault(why, []).append(cfg)
    return [f"not run here: {', '.join(cfgs)} ({why})" for why, cfgs in by.items()]


def _what_ran(settings, not_run: dict[str, str]) -> str:
    """What this run measured (the configurations that ran: the others are named once, above), and how to get
    the rest."""
    batches = ", ".join(map(str, settings["batch_sizes"]))
    ran = [c for c in settings["configs"] if c not in not_run]
    if settings["measured"] == "the headline":
        return (f"measured: the headline ({', '.join(ran)}; batch {batches}; {settings['prompts']} "
                f"prompts, {settings['repeats']} interleaved passes). `eaglelab bench --full` sweeps every "
                "configuration at every batch size, with phase costs and the micro-measure")
    return f"measured: {', '.join(ran) or 'no configuration'}; batch {batches}"


def _table(title: str, gap: int = 2):
    """A table that fits an 80-column terminal: no vertical rules, ``gap`` spaces between columns."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, gap, 0, 0))


def _rows_table(rows, base) -> Any:
    """Tables readable at 80 columns: speed per configuration, its phase costs, then its per-request costs."""
    from rich.console import Group

    speed = _table(f"end to end (speedup over {base})")
    for col in ("config", "batch", "tok/s", "speedup", "passes", "accept", "same tokens"):
        speed.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "same tokens")
    observed = any(r.graph for r in rows)  # the headline alone times end to end: no observed pass, no phase costs
    cost = _table("phase costs, ms per cycle", gap=1)  # eight columns: one space keeps the graph column at 80
    for col in ("config", "batch", "decode", "verify", "v/dec", "draft", "extend", "graphs"):
        cost.add_column(col, justify="left" if col in ("config", "graphs") else "right", no_wrap=col != "graphs")
    last = None
    for r in sorted(rows, key=lambda r: r.batch):
        if last is not None and r.batch != last:
            speed.add_section()
            cost.add_section()
        last = r.batch
        spread = f"{min(r.pass_speedups):.2f}..{max(r.pass_speedups):.2f}" if len(r.pass_speedups) > 1 else "-"
        speed.add_row(r.config, str(r.batch), _f(r.tok_per_s, "{:.1f}"), _f(r.speedup, "{:.2f}x"), spread,
                      _f(r.mean_accept_len), _f(r.same_tokens_as_plain_eager, "{:.0%}"))
        cost.add_row(r.config, str(r.batch), _f(r.decode_ms, "{:.3f}"), _f(r.verify_ms, "{:.3f}"),
                     _f(r.verify_over_decode), _f(r.draft_ms, "{:.3f}"), _f(r.extend_ms, "{:.3f}"), _graphs_cell(r.graph))
    return Group(speed, *([cost] if observed else []), *_request_table(rows))


def _request_table(rows) -> list[Any]:
    """Per request, what runs once before the cycles: the prompt's forward and the drafter's extend over it
    (median over the prompt groups), so a gap between the cycles' speedup and the end-to-end one is seen; then
    :func:`_busy_table`."""
    measured = sorted((r for r in rows if r.prefill_ms is not None), key=lambda r: r.batch)
    if not measured:
        return []
    table = _table("per request, ms (median over the prompt groups)")
    for col in ("config", "batch", "prompt", "drafter's extend", "whole request"):
        table.add_column(col, justify="left" if col == "config" else "right")
    last = None
    for r in measured:
        if last is not None and r.batch != last:
            table.add_section()
        last = r.batch
        table.add_row(r.config, str(r.batch), _f(r.prefill_ms, "{:.2f}"), _f(r.begin_ms, "{:.2f}"),
                      _f(_request_ms(r), "{:.1f}"))
    return [table, *_busy_table(rows)]


def _busy_table(rows) -> list[Any]:
    """What a pass lost beside its cycles: the rows x cycles that made tokens (a row idles from its request's end to
    a refill, or to its group's slowest row) and the share of its time in prompt forwards."""
    measured = sorted((r for r in rows if r.busy_rows is not None), key=lambda r: r.batch)
    if not measured:
        return []
    table = _table("rows x cycles that made tokens; the pass's time in prompt forwards")
    for col in ("config", "batch", "rows busy", "in prompts"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in measured:
        table.add_row(r.config, str(r.batch), _f(r.busy_rows, "{:.0%}"), _f(r.prefill_share, "{:.0%}"))
    return [table]


def _request_ms(r) -> float | None:
    """A request's mean wall time at this row's speed: a group's tokens (the pass's over its groups) / tok/s."""
    if not r.tok_per_s or not r.group_tok_per_s:
        return None
    return r.tokens / len(r.group_tok_per_s) / r.tok_per_s * 1e3


def _graphs_cell(graph: dict[str, str]) -> str:
    """"R" when every phase replayed, "E" when none did, else the phases with their letter."""
    marks = {p: "R" if st == "replay" else "E" for p, st in graph.items()}
    if len(set(marks.values())) <= 1:
        return next(iter(marks.values()), "-")
    return " ".join(f"{_SHORT.get(p, p)}:{m}" for p, m in marks.items())


_SHORT = {"decode": "dec", "draft": "draft", "verify": "ver", "draft_extend": "ext"}


def _eager_reasons(rows) -> list[str]:
    """One line per distinct eager reason, naming the configs and phases it applied to."""
    seen: dict[str, set[str]] = {}
    for r in rows:
        for phase, status in r.graph.items():
            if status != "replay":
                seen.setdefault(status, set()).add(f"{r.config} {_SHORT.get(phase, phase)}")
    lines = [f"  E = {why}: {', '.join(sorted(where))}" for why, where in seen.items()]
    off = {r.gemv for r in rows if r.gemv not in (None, "on")}
    attn_off = {r.decode_attn for r in rows if r.decode_attn not in (None, "on")}
    return (lines + [f"  GEMV off (F.linear instead): {why}" for why in sorted(off)]
            + [f"  decode attention off (SDPA instead): {why}" for why in sorted(attn_off)])


def _compile_fallback_lines(rows) -> list[str]:
    """Per config, each phase compile that fell back to eager (its graph then holds the eager layers)."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        for why in r.compile_fallbacks:
            if why not in seen.setdefault(r.config, []):
                seen[r.config].append(why)
    return [f"  not compiled ({cfg}, ran eager inside its graph): {why}" for cfg, whys in seen.items() for why in whys]


_CALL = {("decode", True): "decode/graph", ("decode", False): "decode/eager", ("prefill", False): "extend/eager",
         ("prefill", True): "extend/graph"}


def _micro_table(micro) -> Any:
    """Per batch and kind of call: the 1-token decode's ms, then each verify width as x that decode."""
    widths = sorted({m.tokens for m in micro if m.tokens > 1})
    t = _table("micro: verify of N tokens / 1-token decode")
    t.add_column("batch", justify="right", no_wrap=True)
    t.add_column("verify", no_wrap=True)
    t.add_column("dec ms", justify="right", no_wrap=True)
    for n in widths:
        t.add_column(f"N={n}", justify="right", no_wrap=True, min_width=4)
    for b in sorted({m.batch for m in micro}):
        base = [m for m in micro if m.batch == b and m.tokens == 1 and m.over_decode == 1.0]
        base_ms = _f(base[0].ms, "{:.3f}") if base else "-"
        kinds = sorted({(m.attention_mode, m.graphs) for m in micro if m.batch == b and m.tokens > 1},
                       key=lambda k: (k[0] != "decode", not k[1]))
        for mode, g in kinds:
            cells = []
            for n in widths:
                hit = [m for m in micro if (m.batch, m.tokens, m.attention_mode, m.graphs) == (b, n, mode, g)]
                cells.append(f"{hit[0].over_decode:.2f}" if hit and hit[0].over_decode is not None else "")
            t.add_row(str(b), _CALL.get((mode, g), mode), base_ms, *cells)
        t.add_section()
    return t


def _headline_lines(h) -> list[str]:
    if h.get("warnings"):  # no headline ratio: say why, loudly, with the figures
        return (["[bold red]no headline: these figures are not to be trusted[/]"]
                + [f"[red]  {w}[/]" for w in h["warnings"]]
                + ["[red]  the tables above show each pass's spread; run again on an idle machine (or with more "
                   "--repeats)[/]"])
    out = ["[bold]headline[/]"]
    if "plain_vs_hf_batch1" in h:
        x = h["plain_vs_hf_batch1"]
        out.append(f"  plain decoding, batch 1: {x['ours']:.1f} tok/s ({h['baseline']}) vs HF generate "
                   f"{x['hf']:.1f} tok/s = {x['ratio']:.2f}x")
    if "bandwidth_bound_batch1" in h:
        x = h["bandwidth_bound_batch1"]
        step = (f"; per decode step (phase median, logits included) {x['decode_step_tok_per_s']:.1f} tok/s = "
                f"{x['decode_step_fraction']:.0%}") if x.get("decode_step_tok_per_s") else ""
        out.append(f"  weight-bandwidth bound, batch 1: {x['weight_bytes'] / 1e9:.3f} GB of weights per token / "
                   f"{x['hbm_tbps']} TB/s = {x['bound_tok_per_s']:.1f} tok/s; ours end to end {x['ours_tok_per_s']:.1f} "
                   f"tok/s = {x['fraction']:.0%} of it{step}")
        for cfg, f in x.get("plain_configs", {}).items():
            if cfg != h["baseline"]:
                per_step = f" ({f['decode_step_fraction']:.0%} per decode step)" if f["decode_step_fraction"] else ""
                out.append(f"    {cfg}: {f['tok_per_s']:.1f} tok/s = {f['fraction']:.0%} of the bound{per_step}")
    for key, label in (("decode-graphs", "decode-mode verify, graphs"), ("decode-eager", "decode-mode verify, eager"),
                       ("prefill-eager", "prefill-mode verify (eager extend)")):
        vals = h.get("verify_over_decode_batch1", {}).get(key)
        if vals:
            shown = "  ".join(f"N={n}: {v:.2f}x" for n, v in sorted(vals.items()) if n >= 4)
            out.append(f"  verify cost / 1-token decode, batch 1, {label}: {shown}")
    for cfg, by_batch in h.get("spec_speedup", {}).items():
        passes = h.get("spec_speedup_passes", {}).get(cfg, {})
        shown = "  ".join(f"b{b}: {v:.2f}x" + (f" ({passes[b]['min']:.2f}..{passes[b]['max']:.2f} over "
                                               f"{passes[b]['passes']} passes)" if passes.get(b, {}).get("passes", 0) > 1
                                               else "")
                          for b, v in sorted(by_batch.items()))
        out.append(f"  {cfg} speedup over {h['baseline']}: {shown}")
        for b, x in sorted(h.get("spec_speedup_spread", {}).get(cfg, {}).items()):
            interval = (f"; 95% over the prompts drawn (bootstrap): {x['interval'][0]:.2f}x .. "
                        f"{x['interval'][1]:.2f}x" if x.get("interval") else "")
            out.append(f"    b{b}, prompt group by group ({x['groups']}): {x['min']:.2f}x .. {x['max']:.2f}x, "
                       f"median {x['median']:.2f}x{interval}")
    return out
