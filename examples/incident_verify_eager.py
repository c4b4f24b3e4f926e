"""Incident 1: verify not graph-captured.

In production, EAGLE-3's verify ran in SGLang's extend ("prefill") attention mode, outside CUDA
graphs: 29-30 ms per verify against 12 ms per plain decode step, so speculation ran at 59-61 tok/s
against 82 tok/s without it. This script runs the same drafter on the same prompts twice:

- healthy: verify as a fixed-shape decode-style forward (``attention_mode="decode"``), captured in
  CUDA graphs when a GPU is present;
- broken:  verify as an eager extend forward (``attention_mode="prefill"``), as in the incident;

each against plain decoding of the same prompts in the same run, and prints the probes' figures and
verdicts side by side: the economics probe names verify as the cause and gives the break-even verify
cost. On a CPU there are no CUDA graphs, so both verifies run eagerly: the table still shows the
cost of each path and what the probes conclude from it, measured, not assumed.

    python examples/incident_verify_eager.py            # CPU, or the GPU when there is one
    python examples/incident_verify_eager.py --small    # a few tokens (what the CI runs)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.console import Console

from eaglelab.compare import measure, plain_baseline, table
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.session import add_engine_args, build_session

# Prompts like the shipped drafter's training prompts, so acceptance is not what limits it.
PROMPTS = (
    "Summarize the key ideas of open source software in a few bullet points.",
    "Explain what a Python list comprehension is, with an example.",
)


def main(argv: list[str] | None = None, console: Console | None = None) -> dict:
    """Run both configurations; print the table; return the measured rows by name."""
    args = _args(argv)
    console = console or Console()
    session = build_session(args, log=lambda m: console.print(f"[dim]{m}[/]"))
    tok = session.target.tokenizer
    prompts = [tok.chat_ids(p) for p in PROMPTS[: args.prompts]]
    healthy_spec = dataclasses.replace(session.spec, attention_mode="decode")
    broken_spec = dataclasses.replace(session.spec, attention_mode="prefill")
    net, taps = session.drafter.net, session.drafter.target_taps
    graphs = "CUDA graphs" if healthy_spec.cuda_graphs else "no CUDA graphs on this device"
    console.print(f"[dim]{session.target.name} on {session.device_label}, {session.dtype_name}; "
                  f"{session.spec_label}; {len(prompts)} prompt(s) x {args.max_new_tokens} tokens[/]")
    baseline = plain_baseline(session, prompts, args.max_new_tokens)
    rows = [
        measure(session, f"healthy: verify in decode mode ({graphs})", healthy_spec,
                Eagle3Drafter(net, healthy_spec, taps), prompts, args.max_new_tokens, baseline),
        measure(session, "broken: verify in prefill (extend) mode, eager", broken_spec,
                Eagle3Drafter(net, broken_spec, taps), prompts, args.max_new_tokens, baseline),
    ]
    console.print(table(rows, "incident 1: verify not graph-captured"))
    return {"healthy": rows[0], "broken": rows[1]}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    p.add_argument("--small", action="store_true", help="one prompt, 8 tokens: checks the verdicts, not the speed")
    p.set_defaults(max_new_tokens=48)
    args = p.parse_args(argv)
    if args.small:
        args.prompts, args.max_new_tokens = 1, 8
    if args.draft in ("ngram", "none"):
        p.error("this incident is about the EAGLE-3 drafter: use --draft default or a drafter directory")
    return args


if __name__ == "__main__":
    main(sys.argv[1:])
