"""What one plain decode step is made of: its kernels, its graph-replayed time, and end-to-end tok/s.

    python benchmarks/decode_profile.py [--model default|llama3.1-8b|smollm2-135m|tiny|DIR] \\
        [--device auto] [--tokens 128] [--no-compile] [--json OUT]

On CUDA the engine is built as ``eaglelab bench``'s plain-compile configuration (bf16, batch 1, CUDA
graphs of torch.compile'd phases; ``--no-compile``: plain-graphs), and the script prints, in one JSON:

(a) ``kernels``: the decode phase's kernels from torch.profiler (name, launches per step, device us per
    step, share of the step), with the compiled phase function run outside the CUDA graph so its
    kernels are visible (the graph replays exactly these);
(b) ``replay_ms``: the median device time of the graph-replayed decode step (CUDA events around each
    phase, as ``bench``'s phase costs);
(c) ``end_to_end``: tok/s of ``generate`` for ``--tokens`` tokens (EOS ignored; capture and compile timed
    apart), median of ``--repeats`` runs, and the time per token outside the replayed step; and, as the
    same-run baseline, ``end_to_end_stop_at_once``: the same engine reading its stop flag right after
    each step (``stop_lag=0``: the host waits for every step before queuing the next, as on CPU).

On CPU it runs the same engine eagerly (plain-eager; float32 unless ``--dtype``) and lists the aten
operators of one step instead of kernels. Scale models (``llama3.1-8b`` ...) have random weights: the
tokens mean nothing, the costs are the model's. Everything runs after the first capture and compile
(reported as ``setup_s``) in well under 90 s on an H200.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from eaglelab.bench import harness as H
from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.formats.loader import load_target, parse_dtype
from eaglelab.engine.model.scale_models import SCALE_PRESETS, build_scale_model
from eaglelab.engine.runtime.sampling import SamplingParams
from eaglelab.engine.runtime.spec_config import SpecConfig


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = profile_decode(args)
    except EagleLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help=f"default | an HF directory | a scale model: {', '.join(SCALE_PRESETS)}")
    p.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per end-to-end run")
    p.add_argument("--repeats", type=int, default=3, help="end-to-end runs (the median counts)")
    p.add_argument("--profile-steps", type=int, default=20, help="decode steps under the profiler")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile'd phases (default: on with CUDA, as bench's plain-compile; off on CPU)")
    p.add_argument("--compile-mode", default="default", choices=("default", "max-autotune-no-cudagraphs"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="also write the report here")
    return p


@torch.inference_mode()
def profile_decode(args: argparse.Namespace) -> dict:
    if args.tokens < 2 or args.repeats < 1 or args.profile_steps < 1:
        raise EagleLabError("need --tokens >= 2, --repeats >= 1, --profile-steps >= 1",
                            field="--tokens/--repeats/--profile-steps", found=(args.tokens, args.repeats, args.profile_steps))
    device = _device(args.device)
    cuda = device.type == "cuda"
    compile_ = cuda if args.compile is None else args.compile
    dtype = parse_dtype(args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    target, tokenizer, model_name = _target(args.model, device, dtype, args.seed)
    texts = H.mtbench_first_turns(1)
    prompts, _ = H.tokenize_prompts(texts, tokenizer, target.config.vocab_size, 256)
    config = H.CONFIGS[("plain-compile" if compile_ else "plain-graphs") if cuda else "plain-eager"]
    if compile_ and not cuda:
        config = replace(config, name="plain-eager-compiled-pieces", compile=True)
    ctx = H.BenchContext(target=target, spec=SpecConfig(), make_drafter=None, prompts=prompts,
                         max_new_tokens=args.tokens, batch_sizes=(1,), log=lambda m: print(m, file=sys.stderr),
                         compile_mode=None if args.compile_mode == "default" else args.compile_mode)
    system = H.OurSystem(config, ctx)
    if compile_ and not cuda:  # no graphs on CPU: the layers' elementwise pieces compiled, as eager --compile runs
        system.runner.kernels = ctx.kernels(True)
    print(f"{model_name}, {config.name}, {dtype}, batch 1, on {device}: warming up (capture and compile) ...",
          file=sys.stderr)
    engine = system.engine()
    t0 = time.perf_counter()
    engine.generate(prompts, 8)
    setup_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    report = {
        "model": model_name, "config": config.name, "description": config.description,
        "hardware": H.hardware(device, dtype), "batch": 1, "prompt_tokens": len(prompts[0]), "setup_s": setup_s,
        "kernels": _kernel_profile(engine, system, prompts, args.profile_steps, cuda),
        "replay_ms": _replay_ms(system, prompts, args.tokens),
        "end_to_end": _end_to_end(system.engine(), prompts, args.tokens, args.repeats),
        "end_to_end_stop_at_once": _end_to_end(_engine(system, stop_lag=0), prompts, args.tokens, args.repeats),
    }
    step_ms = report["replay_ms"]["median"]
    e2e = report["end_to_end"]
    e2e["outside_step_ms_per_token"] = e2e["ms_per_token"] - step_ms
    e2e["bound_by_step_tok_per_s"] = 1e3 / step_ms if step_ms > 0 else None
    e2e["ratio_over_stop_at_once"] = e2e["median_tok_per_s"] / report["end_to_end_stop_at_once"]["median_tok_per_s"]
    report["measure_s"] = time.perf_counter() - t1
    return report


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EagleLabError("CUDA is not available here", field="--device", found=name,
                            hint="run on a GPU machine, or pass --device cpu (eager; operators instead of kernels)")
    return device


def _target(model: str, device: torch.device, dtype: torch.dtype, seed: int):
    """-> (Transformer, tokenizer or None, a name)."""
    if model in SCALE_PRESETS:
        built = build_scale_model(model, device=device, dtype=dtype, seed=seed)
        return built.model, None, f"{model} (random weights, {built.config.num_layers} layers)"
    loaded = load_target(model, device=device, dtype=dtype)
    return loaded.model, loaded.tokenizer, f"{loaded.name} ({loaded.config.num_layers} layers)"


def _kernel_profile(engine, system, prompts, steps: int, cuda: bool) -> dict:
    """The decode phase run ``steps`` times outside any graph (compiled as the runner compiles it) under
    torch.profiler: per kernel (CUDA) or aten operator (CPU), launches and time per step, and share."""
    from torch.profiler import ProfilerActivity, profile

    st = engine._prefill(prompts, steps + 8, SamplingParams(), None)  # the engine's own state and cache
    decode = engine._decode_fn(st.cache, SamplingParams())
    phase = system.runner.compile_phase if cuda else None
    fn = decode
    if phase is not None:  # the very compiled function the graph captured (its guards take other buffers)
        made = [p for p in phase.made if p.name == "decode [b=1]" and p.reason is None]
        fn = made[0] if made else phase("decode [profiled outside the graph]", decode)
    state = {k: v.clone() for k, v in st.state().items()}  # not the graph's bound buffers: nothing else moves
    for _ in range(3):  # compiles (or loads from the on-disk cache) and warms up
        fn(**state)
    _sync(cuda)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn(**state)
        _sync(cuda)
    host_ms = (time.perf_counter() - t0) * 1e3 / steps
    rows = _rows(prof.key_averages(), steps, cuda)
    total = sum(r["us_per_step"] for r in rows)
    for r in rows:
        r["share"] = r["us_per_step"] / total if total else 0.0
    return {"steps": steps, "what": "CUDA kernels" if cuda else "aten operators (self CPU time)",
            "compiled": fn is not decode, "per_step_us": total, "launches_per_step": sum(r["count_per_step"] for r in rows),
            "host_ms_per_step_profiled": host_ms, "rows": rows}


def _rows(averages, steps: int, cuda: bool) -> list[dict]:
    out = []
    for e in averages:
        if cuda:
            if "CUDA" not in str(e.device_type):
                continue
            us = e.self_device_time_total
        else:
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        if us <= 0:
            continue
        out.append({"name": e.key, "count_per_step": e.count / steps, "us_per_step": us / steps})
    return sorted(out, key=lambda r: -r["us_per_step"])


def _replay_ms(system, prompts, tokens: int) -> dict:
    """The decode phase's time per step as the run replays it (events around each phase on CUDA)."""
    collector = H.PhaseCollector()
    system.engine(collector).generate(prompts, tokens)
    vals = [c.phase_ms["decode"] for c in collector.cycles if c.kind == "decode"]
    return {"median": statistics.median(vals), "min": min(vals), "steps": len(vals),
            "graph": collector.graph_summary().get("decode", "?")}


def _engine(system, stop_lag: int):
    """The system's engine (same runner, so the same graphs) with another stop lag."""
    from eaglelab.engine.runtime.generate import Engine

    return Engine(system.ctx.target, eos_token_ids=(), spec=system.spec, runner=system.runner, stop_lag=stop_lag)


def _end_to_end(engine, prompts, tokens: int, repeats: int) -> dict:
    runs = [engine.generate(prompts, tokens) for _ in range(repeats)]
    tps = [r.tokens_per_second for r in runs]
    med = statistics.median(tps)
    return {"tokens": tokens, "tok_per_s": tps, "median_tok_per_s": med, "ms_per_token": 1e3 / med,
            "setup_s_in_runs": sum(r.setup_seconds for r in runs)}


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


if __name__ == "__main__":
    raise SystemExit(main())
