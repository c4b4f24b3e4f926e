"""Synthetic run events: a plausible EAGLE-3 run without a model, for tests and ``eaglelab tui --demo``.

::

    events = synthetic_run(cycles=80, accept_p=0.6, verify_mode="prefill", seed=1)
    write_synthetic_record("demo.jsonl", cycles=80)

The numbers imitate the deployments eaglelab was built for: a verify in ``prefill`` attention mode
runs eagerly and costs ~2.4 plain decodes; in ``decode`` mode it replays a CUDA graph and costs
about one. Deterministic for a given ``seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from eaglelab.probes.events import (
    EAGER_EXTEND,
    EAGER_OFF,
    REPLAY,
    SOURCE_RUNNER,
    AllReduce,
    Event,
    GraphCaptured,
    RunFinished,
    RunStarted,
    Step,
    WarningEvent,
    eager_warning,
)


@dataclass(frozen=True)
class SyntheticSpec:
    """Knobs of a synthetic run (see :func:`synthetic_run`)."""

    cycles: int = 60
    seed: int = 0
    num_steps: int = 3
    batch_size: int = 1
    accept_p: float = 0.6  # chance each further draft token is accepted
    verify_mode: str = "decode"  # "decode" (graph replay) | "prefill" (eager extend)
    cuda_graphs: bool = True
    plain_steps: int = 8  # plain decode steps before speculation (a baseline for verify/decode)
    decode_ms: float = 12.0
    tp_size: int = 1
    layers: int = 4
    t0: float = 1_700_000_000.0


def synthetic_run(**knobs: object) -> list[Event]:
    """Events of one synthetic run: start, captures, prefill, plain steps, spec cycles, finish."""
    spec = SyntheticSpec(**knobs)  # type: ignore[arg-type]
    assert spec.verify_mode in ("decode", "prefill"), f"verify_mode {spec.verify_mode!r}"
    rng = random.Random(spec.seed)
    clock = [spec.t0]
    events: list[Event] = [_run_started(spec), *_captures(spec)]
    if spec.cuda_graphs and spec.verify_mode == "prefill":
        events.append(WarningEvent(SOURCE_RUNNER, eager_warning("verify", EAGER_EXTEND), spec.t0))
    events.append(_step(spec, clock, 0, "prefill", {"prefill": 4.0 * spec.decode_ms}, (1,) * spec.batch_size))
    for i in range(spec.plain_steps):
        graph = {"decode": REPLAY if spec.cuda_graphs else EAGER_OFF}
        events.append(_step(spec, clock, 1 + i, "decode", {"decode": _jitter(rng, spec.decode_ms)}, (1,) * spec.batch_size, graph))
    for i in range(spec.cycles):
        index = 1 + spec.plain_steps + i
        events.extend(_allreduces(spec, rng, clock[0]))
        events.append(_spec_cycle(spec, rng, clock, index))
    steps = [e for e in events if isinstance(e, Step)]
    spec_rows = [a for e in steps if e.kind == "spec" for a in e.accept_len]
    events.append(
        RunFinished(
            prompt_tokens=24 * spec.batch_size,
            generated_tokens=sum(e.tokens for e in steps),
            seconds=clock[0] - spec.t0,
            cycles=spec.plain_steps + spec.cycles,
            mean_accept_len=sum(spec_rows) / len(spec_rows) if spec_rows else None,
            stop_reasons=("length",) * spec.batch_size,
            t=clock[0],
        )
    )
    return events


def write_synthetic_record(path: str | Path, **knobs: object) -> Path:
    """Write :func:`synthetic_run` events as a run record at ``path``; returns the path."""
    from eaglelab.probes.record import RecordWriter

    with RecordWriter(path) as writer:
        for event in synthetic_run(**knobs):
            writer.write(event)
    return Path(path)


def _run_started(spec: SyntheticSpec) -> RunStarted:
    return RunStarted(
        model="synthetic-llama-1b",
        model_digest="0000synthetic",
        device="cuda:0 (synthetic)",
        dtype="bfloat16",
        batch_size=spec.batch_size,
        spec={
            "algorithm": "eagle3",
            "num_steps": spec.num_steps,
            "topk": 1,
            "num_draft_tokens": spec.num_steps + 1,
            "attention_mode": spec.verify_mode,
            "cuda_graphs": spec.cuda_graphs,
        },
        model_config={"num_layers": spec.layers},
        versions={"eaglelab": "synthetic"},
        tp_size=spec.tp_size,
        t=spec.t0,
    )


def _captures(spec: SyntheticSpec) -> list[Event]:
    if not spec.cuda_graphs:
        return []
    names = ["decode", "draft", "draft_extend"] + (["verify"] if spec.verify_mode == "decode" else [])
    return [GraphCaptured(n, spec.batch_size, 0.2 + 0.1 * i, (16 + 8 * i) << 20, spec.t0) for i, n in enumerate(names)]


def _step(
    spec: SyntheticSpec, clock: list[float], index: int, kind: str, phase_ms: dict[str, float],
    accept_len: tuple[int, ...], graph: dict[str, str] | None = None, num_draft_tokens: int = 0,
) -> Step:
    clock[0] += (sum(phase_ms.values()) + 0.4) / 1000.0  # phases plus a little host overhead
    return Step(
        index=index, kind=kind, phase_ms=phase_ms, accept_len=accept_len,
        accepted_positions=tuple(tuple(range(1, a)) for a in accept_len),
        num_draft_tokens=num_draft_tokens, verify_tokens=num_draft_tokens * len(accept_len),
        graph=graph or {}, active_rows=len(accept_len), t=clock[0],
    )


def _spec_cycle(spec: SyntheticSpec, rng: random.Random, clock: list[float], index: int) -> Step:
    accept = tuple(_accept_len(rng, spec) for _ in range(spec.batch_size))
    verify_cost = 1.05 if spec.verify_mode == "decode" else 2.4
    phase_ms = {
        "draft": _jitter(rng, 1.6 * spec.num_steps),
        "verify": _jitter(rng, verify_cost * spec.decode_ms),
        "accept": _jitter(rng, 0.3),
        "draft_extend": _jitter(rng, 1.8),
    }
    on = REPLAY if spec.cuda_graphs else EAGER_OFF
    graph = {"draft": on, "verify": on if spec.verify_mode == "decode" else EAGER_EXTEND, "draft_extend": on}
    return _step(spec, clock, index, "spec", phase_ms, accept, graph, spec.num_steps + 1)


def _accept_len(rng: random.Random, spec: SyntheticSpec) -> int:
    a = 1
    while a <= spec.num_steps and rng.random() < spec.accept_p:
        a += 1
    return a


def _allreduces(spec: SyntheticSpec, rng: random.Random, t: float) -> list[Event]:
    if spec.tp_size <= 1:
        return []
    out: list[Event] = []
    for layer in range(spec.layers):
        for site, base in (("attn", 0.06), ("mlp", 0.09)):
            out.append(
                AllReduce(
                    layer=layer, site=site, nbytes=(spec.num_steps + 1) * 4096 * 2, ms=_jitter(rng, base * (1 + layer % 3)),
                    rank=0, world_size=spec.tp_size, phase="verify", in_graph=spec.verify_mode == "decode", t=t,
                )
            )
    return out


def _jitter(rng: random.Random, ms: float) -> float:
    return round(ms * rng.uniform(0.95, 1.05), 4)
