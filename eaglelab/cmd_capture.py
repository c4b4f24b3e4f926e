"""``eaglelab capture``: make EAGLE-3 training data from the target's own responses.

The target answers training prompts (built offline from Python's documentation and self-instruct
seed topics, never from MT-bench, or read from --prompts-file), then one batched forward records
its hidden states. The output is SpecForge's offline format (rows_*/data_*.ckpt), plus
manifest.json (target identity, layer ids and convention, dtype, chat template, counts),
prompts.jsonl (the prompts used) and vocab_mapping/vocab_mapping.pt (the draft vocabulary).
Running it again on the same --out resumes: existing samples are kept.

With --stream the target runs one decoder layer at a time from its safetensors (memory-mapped), for
targets larger than memory; its responses then come from --prompts-file (JSONL with "prompt" and
"response" per line, e.g. the target's answers from the server that serves it), since generating
with a streamed target would read every weight once per token. Each batch reads every layer once.
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
    p.add_argument("--stream", action="store_true",
                   help="run the target one decoder layer at a time from its safetensors (for targets larger than memory); "
                        "needs --prompts-file with a \"response\" per line")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")
    p.set_defaults(func=run)


def read_prompts_file(path: str) -> list[tuple[str, str | None]]:
    """(prompt, response or None) from a text file (one prompt per line) or JSONL
    ({"prompt"|"text"|"turns"[0]: ..., optionally "response": ...})."""
    import json

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.validate import check_text_value, file_kind, read_user_text

    file = Path(path)
    if file_kind(file) == "missing":
        raise ConfigError("no such prompts file", file=file, field="--prompts-file", hint="check the path")
    shape = 'one prompt per line, or JSONL: {"prompt": "...", "response": "..."} per line'
    out: list[tuple[str, str | None]] = []
    for n, line in enumerate(read_user_text(file, "a prompts file").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not (path.endswith(".jsonl") or line.startswith("{")):
            out.append((line, None))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {n} is not JSON ({exc.msg})", file=file, found=line[:80], expected=shape,
                              hint="fix that line, or write the file as plain text, one prompt per line") from None
        text = _prompt_of(obj)
        if text is None:
            raise ConfigError(f"line {n} has no prompt", file=file, field="prompt", found=line[:80], expected=shape,
                              hint='give each line a "prompt" (or "text") string')
        check_text_value(text, file, f"line {n}: prompt")
        response = obj.get("response")
        if response is not None:
            check_text_value(response, file, f"line {n}: response")
        out.append((text, response))
    if not out:
        raise ConfigError("no prompts in the file", file=file, found="empty lines only", expected=shape,
                          hint="write the prompts into it")
    return out


def _prompt_of(obj) -> str | None:
    """The prompt of one JSONL record: "prompt", "text" or the first of "turns" (a string), else None."""
    if not isinstance(obj, dict):
        return None
    turns = obj.get("turns")
    first = turns[0] if isinstance(turns, list) and turns else None
    for text in (obj.get("prompt"), obj.get("text"), first):
        if isinstance(text, str) and text:
            return text
    return None


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
    from rich.console import Console

    from eaglelab.engine.training.capture import check_layer_ids, read_manifest
    from eaglelab.engine.formats.loader import resolve_model_dir
    from eaglelab.engine.formats.safe_write import output_lock
    from eaglelab.engine.model.config import ModelConfig

    console = Console(stderr=True, highlight=False)
    pairs = _prompt_pairs(args)
    model_dir = resolve_model_dir(args.model)
    config = ModelConfig.from_json(model_dir / "config.json")
    settings = _settings(args, config)
    check_layer_ids(settings.hf_indices, config.num_layers, convention=settings.convention,
                    source=model_dir / "config.json")  # before any weight is read
    out = Path(args.out)
    with output_lock(out, "capture"):  # a second capture into the same --out interleaved its samples with ours
        _check_resume(out, read_manifest(out), settings, console, pairs, args.system)
        return _capture_into(args, out, pairs, settings, config, model_dir, console)


def _capture_into(args: argparse.Namespace, out: Path, pairs, settings, config, model_dir: Path, console) -> int:
    from eaglelab.devices import pick_device, pick_dtype

    device, device_reason = pick_device(args.device)
    dtype, dtype_reason = pick_dtype(args.dtype, device)
    target = (_Streamed(model_dir, device, dtype, console) if args.stream
              else _InMemory(args.model, device, dtype, console))
    tok = target.tokenizer
    prompt_ids = [tok.chat_ids(p, system=args.system) for p, _, _ in pairs]
    responses = _response_ids(tok, pairs)
    _write_prompts(out, pairs)
    how = "streamed one decoder layer at a time" if args.stream else "in memory"
    console.print(f"[bold]capture[/] {target.name} {how} on {device} ({device_reason}), {dtype} ({dtype_reason})")
    console.print(f"  {len(pairs)} prompts, layer ids {list(settings.layer_ids)} ({settings.convention}) = hs{list(settings.hf_indices)}, "
                  + ("responses from --prompts-file" if responses is not None else f"responses up to {args.max_new_tokens} tokens")
                  + f", batches of {args.batch_size}")
    identity = target.identity()
    identity["model_arg"] = str(args.model)
    extra = {"prompts_file": "prompts.jsonl", "prompt_source": args.prompts_file or "eaglelab.engine.training.train_prompts",
             "system_prompt": args.system}
    if responses is not None:  # the target's own answers only if the file says so: not vouched for here
        extra |= {"self_distillation": False, "responses_source": args.prompts_file}
    summary = target.capture(prompt_ids, responses, out, settings, identity, extra)
    for note in target.notes():  # how the target was read (quantized weights dequantized), as `run` prints them
        console.print(f"[dim]{note}[/]")
    size, dv = _write_draft_vocab(out, config.vocab_size, args.draft_vocab_size)
    console.print(f"wrote {summary.samples} samples ({summary.tokens} tokens, {summary.assistant_tokens} assistant) to {out}"
                  + (f"; kept {summary.skipped_existing} from before" if summary.skipped_existing else "")
                  + (f"; dropped {summary.dropped} prompts (too long or empty responses)" if summary.dropped else ""))
    console.print(f"draft vocabulary {size}: covers {dv.coverage:.2%} of assistant tokens "
                  f"({dv.distinct_tokens} distinct seen)")
    return 0


def _write_prompts(out: Path, pairs: list[tuple[str, str | None, str]]) -> None:
    """prompts.jsonl: each prompt used, its source and its given response (if any)."""
    import json

    from eaglelab.engine.formats.safe_write import write_atomic

    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            for i, (prompt, response, source) in enumerate(pairs):
                given = {"response": response} if response is not None else {}
                f.write(json.dumps({"index": i, "source": source, "prompt": prompt} | given) + "\n")

    write_atomic(out / "prompts.jsonl", write, what="prompts list")


def _write_draft_vocab(out: Path, vocab_size: int, wanted: int):
    """vocab_mapping.pt from the assistant tokens of the data, recorded in the manifest. -> (size, DraftVocab)."""
    from eaglelab.engine.formats.specforge_data import write_vocab_mapping
    from eaglelab.engine.training.capture import read_manifest, write_manifest
    from eaglelab.engine.training.draft_vocab import build_draft_vocab, scan_data

    counts, _ = scan_data(out, vocab_size)
    size = min(wanted, vocab_size)
    dv = build_draft_vocab(counts, size)
    write_vocab_mapping(out, dv.mapping)
    manifest = read_manifest(out) or {}
    manifest["draft_vocab"] = {"size": size, "coverage": dv.coverage, "distinct_assistant_tokens": dv.distinct_tokens}
    write_manifest(out, manifest)
    return size, dv


def _prompt_pairs(args: argparse.Namespace) -> list[tuple[str, str | None, str]]:
    """(prompt, given response or None, source): from --prompts-file, else the built-in training prompts."""
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.training.train_prompts import build_prompts

    if args.prompts_file:
        pairs = [(p, r, "file") for p, r in read_prompts_file(args.prompts_file)]
    else:
        pairs = [(p.text, None, p.source) for p in build_prompts(args.prompts, seed=args.seed)]
    given = sum(r is not None for _, r, _ in pairs)
    if args.stream and given < len(pairs):
        raise ConfigError(
            "--stream needs the target's responses: a layer-streamed target cannot generate", field="--prompts-file",
            file=args.prompts_file, found=f"{given} of {len(pairs)} prompts with a response",
            expected='JSONL with {"prompt": ..., "response": ...} on every line',
            hint="collect the responses from the server that serves the target (the same chat template), or drop --stream")
    if 0 < given < len(pairs):
        raise ConfigError("some prompts have a response and some do not", file=args.prompts_file, field="response",
                          found=f"{given} of {len(pairs)}", expected="all or none",
                          hint="give every prompt its response, or none (the target then writes them)")
    return pairs


def _response_ids(tok, pairs: list[tuple[str, str | None, str]]) -> list[list[int]] | None:
    """Given responses as token ids, each ending in the end-of-turn token as a generated one would."""
    if pairs[0][1] is None:
        return None
    end = list(tok.eos_token_ids[:1])
    return [tok.encode(r) + end for _, r, _ in pairs]


def _settings(args: argparse.Namespace, config):
    """The flags as CaptureSettings; --max-length cut to the target's context window (said when it is)."""
    from rich.console import Console

    from eaglelab.engine.runtime.limits import length_in_window
    from eaglelab.engine.training.capture import CaptureSettings, default_layer_ids

    ids = parse_ids(args.layer_ids)
    convention = args.convention if ids is not None else "sglang"
    max_length, why = length_in_window(config, args.max_length)
    if why:
        Console(stderr=True, highlight=False).print(f"[yellow]{why}[/]")
    return CaptureSettings(layer_ids=ids if ids is not None else default_layer_ids(config.num_layers), convention=convention,
                           max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, temperature=args.temperature,
                           seed=args.seed, max_length=max_length, compress=args.compress)


class _InMemory:
    """The whole target loaded; it writes its own responses unless they are given."""

    def __init__(self, model: str, device, dtype, console) -> None:
        from eaglelab.engine.errors import ConfigError
        from eaglelab.engine.formats.loader import load_target

        self.target, self.console = load_target(model, device=device, dtype=dtype), console
        if self.target.tokenizer is None:
            raise ConfigError("the target has no tokenizer", file=self.target.path, hint="capture needs tokenizer.json")
        self.tokenizer, self.name = self.target.tokenizer, self.target.name

    def identity(self) -> dict:
        from eaglelab.engine.training.capture import target_identity

        return target_identity(self.target.model, self.target.path, self.target.name)

    def notes(self) -> tuple[str, ...]:
        return tuple(self.target.notes)

    def capture(self, prompt_ids, responses, out, settings, identity, extra):
        from eaglelab.engine.training.capture import capture

        with _Bar(self.console, len(prompt_ids)) as tick:
            return capture(self.target.model, prompt_ids, out, settings, eos_token_ids=self.tokenizer.eos_token_ids,
                           responses=responses, identity=identity, chat_template=self.tokenizer.chat_template,
                           extra=extra, progress=tick)


class _Streamed:
    """The target read one decoder layer at a time (only the safetensors headers are read here)."""

    def __init__(self, model_dir: Path, device, dtype, console) -> None:
        from eaglelab.engine.formats.streamed import StreamedTarget
        from eaglelab.engine.formats.tokenizer import Tokenizer

        self.model_dir, self.console, self.name = model_dir, console, model_dir.name
        self.streamed = StreamedTarget(model_dir, device=device, dtype=dtype)
        self.tokenizer = Tokenizer(model_dir, self.streamed.config.eos_token_ids)

    def identity(self) -> dict:
        from eaglelab.engine.training.capture import target_identity

        return target_identity(self.streamed, self.model_dir, self.name, full_hash=False)

    def notes(self) -> tuple[str, ...]:
        return tuple(self.streamed.notes)

    def capture(self, prompt_ids, responses, out, settings, identity, extra):
        from eaglelab.engine.training.capture import capture_streamed

        L = self.streamed.config.num_layers
        with _Bar(self.console, len(prompt_ids), layers=L) as (tick, layer_tick):
            return capture_streamed(self.streamed, prompt_ids, responses, out, settings, identity=identity,
                                    chat_template=self.tokenizer.chat_template, extra=extra, progress=tick,
                                    layer_progress=layer_tick)


class _Bar:
    """Rich progress: prompts done; with ``layers``, also the decoder layer of the current batch's pass."""

    def __init__(self, console, prompts: int, layers: int | None = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.layers = layers
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=console, transient=False)
        self.task = self.bar.add_task("prompts", total=prompts)
        self.layer_task = self.bar.add_task("decoder layers (this batch)", total=layers) if layers else None

    def __enter__(self):
        self.bar.__enter__()
        return self.prompts_done if self.layer_task is None else (self.prompts_done, self.layer_done)

    def prompts_done(self, stage: str, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)

    def layer_done(self, i: int, n: int, seconds: float) -> None:
        self.bar.update(self.layer_task, completed=i, total=n, description=f"decoder layers (this batch, {seconds:.2f} s/layer)")

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)


def _check_resume(out: Path, manifest, settings, console, pairs: list[tuple[str, str | None, str]],
                  system: str | None) -> None:
    """Resuming keeps sample i as it is; refuse when that would mix data or relabel it: other layers, other
    prompts (sample i would be listed under another prompt in prompts.jsonl), another system prompt, or
    samples with no manifest saying what they are."""
    from eaglelab.engine.errors import ConfigError

    if manifest is None:
        kept = sorted(out.glob("rows_*/data_*.ckpt*")) if out.is_dir() else []
        if kept:
            raise ConfigError("holds samples but no manifest.json saying what they are", file=out, field="--out",
                              found=f"{len(kept)} samples (e.g. {kept[0].relative_to(out)})", expected="a new directory, or one `eaglelab capture` wrote",
                              hint="pick a new --out: resuming would keep these samples as if they answered your prompts")
        return
    if list(manifest.get("hf_indices", [])) != list(settings.hf_indices):
        raise ConfigError("the directory holds data captured at other layers", file=out / "manifest.json",
                          field="hf_indices", found=manifest.get("hf_indices"), expected=list(settings.hf_indices),
                          hint="use another --out, or the same --layer-ids")
    if "system_prompt" in manifest and manifest.get("system_prompt") != system:
        raise ConfigError("the directory holds data captured with another system prompt", file=out / "manifest.json",
                          field="system_prompt", found=repr(manifest.get("system_prompt")), expected=repr(system),
                          hint="use another --out, or the same --system")
    _check_same_prompts(out, pairs)
    console.print(f"[dim]resuming into {out}: existing samples are kept[/]")


def _check_same_prompts(out: Path, pairs: list[tuple[str, str | None, str]]) -> None:
    """The prompts (and given responses) of the earlier capture are the first ones of this one."""
    import json

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.validate import check_regular_file, file_kind

    path = out / "prompts.jsonl"
    if file_kind(path) == "missing":
        return
    check_regular_file(path, "the earlier capture's prompts list", error=ConfigError)
    hint = "use another --out; to add prompts to this data, keep the earlier prompts first, in the same order"
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            row = json.loads(line)
            old = (row["prompt"], row.get("response"))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"line {n + 1} is not a prompt record", file=path, hint=hint) from None
        if n >= len(pairs):
            raise ConfigError("the directory holds data for more prompts than this capture has", file=path,
                              found=f"more than {n} prompts before", expected=f"at most {len(pairs)}", hint=hint)
        if old != pairs[n][:2]:
            raise ConfigError(f"prompt {n} differs from the one its sample answers", file=path, field=f"line {n + 1}",
                              found=repr(pairs[n][0][:80]), expected=repr(str(old[0])[:80]), hint=hint)
