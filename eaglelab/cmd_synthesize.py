"""``eaglelab synthesize``: training prompts written by the target itself (its own user turns).

Gives the target only the chat template's text before a user's message and samples what follows:
an instruct model writes a user's request of the kinds it was tuned on and ends the turn (the Magpie
method). Turns that were cut, too short, full of template markup or not text are dropped; the rest
are deduplicated and screened against MT-bench and HumanEval like ``eaglelab prompts``. Writes
DIR/prompts.jsonl.gz and DIR/manifest.json in ``eaglelab prompts``' format; answer them with
``eaglelab distill --prompts DIR`` (several prompt directories may be given to distill together).
With --systems-file, batch b is conditioned on the file's system message b mod n (a wider spread of
requests: writing, maths, code, ...); the manifest counts what each message kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eaglelab.batch_cli import add_batch_generation_args, out_of_memory_is_batch_size, progress_columns
from eaglelab.devices import device_name


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``synthesize`` subcommand."""
    p = subparsers.add_parser(
        "synthesize", help="training prompts written by the target (its own user turns, sampled)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where prompts.jsonl.gz and manifest.json go")
    p.add_argument("--force", action="store_true", help="replace a corpus already in --out (refused without it)")
    p.add_argument("--count", type=int, default=10_000, metavar="N", help="prompts to keep (default 10000)")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0; default 1.0)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="a user turn longer than this is dropped (default 128)")
    p.add_argument("--batch-size", type=int, default=512, help="turns sampled together (default 512)")
    p.add_argument("--min-words", type=int, default=4, help="shorter turns are dropped (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems-file", type=Path, default=None, metavar="FILE",
                   help="system messages, one per line ('#' starts a comment): batch b is conditioned on line "
                        "b mod n, for a wider spread of requests (instead of --system)")
    p.add_argument("--ask", default=None, metavar="KINDS|FILE",
                   help="instead of user turns, the target's answers to requests for a question: 'code', 'maths' or "
                        "'code,maths' (requests we wrote), or a file of requests, one per line; batch b asks request "
                        "b mod n (screened against MT-bench and HumanEval like every prompt)")
    add_batch_generation_args(p)
    p.set_defaults(func=run)


def read_asks(value: str) -> tuple[str, ...]:
    """--ask: preset kinds ('code', 'maths', comma-separated) or a file of requests, one per line."""
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.training.synth_prompts import ASKS

    kinds = [k.strip() for k in value.split(",") if k.strip()]
    if kinds and all(k in ASKS for k in kinds):
        return tuple(a for k in kinds for a in ASKS[k])
    if not Path(value).is_file():
        raise ConfigError("neither request kinds nor a file", field="--ask", found=value,
                          expected=f"{', '.join(ASKS)} (comma-separated), or a file of requests, one per line")
    return read_systems(Path(value), "request", "--ask")


def read_systems(path: Path, what: str = "system message", flag: str = "--systems-file") -> tuple[str, ...]:
    """The lines of ``--systems-file`` (or ``flag``'s file of ``what``, e.g. --ask's requests): its non-empty lines
    that are not comments."""
    from eaglelab.engine.errors import ConfigError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the {what}s ({type(exc).__name__}: {exc})", file=path, field=flag,
                          expected=f"a UTF-8 text file, one {what} per line") from None
    messages = tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not messages:
        raise ConfigError(f"no {what} in the file", file=path, field=flag, found="only blank or '#' lines",
                          expected=f"one {what} per line")
    return messages


def run(args: argparse.Namespace) -> int:
    """Sample, screen and write the prompts; 0 on success."""
    from rich.console import Console
    from rich.progress import Progress

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training import prompt_corpus as pc
    from eaglelab.engine.training.capture import target_identity
    from eaglelab.engine.training.synth_prompts import SynthSettings, Synthesizer, synthesis_manifest
    from eaglelab.devices import pick_device, pick_dtype

    console = Console(stderr=True, highlight=False)
    settings = SynthSettings(count=args.count, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, min_words=args.min_words,
                             seed=args.seed, time_limit=args.time_limit, cuda_graphs=not args.no_cuda_graphs,
                             system=args.system,
                             systems=read_systems(args.systems_file) if args.systems_file else (),
                             asks=read_asks(args.ask) if args.ask else ())
    with console.status("reading the evaluation sets (MT-bench, HumanEval) for the overlap check ..."):
        overlap = pc.OverlapIndex.from_texts(pc.evaluation_texts())
    device, device_reason = pick_device(args.device)
    dtype, dtype_reason = pick_dtype(args.dtype, device)
    target = load_target(args.model, device=device, dtype=dtype)
    if target.tokenizer is None:
        raise ConfigError("the target has no tokenizer", file=target.path, hint="synthesis needs tokenizer.json")
    synth = Synthesizer(target.model, target.tokenizer, settings)
    prefix = target.tokenizer.decode(synth.prefixes[0], skip_special_tokens=False)  # with --ask: the first request
    console.print(f"[bold]synthesize[/] {target.name} on {device} ({device_reason}), {dtype} ({dtype_reason}): "
                  f"{settings.count} user turns, batches of {settings.batch_size}, temperature {settings.temperature}, "
                  f"top-p {settings.top_p}, up to {settings.max_new_tokens} tokens")
    console.print(f"  conditioned on the template's text before a user message: {prefix!r}"
                  + (f" (the first of {len(synth.prefixes)} system messages, one per batch in turn)"
                     if len(synth.prefixes) > 1 else ""))
    with Progress(*progress_columns(), console=console) as bar:
        task = bar.add_task("kept", total=settings.count, rate="")
        sampled = [0, 0]

        def on_batch(r) -> None:
            sampled[0] += r.sampled
            sampled[1] += r.kept
            bar.update(task, completed=r.total_kept,
                       rate=f"kept {sampled[1] / max(sampled[0], 1):.0%} of {sampled[0]} sampled, {r.seconds:.1f} s a batch")

        rows = settings.batch_size
        result = out_of_memory_is_batch_size(
            lambda: synth.run(overlap, progress=on_batch), rows, f"sampling {rows} user turns at once",
            hint="a smaller --batch-size (a batch holds a KV cache of rows x (the template's opening + "
                 "--max-new-tokens) slots and the vocabulary's logits per row)")
    synth.release()
    identity = target_identity(target.model, target.path, target.name)
    identity["model_arg"] = str(args.model)
    extra = {"synthesis": synthesis_manifest(result, settings, prefix, {"target": identity, "device": device_name(device),
                                                                         "dtype": dtype})}
    path = pc.write_corpus(result.corpus(args.seed), args.out, overlap, extra=extra)
    dropped = ", ".join(f"{k} {v}" for k, v in result.dropped.most_common()) or "none"
    console.print(f"wrote {len(result.prompts)} prompts to {path} ({path.stat().st_size / 2**20:.1f} MiB) from "
                  f"{result.sampled} sampled turns ({result.tokens} tokens) in {result.seconds:.1f} s; dropped: {dropped}"
                  + ("; stopped at the time limit" if result.stopped_by_time else ""))
    return 0
