"""``eaglelab run PROMPT``: generate with the instrumented engine, stream the text, summarise."""

from __future__ import annotations

import argparse
from typing import Any

from eaglelab.session import add_engine_args, build_session


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="generate text for a prompt (plain or speculative), stream it and summarise the run",
        description="Apply the model's chat template to PROMPT, stream the reply, end with a summary.",
    )
    p.add_argument("prompt", help="the user message")
    add_engine_args(p)
    p.add_argument("--system", default=None, help="a system message (default: the template's own)")
    p.add_argument("--raw", action="store_true", help="feed PROMPT as is, without the chat template")
    p.add_argument(
        "--compare", action=argparse.BooleanOptionalAction, default=True,
        help="when speculating, also run plain decoding on the same prompt and report the speedup",
    )
    p.add_argument("--record", metavar="FILE", help="write a JSONL run record (replay it with `eaglelab tui`)")
    p.add_argument("--force", action="store_true", help="replace an existing run record named by --record")
    p.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard scalars to DIR")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel ranks (NCCL on GPU, gloo on CPU); launch as "
                        "`torchrun --nproc-per-node N -m eaglelab run --tp N ...`; rank 0 prints")
    p.add_argument("--tp-check", action="store_true",
                   help="debug: assert every cycle that each rank's replicated drafter drafted the same tree "
                        "(one host sync and a checksum gather per cycle)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.tp == 1:
        return _run(args, None)
    tp = join_tp(args.tp, args.device)
    tp.check_replicas = args.tp_check
    try:
        with tp.guard("eaglelab run"):  # a rank that fails makes every rank stop with its error
            return _run(args, tp)
    finally:
        tp.close()


def join_tp(n: int, device: str):
    """Join the torchrun-launched group of ``n`` ranks (``--tp N``), checking the process count."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.core.tp_group import init_tp

    if n < 1:
        raise EagleLabError("must be >= 1", field="--tp", found=n)
    tp = init_tp("auto", device=device)
    if tp.world_size != n:
        tp.close()
        raise EagleLabError(
            "--tp must equal the number of processes torchrun started", field="--tp", found=n,
            expected=tp.world_size, hint=f"torchrun --nproc-per-node {n} -m eaglelab run --tp {n} ...",
        )
    return tp


class StreamedAnswer:
    """The answer printed to stdout as it decodes, and the status lines said meanwhile (a phase captured
    or compiled lazily on its first use) on stderr, each on a line of its own: when the answer stopped
    mid-line, a newline goes to stderr first, so the terminal shows the status apart and the answer on
    stdout stays exactly the model's text."""

    def __init__(self, out, err) -> None:
        self.out, self.err = out, err
        self.tokenizer = None  # set once the session has loaded it
        self.shown: list[int] = []
        self.printed = ""
        self.midline = False

    def stream(self, row: int, new: list[int]) -> None:
        self.shown.extend(new)
        text = self.tokenizer.decode(self.shown)
        if text.startswith(self.printed) and len(text) > len(self.printed):
            if not self.out.quiet:  # the text as it is, straight to the file: no rich rendering between cycles
                self.out.file.write(text[len(self.printed):])
                self.out.file.flush()
            self.printed = text
            self.midline = not text.endswith("\n")

    def say(self, message: str) -> None:
        if self.midline:
            self.err.print()
            self.midline = False
        self.err.print(f"[dim]{message}[/]")


def _run(args: argparse.Namespace, tp) -> int:
    from rich.console import Console

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.runtime.limits import check_context

    quiet = tp is not None and tp.rank != 0  # only rank 0 prints, streams and writes records
    console = Console(highlight=False, quiet=quiet)
    err = Console(stderr=True, highlight=False, quiet=quiet)
    answer = StreamedAnswer(console, err)
    session = build_session(args, log=answer.say, tp=tp)
    tok = session.target.tokenizer
    assert tok is not None
    ids = tok.encode(args.prompt) if args.raw else tok.chat_ids(args.prompt, system=args.system)
    if not ids:
        raise EagleLabError("gives no tokens", field="PROMPT", found=repr(args.prompt), hint="give a prompt with text")
    check_context(session.target.config, len(ids), args.max_new_tokens)

    from eaglelab.probes.sinks import ConsoleSummary

    observer, finish = session.observer(record=None if quiet else args.record,
                                        tensorboard=None if quiet else args.tensorboard, always=True)
    probes = ConsoleSummary(console, print_on_finish=False)
    observer.subscribe(probes)
    allreduce = None
    if tp is not None:
        from eaglelab.probes.allreduce import AllReduceProbe

        allreduce = AllReduceProbe()
        observer.subscribe(allreduce)
    for note in session.notes:
        err.print(f"[dim]{note}[/]")
    engine = session.engine(observer=observer)
    answer.tokenizer = tok
    # Every rank streams (a quiet console prints nothing): the same host work between cycles on every
    # rank, so none reaches the next forward's first collective late and makes the others wait.
    result = engine.generate([ids], args.max_new_tokens, session.sampling, session.generator(), stream=answer.stream,
                             warm_up=session.warm_up_tokens())
    console.print()
    ar_summary = None
    if allreduce is not None:  # every rank's timings, published on rank 0's bus (into the record)
        from eaglelab.probes.allreduce import summarize

        events = allreduce.gather(tp)
        if not quiet:
            allreduce.publish_peers(observer, events, own_rank=tp.rank)
        ar_summary = summarize(events)
    baseline = None
    if session.spec.enabled and args.compare:
        err.print("[dim]running plain decoding on the same prompt for comparison ...[/]")
        # On the same bus: the record keeps it as this run's baseline (the TUI's "verify x decode"),
        # the summary takes its decode cost; the run's own figures do not change.
        baseline = session.plain_engine(observer=observer).generate(
            [ids], args.max_new_tokens, session.sampling, session.generator(),
            warm_up=session.warm_up_tokens(session.spec.plain()))
    graphs = session.runner_factory is not None  # CUDA graphs in use: their replay share means something
    extra = probes.probe_rows(graphs) if session.spec.enabled else []
    summary_rows(console, session, result, baseline, ar_summary, extra)
    if session.spec.enabled:
        for line in probes.verdict_lines():
            console.print(line)
    finish()
    if args.record:
        err.print(f"[dim]run record written to {args.record} (replay: eaglelab tui {args.record})[/]")
    return 0


def summary_rows(console, session, result, baseline, allreduce=None, probe_rows=()) -> None:
    """The one end-of-run table: tokens, speed, device, dtype, acceptance, speedup, all-reduce cost, and the
    probes' own figures (``probe_rows``: accept rate, ms per phase, graph replay share)."""
    from rich.table import Table

    from eaglelab.compare import output_difference

    t = Table(title="run summary", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    rows: list[tuple[str, Any]] = [
        ("model", f"{session.target.name} ({session.target.config.num_layers} layers)"),
        ("device", f"{session.device_label}  [dim]{session.device_reason}[/]"),
        ("dtype", f"{session.dtype_name}  [dim]{session.dtype_reason}[/]"),
        ("prompt tokens", result.prompt_tokens),
        ("generated tokens", f"{result.generated_tokens} (stopped: {', '.join(result.stop_reasons)})"),
        ("speed", f"{result.tokens_per_second:.1f} tok/s over {result.seconds:.2f} s"),
    ]
    setup = result.setup_seconds + (baseline.setup_seconds if baseline is not None else 0.0)
    if setup > 0:
        rows.append(("setup", f"{setup:.2f} s capturing CUDA graphs, compiling and warming up [dim](once; not in tok/s)[/]"))
    if session.spec.enabled:
        rows.append(("speculation", session.spec_label))
        if result.mean_accept_len is not None:
            rows.append(("mean accepted length", f"{result.mean_accept_len:.2f} tokens per verify (bonus included)"))
    if baseline is not None:
        ratio = result.tokens_per_second / baseline.tokens_per_second if baseline.tokens_per_second else 0.0
        rows.append(("plain decoding", f"{baseline.tokens_per_second:.1f} tok/s (same prompt, same run)"))
        rows.append(("speedup", f"{ratio:.2f}x over plain decoding"))
        if session.sampling.greedy:
            check = "identical to plain greedy decoding"
            diff = output_difference(result.tokens, baseline.tokens, session.dtype_name, session.spec.draft_tokens)
            if diff is not None:
                text, alarm = diff
                check = f"[red]{text}[/]" if alarm else text
            rows.append(("output check", check))
    if allreduce is not None:
        rows.append(("tensor parallel", allreduce_row(allreduce, session.target.config.num_layers)))
    rows += list(probe_rows)
    for k, v in rows:
        t.add_row(k, str(v))
    console.print(t)


def allreduce_row(summary, num_layers: int) -> str:
    """One line on the all-reduce probe: collectives per layer, transfer and skew summed over the run."""
    ranks = len(summary.ranks)
    transfer, skew = summary.totals()
    calls = summary.matched_calls
    per_layer = summary.calls_per_layer()
    forwards = per_layer.get(num_layers, 0) or 1  # one logits all-gather per target forward
    return (f"{ranks} ranks; {calls} collectives ({per_layer.get(0, 0) / forwards:g} per layer per target forward), "
            f"transfer {transfer:.1f} ms + arrival skew {skew:.1f} ms in all "
            f"[dim](min over ranks / spread; per layer in the record)[/]")
