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

from eaglelab.batch_cli import add_batch_generation_args, out_of_memory_is_batch_size, progress_columns
from eaglelab.devices import device_name


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
    add_batch_generation_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Distill; 0 on success. One writer per --out, as capture: a second distill into the same directory would
    number its shards as ours and both would answer the same prompts."""
    from eaglelab.engine.formats.safe_write import output_lock

    with output_lock(args.out, "distill"):
        return _distill(args)


def _distill(args: argparse.Namespace) -> int:
    from rich.console import Console

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training.capture import target_identity
    from eaglelab.engine.training.distill import DistillSettings, Distiller, update_manifest
    from eaglelab.engine.training.prompt_corpus import read_corpus
    from eaglelab.devices import pick_device, pick_dtype

    console = Console(stderr=True, highlight=False)
    settings = DistillSettings(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                               max_prompt_tokens=args.max_prompt_tokens, time_limit=args.time_limit,
                               cuda_graphs=not args.no_cuda_graphs)
    records = [r for path in args.prompts for r in read_corpus(path)]
    if args.limit is not None:
        records = records[: args.limit]
    device, device_reason = pick_device(args.device)
    dtype, dtype_reason = pick_dtype(args.dtype, device)
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
    manifest = update_manifest(args.out, {
        "target": identity, "prompts_file": str(args.prompts[0]), "prompts_files": [str(x) for x in args.prompts], "prompts": len(records), "system_prompt": args.system,
        "chat_template": target.tokenizer.chat_template, "dtype": dtype,
        "run": {"device": device_name(device), "dtype": dtype},
    }, summary, settings)
    c = manifest["counts"]
    console.print(f"{summary.done_now} prompts answered this run ({summary.new_tokens} tokens in {summary.seconds:.1f} s, "
                  f"{summary.tokens_per_second:.0f} tok/s on {device_name(device)}); {c['samples']} in total, "
                  f"{summary.remaining} left" + ("; stopped at the time limit" if summary.stopped_by_time else "")
                  + (f"; {summary.skipped_long} prompts over --max-prompt-tokens skipped" if summary.skipped_long else ""))
    return 0


def _run_in_memory(distiller, prompt_ids, out, console):
    """:func:`_run`; running out of memory is the user's --batch-size, said with the rows of the batch and that
    the shards written so far are kept."""
    rows = distiller.settings.batch_size
    return out_of_memory_is_batch_size(
        lambda: _run(distiller, prompt_ids, out, console), rows, f"in a batch of up to {rows} rows",
        hint="a smaller --batch-size (a batch holds a KV cache of rows x (prompt + --max-new-tokens) slots); the "
             "shards written so far are kept: run the same command again to resume")


def _run(distiller, prompt_ids, out, console):
    from rich.progress import Progress

    with Progress(*progress_columns(), console=console) as bar:
        task = bar.add_task("prompts", total=None, rate="")
        tokens, seconds = [0], [0.0]

        def on_batch(r) -> None:
            tokens[0] += r.new_tokens
            seconds[0] += r.seconds
            bar.update(task, completed=r.done, total=r.total,
                       rate=f"{tokens[0] / max(seconds[0], 1e-9):.0f} new tok/s, batch {r.rows} rows {r.seconds:.1f} s")

        return distiller.run(prompt_ids, out, progress=on_batch)
