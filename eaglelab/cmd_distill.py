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

MAX_NEW_TOKENS, MAX_PROMPT_TOKENS = 256, 512  # the flags' defaults with --prompts (a mix sets them per part)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``distill`` subcommand."""
    p = subparsers.add_parser(
        "distill", help="generate the target's own answers to training prompts (token ids, resumable)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", nargs="+", metavar="FILE",
                   help="prompts.jsonl.gz (or its directory) from `eaglelab prompts` or `eaglelab synthesize`; several "
                        "are answered together, in the order given (--limit counts over all of them)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (shards/ and distill.json)")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"answer length cap (default {MAX_NEW_TOKENS})")
    p.add_argument("--batch-size", type=int, default=512, help="rows generated together (default 512)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help=f"longer prompts are skipped (default {MAX_PROMPT_TOKENS})")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    p.add_argument("--mix", default=None, metavar="FILE",
                   help="a mix spec (JSON) instead of --prompts: parts of prompts, each with its own --max-new-tokens "
                        "and --limit, and second turns of an earlier part (its answer kept, a follow-up asked); see "
                        "docs/training.md")
    add_batch_generation_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Distill; 0 on success. One writer per --out, as capture: a second distill into the same directory would
    number its shards as ours and both would answer the same prompts."""
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.safe_write import output_lock

    if bool(args.prompts) == bool(args.mix):
        raise ConfigError("give --prompts or --mix (one of them)", field="--prompts / --mix",
                          found="both" if args.prompts else "neither", hint="--prompts DIR [DIR ...], or --mix MIX.json")
    per_part = {"limit": args.limit, "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens}
    for key, value in per_part.items():
        if args.mix and value is not None:  # a mix would ignore the flag: say so rather than drop it
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is for --prompts; a mix sets it per part", field=flag, found=value,
                              hint=f'put "{key}": N in the parts of the mix spec')
    with output_lock(args.out, "distill"):
        return _distill_mix(args) if args.mix else _distill(args)


def _distill(args: argparse.Namespace) -> int:
    from rich.console import Console

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training.capture import target_identity
    from eaglelab.engine.training.distill import DistillSettings, Distiller, update_manifest
    from eaglelab.engine.training.prompt_corpus import read_corpus
    from eaglelab.devices import pick_device, pick_dtype

    console = Console(stderr=True, highlight=False)
    settings = DistillSettings(max_new_tokens=args.max_new_tokens or MAX_NEW_TOKENS, batch_size=args.batch_size,
                               max_prompt_tokens=args.max_prompt_tokens or MAX_PROMPT_TOKENS,
                               time_limit=args.time_limit, cuda_graphs=not args.no_cuda_graphs)
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


def _distill_mix(args: argparse.Namespace) -> int:
    """Each part of the mix in turn, its shards in the one --out (see engine/training/distill_mix.py)."""
    import time
    from dataclasses import asdict

    from rich.console import Console

    from eaglelab.devices import pick_device, pick_dtype
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training import distill_mix as M
    from eaglelab.engine.training.capture import target_identity
    from eaglelab.engine.training.distill import DistillSettings, Distiller, free_device_memory, update_manifest

    console, t0 = Console(stderr=True, highlight=False), time.perf_counter()
    spec = M.read_mix(args.mix)
    texts = M.first_turn_texts(spec)
    ranges = M.part_ranges(spec, texts)
    ids: list = [None] * sum(len(r) for r in ranges.values())
    device, device_reason = pick_device(args.device)
    dtype, dtype_reason = pick_dtype(args.dtype, device)
    target = load_target(args.model, device=device, dtype=dtype)
    if target.tokenizer is None:
        raise ConfigError("the target has no tokenizer", file=target.path, hint="distill needs tokenizer.json")
    console.print(f"[bold]distill[/] {target.name} on {device} ({device_reason}), {dtype} ({dtype_reason}): a mix of "
                  + ", ".join(f"{p.name} {len(ranges[p.name])}" for p in spec.parts))
    identity = target_identity(target.model, target.path, target.name)
    identity["model_arg"] = str(args.model)
    mix = {"file": str(args.mix), "seed": spec.seed, "parts": [
        {**asdict(p), "indices": [ranges[p.name].start, ranges[p.name].stop]} for p in spec.parts]}
    for part in spec.parts:
        left = None if args.time_limit is None else args.time_limit - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            console.print("stopped at the time limit; run the same command again to resume")
            break
        M.mix_prompt_ids(spec, texts, ranges, part, args.out, target.tokenizer, args.system, ids)
        settings = DistillSettings(max_new_tokens=part.max_new_tokens, batch_size=args.batch_size,
                                   max_prompt_tokens=part.max_prompt_tokens, time_limit=left,
                                   cuda_graphs=not args.no_cuda_graphs)
        distiller = Distiller(target.model, target.tokenizer.eos_token_ids, settings)
        ready = sum(1 for i in ranges[part.name] if ids[i] is not None)
        console.print(f"  {part.name}: {ready} of {len(ranges[part.name])} prompts ready, answers up to "
                      f"{part.max_new_tokens} tokens")
        summary = _run_in_memory(distiller, ids, args.out, console, select=ranges[part.name])
        del distiller
        free_device_memory()
        update_manifest(args.out, {
            "target": identity, "prompts_files": [p.prompts for p in spec.parts if p.prompts], "mix": mix,
            "prompts": len(ids), "system_prompt": args.system, "chat_template": target.tokenizer.chat_template,
            "dtype": dtype, "run": {"device": device_name(device), "dtype": dtype, "part": part.name},
        }, summary, settings)
        console.print(f"  {part.name}: {summary.done_now} answered this run ({summary.new_tokens} tokens in "
                      f"{summary.seconds:.1f} s), {summary.remaining} left"
                      + (f", {summary.skipped_long} over max_prompt_tokens skipped" if summary.skipped_long else ""))
    return 0


def _run_in_memory(distiller, prompt_ids, out, console, select=None):
    """:func:`_run`; running out of memory is the user's --batch-size, said with the rows of the batch and that
    the shards written so far are kept."""
    rows = distiller.settings.batch_size
    return out_of_memory_is_batch_size(
        lambda: _run(distiller, prompt_ids, out, console, select), rows, f"in a batch of up to {rows} rows",
        hint="a smaller --batch-size (a batch holds a KV cache of rows x (prompt + --max-new-tokens) slots); the "
             "shards written so far are kept: run the same command again to resume")


def _run(distiller, prompt_ids, out, console, select=None):
    from rich.progress import Progress

    with Progress(*progress_columns(), console=console) as bar:
        task = bar.add_task("prompts", total=None, rate="")
        tokens, seconds = [0], [0.0]

        def on_batch(r) -> None:
            tokens[0] += r.new_tokens
            seconds[0] += r.seconds
            bar.update(task, completed=r.done, total=r.total,
                       rate=f"{tokens[0] / max(seconds[0], 1e-9):.0f} new tok/s, batch {r.rows} rows {r.seconds:.1f} s")

        return distiller.run(prompt_ids, out, progress=on_batch, select=select)
