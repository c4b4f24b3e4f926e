"""``eaglelab check-wiring DRAFT_DIR``: is the drafter fed the target layers it was trained on?

Which check runs: with ``--data``, the numerical match against the training data; else with a target
that has weights (``--target default`` or a model directory), the data-free tap search; else (no target,
a target config.json alone, a drafter without weights, or ``--no-search``) static checks only.

Exit codes: 0 wiring right, shown numerically (never from static checks alone); 1 wiring wrong
(including config/weights that disagree and data that no layer of the target reproduces); 2 could not
check (a file that cannot be read, with the reason); 4 inconclusive: static checks passed but nothing
was checked numerically, or the search's texts do not separate the candidate taps (the report says why).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
VERDICT_STYLE = {"ok": "green", "wrong layer": "bold red", "no layer matches": "bold red", "not tapped": "bold red"}
VERDICT_LABEL = {"ok": "[bold green]WIRING OK[/]", "mismatch": "[bold red]WIRING WRONG[/]"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-wiring",
        help="check that an EAGLE-3 drafter is fed the target layers it was trained on",
        description=(
            "Static checks of an EAGLE-3 drafter directory (config and tensor shapes) and of the target layers "
            "SGLang and vLLM would tap with its config, then a numerical check: with --data (SpecForge offline data) "
            "a match of every aux slot against every layer of the target; without data but with --target, the "
            "data-free tap search. Exit 0: wiring right, checked numerically; 1: wiring wrong; 2: could not check; "
            "4: inconclusive (static checks only, or texts that do not separate the taps)."
        ),
    )
    p.add_argument("draft_dir", metavar="DRAFT_DIR", help="the drafter directory (config.json [+ *.safetensors])")
    p.add_argument("--data", metavar="DIR", help="SpecForge offline data (rows_*/data_*.ckpt) the drafter was trained on")
    p.add_argument("--target", metavar="default|PATH",
                   help="the target model ('default' = SmolLM2-135M-Instruct, or an HF directory / config.json); "
                        "with --data it defaults to 'default'; without --data a target with weights runs the tap search")
    p.add_argument("--serving", choices=("sglang", "vllm"),
                   help="the engine that serves the drafter (default: the checkpoint format's: SGLang/SpecForge -> sglang, "
                        "speculators -> vllm)")
    p.add_argument("--sglang-version", metavar="X.Y.Z", help="SGLang version, for its version-dependent behaviour")
    p.add_argument("--samples", type=int, default=8, help="samples to read from --data (default 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per sample to compare (default 64)")
    p.add_argument("--device", default="cpu", help="where the target runs for --data (default cpu)")
    p.add_argument("--dtype", default="float32", help="the target's dtype for --data (default float32)")
    p.add_argument("--live", action="store_true",
                   help="with --data: also run the eaglelab engine with this drafter (as --serving reads its ids) and "
                        "compare the aux features it really feeds the drafter with the data, slot by slot")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    from eaglelab.check_wiring_search import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglelab.engine.errors import EagleLabError

    if not args.json:
        return _run(args)
    try:
        return _run(args)
    except (EagleLabError, OSError) as exc:
        print(json.dumps(_error_json(exc)))
        return 2


def _run(args: argparse.Namespace) -> int:
    from eaglelab.engine.formats.draft_checkpoint import check_fits_target, read_draft_checkpoint
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.wiring import check_wiring

    if args.samples < 1 or args.max_tokens < 2:
        raise EagleLabError("--samples must be >= 1 and --max-tokens >= 2", field="--samples/--max-tokens",
                            found=f"{args.samples}/{args.max_tokens}")
    if args.live and not args.data:
        raise EagleLabError("--live compares against training data", field="--live", hint="pass --data DIR too")
    ckpt = read_draft_checkpoint(args.draft_dir)
    because = _why_no_search(args, ckpt)
    if because is None:
        return _run_search(args, ckpt)
    target_config, states_fn, target_name = _target(args)
    if target_config is not None:  # before any weight is read: a drafter for another target is exit 2
        check_fits_target(ckpt, target_config, target_name or "")
    report = check_wiring(
        ckpt, target_config=target_config, hidden_states_fn=states_fn, data_dir=args.data, serving=args.serving,
        sglang_version=args.sglang_version, max_samples=args.samples, max_tokens=args.max_tokens,
        unchecked_because=because,
    )
    live = _live(args) if args.live else None
    if args.json:
        out = report.to_json() | {"checked": "data" if args.data else "static"}
        if out["target"] is not None:
            out["target"]["name"] = target_name
        if live is not None:
            out["live"] = live.to_json()
            if live.verdict != "ok":
                out["verdict"], out["exit_code"] = "mismatch", max(out["exit_code"], 1)
        print(json.dumps(out))
    else:
        render(report, target_name)
        if live is not None:
            _render_live(live)
    return max(report.exit_code, live.exit_code if live is not None else 0)


def _why_no_search(args: argparse.Namespace, ckpt: Any) -> str | None:
    """None when the data-free search runs; else why not (shown with a static verdict). An explicit
    --search that cannot run is the search's error to raise, so it returns None then."""
    if args.search:
        return None
    if args.data:
        return "--data given"  # not shown: --data checks numerically
    if args.search is False:
        return "--no-search"
    if not args.target:
        return "no --target and no --data: pass --target default|PATH to run the data-free tap search, or --data DIR"
    if Path(args.target).suffix == ".json" and Path(args.target).is_file():
        return "--target is a config.json alone; the tap search runs the target: pass its model directory"
    if not ckpt.has_weights:
        return "the drafter directory has no weights (*.safetensors); the tap search runs the drafter"
    return None


def _run_search(args: argparse.Namespace, ckpt: Any) -> int:
    """Static checks, then the data-free tap search; wrong if either finds it wrong."""
    from eaglelab.check_wiring_search import render as render_search
    from eaglelab.check_wiring_search import search_report
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.draft_checkpoint import check_fits_target
    from eaglelab.engine.formats.loader import resolve_model_dir
    from eaglelab.engine.model.config import ModelConfig
    from eaglelab.probes.wiring import EXIT_CODES, check_wiring

    if not args.target:
        raise EagleLabError("the tap search runs the target", field="--target",
                            hint="pass --target default or an HF model directory")
    model_dir = resolve_model_dir(args.target)
    config = ModelConfig.from_json(model_dir / "config.json")
    check_fits_target(ckpt, config, args.target)  # before the target loads: a drafter for another target is exit 2
    static = check_wiring(ckpt, target_config=config, serving=args.serving, sglang_version=args.sglang_version)
    search = search_report(args, model_dir)
    verdict = "mismatch" if static.verdict == "mismatch" else search.verdict
    if args.json:
        out = search.to_json() | {"checked": "search", "verdict": verdict, "exit_code": EXIT_CODES[verdict],
                                  "static": static.to_json()}
        print(json.dumps(out))
    else:
        from rich.console import Console

        console = Console(highlight=False)
        label = "SmolLM2-135M-Instruct" if args.target == "default" else str(model_dir)
        _header(console, static, label)
        _findings(console, static)
        _engines(console, static)
        render_search(search, label)
        text = search.conclusion if static.verdict != "mismatch" else f"{static.conclusion}; search: {search.conclusion}"
        _verdict_line(console, verdict, text, "search")
    return EXIT_CODES[verdict]


def _live(args: argparse.Namespace) -> Any:
    """Run the engine's own prefill with this drafter over each sample and catch the aux features
    handed to the drafter (what a deployment of this config actually feeds it)."""
    import torch

    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.probes.wiring import live_check

    target = load_target(args.target or "default", device=args.device, dtype=args.dtype, with_tokenizer=False)
    net, taps, _ = load_eagle3(args.draft_dir, target.model, serving=args.serving)
    spec = SpecConfig("eagle3", num_steps=1)
    proposer = Eagle3Drafter(net, spec, taps)
    fed: list[torch.Tensor] = []
    begin = proposer.begin

    def spy(st, prompt_ids, aux, runner):
        fed.append(aux.detach().float().cpu())
        return begin(st, prompt_ids, aux, runner)

    proposer.begin = spy
    engine = Engine(target.model, drafter=proposer, spec=spec)

    def engine_taps(input_ids: torch.Tensor) -> torch.Tensor:
        fed.clear()
        engine.generate([input_ids[0].tolist()], 1)
        return fed[0]

    return live_check(engine_taps, args.data, hidden_size=target.config.hidden_size,
                      max_samples=args.samples, max_tokens=args.max_tokens)


def _render_live(live: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    t = Table(title="live: what the eaglelab engine feeds the drafter, against the data", title_justify="left")
    for col in ("data slot", "engine slot", "cos", "rel err", "verdict"):
        t.add_column(col)
    for s in live.slots:
        style = VERDICT_STYLE.get(s.verdict, "bold red")
        t.add_row(str(s.data_slot), "-" if s.engine_slot is None else str(s.engine_slot), f"{s.similarity:.5f}",
                  f"{s.rel_error:.4f}", f"[{style}]{s.verdict}[/]")
    console.print(t)
    console.print(f"live {'OK' if live.verdict == 'ok' else 'MISMATCH'}: {_esc(live.conclusion)}")


def _target(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """(config, all_hidden_states function or None, name). The config is read from config.json
    alone; the weights load on the first call of the function, so bad data fails fast."""
    from eaglelab.engine.model.config import ModelConfig
    from eaglelab.engine.errors import ConfigError

    name = args.target or ("default" if args.data else None)
    if name is None:
        return None, None, None
    path = Path(name)
    if name != "default" and path.is_file() and path.suffix == ".json":
        if args.data:
            raise ConfigError("--data needs the target's weights, not only its config.json", file=path, field="--target",
                              hint="pass the model directory (config.json + *.safetensors) or 'default'")
        return ModelConfig.from_json(path), None, str(path)
    from eaglelab.engine.formats.loader import resolve_model_dir

    model_dir = resolve_model_dir(name)
    label = "SmolLM2-135M-Instruct" if name == "default" else str(model_dir)
    states = (_LazyStates(name, args.device, args.dtype, stream=model_dir if args.stream else None) if args.data else None)
    return ModelConfig.from_json(model_dir / "config.json"), states, label


class _LazyStates:
    """``all_hidden_states`` of the target, loaded on first use; states come back on the CPU."""

    def __init__(self, name: str, device: str, dtype: str, stream: Path | None = None) -> None:
        self.name, self.device, self.dtype, self.model, self.stream = name, device, dtype, None, stream

    def __call__(self, input_ids: Any) -> Any:
        if self.stream is not None:  # one decoder layer in memory at a time
            from eaglelab.check_wiring_search import ProgressLine
            from eaglelab.engine.formats.streamed import StreamedTarget

            st = StreamedTarget(self.stream, device=self.device, dtype=self.dtype)
            with ProgressLine(f"{self.stream.name}: decoder layer {{p}} of {st.config.num_layers}", False) as tick:
                out = st.run(input_ids, progress=lambda i, n, s: tick(i, 0)).hidden_states
            _print_notes(st.notes)  # what was dequantized, as `run` prints a loaded target's notes
            return out
        if self.model is None:
            from eaglelab.engine.formats.loader import load_target

            self.model = load_target(self.name, device=self.device, dtype=self.dtype, with_tokenizer=False).model
        return [h.cpu() for h in self.model.all_hidden_states(input_ids.to(self.device))]


def _print_notes(notes) -> None:
    from rich.console import Console

    for n in notes:
        Console(stderr=True, highlight=False).print(f"[dim]{n}[/]")


def _error_json(exc: BaseException) -> dict[str, Any]:
    file = getattr(exc, "file", None) or getattr(exc, "filename", None)
    message = str(exc) if not isinstance(exc, FileNotFoundError) else f"{exc.filename}: no such file"
    return {"verdict": "error", "exit_code": 2, "error": message, "file": str(file) if file else None,
            "field": getattr(exc, "field", None), "slots": [], "expected_ids": None}


# ---- the rich report ------------------------------------------------------------------------------------


def render(report: Any, target_name: str | None) -> None:
    """Print the report: header, findings, engine taps, slot table, expected ids, fixes, verdict."""
    from rich.console import Console

    console = Console(highlight=False)
    _header(console, report, target_name)
    _findings(console, report)
    _engines(console, report)
    if report.data is not None:
        _slots(console, report)
    _expected(console, report)
    _verdict_line(console, report.verdict, report.conclusion, "data" if report.data is not None else "static")


def _verdict_line(console: Any, verdict: str, conclusion: str, checked: str) -> None:
    """The last line: OK only for a numerical check; static checks alone read NOT CHECKED."""
    from eaglelab.probes.wiring import EXIT_CODES

    label = VERDICT_LABEL.get(verdict) or ("[bold yellow]WIRING NOT CHECKED[/]" if checked == "static"
                                           else "[bold yellow]WIRING INCONCLUSIVE[/]")
    console.print(f"\n{label} — {_esc(conclusion)}  [dim](exit {EXIT_CODES[verdict]})[/]")


def _esc(text: Any) -> str:
    from rich.markup import escape

    return escape(str(text))


def _header(console: Any, r: Any, target_name: str | None) -> None:
    fmt = "SGLang/SpecForge" if r.format == "sglang" else "speculators (vLLM)"
    ids = f"{list(r.config_ids)} ({r.config_convention} convention, {r.config_field})" if r.config_ids else "none (engine defaults apply)"
    console.print(f"[bold]drafter[/]  {_esc(r.draft_dir)}  [dim]format:[/] {fmt}")
    console.print(f"[bold]serving[/]  {r.serving}  [dim]({_esc(r.serving_reason)})[/]")
    console.print(f"[bold]ids[/]      {_esc(ids)}")
    if r.target:
        console.print(f"[bold]target[/]   {_esc(target_name or '')}  [dim]{r.target['num_layers']} layers, hidden {r.target['hidden_size']}[/]")
    if r.data:
        d = r.data
        console.print(f"[bold]data[/]     {_esc(d.path)}  [dim]{d.samples} samples, {d.tokens} tokens, {d.num_slots} slots, {d.dtype}[/]")


def _findings(console: Any, r: Any) -> None:
    from rich.table import Table

    shown = [f for f in r.findings if f.code != "format"]
    if not shown:
        return
    t = Table(title="static checks", title_justify="left")
    t.add_column("", no_wrap=True)
    t.add_column("field", overflow="fold", max_width=28)
    t.add_column("finding / what to do", overflow="fold")
    for f in shown:
        hint = f"\n[dim]→ {_esc(f.hint)}[/]" if f.hint else ""
        t.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", _esc(f.field), _esc(f.message) + hint)
    console.print(t)


def _engines(console: Any, r: Any) -> None:
    from rich.table import Table

    if not r.engines:
        return
    t = Table(title="what each serving engine taps with this config", title_justify="left")
    for col in ("engine", "reads ids", "taps"):
        t.add_column(col, no_wrap=True)
    notes = []
    for e in r.engines:
        ids = "none → defaults" if e.config_ids is None else f"{list(e.config_ids)} as {e.convention} ids"
        mark = " (serving)" if e.engine == r.serving else ""
        t.add_row(e.engine + mark, _esc(ids), f"hs{list(e.hf_indices)}")
        notes += [f"{e.engine}: {n}" for n in e.notes]
    console.print(t)
    for n in notes:
        console.print(f"  [dim]• {_esc(n)}[/]")


def _slots(console: Any, r: Any) -> None:
    from rich.table import Table

    t = Table(title="data slots matched against every target layer (hs[i] = HF output_hidden_states[i])", title_justify="left")
    for col in ("slot", "data is", "cos", "rel err", "margin", f"{r.serving} taps", "verdict"):
        t.add_column(col, justify="right" if col in ("cos", "rel err") else "left", no_wrap=True)
    for s in r.slots:
        layer = f"hs[{s.matched_hf_index}]" if s.matched_hf_index is not None else f"none (~hs[{s.best_hf_index}])"
        margin = f"{s.margin:.3f} vs hs[{s.runner_up_hf_index}]" if s.margin is not None else "-"
        taps = f"hs[{s.config_hf_index}]" if s.config_hf_index is not None else "nothing"
        t.add_row(str(s.slot), layer, f"{s.similarity:.5f}", f"{s.rel_error:.4f}", margin, taps,
                  f"[{VERDICT_STYLE.get(s.verdict, 'red')}]{s.verdict}[/]")
    console.print(t)
    f = r.final_state
    if f is not None:
        state = "[green]matches[/]" if f.matches else f"[red]does not match[/] (closest hs[{f.best_hf_index}])"
        console.print(f"final hidden_state vs the target's last normed state: {state}, cos {f.similarity:.5f}, "
                      f"rel err {f.rel_error:.4f}")


def _expected(console: Any, r: Any) -> None:
    if r.expected_ids:
        e = r.expected_ids
        console.print(f"\n[bold]the data came from[/] hs{list(r.expected_hf_indices)}: "
                      f"SGLang/SpecForge ids [bold]{e['sglang']}[/], vLLM/speculators ids [bold]{e['vllm']}[/]")
    for fix in r.fixes:
        console.print(f"[bold]change[/] {_esc(fix.file)}: [bold]{_esc(fix.field)}[/]: {_esc(fix.current)} → "
                      f"[bold green]{_esc(fix.new)}[/]  [dim]({_esc(fix.reason)})[/]")
