"""Speculative and plain decoding on CPU with the projections on the few-row C kernel (the CPU default) and on
MKL (``--no-gemv``), interleaved in one process: for each prompt, spec and plain on the kernel, then spec and
plain on MKL (the order swapped every other prompt), each prompt ``--rounds`` times; tok/s from the summed
times, and the median of the per-prompt speedups.

    PYTHONPATH=. python benchmarks/cpu_spec_ab.py --prompts 10 --max-new-tokens 64 [--rounds 1] [--json OUT]

Every run's tokens must equal the plain run's on MKL (speculation and the kernel change nothing): the script
says how many do.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from benchmarks.drafter_acceptance import write_report
from eaglelab.bench.harness import mtbench_first_turns, tokenize_prompts
from eaglelab.session import add_engine_args, build_session

VARIANTS = ("kernel", "mkl")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args()
    args.device = "cpu"
    load0 = os.getloadavg()
    sessions = {}
    for variant in VARIANTS:
        args.gemv = variant == "kernel"
        sessions[variant] = build_session(args, log=lambda m: print(m, file=sys.stderr))
    s = sessions["kernel"]
    assert s.kernels is not None and s.kernels.gemv is not None, f"the kernel is off: {s.notes}"
    ids, _ = tokenize_prompts(mtbench_first_turns(args.prompts, None), s.target.tokenizer,
                              s.target.config.vocab_size, 1024)
    engines = {(v, kind): (ss.engine() if kind == "spec" else ss.plain_engine())
               for v, ss in sessions.items() for kind in ("spec", "plain")}
    for eng in engines.values():  # warm-up
        eng.generate([ids[0]], 8)
    seconds = {key: 0.0 for key in engines}
    per_prompt: dict[str, list[float]] = {v: [] for v in VARIANTS}
    tokens, same, runs = 0, 0, 0
    for i, prompt in enumerate(ids * args.rounds):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        took, outs = {}, {}
        for v in order:
            for kind in ("spec", "plain"):
                t0 = time.perf_counter()
                res = engines[(v, kind)].generate([prompt], args.max_new_tokens)
                took[(v, kind)] = time.perf_counter() - t0
                outs[(v, kind)] = res.tokens
        for key, t in took.items():
            seconds[key] += t
        for v in VARIANTS:
            per_prompt[v].append(took[(v, "plain")] / took[(v, "spec")])
        tokens += len(outs[("mkl", "plain")][0])
        same += sum(o == outs[("mkl", "plain")] for o in outs.values())
        runs += len(outs)
    report = {"prompts": len(ids), "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "spec": s.spec_label,
              "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "load_average": [load0[0], os.getloadavg()[0]],
              "tok_s": {f"{v} {k}": tokens / t for (v, k), t in seconds.items()},
              "speedup": {v: seconds[(v, "plain")] / seconds[(v, "spec")] for v in VARIANTS},
              "median_prompt_speedup": {v: statistics.median(per_prompt[v]) for v in VARIANTS},
              "identical_to_mkl_plain": f"{same}/{runs}"}
    tok = report["tok_s"]
    for v in VARIANTS:
        print(f"{v:6s}: spec {tok[f'{v} spec']:.1f} tok/s vs plain {tok[f'{v} plain']:.1f} tok/s = "
              f"{report['speedup'][v]:.2f}x (median per prompt {report['median_prompt_speedup'][v]:.2f}x)")
    print(f"kernel spec over MKL plain: {seconds[('mkl', 'plain')] / seconds[('kernel', 'spec')]:.2f}x; "
          f"identical tokens {report['identical_to_mkl_plain']}; {s.spec_label}; {len(ids)} MT-bench prompts x "
          f"{args.rounds}, {args.max_new_tokens} new tokens; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
