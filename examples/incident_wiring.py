"""Incident 2: the wiring "fixed" the wrong way.

In production, the serving config of an EAGLE-3 drafter was changed to also capture the embedding
output (SGLang layer id -1). Nothing errored; the accept rate fell from 47% to 19% and speculation
ran at 46-54 tok/s against 90 tok/s without it. This script serves the shipped drafter three ways:

- healthy: as trained, SGLang reading its ids ``[1, 14, 26]`` = ``hs[2, 15, 27]``;
- broken:  the embedding added to its taps (ids ``[-1, 1, 14]`` = ``hs[0, 2, 15]``: the fc layer still
  takes three states, so the embedding pushes out the deepest one);
- broken:  the same config read with the other engine's id convention (vLLM counts ids as layer
  inputs: ``hs[1, 14, 26]``, every slot one layer early);

prints acceptance, speed and the probes' verdicts side by side, then makes a little training data
from the target (``eaglelab capture``) and runs ``eaglelab check-wiring`` on each served config: it
exits 1 on the broken ones and prints the one-line config fix.

    python examples/incident_wiring.py            # CPU, or the GPU when there is one
    python examples/incident_wiring.py --small    # a few tokens (what the CI runs)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from eaglelab.compare import measure, plain_baseline, table
from eaglelab.engine.formats.conventions import engine_taps, ids_for_engine
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.draft_registry import shipped_drafter_dir
from eaglelab.session import add_engine_args, build_session

PROMPTS = (
    "Summarize the key ideas of open source software in a few bullet points.",
    "Explain what a Python list comprehension is, with an example.",
)
IDS_FIELD = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class Served:
    """One way of serving the drafter: a config directory and the engine that reads it."""

    label: str
    config_dir: Path
    serving: str  # "sglang" | "vllm"


@dataclass(frozen=True)
class WiringCheck:
    """What ``eaglelab check-wiring`` said about one served config."""

    exit_code: int
    fix: str | None  # the "change CONFIG: field: old → new" line, if any
    verdict_line: str


def main(argv: list[str] | None = None, console: Console | None = None) -> dict:
    """Serve the drafter three ways, check each; returns {"rows": [...], "checks": [...]}."""
    args = _args(argv)
    console = console or Console()
    args.draft = args.draft_dir  # the session loads the trained drafter; the served configs change its taps
    session = build_session(args, log=lambda m: console.print(f"[dim]{m}[/]"))
    tok = session.target.tokenizer
    prompts = [tok.chat_ids(p) for p in PROMPTS[: args.prompts]]
    work = Path(tempfile.mkdtemp(prefix="eaglelab-wiring-"))
    served = serve_three_ways(Path(args.draft_dir), work)
    baseline = plain_baseline(session, prompts, args.max_new_tokens)
    net = session.drafter.net  # the trained weights; only what the serving engine taps changes
    rows = []
    for s in served:
        taps = served_taps(s, session.target.config.num_layers)
        console.print(f"[dim]{s.label}: {s.serving} taps hs{list(taps)}[/]")
        rows.append(measure(session, s.label, session.spec, Eagle3Drafter(net, session.spec, taps), prompts,
                            args.max_new_tokens, baseline))
    console.print(table(rows, "incident 2: wiring fixed the wrong way"))
    data = capture_data(work / "data", args, console)
    checks = [check_wiring(s, data, console) for s in served]
    return {"rows": rows, "checks": checks}


def serve_three_ways(draft_dir: Path, work: Path) -> list[Served]:
    """The trained config, one with the embedding added (id -1), both read by SGLang; the trained one read by vLLM."""
    config = json.loads((draft_dir / "config.json").read_text())
    ids = list(config["eagle_config"][IDS_FIELD])
    embedded = json.loads(json.dumps(config))
    embedded["eagle_config"][IDS_FIELD] = [-1, *ids[:-1]]  # fc takes 3 states: the deepest one drops out
    return [
        Served(f"healthy: SGLang reads ids {ids}", draft_dir, "sglang"),
        Served(f"broken: embedding added, ids {[-1, *ids[:-1]]}", config_copy(draft_dir, work / "embedding", embedded),
               "sglang"),
        Served(f"broken: ids {ids} read by vLLM (layer inputs)", draft_dir, "vllm"),
    ]


def served_taps(s: Served, num_layers: int) -> tuple[int, ...]:
    """The target layers (HF indices) ``s.serving`` taps with the served config, as that engine reads it."""
    config = json.loads((s.config_dir / "config.json").read_text())
    ids, _ = ids_for_engine(config, s.serving)
    return engine_taps(s.serving, ids, num_layers).hf_indices


def config_copy(draft_dir: Path, out: Path, config: dict) -> Path:
    """A served copy of the drafter: the edited config.json, the same weight files (linked)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in draft_dir.iterdir():
        if f.name != "config.json" and f.is_file() and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def capture_data(out: Path, args: argparse.Namespace, console: Console) -> Path:
    """SpecForge-format data from the target's own answers: what check-wiring matches slots against."""
    n, tokens = (1, 8) if args.small else (2, 32)
    console.print(f"[dim]capturing {n} sample(s) of training data from the target into {out} ...[/]")
    cmd = [sys.executable, "-m", "eaglelab", "capture", "--out", str(out), "--prompts", str(n),
           "--max-new-tokens", str(tokens), "--max-length", "160", "--batch-size", str(n), "--device", args.device]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def check_wiring(s: Served, data: Path, console: Console) -> WiringCheck:
    """Run ``eaglelab check-wiring`` as a user would; show its fix line and exit code."""
    cmd = [sys.executable, "-m", "eaglelab", "check-wiring", str(s.config_dir), "--data", str(data),
           "--serving", s.serving, "--samples", "2", "--max-tokens", "48"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_wide_env())
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    fix = next((line for line in lines if line.startswith("change ")), None)
    verdict = next((line for line in lines if line.startswith("WIRING")), f"(exit {proc.returncode})")
    console.print(f"[bold]$ eaglelab check-wiring {s.config_dir.name} --data DATA --serving {s.serving}[/]")
    if fix:
        console.print(f"  {fix}", markup=False, soft_wrap=True)
    console.print(f"  {verdict.split(' — ')[0]}  (exit {proc.returncode})", markup=False)
    return WiringCheck(proc.returncode, fix, verdict)


def _wide_env() -> dict:
    """Keep check-wiring's lines whole (no wrapping) so the fix line reads as one line."""
    import os

    return {**os.environ, "COLUMNS": "400"}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--draft-dir", default=str(shipped_drafter_dir()), help="the drafter (default: the shipped one)")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    p.add_argument("--small", action="store_true", help="one prompt, 8 tokens: checks the verdicts, not the speed")
    p.set_defaults(max_new_tokens=48)
    args = p.parse_args(argv)
    if args.small:
        args.prompts, args.max_new_tokens = 1, 8
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


if __name__ == "__main__":
    main(sys.argv[1:])
