"""What one plain decode step is made of: its kernels, its graph-replayed time, and end-to-end tok/s.

    python benchmarks/decode_profile.py [--model default|llama3.1-8b|smollm2-135m|tiny|DIR] \\
        [--device auto] [--tokens 128] [--no-compile] [--json OUT]

On CUDA the engine is built as ``eaglelab bench``'s plain-compile configuration (bf16, batch 1, CUDA
graphs of torch.compile'd phases; ``--no-compile``: plain-graphs), and the script prints, in one JSON:

(a) ``kernels``: the decode phase's kernels from torch.profiler (name, category, launches per step,
    device us per step, share of the step), eager layers and compiled whole as the graph runner compiles
    the phase, run outside the CUDA graph so its kernels are visible (``eaglelab bench --profile``'s
    measure: ``eaglelab/bench/profile.py``);
(b) ``replay_ms``: the median device time of the graph-replayed decode step (CUDA events around each
    phase, as ``bench``'s phase costs);
(c) ``end_to_end``: tok/s of ``generate`` for ``--tokens`` tokens (EOS ignored; capture and compile timed
    apart), median of ``--repeats`` runs; the prefill's time (a 1-token run) and, per decode step, the
    time beyond the replayed step (the host loop's share); and, as the
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
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.devices import pick_device


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
    device, _ = pick_device(args.device)
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
    t0 = time.perf_counter()
    system.engine().generate(prompts, 8)
    setup_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    report = {
        "model": model_name, "config": config.name, "description": config.description,
        "hardware": H.hardware(device, dtype), "batch": 1, "prompt_tokens": len(prompts[0]), "setup_s": setup_s,
        "kernels": _kernels(system, args.profile_steps),
        "replay_ms": _replay_ms(system, prompts, args.tokens),
        "end_to_end": _end_to_end(system.engine(), prompts, args.tokens, args.repeats),
        "end_to_end_stop_at_once": _end_to_end(_engine(system, stop_lag=0), prompts, args.tokens, args.repeats),
    }
    step_ms = report["replay_ms"]["median"]
    e2e = report["end_to_end"]
    e2e["outside_step_ms_per_token"] = e2e["ms_per_token"] - step_ms
    e2e["loop_ms_per_decode_step"] = e2e["ms_per_decode_step"] - step_ms  # beyond the replayed step, prefill apart
    e2e["bound_by_step_tok_per_s"] = 1e3 / step_ms if step_ms > 0 else None
    e2e["ratio_over_stop_at_once"] = e2e["median_tok_per_s"] / report["end_to_end_stop_at_once"]["median_tok_per_s"]
    report["measure_s"] = time.perf_counter() - t1
    return report


def _target(model: str, device: torch.device, dtype: torch.dtype, seed: int):
    """-> (Transformer, tokenizer or None, a name)."""
    if model in SCALE_PRESETS:
        built = build_scale_model(model, device=device, dtype=dtype, seed=seed)
        return built.model, None, f"{model} (random weights, {built.config.num_layers} layers)"
    loaded = load_target(model, device=device, dtype=dtype)
    return loaded.model, loaded.tokenizer, f"{loaded.name} ({loaded.config.num_layers} layers)"


def _kernels(system, steps: int) -> list[dict]:
    """``bench --profile`` on batch 1: eager layers, and on CUDA the phase compiled whole."""
    from eaglelab.bench.profile import profile_decode, profile_section
    from eaglelab.engine.model.scale_models import decode_weight_bytes

    ctx = system.ctx
    cuda = ctx.device.type == "cuda"
    compiler = ctx.kernels(True).compile_phase if cuda else None
    found = profile_decode(ctx.target, None, (1,), ctx.max_len, compiler, decode_weight_bytes(ctx.target),
                           steps=steps, warmup=3 if cuda else 1, log=lambda m: print(m, file=sys.stderr))
    return profile_section(found)


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
    """tok/s of ``tokens``-token runs, and where a run's time goes: the prefill (a 1-token run: no
    decode step) and, per decode step, the rest."""
    runs = [engine.generate(prompts, tokens) for _ in range(repeats)]
    prefill_ms = statistics.median(engine.generate(prompts, 1).seconds * 1e3 for _ in range(repeats))
    tps = [r.tokens_per_second for r in runs]
    med = statistics.median(tps)
    run_ms = statistics.median(r.seconds * 1e3 for r in runs)
    return {"tokens": tokens, "tok_per_s": tps, "median_tok_per_s": med, "ms_per_token": 1e3 / med,
            "run_ms": run_ms, "prefill_ms": prefill_ms, "ms_per_decode_step": (run_ms - prefill_ms) / (tokens - 1),
            "setup_s_in_runs": sum(r.setup_seconds for r in runs)}


if __name__ == "__main__":
    raise SystemExit(main())
