"""CPU verify cost: a verify of N tokens against a 1-token decode of the same model, with the projections on
MKL (the transposed weight copy eaglelab kept on CPU before) and on the few-row C kernel
(``engine/model/cpu_gemm.py``, the CPU default now), interleaved in one process (MKL, kernel, MKL, ...),
medians and minima.

    PYTHONPATH=. python benchmarks/cpu_verify.py [--model default] [--threads 2] [--widths 4] [--rounds 30]

Both variants run the same model, cache and inputs: the decode and the verify (attention mode ``decode``:
fixed shapes over the whole static cache, logits for every node, argmax) as the engine's phases run them
(``kernels=`` passed through the forward and the head). On a shared machine the minimum is the figure least
disturbed by other processes; the load average at start and end is printed to judge the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from eaglelab.engine.formats.assets import cache_dir
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.model.cpu_gemm import CpuGemm
from eaglelab.engine.model.layers import Kernels, prefix_mask, prepare_fused
from eaglelab.engine.runtime.tree import chain_tree, tree_attention_mask


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--widths", default="4", help="comma list of verify widths N")
    p.add_argument("--context", type=int, default=256, help="tokens in the cache")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    widths = tuple(int(w) for w in args.widths.split(","))
    load0 = os.getloadavg()
    target = load_target(args.model, "cpu", torch.float32, with_tokenizer=False).model
    gemm = CpuGemm(cache_dir(), print)
    if gemm.reason is not None:
        raise SystemExit(gemm.reason)
    variants = {"MKL (transposed copy)": Kernels(), "few-row kernel": Kernels(gemv=gemm)}
    prepare_fused(target)  # both weight copies, built before any timing
    prepare_fused(target, gemv=gemm)
    calls = _calls(target, args.context, widths)
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for rnd in range(args.rounds + 2):  # two warm-up rounds
            for variant, kernels in variants.items():
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    call(kernels)
                    if rnd >= 2:
                        times.setdefault((variant, name), []).append((time.perf_counter() - t0) * 1e3)
    report = _report(args, times, variants, calls, load0)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


def _calls(target, context: int, widths: tuple[int, ...]) -> dict:
    """The timed calls, each taking the kernels: a decode and a verify per width over a cache of ``context``
    tokens (the engine's shapes: the static cache has room for the widest verify)."""
    S = -(-(context + max(widths) + 2) // 64) * 64
    cache = target.make_cache(1, S, dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, context), generator=g)
    pos = torch.arange(context)[None]
    with torch.inference_mode():
        target(ids, pos, cache, pos, prefix_mask(pos, S))
    lengths = torch.tensor([context])

    def decode(kernels):
        slots = lengths[:, None]  # [1, 1]
        hidden, _ = target(torch.tensor([[7]]), slots, cache, slots, prefix_mask(slots, S), kernels=kernels)
        return target.logits(hidden[:, 0], kernels).argmax(-1)

    def verify_fn(n: int):
        tree = chain_tree(torch.full((1, n), 7, dtype=torch.long))
        slots = lengths[:, None] + torch.arange(n)

        def verify(kernels):  # as Engine._verify_fn
            mask = tree_attention_mask(lengths, tree, S)
            hidden, _ = target(tree.tokens, tree.positions(lengths), cache, slots, mask, kernels=kernels)
            return target.logits(hidden, kernels).argmax(-1)
        return verify

    return {"decode": decode, **{f"verify {n}": verify_fn(n) for n in widths}}


def _report(args, times, variants, calls, load0) -> dict:
    load1 = os.getloadavg()
    hw = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, float32")
    print(f"hardware: {hw}; load average {load0[0]:.1f} at start, {load1[0]:.1f} at end")
    print(f"workload: {args.model}, cache of {args.context} tokens, batch 1, {args.rounds} interleaved rounds")
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"hardware": hw, "load_average": [load0[0], load1[0]], "rounds": args.rounds, "context": args.context,
           "median_ms": {f"{v} | {n}": m for (v, n), m in med.items()},
           "min_ms": {f"{v} | {n}": min(t) for (v, n), t in times.items()}, "ratios": {}}
    for variant in variants:
        dec = med[(variant, "decode")]
        line = f"{variant:22s} decode {dec:7.2f} ms (min {min(times[(variant, 'decode')]):6.2f})"
        for name in calls:
            if name != "decode":
                v = med[(variant, name)]
                line += f" | {name} {v:7.2f} ms (min {min(times[(variant, name)]):6.2f})  ratio {v / dec:.3f}"
                out["ratios"][f"{variant} | {name} / decode"] = v / dec
        print(line)
    return out


if __name__ == "__main__":
    main()
