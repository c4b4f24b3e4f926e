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

On the default model (SmolLM2-135M) a GPU decode is launch-bound (~0.8 ms on an H200), so an eager
verify costs dozens of decodes: not the incident's regime, where a decode of a large target reads
gigabytes and the same eager verify cost 2.4x one. ``--scale-model NAME`` measures that regime on a
random-weight target of a real shape (``llama3.1-8b``, ``kimi-like``; ``tiny`` for tests): a plain
decode step, a healthy verify (decode mode, CUDA graphs on CUDA) and a broken verify (prefill/extend
mode, eager) of the same N tokens over the same cache, each the median of synchronised calls. Random
weights accept nothing meaningful, so acceptance is not measured: the economics model
(``eaglelab.probes.economics``) says what speculation would give at the incident's acceptance and
drafting overhead (derived from its figures and printed), beside the incident's own figures.

    python examples/incident_verify_eager.py --scale-model llama3.1-8b --device cuda   # ~1 min on an H200
    python examples/incident_verify_eager.py --scale-model tiny --device cpu           # what the CI runs
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

from rich.console import Console

from eaglelab.compare import measure, plain_baseline, table
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.probes.economics import Economics, EconomicsInputs, analyse
from eaglelab.session import add_engine_args, build_session

# Prompts like the shipped drafter's training prompts, so acceptance is not what limits it.
PROMPTS = (
    "Summarize the key ideas of open source software in a few bullet points.",
    "Explain what a Python list comprehension is, with an example.",
)


def main(argv: list[str] | None = None, console: Console | None = None) -> dict:
    """Run both configurations; print the table; return the measured rows by name (with --scale-model:
    the :class:`ScaleResult`'s costs and economics by name)."""
    args = _args(argv)
    console = console or Console()
    if args.scale_model:
        r = scale_measure(args.scale_model, args.device, args.dtype, args.verify_tokens, args.context, args.seed,
                          log=lambda m: console.print(f"[dim]{m}[/]"))
        print_scale(r, console)
        return {"seed": r.seed, "healthy": r.healthy, "broken": r.broken, "result": r}
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


# ---- the incident's regime on a random-weight target of a real shape (--scale-model) -------------------


@dataclass(frozen=True)
class Seed:
    """The incident as measured in production (SGLang, a 61-layer MoE target, an EAGLE-3 drafter) and the
    accepted length assumed from it. Only ``accept_len`` is not a measured figure: the deployment's
    accept rate was 47% of drafted tokens (incident 2's healthy figure, same deployment) over 3 draft
    tokens a cycle, so 1 + 0.47 x 3 = 2.41 tokens a cycle, bonus included."""

    decode_ms: float = 12.0  # one plain 1-token decode, graph-replayed
    verify_ms: float = 29.5  # one verify of 3 tokens in extend ("prefill") mode, eager: 29-30 ms
    verify_tokens: int = 3
    spec_tok_s: float = 60.0  # 59-61 tok/s with speculation
    plain_tok_s: float = 82.0
    accept_rate: float = 0.47
    draft_tokens: int = 3

    @property
    def accept_len(self) -> float:
        return 1 + self.accept_rate * self.draft_tokens

    @property
    def overhead_ms(self) -> float:
        """Draft + accept + draft-extend a cycle: a cycle takes accept_len / spec_tok_s, verify the rest of it
        is not: 2.41 / 60 tok/s = 40.2 ms - 29.5 ms = 10.7 ms."""
        return self.accept_len / self.spec_tok_s * 1e3 - self.verify_ms

    @property
    def overhead_decodes(self) -> float:
        """The drafting overhead in decode steps (10.7 / 12 = 0.89): what a cycle adds to verify on any target."""
        return self.overhead_ms / self.decode_ms


SEED = Seed()


@dataclass(frozen=True)
class ScaleResult:
    """Measured costs on the scale model and what the economics model predicts from them at the seed's
    acceptance and drafting overhead (in decode steps)."""

    model: str
    device: str
    dtype: str
    verify_tokens: int
    context: int
    decode_ms: float
    decode_graph: str  # "replay" | "eager: why"
    seed: Economics  # the seed's own figures through the same model (its measured speedup: 0.73x)
    healthy: Economics
    broken: Economics


def scale_measure(name: str, device: str = "auto", dtype: str = "auto", verify_tokens: int = SEED.verify_tokens,
                  context: int = 512, seed: int = 0, seed_figures: Seed = SEED, log=lambda m: None) -> ScaleResult:
    """Build ``name`` with random weights, time a 1-token decode and a verify of ``verify_tokens`` tokens in
    both attention modes over a cache of ``context`` tokens, and predict speculation at the seed's acceptance."""
    import torch

    from eaglelab.bench.micro import MicroBench
    from eaglelab.bench.timing import time_call
    from eaglelab.devices import device_name, pick_device, pick_dtype
    from eaglelab.engine.formats.loader import parse_dtype
    from eaglelab.engine.model.scale_models import build_scale_model
    from eaglelab.engine.runtime.reasons import EAGER_EXTEND

    dev, _ = pick_device(device)
    dtype_name, _ = pick_dtype(dtype, dev)
    log(f"building {name} with random weights on {device_name(dev)} ({dtype_name}) ...")
    model = build_scale_model(name, device=dev, dtype=parse_dtype(dtype_name), seed=seed).model
    cuda = dev.type == "cuda"
    warmup, iters = (10, 50) if cuda else (5, 20)
    with torch.inference_mode():
        mb = MicroBench(model, (1,), (verify_tokens,), context, graphs=cuda)
        calls = (mb.decode_fn(1, cuda), mb.verify_fn(1, verify_tokens, "decode", cuda),
                 mb.verify_fn(1, verify_tokens, "prefill", False))
        # three rounds, the three calls interleaved; each keeps its lowest median (other work on the machine
        # only ever adds time, and a round's first calls pay one-off set-up)
        rounds = [[time_call(fn, dev, warmup, iters) for fn in calls] for _ in range(3)]
        decode_ms, healthy_ms, broken_ms = (min(col) for col in zip(*rounds))
    del mb, model
    s = seed_figures

    def at_seed(d: float, v: float, graph: str, mode: str) -> Economics:
        return analyse(EconomicsInputs(decode_ms=d, draft_ms=s.overhead_decodes * d, verify_ms=v, accept_len=s.accept_len,
                                       verify_graph=graph, attention_mode=mode))

    return ScaleResult(
        name, device_name(dev), dtype_name, verify_tokens, context, decode_ms, mb_status(cuda),
        seed=at_seed(s.decode_ms, s.verify_ms, EAGER_EXTEND, "prefill"),
        healthy=at_seed(decode_ms, healthy_ms, mb_status(cuda), "decode"),
        broken=at_seed(decode_ms, broken_ms, EAGER_EXTEND, "prefill"),
    )


def mb_status(cuda: bool) -> str:
    """What MicroBench's runner does for a decode-mode call (decode, healthy verify): replay on CUDA, eager without it."""
    from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA

    return "replay" if cuda else EAGER_NO_CUDA


def print_scale(r: ScaleResult, console: Console) -> None:
    """The seed and our two verifies side by side, the assumptions, the verdicts."""
    from rich.table import Table

    s = SEED
    console.print(f"[dim]{r.model} (random weights) on {r.device}, {r.dtype}; verify of {r.verify_tokens} tokens over "
                  f"a cache of {r.context}; decode {r.decode_graph}[/]")
    t = Table(title="incident 1 at the seed's acceptance: verify not graph-captured", title_justify="left", show_lines=True)
    t.add_column("", style="bold")
    for head in ("seed: SGLang, 61-layer MoE (measured)", f"{r.model}: healthy verify (decode mode)",
                 f"{r.model}: broken verify (prefill/extend, eager)"):
        t.add_column(head, overflow="fold")
    rows = (r.seed, r.healthy, r.broken)
    t.add_row("decode ms (1 token)", *(f"{e.inputs.decode_ms:.2f}" for e in rows))
    t.add_row(f"verify ms ({r.verify_tokens} tokens)", *(f"{e.inputs.verify_ms:.2f}" for e in rows))
    t.add_row("verify / decode", *(f"{e.verify_decode_ratio:.2f}x" for e in rows))
    t.add_row("verify graph", *(e.inputs.verify_graph or "—" for e in rows))
    t.add_row(f"speculation at accepted length {s.accept_len:.2f}",
              f"{r.seed.predicted_speedup:.2f}x predicted; measured {s.spec_tok_s:.0f} / {s.plain_tok_s:.0f} tok/s = "
              f"{s.spec_tok_s / s.plain_tok_s:.2f}x", *(f"{e.predicted_speedup:.2f}x predicted" for e in rows[1:]))
    t.add_row("break-even verify", *(f"{e.break_even_verify_ms:.2f} ms" for e in rows))
    t.add_row("economics verdict", *(e.verdict for e in rows))
    console.print(t)
    console.print(
        f"[dim]assumed, from the seed: accepted length {s.accept_len:.2f} (accept rate {s.accept_rate:.0%} over "
        f"{s.draft_tokens} draft tokens, bonus included); drafting overhead (draft + accept + draft-extend) "
        f"{s.overhead_decodes:.2f} decode steps a cycle (its {s.accept_len:.2f} / {s.spec_tok_s:.0f} tok/s = "
        f"{s.overhead_ms + s.verify_ms:.1f} ms cycle, less its {s.verify_ms:g} ms verify). Acceptance on random weights "
        f"means nothing, so none is measured here: only the decode and the two verifies are.[/]")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    p.add_argument("--small", action="store_true", help="one prompt, 8 tokens: checks the verdicts, not the speed")
    p.add_argument("--scale-model", metavar="NAME",
                   help="measure decode and both verifies on a random-weight target of this shape (llama3.1-8b, kimi-like, "
                        "smollm2-135m, tiny) and predict speculation at the seed's acceptance")
    p.add_argument("--verify-tokens", type=int, default=SEED.verify_tokens,
                   help=f"with --scale-model: tokens per verify (default {SEED.verify_tokens}, the seed's)")
    p.add_argument("--context", type=int, default=512, help="with --scale-model: tokens in the cache (default 512)")
    p.set_defaults(max_new_tokens=48)
    args = p.parse_args(argv)
    if args.small:
        args.prompts, args.max_new_tokens = 1, 8
    if args.scale_model and args.verify_tokens < 2:
        p.error("--verify-tokens must be >= 2")
    if args.draft in ("ngram", "none"):
        p.error("this incident is about the EAGLE-3 drafter: use --draft default or a drafter directory")
    return args


if __name__ == "__main__":
    main(sys.argv[1:])
