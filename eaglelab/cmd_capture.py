"""``eaglelab capture``: make EAGLE-3 training data from the target's own responses.

The target answers training prompts (built offline from Python's documentation and self-instruct
seed topics, never from MT-bench, or read from --prompts-file), then one batched forward records
its hidden states. The output is SpecForge's offline format (rows_*/data_*.ckpt), plus
manifest.json (target identity, layer ids and convention, dtype, chat template, counts),
prompts.jsonl (the prompts used) and vocab_mapping/vocab_mapping.pt (the draft vocabulary).
Running it again on the same --out resumes: existing samples are kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``capture`` subcommand."""
    p = subparsers.add_parser(
        "capture",
        help="capture EAGLE-3 training data (SpecForge offline format) from the target's own responses",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf")
    p.add_argument("--out", required=True, metavar="DIR", help="output data directory")
    p.add_argument("--prompts", type=int, default=2000, metavar="N", help="number of training prompts (default 2000)")
    p.add_argument("--prompts-file", metavar="FILE", default=None,
                   help="prompts to use instead of the built-in ones: one per line, or JSONL with a 'prompt' or 'text' field")
    p.add_argument("--max-new-tokens", type=int, default=512, help="response length cap (default 512)")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + response tokens kept per sample (default 2048)")
    p.add_argument("--layer-ids", default=None, metavar="IDS",
                   help="aux layer ids, comma-separated (default: SpecForge's [1, L/2-1, L-4] in the SGLang convention)")
    p.add_argument("--convention", default="sglang", choices=("sglang", "vllm", "eagle"),
                   help="how --layer-ids count layers (sglang: output of layer k = hs[k+1]; vllm/eagle: hs[k])")
    p.add_argument("--batch-size", type=int, default=32, help="prompts generated and captured together (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the responses (0 = greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    p.add_argument("--draft-vocab-size", type=int, default=8192, help="size of the draft vocabulary written (default 8192)")
    p.add_argument("--compress", action="store_true", help="write data_*.ckpt.gz")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")
    p.set_defaults(func=run)


def read_prompts_file(path: str) -> list[str]:
    """Prompts from a text file (one per line) or JSONL ({"prompt"|"text"|"turns"[0]: ...})."""
    import json

    from eaglelab.engine.errors import ConfigError

    file = Path(path)
    if not file.exists():
        raise ConfigError("no such prompts file", file=file)
    out = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not (path.endswith(".jsonl") or line.startswith("{")):
            out.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {n} is not JSON ({exc.msg})", file=file) from None
        text = obj.get("prompt") or obj.get("text") or (obj.get("turns") or [None])[0]
        if not isinstance(text, str):
            raise ConfigError(f"line {n} has no prompt", file=file, expected='"prompt", "text" or "turns"')
        out.append(text)
    if not out:
        raise ConfigError("no prompts in the file", file=file)
    return out


def parse_ids(text: str | None) -> tuple[int, ...] | None:
    from eaglelab.engine.errors import ConfigError

    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ConfigError("expected comma-separated integers", field="--layer-ids", found=text) from None


def run(args: argparse.Namespace) -> int:
    """Capture; 0 on success."""
    import json

    from rich.console import Console

    from eaglelab.engine.training.capture import CaptureSettings, default_layer_ids, read_manifest, target_identity, write_manifest
    from eaglelab.engine.training.draft_vocab import build_draft_vocab, scan_data
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.formats.specforge_data import write_vocab_mapping
    from eaglelab.engine.training.train_prompts import TrainPrompt, build_prompts
    from eaglelab.session import _pick_device, _pick_dtype

    console = Console(stderr=True, highlight=False)
    device, device_reason = _pick_device(args.device)
    dtype, dtype_reason = _pick_dtype(args.dtype, device)
    target = load_target(args.model, device=device, dtype=dtype)
    if target.tokenizer is None:
        raise ConfigError("the target has no tokenizer", file=target.path, hint="capture needs tokenizer.json")
    L = target.config.num_layers
    ids = parse_ids(args.layer_ids)
    convention = args.convention if ids is not None else "sglang"
    ids = ids if ids is not None else default_layer_ids(L)
    settings = CaptureSettings(layer_ids=ids, convention=convention, max_new_tokens=args.max_new_tokens,
                               batch_size=args.batch_size, temperature=args.temperature, seed=args.seed,
                               max_length=args.max_length, compress=args.compress)
    out = Path(args.out)
    if args.prompts_file:
        prompts = [TrainPrompt(t, "file") for t in read_prompts_file(args.prompts_file)]
    else:
        prompts = build_prompts(args.prompts, seed=args.seed)
    _check_resume(out, read_manifest(out), settings, console)
    tok = target.tokenizer
    prompt_ids = [tok.chat_ids(p.text, system=args.system) for p in prompts]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "prompts.jsonl", "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"index": i, "source": p.source, "prompt": p.text}) + "\n")
    console.print(f"[bold]capture[/] {target.name} on {device} ({device_reason}), {dtype} ({dtype_reason})")
    console.print(f"  {len(prompts)} prompts, layer ids {list(ids)} ({convention}) = hs{list(settings.hf_indices)}, "
                  f"responses up to {args.max_new_tokens} tokens, batches of {args.batch_size}")
    identity = target_identity(target.model, target.path, target.name)
    identity["model_arg"] = str(args.model)
    extra = {"prompts_file": "prompts.jsonl", "prompt_source": args.prompts_file or "eaglelab.engine.training.train_prompts",
             "system_prompt": args.system}
    summary = _run_capture(target, prompt_ids, out, settings, identity, extra, console)
    counts, _ = scan_data(out, target.config.vocab_size)
    size = min(args.draft_vocab_size, target.config.vocab_size)
    dv = build_draft_vocab(counts, size)
    write_vocab_mapping(out, dv.mapping)
    manifest = read_manifest(out) or {}
    manifest["draft_vocab"] = {"size": size, "coverage": dv.coverage, "distinct_assistant_tokens": dv.distinct_tokens}
    write_manifest(out, manifest)
    console.print(f"wrote {summary.samples} samples ({summary.tokens} tokens, {summary.assistant_tokens} assistant) to {out}"
                  + (f"; kept {summary.skipped_existing} from before" if summary.skipped_existing else "")
                  + (f"; dropped {summary.dropped} prompts (too long or empty responses)" if summary.dropped else ""))
    console.print(f"draft vocabulary {size}: covers {dv.coverage:.2%} of assistant tokens "
                  f"({dv.distinct_tokens} distinct seen)")
    return 0


def _check_resume(out: Path, manifest, settings, console) -> None:
    """Resuming into a directory captured with other layers would mix data: refuse."""
    from eaglelab.engine.errors import ConfigError

    if manifest is None:
        return
    if list(manifest.get("hf_indices", [])) != list(settings.hf_indices):
        raise ConfigError("the directory holds data captured at other layers", file=out / "manifest.json",
                          field="hf_indices", found=manifest.get("hf_indices"), expected=list(settings.hf_indices),
                          hint="use another --out, or the same --layer-ids")
    console.print(f"[dim]resuming into {out}: existing samples are kept[/]")


def _run_capture(target, prompt_ids, out, settings, identity, extra, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from eaglelab.engine.training.capture import capture

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=False) as bar:
        task = bar.add_task("prompts", total=len(prompt_ids))
        return capture(
            target.model, prompt_ids, out, settings, eos_token_ids=target.tokenizer.eos_token_ids,
            identity=identity, chat_template=target.tokenizer.chat_template, extra=extra,
            progress=lambda stage, done, total: bar.update(task, completed=done, total=total),
        )
