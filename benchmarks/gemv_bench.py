"""The Triton GEMV (``engine/model/gemv.py``) against torch's ``F.linear`` on the Llama-3.1-8B (or SmolLM2-135M)
decode shapes.

    python benchmarks/gemv_bench.py --json OUT.json        # CUDA only; about a minute on an H200
    python benchmarks/gemv_bench.py --model smollm2-135m --rows 1,16,24,32,64   # a wide tree's verify
    python benchmarks/gemv_bench.py --model smollm2-135m --rows 4,24 --tilings '8,512,1,8,1;16,512,3,8,1'  # and these
    python benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,24 --shares   # K shares added by the reader

For each projection (Llama-3.1-8B, K -> N: qkv 4096 -> 6144, o 4096 -> 4096, gate_up 4096 -> 28672, down
14336 -> 4096, head 4096 -> 128256; SmolLM2-135M: 576 -> 960, 576 -> 576, 576 -> 3072, 1536 -> 576,
576 -> 49152) at M = 1, 4, 8, 16 rows (``--rows``), bf16: the max abs error of both against an fp32 reference,
then the time per call of F.linear, of the tiling our tuner chose, and of every candidate tiling. Times
are medians over replays of a CUDA graph of ``--calls`` calls, each call on the next of several weight
copies (together > 256 MB, more than the L2 cache: a decode streams 15 GB of distinct weights, so a
weight re-read from L2 would flatter small shapes). GB/s counts the bytes a call must move (weight, x, y);
% is of ``--tbps`` (4.8 TB/s, the H200's datasheet HBM3e figure). Each shape runs in its own try: an
error is printed and the next shape runs.

The end-to-end figure (the issue's: plain decoding at batch 1 as a share of the weight-bandwidth bound)
comes from ``eaglelab bench``; the command is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglelab.engine.model.triton_ops import time_in_turn as graph_ms  # ms per call, inputs in turn
from eaglelab.engine.model.triton_ops import triton_version

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
          "head": (4096, 128256)}  # name -> (K, N)
MODELS = {  # model -> (its projections' (K, N), decoder layers)
    "llama3.1-8b": (SHAPES, 32),
    "smollm2-135m": ({"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576),
                      "head": (576, 49152)}, 30),
}
E2E = ("python -m eaglelab bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1,8 "
       "--configs plain-graphs,plain-graphs-gemv,plain-compile,plain-compile-gemv --prompts 2 "
       "--max-new-tokens 64 --repeats 2 --no-micro --json OUT/gemv_e2e_llama8b.json")


def one_shape(name: str, K: int, N: int, rows: int, gemv, args) -> dict:
    """Errors and times of F.linear, the tuned GEMV and every candidate tiling at one (shape, M)."""
    from eaglelab.engine.model.gemv import candidates, describe, row_bucket, run_op, run_shares

    dev, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w_bytes = N * K * 2
    copies = max(1, -(-256 * 2**20 // w_bytes))
    ws = [(torch.randn(N, K, device=dev, generator=g) * K ** -0.5).to(dtype) for _ in range(copies)]  # [N, K]
    x = torch.randn(rows, K, device=dev, generator=g).to(dtype)  # [M, K]
    ref = F.linear(x.float(), ws[0].float())  # [M, N] fp32 reference
    torch_y = F.linear(x, ws[0])
    gemv_y = gemv(x, ws[0], None)  # tunes this (N, K, M bucket) once, on copy 0
    chosen = gemv.chosen.get((N, K, row_bucket(rows)))
    moved = w_bytes + (rows * K + rows * N) * 2
    out = {"name": name, "K": K, "N": N, "M": rows, "weight_copies": copies, "bytes_per_call": moved,
           "max_abs_err_gemv": (gemv_y.float() - ref).abs().max().item(),
           "max_abs_err_torch": (torch_y.float() - ref).abs().max().item(),
           "ref_max_abs": ref.abs().max().item(), "tuned": describe(chosen) if chosen else None,
           "gemv_reason": gemv.reason}
    timed = lambda fn: graph_ms(fn, copies, args.calls, args.replays)  # noqa: E731
    out["torch_ms"] = timed(lambda i: F.linear(x, ws[i]))
    if chosen is not None:  # the tuner's choice: a tiling, or F.linear where cuBLAS beat them all
        out["gemv_ms"] = timed(lambda i: gemv(x, ws[i], None))
    out["candidates"], out["extra"] = [], []
    for cfg, into in [*((c, "candidates") for c in candidates(rows)), *((c, "extra") for c in args.extra)]:
        try:
            split = args.shares and cfg.split_k > 1  # timed as a compiled reader runs it: the shares' kernel alone
            ms = timed((lambda i, c=cfg: torch.ops.eaglelab.gemv_shares(x, ws[i], *c)) if split
                       else (lambda i, c=cfg: run_op(x, ws[i], None, c)))
            y = (run_shares if split else run_op)(x, ws[0], None, cfg)
            err = (y.float() - ref).abs().max().item()
            out[into].append({"tiling": list(cfg), "ms": ms, "max_abs_err": err, "as": "shares" if split else "kernel"})
        except Exception as exc:  # noqa: BLE001 - one tiling's failure is a figure too
            out[into].append({"tiling": list(cfg), "error": f"{type(exc).__name__}: {exc}"[:200]})
    if args.shares:
        out["shares"] = shares_ab(x, ws, timed, args.shares)
    best = min((c for c in out["candidates"] if "ms" in c), key=lambda c: c["ms"], default=None)
    out["best_candidate"] = best
    out["best_extra"] = min((c for c in out["extra"] if "ms" in c), key=lambda c: c["ms"], default=None)
    for key in ("torch_ms", "gemv_ms"):
        if out.get(key):
            out[key.replace("_ms", "_gbps")] = moved / (out[key] * 1e6)
            out[key.replace("_ms", "_pct")] = 100 * moved / (out[key] * 1e-3) / (args.tbps * 1e12)
    if out.get("gemv_ms"):
        out["speedup_over_torch"] = out["torch_ms"] / out["gemv_ms"]
    return out


def shares_ab(x: torch.Tensor, ws: list[torch.Tensor], timed, gemvs) -> dict:
    """A split tiling's K shares added in the kernel (tickets) against added by the compiled code that reads them
    (``gemv.SHARES``), at one (shape, M): each way's own tuner picks the tiling (timing split tilings as that way
    runs them); then each pick timed alone, and inside a compiled reader ``r + x @ W^T`` (one compiled function per
    way, traced with ``SHARES`` set that way) -- what a compiled phase pays."""
    from eaglelab.engine.model import gemv as G
    from eaglelab.engine.model.gemv import describe, row_bucket

    tickets, shares = gemvs
    (M, K), N = x.shape, ws[0].shape[0]
    torch._dynamo.reset()  # each (shape, M) compiles its readers afresh (else the recompile limit ends them)
    r = torch.randn(M, N, device=x.device, dtype=x.dtype)
    out, was = {}, G.SHARES
    for name, gemv, on in (("tickets", tickets, False), ("shares", shares, True)):
        G.SHARES = on
        try:
            gemv(x, ws[0], None, sums_fused=True)  # tunes the shape the way ``on`` says
            cfg = gemv.chosen.get((N, K, row_bucket(M)))
            split = on and cfg is not None and cfg.split_k > 1  # LINEAR's split_k is 0
            kernel = ((lambda i: torch.ops.eaglelab.gemv_shares(x, ws[i], *cfg)) if split
                      else (lambda i: gemv(x, ws[i], None, sums_fused=True)))
            reader = torch.compile(lambda a, w, b, g=gemv: b + g(a, w, None, sums_fused=True), fullgraph=True,
                                   dynamic=False)
            out[name] = {"tiling": describe(cfg) if cfg else None, "kernel_ms": timed(kernel),
                         "reader_ms": timed(lambda i: reader(x, ws[i], r))}
        except Exception as exc:  # noqa: BLE001 - one way's failure is a figure too
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            G.SHARES = was
    return out


def line(r: dict) -> str:
    if "error" in r:
        return f"{r['name']:>8} M={r['M']:<2}  ERROR {r['error']}"
    g = (f"gemv {r['gemv_ms'] * 1e3:8.1f} us {r['gemv_gbps']:6.0f} GB/s {r['gemv_pct']:4.0f}%  x{r['speedup_over_torch']:.2f}"
         if r.get("gemv_ms") else f"gemv off: {r['gemv_reason']}")
    best = r.get("best_candidate")
    b = f"  best cand {best['ms'] * 1e3:.1f} us {tuple(best['tiling'])}" if best else ""
    extra = r.get("best_extra")
    b += f"  best extra {extra['ms'] * 1e3:.1f} us {tuple(extra['tiling'])}" if extra else ""
    text = (f"{r['name']:>8} {r['K']:>5}->{r['N']:<6} M={r['M']:<2}  torch {r['torch_ms'] * 1e3:8.1f} us "
            f"{r['torch_gbps']:6.0f} GB/s {r['torch_pct']:4.0f}%  {g}  tuned: {r['tuned']}{b}  "
            f"err gemv {r['max_abs_err_gemv']:.2e} torch {r['max_abs_err_torch']:.2e}")
    for way, got in r.get("shares", {}).items():
        text += (f"\n{'':>10}{way:>8}: error {got['error']}" if "error" in got else
                 f"\n{'':>10}{way:>8}: kernel {got['kernel_ms'] * 1e3:5.1f} us, in a compiled reader "
                 f"{got['reader_ms'] * 1e3:5.1f} us  ({got['tiling']})")
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure as JSON")
    p.add_argument("--rows", default="1,4,8,16", help="comma list of M")
    p.add_argument("--model", default="llama3.1-8b", choices=tuple(MODELS), help="whose projection shapes")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--calls", type=int, default=50, help="calls per CUDA graph")
    p.add_argument("--replays", type=int, default=5, help="timed replays (median)")
    p.add_argument("--tbps", type=float, default=4.8, help="HBM bandwidth for the %% column (H200: 4.8 TB/s)")
    p.add_argument("--tilings", default="", metavar="BN,BK,SPLIT,WARPS,STAGES;...",
                   help="more tilings to time at every shape and M beside the tuner's candidates (each one's time and "
                        "error in the JSON's 'extra'), e.g. '8,512,1,8,1;16,512,3,4,1'")
    p.add_argument("--shares", action="store_true",
                   help="also compare a split tiling's K shares added in the kernel against added by the compiled "
                        "code that reads the output (gemv.SHARES): each way's tuner pick, alone and inside a compiled "
                        "reader (JSON 'shares'); split candidates and --tilings are then timed as their shares' kernel")
    args = p.parse_args()
    from eaglelab.engine.model.gemv_tiling import parse_tilings

    try:
        args.extra = parse_tilings(args.tilings)
    except ValueError as exc:
        p.error(f"--tilings: {exc}")
    if not torch.cuda.is_available():
        print("gemv_bench: needs a CUDA device (the kernel is a CUDA kernel); nothing measured", file=sys.stderr)
        return 2
    from eaglelab.engine.model.gemv import TritonGemv

    t0 = time.perf_counter()
    gemv = TritonGemv(log=lambda m: print(m, flush=True))
    args.shares = (TritonGemv(), TritonGemv()) if args.shares else None  # tickets' tuner, shares' tuner
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton_version(), "dtype": "bfloat16", "tbps": args.tbps, "calls_per_graph": args.calls,
            "replays": args.replays, "gemv_reason": gemv.reason}
    print(json.dumps(info), flush=True)
    results = []
    shapes, layers = MODELS[args.model]
    info["model"] = args.model
    for name in args.shapes.split(","):
        K, N = shapes[name]
        for rows in (int(m) for m in args.rows.split(",")):
            try:
                r = one_shape(name, K, N, rows, gemv, args)
            except Exception as exc:  # noqa: BLE001 - one shape's failure must not lose the others
                traceback.print_exc()
                r = {"name": name, "K": K, "N": N, "M": rows, "error": f"{type(exc).__name__}: {exc}"[:300]}
            results.append(r)
            print(line(r), flush=True)
            torch.cuda.empty_cache()
            if args.json:  # after every point: a run cut short keeps what it measured
                _write(args.json, {"info": info, "results": results, "partial": True})
    summary = _summary(results, layers)
    for s in summary:
        print(s)
    print(f"done in {time.perf_counter() - t0:.0f} s (tuning {gemv.setup_seconds:.1f} s)")
    print(f"end to end (the issue's figure), run from the repo root:\n  {E2E}")
    if args.json:
        _write(args.json, {"info": info, "results": results, "summary": summary, "tune_seconds": gemv.setup_seconds,
                           "seconds": time.perf_counter() - t0, "e2e_command": E2E})
        print(f"wrote {args.json}")
    return 0


def _write(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))


def _summary(results: list[dict], layers: int = 32) -> list[str]:
    """Per M: ``layers`` decode layers' projections (qkv + o + gate_up + down) plus the head, time-weighted."""
    out = []
    for rows in sorted({r["M"] for r in results}):
        got = [r for r in results if r["M"] == rows and r.get("gemv_ms") and r.get("torch_ms")]
        if len(got) == len(SHAPES):
            layer = lambda key: sum(r[key] for r in got if r["name"] != "head")  # noqa: E731
            head = {r["name"]: r for r in got}["head"]
            t_torch, t_gemv = layers * layer("torch_ms") + head["torch_ms"], layers * layer("gemv_ms") + head["gemv_ms"]
            best = {r["name"]: (r["best_candidate"] or {}).get("ms") for r in got}
            t_best = (layers * sum(v for k, v in best.items() if k != "head") + best["head"]) if all(best.values()) else None
            tilings = f", our best tilings alone {t_best:.3f} ms" if t_best else ""
            out.append(f"M={rows}: {layers} layers + head, matmuls only: torch {t_torch:.3f} ms, gemv (tuner's picks) "
                       f"{t_gemv:.3f} ms = x{t_torch / t_gemv:.2f}{tilings}")
    return out


if __name__ == "__main__":
    sys.exit(main())
