"""CPU verify cost: a verify of N tokens against a 1-token decode of the same model, with the linear
layers in MKL's ``x W^T`` layout (before) and in the transposed layout eaglelab now keeps on CPU
(after), interleaved in one process (before, after, before, ...), medians and minima.

    python benchmarks/cpu_verify.py [--model default] [--threads 2] [--widths 4] [--rounds 30]

Both layouts run the same model, cache and inputs: the decode and the verify (attention mode
``decode``: fixed shapes over the whole static cache, logits for every node, argmax) exactly as
``eaglelab bench --micro`` times them. On a shared machine the minimum is the figure least
disturbed by other processes; the load average at start and end is printed to judge the noise.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from eaglelab.bench.harness import _MicroBench
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.model.layers import fused_linears

LAYOUTS = {"x W^T (before)": False, "transposed (after)": True}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--widths", default="4", help="comma list of verify widths N")
    p.add_argument("--context", type=int, default=256, help="tokens in the cache")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    widths = tuple(int(w) for w in args.widths.split(","))
    load0 = os.getloadavg()
    target = load_target(args.model, "cpu", torch.float32, with_tokenizer=False).model
    bench = _MicroBench(target, (1,), widths, args.context, graphs=False)
    calls = {"decode": bench.decode_fn(1, False), **{f"verify {n}": bench.verify_fn(1, n, "decode", False) for n in widths}}
    linears = fused_linears(target)
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for rnd in range(args.rounds + 2):  # two warm-up rounds (each layout builds its weight copies)
            for layout, transposed in LAYOUTS.items():
                for lin in linears:
                    lin.transpose_on_cpu = transposed
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    if rnd >= 2:
                        times.setdefault((layout, name), []).append((time.perf_counter() - t0) * 1e3)
    _report(args, times, calls, load0)


def _report(args, times, calls, load0) -> None:
    print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, float32; load average {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"workload: {args.model}, cache of {args.context} tokens, batch 1, {args.rounds} interleaved rounds")
    for layout in LAYOUTS:
        dec = times[(layout, "decode")]
        line = f"{layout:20s} decode {statistics.median(dec):7.2f} ms (min {min(dec):6.2f})"
        for name in calls:
            if name != "decode":
                v = times[(layout, name)]
                line += (f" | {name} {statistics.median(v):7.2f} ms (min {min(v):6.2f})  ratio "
                         f"{statistics.median(v) / statistics.median(dec):.3f} (of minima {min(v) / min(dec):.3f})")
        print(line)


if __name__ == "__main__":
    main()
