"""Healthy against broken, side by side: run speculative configurations on one target with the probes on,
each against plain decoding of the same prompts in the same run, and let the probes give the verdicts.

This is what the incident examples (``examples/incident_*.py``) print. Every figure is measured in
the run that prints it; the verdicts come from :mod:`eaglelab.probes.report` (economics, acceptance,
eager fallbacks), never from thresholds in the examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from eaglelab.probes.bus import ProbeBus, RunTotals
from eaglelab.probes.economics import Economics, analyse
from eaglelab.probes.report import dominant_verify_graph, economics_inputs, record_verdicts


# Per-phase eager fallbacks and the runner's warnings about them: the "verify graph" row says it.
_EAGER_LINE = re.compile(r"^(\w+ ran eagerly in \d+ of \d+ steps|warning from runner: )")


@dataclass(frozen=True)
class Baseline:
    """Plain decoding of the prompts: the tokens speculation must reproduce and the cost of one decode."""

    tokens: list[list[int]]
    decode_ms: float  # mean wall time of one plain decode step
    tokens_per_s: float


@dataclass(frozen=True)
class Measured:
    """One speculative configuration, measured against the plain baseline of the same run."""

    label: str
    accept_len: float | None  # mean accepted length, bonus included
    accept_rate: float | None
    verify_ms: float | None
    decode_ms: float
    tokens_per_s: float
    plain_tokens_per_s: float
    verify_graph: str | None  # "replay" | "eager: <reason>"
    output_difference: str | None  # where and why the tokens part from plain greedy's (None: identical)
    economics: Economics | None
    verdicts: tuple[str, ...]

    @property
    def identical_to_plain(self) -> bool:
        return self.output_difference is None

    @property
    def verify_over_decode(self) -> float | None:
        return None if self.verify_ms is None else self.verify_ms / self.decode_ms

    @property
    def cause(self) -> str | None:
        """The economics probe's cause ("pays", "acceptance_low", "verify_eager", ...)."""
        return None if self.economics is None else self.economics.cause


def plain_baseline(session: Any, prompt_ids: Sequence[list[int]], max_new_tokens: int) -> Baseline:
    """Plain greedy decoding of each prompt (batch 1, as the speculative runs), probes on."""
    tokens: list[list[int]] = []
    seconds = generated = steps = decode_sum = 0.0
    runner = session.runner(session.spec.plain(), None)  # one for every prompt: graphs captured once
    for i, ids in enumerate(prompt_ids):
        bus = ProbeBus()  # its totals fold this run in as a baseline (the engine marks it so)
        warm = session.warm_up_tokens(session.spec.plain()) if i == 0 else 0  # the runner's graphs, before timing
        out = session.plain_engine(observer=bus, runner=runner).generate([ids], max_new_tokens, warm_up=warm)
        own = bus.totals.baseline or bus.totals
        n = own.cycles_by_kind.get("decode", 0)
        if n:
            decode_sum += n * own.mean_phase_ms("decode", kind="decode")
            steps += n
        tokens += out.tokens
        seconds += out.seconds
        generated += out.generated_tokens
    assert steps, "plain decoding ran no decode step: raise max_new_tokens"
    return Baseline(tokens, decode_sum / steps, generated / seconds)


def measure(session: Any, label: str, spec: Any, drafter: Any, prompt_ids: Sequence[list[int]],
            max_new_tokens: int, baseline: Baseline, expected_accept_len: float = 2.0) -> Measured:
    """Run ``drafter`` with ``spec`` over the prompts (batch 1 each) and judge it with the probes."""
    totals = RunTotals()
    tokens: list[list[int]] = []
    seconds = generated = 0.0
    runner = session.runner(spec, drafter)  # one for every prompt: graphs captured once
    for i, ids in enumerate(prompt_ids):
        bus = ProbeBus()
        bus.subscribe(totals.observe_event)
        warm = session.warm_up_tokens(spec) if i == 0 else 0  # the runner's graphs, before timing
        out = session.engine(observer=bus, spec=spec, drafter=drafter, runner=runner).generate(
            [ids], max_new_tokens, warm_up=warm)
        tokens += out.tokens
        seconds += out.seconds
        generated += out.generated_tokens
    inputs = economics_inputs(totals, baseline.decode_ms, expected_accept_len)
    differs = output_difference(tokens, baseline.tokens, session.dtype_name, spec.draft_tokens)
    return Measured(
        label=label,
        accept_len=totals.acceptance.mean_accept_len,
        accept_rate=totals.acceptance.accept_rate,
        verify_ms=totals.mean_phase_ms("verify", kind="spec"),
        decode_ms=baseline.decode_ms,
        tokens_per_s=generated / seconds,
        plain_tokens_per_s=baseline.tokens_per_s,
        verify_graph=dominant_verify_graph(totals),
        output_difference=differs[0] if differs else None,
        economics=analyse(inputs) if inputs is not None else None,
        verdicts=tuple(v for v in record_verdicts(totals, baseline.decode_ms, expected_accept_len)
                       if not _EAGER_LINE.match(v)),
    )


def output_difference(tokens: list[list[int]], plain: list[list[int]], dtype: str,
                      verify_tokens: int) -> tuple[str, bool] | None:
    """How greedy speculation's tokens part from plain greedy decoding's of the same prompts (None: identical): the
    text, and whether it is an alarm. In float32 the two must agree token for token; in bfloat16 or float16 a verify
    of ``verify_tokens`` rows rounds differently from one-token decodes, so two near-tied logits can part them after
    a while: the text says where, and how to check exactly, rather than raise a false alarm."""
    if tokens == plain:
        return None
    n = max(len(r) for r in plain)
    first = min((next((i for i, (a, b) in enumerate(zip(r, q)) if a != b), min(len(r), len(q)))
                 for r, q in zip(tokens, plain) if r != q), default=0)
    if dtype == "float32":
        return (f"DIFFERS from plain greedy decoding from token {first + 1} of {n} (in float32 speculation must match "
                "it exactly: please report this)"), True
    return (f"the first {first} of {n} tokens match plain greedy decoding, then they part: in {dtype} a verify of "
            f"{verify_tokens} tokens rounds differently from one-token decodes (--dtype float32 checks exactly)"), False


def table(rows: Sequence[Measured], title: str) -> Any:
    """A rich table, one column per configuration."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_lines=True)
    t.add_column("", style="bold")
    for r in rows:
        t.add_column(r.label, overflow="fold")
    lines: list[tuple[str, list[str]]] = [
        ("mean accepted length", [_f(r.accept_len, "{:.2f} (bonus incl.)") for r in rows]),
        ("accept rate", [_f(r.accept_rate, "{:.0%}") for r in rows]),
        ("verify ms / decode ms", [f"{_f(r.verify_ms, '{:.1f}')} / {r.decode_ms:.1f} = "
                                   f"{_f(r.verify_over_decode, '{:.2f}x')}" for r in rows]),
        ("tok/s (plain, same run)", [f"{r.tokens_per_s:.1f} ({r.plain_tokens_per_s:.1f}) = "
                                     f"{r.tokens_per_s / r.plain_tokens_per_s:.2f}x" for r in rows]),
        ("verify graph", [r.verify_graph or "—" for r in rows]),
        ("output", [r.output_difference or "identical to plain greedy" for r in rows]),
        ("probe verdict", ["\n".join(f"• {v}" for v in r.verdicts) or "nothing to flag" for r in rows]),
    ]
    for name, cells in lines:
        t.add_row(name, *cells)
    return t


def _f(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)
