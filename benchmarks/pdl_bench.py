"""What dependent launches (``engine/model/pdl.py``) save between kernels, alone: a SmolLM2-shaped chain of our GEMV
captured in one CUDA graph, launched plainly, dependently (PDL), and dependently with each program's first weight
tile, or first two, loaded before it waits (PDL + early weights; + early2), in one process.

    python benchmarks/pdl_bench.py --json OUT.json       # CUDA, Hopper or later; ~20 s
    python benchmarks/pdl_bench.py --check               # any machine with Triton: the chain's maths, no timing

The chain is a decoder's projections, layer after layer, each call's input a slice of the call before's output (so
every kernel depends on the one before, as in a forward): q/k/v 576 -> 960, o 576 -> 576, gate/up 576 -> 3072,
down 1536 -> 576, 30 layers, then the head 576 -> 49,152: 121 launches at ``--rows`` 1 (a decode), 4 (a draft
step's rows) and 24 (a verify). Each weight is its own tensor (the 135M model's 270 MB of bf16 weights stream from
memory, as in a decode). Times are medians of ``--replays`` graph replays, the three ways interleaved replay by
replay; the tilings are each shape's untuned default (the same for every way). Per launch = the graph's time /
121 (saved: plain against the better early way). ``--check`` runs the chain once eagerly without and with early
weights (Triton's interpreter on a CPU) and checks the outputs are the same bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

LAYERS = 30
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))  # name, K, N
HEAD = ("head", 576, 49152)
WAYS = (("plain", False, 0), ("pdl", True, 0), ("pdl_early", True, 1), ("pdl_early2", True, 2))  # name, dependent,
# early weight tiles


def weights(device: torch.device, dtype: torch.dtype, layers: int, vocab: int) -> list[tuple[str, torch.Tensor]]:
    """The chain's weights in order, each its own [N, K] tensor."""
    g = torch.Generator(device=device).manual_seed(0)
    out = []
    for layer in range(layers):
        for name, K, N in SHAPES:
            out.append((f"{name}{layer}", (torch.randn(N, K, device=device, generator=g) * K ** -0.5).to(dtype)))
    name, K, _ = HEAD
    out.append((name, (torch.randn(vocab, K, device=device, generator=g) * K ** -0.5).to(dtype)))
    return out


def chain(x: torch.Tensor, ws: list[tuple[str, torch.Tensor]], dependent: bool, early: int) -> torch.Tensor:
    """Each GEMV's input the first K columns of the one before's output (the decoder's order; a strided view, as the
    kernel takes a row stride); -> the head's."""
    from eaglelab.engine.model.gemv import default_config
    from eaglelab.engine.model.gemv_kernels import launch

    y = x
    for _, w in ws:
        N, K = w.shape
        y = launch(y[:, :K], w, None, default_config(N, K, x.shape[0]), dependent, early)  # a view: no copy kernel
    return y


def check() -> int:
    """The chain's outputs without and with early weights (one tile, two), the same bits (small, so the interpreter
    runs it)."""
    ws = weights(torch.device("cpu"), torch.float16, 2, 256)
    for rows in (1, 4, 24):
        x = torch.randn(rows, 576, dtype=torch.float16)
        plain = chain(x, ws, False, 0)
        for early in (1, 2):
            same = torch.equal(chain(x, ws, False, early), plain)
            print(f"rows {rows}: {early} early weight tile(s) give the same bits: {same}")
            if not same:
                return 1
    return 0


def time_ways(rows: int, ws, replays: int) -> dict[str, float]:
    """Microseconds per graph replay of the chain, each way captured in its own graph, replays interleaved."""
    from eaglelab.engine.model.pdl import dependent_launches

    dev = ws[0][1].device
    x = torch.randn(rows, 576, device=dev, dtype=ws[0][1].dtype)
    graphs = {}
    for name, dependent, early in WAYS:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), dependent_launches(dependent):
            for _ in range(2):  # compiles each tiling (Triton JIT) outside the capture
                chain(x, ws, dependent, early)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = chain(x, ws, dependent, early)
        torch.cuda.current_stream().wait_stream(stream)
        graphs[name] = (graph, out)
    outs = [o for _, o in graphs.values()]
    for g, _ in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:]), "the ways disagree"
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(replays + 3):  # the first three: warm-up
        for name, (graph, _) in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000)
    return {name: statistics.median(t[3:]) for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,24")
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--json", default=None)
    p.add_argument("--check", action="store_true", help="the chain's maths only, no timing (any machine with Triton)")
    args = p.parse_args()
    if args.check:
        return check()
    if not torch.cuda.is_available():
        print("needs CUDA (--check runs the chain's maths without a GPU)", file=sys.stderr)
        return 2
    from eaglelab.engine.model.gemv import load_op
    from eaglelab.engine.model.pdl import refusal
    from eaglelab.engine.model.triton_ops import triton_version

    why = refusal("cuda")
    if why is not None:
        print(f"PDL unavailable here: {why}", file=sys.stderr)
        return 2
    load_op()
    ws = weights(torch.device("cuda"), torch.bfloat16, LAYERS, HEAD[2])
    launches = len(ws)
    hw = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton_version()}
    print(f"{hw['gpu']}, torch {hw['torch']}, Triton {hw['triton']}, bf16; a chain of {launches} GEMV launches "
          f"(SmolLM2's 30 layers and head) in one CUDA graph, median of {args.replays} replays, interleaved")
    print(f"{'rows':>4} {'plain us':>9} {'pdl us':>9} {'pdl+early us':>13} {'pdl+early2 us':>14} "
          f"{'saved/launch us':>16} {'pdl+early/plain':>16} {'pdl+early2/plain':>17}")
    rows_out = []
    for rows in (int(r) for r in args.rows.split(",")):
        t = time_ways(rows, ws, args.replays)
        saved = (t["plain"] - min(t["pdl_early"], t["pdl_early2"])) / launches
        print(f"{rows:>4} {t['plain']:>9.1f} {t['pdl']:>9.1f} {t['pdl_early']:>13.1f} {t['pdl_early2']:>14.1f} "
              f"{saved:>16.3f} {t['pdl_early'] / t['plain']:>16.3f} {t['pdl_early2'] / t['plain']:>17.3f}")
        rows_out.append({"rows": rows, "us": t, "launches": launches})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": hw, "replays": args.replays, "rows": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
