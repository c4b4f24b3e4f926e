"""``eaglelab check-wiring DRAFT --target T``: which taps the drafter behaves as trained on, without its
training data (the default with a target and no --data; the search lives in ``eaglelab.probes.tap_search``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--search", action=argparse.BooleanOptionalAction, default=None,
                   help="the data-free tap search: run the target over texts and find the taps under which the drafter "
                        "predicts the target best; exit 1 when the config's taps are not those, 4 when the texts do not "
                        "separate the candidates. The default with --target (a model directory or 'default') and no --data; "
                        "--no-search: static checks only, which never read OK (exit 4)")
    p.add_argument("--texts", metavar="FILE",
                   help="for the search: texts to score, JSONL ({\"prompt\", \"response\"} or {\"text\"}) or one per line "
                        "(default: built-in prompts and the target's own greedy responses)")
    p.add_argument("--new-tokens", type=int, default=48, help="for the search: response tokens the target writes per prompt (default 48)")
    p.add_argument("--stream", action="store_true",
                   help="run the target one decoder layer at a time from its safetensors (for targets larger than memory): "
                        "--data and the search")


def search_report(args: argparse.Namespace, model_dir: Path) -> Any:
    """Load the target, write or read the texts, run the search: a ``TapSearchReport``."""
    import torch

    from eaglelab.probes.tap_search import AgreementScorer, config_taps, drafter_for_search, verdict_from_search

    target, tokenizer, run_pass = _target(args, model_dir)
    ck, net = drafter_for_search(args.draft_dir, target.embed_tokens, target.config.hidden_size)
    serving = args.serving or ck.default_serving
    ids, config_hf, field, current = config_taps(ck, serving, target.config.num_layers, target.config.family)
    texts = _texts(args, tokenizer, target)
    with torch.inference_mode():
        tp = run_pass(texts, net.token_map())
    scorer = AgreementScorer(net, tp)
    with ProgressLine("searching taps (pass {p}, slot {s})", args.json) as tick:
        return verdict_from_search(scorer, serving=serving, config_ids=ids, config_hf=config_hf,
                                   fix_file=str(ck.config_file), fix_field=field, fix_current=current,
                                   texts=len(tp.lengths), progress=tick)


def _target(args: argparse.Namespace, model_dir: Path) -> tuple[Any, Any, Any]:
    """(an object with .config and .embed_tokens, the tokenizer or None, pass(texts, vocab_ids) -> TargetPass)."""
    from eaglelab.engine.formats.tokenizer import Tokenizer
    from eaglelab.probes.tap_search import TargetPass, in_memory_pass

    tokenizer = Tokenizer(model_dir) if (model_dir / "tokenizer.json").exists() else None
    if not args.stream:
        from eaglelab.engine.formats.loader import load_target

        model = load_target(args.target, device=args.device, dtype=args.dtype, with_tokenizer=False).model
        return model, tokenizer, lambda t, vocab: in_memory_pass(model, t[0], t[1], vocab, t[2])
    from eaglelab.engine.formats.streamed import StreamedTarget

    st = StreamedTarget(model_dir, device=args.device, dtype=args.dtype)

    def run_pass(t: tuple, vocab: Any) -> TargetPass:
        with ProgressLine(f"{model_dir.name}: decoder layer {{p}} of {st.config.num_layers}", args.json) as tick:
            out = st.run(t[0], progress=lambda i, n, s: tick(i, 0), vocab_ids=vocab)
        from rich.console import Console

        for note in st.notes:  # what was dequantized, as `run` prints a loaded target's notes
            Console(stderr=True, highlight=False).print(f"[dim]{note}[/]")
        return TargetPass(out.hidden_states, t[0], t[1], out.next_tokens, out.draft_logprobs, t[2])

    return SimpleNamespace(config=st.config, embed_tokens=st.embed_tokens), tokenizer, run_pass


def _texts(args: argparse.Namespace, tokenizer: Any, target: Any) -> tuple[Any, Any, Any]:
    """ids [B, T], lengths [B], scoring starts [B] (None: every position)."""
    from eaglelab.engine.errors import ConfigError
    from eaglelab.probes.tap_search import default_texts, pad_prompts, target_texts

    if args.texts:
        return _read_texts(Path(args.texts), tokenizer, args.samples, target.config.max_position_embeddings)
    if tokenizer is None:
        raise ConfigError("no tokenizer.json in the target directory, and no --texts", file=args.target, field="--texts",
                          hint="pass --texts FILE with the texts to score, or add the target's tokenizer.json")
    prompts = default_texts(tokenizer, args.samples)
    _check_window(prompts, 0 if args.stream else args.new_tokens, target.config)
    if args.stream:  # a streamed target cannot write responses: score the prompts themselves
        ids, lengths = pad_prompts(prompts)
        return ids, lengths, None
    return target_texts(target, prompts, args.new_tokens)


def _check_window(prompts: list[list[int]], new_tokens: int, config: Any) -> None:
    """The built-in prompts plus the responses the target writes must fit its context window, as `run` checks a
    prompt (the target never saw positions past it): exit 2 naming --new-tokens, or --texts if a prompt alone
    does not fit a small-window target."""
    from eaglelab.engine.runtime.limits import check_context

    check_context(config, max(len(p) for p in prompts), new_tokens, flag="--new-tokens", prompt_field="--texts",
                  prompt_hint="pass --texts FILE with texts that fit the window")


def _read_texts(path: Path, tokenizer: Any, limit: int, window: int) -> tuple[Any, Any, Any]:
    """A text past the target's context window is refused, as `run` refuses such a prompt: the target never saw
    positions beyond it, so scoring taps there measures nothing the drafter was trained on."""
    import torch

    from eaglelab.engine.errors import ConfigError
    from eaglelab.probes.tap_search import pad_prompts

    if tokenizer is None:
        raise ConfigError("--texts needs the target's tokenizer.json", file=path, field="--texts")
    rows, starts = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"line {n} is not JSON ({exc.msg})", file=path, field=f"line {n}") from None
            if not isinstance(obj, dict) or not ({"prompt", "response"} <= obj.keys() or "text" in obj):
                raise ConfigError("each line needs \"prompt\" and \"response\", or \"text\"", file=path,
                                  field=f"line {n}", found=line[:80])
            prompt = tokenizer.chat_ids(obj["prompt"]) if "prompt" in obj else []
            rows.append(prompt + tokenizer.encode(obj.get("response", obj.get("text", ""))))
            starts.append(len(prompt))
        else:
            rows.append(tokenizer.encode(line))
            starts.append(0)
        if len(rows[-1]) > window:
            raise ConfigError(f"the text on line {n} is longer than the target's context window", file=path,
                              field=f"--texts line {n}", found=f"{len(rows[-1])} tokens",
                              expected=f"<= {window} (the target's max_position_embeddings)",
                              hint=f"shorten line {n} to {window} tokens or fewer, or drop it")
        if len(rows) >= limit:
            break
    if not rows or min(len(r) for r in rows) < 3:
        raise ConfigError("no usable texts (each needs at least 3 tokens)", file=path, field="--texts")
    ids, lengths = pad_prompts(rows)
    return ids, lengths, torch.tensor(starts)


class ProgressLine:
    """A rich progress line (on stderr) whose ``tick(p, s)`` redraws it; silent with --json."""

    def __init__(self, text: str, quiet: bool) -> None:
        self.text, self.quiet = text, quiet

    def __enter__(self):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), disable=self.quiet, transient=True)
        self.progress.__enter__()
        self.task = self.progress.add_task(self.text.format(p=0, s=0), total=None)
        return lambda p, s: self.progress.update(self.task, description=self.text.format(p=p, s=s))

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)


def render(r: Any, target_name: str) -> None:
    """The search table, the config's taps against the best, the fix in both conventions (the verdict
    line is the caller's: it also weighs the static checks)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    console.print(f"\n[bold]search[/]   {escape(target_name)}  [dim]{r.texts} texts, {r.tokens} scored tokens, "
                  f"{r.evaluations} tap sets tried in {r.passes} pass(es)[/]")
    ids = f"{list(r.config_ids)} as {r.serving} ids" if r.config_ids else "none (engine defaults)"
    console.print(f"[bold]config[/]   {escape(ids)} = hs{list(r.config_hf_indices)}"
                  + (f"  loss {r.config_score.loss:.3f}, agreement {r.config_score.agreement:.1%}" if r.config_score else ""))
    t = Table(title="aux slots: the state under which the drafter predicts the target best", title_justify="left")
    for col in ("slot", "config", "best", "loss", "agreement", "runner-up", "margin (nats)", "least separated (t)"):
        t.add_column(col, no_wrap=True)
    for s in r.slots:
        cfg = "-" if s.config_hf_index is None else f"hs[{s.config_hf_index}]"
        style = "green" if s.config_hf_index == s.best_hf_index else "bold red"
        ru = "-" if s.runner_up_hf_index is None else f"hs[{s.runner_up_hf_index}] {s.runner_up_loss:.3f}"
        sep = "-" if s.contender_t is None else f"hs[{s.contender_hf_index}] {s.contender_t:.1f}"
        sep = sep if s.contender_t is None or s.contender_t >= r.t_separated else f"[yellow]{sep}[/]"
        t.add_row(str(s.slot), cfg, f"[{style}]hs[{s.best_hf_index}][/]", f"{s.loss:.3f}", f"{s.agreement:.1%}", ru,
                  "-" if s.margin is None else f"{s.margin:.3f}", sep)
    console.print(t)
    e = r.expected_ids
    lead = "the drafter behaves as trained on" if r.verdict != "inconclusive" else "best found (not conclusive)"
    console.print(f"[bold]{lead}[/] hs{list(r.best_hf_indices)}: SGLang/SpecForge ids "
                  f"[bold]{e['sglang']}[/], vLLM/speculators ids [bold]{e['vllm']}[/]")
    if r.fix:
        f = r.fix
        console.print(f"[bold]change[/] {escape(f['file'])}: [bold]{escape(f['field'])}[/]: {escape(str(f['current']))} → "
                      f"[bold green]{f['new']}[/]")
    console.print(f"[dim]t: the loss difference to the best tap, paired per text, over its standard error; over >= "
                  f"{r.min_texts} texts, t >= {r.t_separated:g} separates the config's tap from another, t >= "
                  f"{r.t_wrong:g} calls the config's taps wrong[/]")
