"""The draft tree's expansion step, compiled as the engine compiles a phase, with top-k in one pass against in two
stages (blocks, then the blocks' best), at the drafter's vocabulary sizes.

    python benchmarks/topk_bench.py [--vocab 8192,12288,32000] [--rows 1x1,1x4,8x4] [--chunks 128,256,512]

What is timed: :func:`expand_step` of float32 logits ``[B, F, V]`` (their log-probabilities' top-k, the row's
log-sum-exp from the same passes, the candidates' scores, the new frontier), as one
``torch.compile(fullgraph=True, dynamic=False)`` function: the part of a draft step after the drafter's head
(F = 1 at the root, F = topk after it). Per case: the median over replays of a CUDA graph of ``--calls`` calls on
inputs in turn (launch costs out, as in the engine's captured draft), for the one-pass path and each block size;
the tokens and scores must agree with the one-pass path's. CUDA only.

The one-pass path gives each row one program; a 6/4/16 draft at a 32,000-token vocabulary spent ~30 us a step there
on the H200 (hence two stages past ``TOP_K_ONE_PASS`` entries). This measures where the crossover lies.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from eaglelab.engine.model.triton_ops import time_in_turn, triton_version
from eaglelab.engine.runtime import tree


def expansion(topk: int):
    def fn(logits: torch.Tensor, scores: torch.Tensor):
        exp = tree.expand_step(scores, logits, topk)
        return exp.tokens, exp.scores, exp.selected
    return fn


def compiled(topk: int, one_pass: int, chunk: int):
    """A fresh compile of :func:`expansion` with ``TOP_K_ONE_PASS`` / ``TOP_K_CHUNK`` set for its trace."""
    torch._dynamo.reset()
    tree.TOP_K_ONE_PASS, tree.TOP_K_CHUNK = one_pass, chunk
    fn = torch.compile(expansion(topk), fullgraph=True, dynamic=False)
    return fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="8192,12288,32000")
    p.add_argument("--rows", default="1x1,1x4,8x4", help="B x F cases (F = 1: the root's step; F = topk after)")
    p.add_argument("--chunks", default="128,256,512", help="block sizes of the two-stage path")
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--calls", type=int, default=200, help="calls per captured graph")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("topk_bench.py needs CUDA")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    saved = tree.TOP_K_ONE_PASS, tree.TOP_K_CHUNK
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton_version()}, "
          f"python {platform.python_version()}; top-{args.topk}, float32 logits; us per call (graph of {args.calls})")
    print(f"{'V':>6} {'B x F':>6} {'one pass':>9} " + " ".join(f"{'blocks ' + str(c):>11}" for c in chunks) + "  best")
    results = []
    try:
        for V in (int(v) for v in args.vocab.split(",")):
            for case in args.rows.split(","):
                B, F = (int(x) for x in case.split("x"))
                copies = 8
                logits = [torch.randn(B, F, V, device=dev, generator=g) * 4 for _ in range(copies)]
                scores = [-torch.rand(B, F, device=dev, generator=g) for _ in range(copies)]
                row = {"vocab": V, "batch": B, "frontier": F, "topk": args.topk}
                ref = None
                for name, one_pass, chunk in [("one_pass", 1 << 30, 256)] + [(f"blocks_{c}", 0, c) for c in chunks]:
                    fn = compiled(args.topk, one_pass, chunk)
                    out = fn(logits[0], scores[0])
                    if ref is None:
                        ref = out
                    else:  # the same tokens and scores as the one-pass path (ties go to the lower index in both)
                        assert torch.equal(out[0], ref[0]) and torch.equal(out[2], ref[2]), f"{name} differs at V {V}"
                        torch.testing.assert_close(out[1], ref[1])
                    row[name] = 1e3 * time_in_turn(lambda i: fn(logits[i], scores[i]), copies, args.calls)
                timed = {k: v for k, v in row.items() if k == "one_pass" or k.startswith("blocks_")}
                row["best"] = min(timed, key=timed.get)
                results.append(row)
                print(f"{V:>6} {case:>6} {row['one_pass']:>9.2f} "
                      + " ".join(f"{row[f'blocks_{c}']:>11.2f}" for c in chunks) + f"  {row['best']}")
    finally:
        tree.TOP_K_ONE_PASS, tree.TOP_K_CHUNK = saved
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                       "triton": triton_version(), "results": results}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
