"""``eaglelab distill``: the target's own greedy answers to the training prompts, token ids only.

Reads the prompts (``eaglelab prompts`` output, or any JSONL with a "prompt" field), applies the
target's chat template, and generates in large batches with the engine (plain greedy decoding,
CUDA graphs on a GPU, stop at EOS or --max-new-tokens). Each batch becomes one shard under
OUT/shards/ (token ids + where the answer starts); OUT/distill.json records the target, settings,
counts and throughput. Run it again on the same OUT to resume: prompts already in a shard are
skipped. --time-limit stops before a batch that would overrun it. Train on the result with
``eaglelab train --data OUT --online``.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``distill`` subcommand."""
    p = subparsers.add_parser(
        "distill", help="generate the target's own answers to training prompts (token ids, resumable)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", required=True, nargs="+", metavar="FILE",
                   help="prompts.jsonl.gz (or its directory) from `eaglelab prompts` or `eaglelab synthesize`; several "
                        "are answered together, in the order given (--limit counts over all of them)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (shards/ and distill.json)")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap (default 256)")
    p.add_argument("--batch-size", type=int, default=512, help="rows generated together (default 512)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="longer prompts are skipped (default 512)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="stop before a batch would overrun S seconds")
    p.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Distill; 0 on success."""
    from rich.console import Console

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training.capture import target_identity
    from eaglelab.engine.training.distill import DistillSettings, Distiller, update_manifest
    from eaglelab.engine.training.prompt_corpus import read_corpus
    from eaglelab.session import _pick_device, _pick_dtype

    console = Console(stderr=True, highlight=False)
    settings = DistillSettings(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                               max_prompt_tokens=args.max_prompt_tokens, time_limit=args.time_limit,
                               cuda_graphs=not args.no_cuda_graphs)
    records = [r for path in args.prompts for r in read_corpus(path)]
    if args.limit is not None:
        records = records[: args.limit]
    device, device_reason = _pick_device(args.device)
    dtype, dtype_reason = _pick_dtype(args.dtype, device)
    target = load_target(args.model, device=device, dtype=dtype)
    if target.tokenizer is None:
        raise ConfigError("the target has no tokenizer", file=target.path, hint="distill needs tokenizer.json")
    with console.status(f"applying the chat template to {len(records)} prompts ..."):
        prompt_ids = target.tokenizer.chat_ids_many([r["prompt"] for r in records], system=args.system)
    distiller = Distiller(target.model, target.tokenizer.eos_token_ids, settings)
    console.print(f"[bold]distill[/] {target.name} on {device} ({device_reason}), {dtype} ({dtype_reason})")
    console.print(f"  {len(records)} prompts, answers up to {settings.max_new_tokens} tokens, batches of "
                  f"{settings.batch_size}; decode: {distiller.graph_status}")
    summary = _run_in_memory(distiller, prompt_ids, args.out, console)
    identity = target_identity(target.model, target.path, target.name)
    identity["model_arg"] = str(args.model)
    device_name = str(device) + (f" ({_cuda_name(device)})" if device.type == "cuda" else "")
    manifest = update_manifest(args.out, {
        "target": identity, "prompts_file": str(args.prompts[0]), "prompts_files": [str(x) for x in args.prompts], "prompts": len(records), "system_prompt": args.system,
        "chat_template": target.tokenizer.chat_template, "dtype": dtype,
        "run": {"device": device_name, "dtype": dtype},
    }, summary, settings)
    c = manifest["counts"]
    console.print(f"{summary.done_now} prompts answered this run ({summary.new_tokens} tokens in {summary.seconds:.1f} s, "
                  f"{summary.tokens_per_second:.0f} tok/s on {device_name}); {c['samples']} in total, "
                  f"{summary.remaining} left" + ("; stopped at the time limit" if summary.stopped_by_time else "")
                  + (f"; {summary.skipped_long} prompts over --max-prompt-tokens skipped" if summary.skipped_long else ""))
    return 0


def _cuda_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device)


def _run_in_memory(distiller, prompt_ids, out, console):
    """:func:`_run`; running out of memory (a --batch-size the device cannot hold) is the user's error, said
    with the rows of the batch and that the shards written so far are kept (any other command gets the
    CLI's general out-of-memory message)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.errors import is_out_of_memory

    try:
        return _run(distiller, prompt_ids, out, console)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        rows = distiller.settings.batch_size
        first = next((line for line in str(exc).splitlines() if line.strip()), "")[:200]
        raise EagleLabError(f"out of memory in a batch of up to {rows} rows ({first})", field="--batch-size",
                            found=rows, hint="a smaller --batch-size (a batch holds a KV cache of rows x (prompt + "
                                             "--max-new-tokens) slots); the shards written so far are kept: run the "
                                             "same command again to resume") from None


def _run(distiller, prompt_ids, out, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[rate]}"))
    with Progress(*cols, console=console) as bar:
        task = bar.add_task("prompts", total=None, rate="")
        tokens, seconds = [0], [0.0]

        def on_batch(r) -> None:
            tokens[0] += r.new_tokens
            seconds[0] += r.seconds
            bar.update(task, completed=r.done, total=r.total,
                       rate=f"{tokens[0] / max(seconds[0], 1e-9):.0f} new tok/s, batch {r.rows} rows {r.seconds:.1f} s")

        return distiller.run(prompt_ids, out, progress=on_batch)
