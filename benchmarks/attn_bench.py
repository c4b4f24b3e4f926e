"""The Triton decode attention (``engine/model/decode_attention.py``) against the engine's current path (SDPA with
the bool mask, ``layers.attend``) on decode and verify shapes.

    python benchmarks/attn_bench.py --json OUT.json        # CUDA only; well under a minute on an H200

Shapes: Llama-3.1-8B (32 query heads over 8 KV heads, D 128) and SmolLM2-135M (9 over 3, D 64), batch 1 and 8,
T = 1 (a decode) and 4 (a verify of 4 tokens: a chain's prefix mask), a static cache of 128 or 2048 slots with
100 or 1000 of them in use (1000 only when it fits). Per case: the max abs error of both against an fp32
reference (SDPA in float32 on the same inputs), then the time per call of each, the median over replays of a
CUDA graph of ``--calls`` calls (call i reads layer i % L of a cache of L layers, together > 256 MB, so K and V
come from memory as in a decode, not from the L2 cache), and the ratio. ``--sweep`` also times other plans
(slots per block x splits, the planned warps) and names the fastest, to check the planner's choice. Each
case runs in its own try: an error is printed and the next case runs.

The end-to-end figures (the issue's: plain decoding at batch 1 as a share of the weight-bandwidth bound; the
speculative cycle) come from ``eaglelab bench``; the commands are printed at the end (``h200_speed.sh`` stage C runs the
8B shape's in a bounded device call).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from eaglelab.engine.model.triton_ops import time_in_turn as graph_ms  # ms per call, inputs in turn
from eaglelab.engine.model.triton_ops import triton_version

SHAPES = {"llama3.1-8b": (32, 8, 128), "smollm2-135m": (9, 3, 64)}  # name -> (query heads, KV heads, head dim)
E2E = (
    "python -m eaglelab bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1 "
    "--configs plain-compile-gemv,plain-compile-gemv-attn --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro "
    "--json OUT/attn_e2e_llama8b.json",
    "python -m eaglelab bench --scale-model llama3.1-8b --dtype bfloat16 --seed 0 --batch-sizes 1 "
    "--configs spec-compile-gemv,spec-compile-gemv-attn --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro "
    "--json OUT/attn_e2e_llama8b_spec.json",
    "python -m eaglelab bench --scale-model smollm2-135m --dtype bfloat16 --seed 0 --batch-sizes 1,8 "
    "--configs plain-compile-gemv,plain-compile-gemv-attn,spec-compile-gemv,spec-compile-gemv-attn --prompts 2 "
    "--max-new-tokens 64 --repeats 2 --no-micro --json OUT/attn_e2e_smollm2.json",
)
SWEEP = [(b, s) for b, s in itertools.product((16, 32, 64, 128), (1, 2, 4, 8, 16, 32))]  # (block_s, splits)


def inputs(shape: str, B: int, T: int, S: int, used: int, g: torch.Generator, dtype: torch.dtype = torch.bfloat16,
           min_bytes: int = 256 * 2**20, max_layers: int = 100):
    """q [B, NH, T, D] (strided as the model makes it), the cache's per-layer K/V views [B, KVH, S, D] of
    [L, B, KVH, S, D] buffers (L layers: >= ``min_bytes`` together, at most ``max_layers``, one per call of a
    graph: the smallest caches, 0.5 MB a layer at B 1 and S 128, then fit in the L2 cache together), and the
    prefix mask [B, T, S] of T new tokens at slots used - T .. used - 1 (the engine's decode / chain-verify mask)."""
    NH, KVH, D = SHAPES[shape]
    dev = g.device
    per_layer = 2 * B * KVH * S * D * 2
    L = max(1, min(max_layers, -(-min_bytes // per_layer)))
    q = torch.randn(B, T, NH, D, device=dev, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(L, B, KVH, S, D, device=dev, generator=g).to(dtype)
    v = torch.randn(L, B, KVH, S, D, device=dev, generator=g).to(dtype)
    cols = torch.arange(S, device=dev)
    slots = used - T + torch.arange(T, device=dev)
    mask = (cols[None, None, :] <= slots[None, :, None]).expand(B, T, S).contiguous()
    return q, k.unbind(0), v.unbind(0), mask


@torch.no_grad()
def one_case(shape: str, B: int, T: int, S: int, used: int, attention, args, device: str = "cuda",
             dtype: torch.dtype = torch.bfloat16) -> dict:
    """Errors and times of SDPA (the engine's path) and the kernel at one (shape, B, T, S, used)."""
    from eaglelab.engine.model import decode_attention as A
    from eaglelab.engine.model.layers import attend

    g = torch.Generator(device=device).manual_seed(0)
    q, ks, vs, mask = inputs(shape, B, T, S, used, g, dtype, min_bytes=args.min_bytes, max_layers=args.calls)
    L = len(ks)
    ref = A.sdpa(q.float(), ks[0].float(), vs[0].float(), mask)  # fp32 reference
    plan = attention.plan(q, ks[0])
    out = {"shape": shape, "B": B, "T": T, "S": S, "used": used, "layers": L, "plan": list(plan),
           "refusal": attention.refusal(q, ks[0], mask), "ref_max_abs": ref.abs().max().item(),
           "max_abs_err_sdpa": (attend(q, ks[0], vs[0], mask).float() - ref).abs().max().item()}
    ours = attention(q, ks[0], vs[0], mask)  # the first eager call checks the shape against SDPA
    out["max_abs_err_ours"] = (ours.float() - ref).abs().max().item()
    out["kernel_reason"] = attention.reason
    timed = lambda fn: graph_ms(fn, L, args.calls, args.replays)  # noqa: E731
    out["sdpa_us"] = 1e3 * timed(lambda i: attend(q, ks[i], vs[i], mask))
    if attention.reason is None and out["refusal"] is None:
        out["ours_us"] = 1e3 * timed(lambda i: torch.ops.eaglelab.decode_attention(q, ks[i], vs[i], mask, *plan))
        out["speedup_over_sdpa"] = out["sdpa_us"] / out["ours_us"]
    if args.sweep and out.get("ours_us"):
        out["sweep"] = []
        for block_s, splits in SWEEP:
            if splits > -(-S // block_s):
                continue
            p = A.AttnPlan(block_s, splits, plan.num_warps)
            try:
                err = (torch.ops.eaglelab.decode_attention(q, ks[0], vs[0], mask, *p).float() - ref).abs().max().item()
                us = 1e3 * timed(lambda i, p=p: torch.ops.eaglelab.decode_attention(q, ks[i], vs[i], mask, *p))
                out["sweep"].append({"plan": list(p), "us": us, "max_abs_err": err})
            except Exception as exc:  # noqa: BLE001 - one plan's failure is a figure too
                out["sweep"].append({"plan": list(p), "error": f"{type(exc).__name__}: {exc}"[:200]})
        out["best_plan"] = min((s for s in out["sweep"] if "us" in s), key=lambda s: s["us"], default=None)
    return out


def line(r: dict) -> str:
    head = f"{r['shape']:>13} B={r['B']:<2} T={r['T']:<2} S={r['S']:<5} used={r['used']:<5}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    ours = (f"ours {r['ours_us']:7.1f} us  x{r['speedup_over_sdpa']:.2f}  plan {tuple(r['plan'])}" if r.get("ours_us")
            else f"ours off: {r['kernel_reason'] or r['refusal']}")
    best = r.get("best_plan")
    b = f"  best plan {tuple(best['plan'])} {best['us']:.1f} us" if best else ""
    return (f"{head} sdpa {r['sdpa_us']:7.1f} us  {ours}{b}  err ours {r['max_abs_err_ours']:.2e} "
            f"sdpa {r['max_abs_err_sdpa']:.2e} (|ref| {r['ref_max_abs']:.2f})")


def cases(args):
    for shape in args.shapes.split(","):
        for B, T, S, used in itertools.product(_ints(args.batch), _ints(args.rows), _ints(args.slots), _ints(args.used)):
            if used <= S:
                yield shape, B, T, S, used


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure as JSON")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    p.add_argument("--rows", default="1,4", help="comma list of query rows T")
    p.add_argument("--slots", default="128,2048", help="comma list of static cache slots S")
    p.add_argument("--used", default="100,1000", help="comma list of slots in use (those <= S run)")
    p.add_argument("--calls", type=int, default=100, help="calls per CUDA graph")
    p.add_argument("--replays", type=int, default=5, help="timed replays (median)")
    p.add_argument("--min-bytes", type=int, default=256 * 2**20, help="cache layers cycled through: at least this many bytes")
    p.add_argument("--sweep", action="store_true", help="also time every plan (block of 16/32/64/128 slots x 1..32 splits)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("attn_bench: needs a CUDA device (the kernel is a CUDA kernel); nothing measured", file=sys.stderr)
        return 2
    from eaglelab.engine.model.decode_attention import TritonDecodeAttention

    t0 = time.perf_counter()
    attention = TritonDecodeAttention(log=lambda m: print(m, flush=True))
    info = {"gpu": torch.cuda.get_device_name(), "sms": attention.sms, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version(), "dtype": "bfloat16", "calls_per_graph": args.calls,
            "replays": args.replays, "kernel_reason": attention.reason}
    print(json.dumps(info), flush=True)
    results = []
    with torch.no_grad():
        for shape, B, T, S, used in cases(args):
            try:
                r = one_case(shape, B, T, S, used, attention, args)
            except Exception as exc:  # noqa: BLE001 - one case's failure must not lose the others
                traceback.print_exc()
                r = {"shape": shape, "B": B, "T": T, "S": S, "used": used, "error": f"{type(exc).__name__}: {exc}"[:300]}
            results.append(r)
            print(line(r), flush=True)
            torch.cuda.empty_cache()
            if args.json:  # after every case: a run cut short keeps what it measured
                _write(args.json, {"info": info, "results": results, "partial": True})
    summary = _summary(results)
    for s in summary:
        print(s)
    print(f"done in {time.perf_counter() - t0:.0f} s")
    print("end to end (the issue's figures), run from the repo root:\n  " + "\n  ".join(E2E))
    if args.json:
        _write(args.json, {"info": info, "results": results, "summary": summary, "seconds": time.perf_counter() - t0,
                           "e2e_commands": list(E2E)})
        print(f"wrote {args.json}")
    return 0


def _summary(results: list[dict]) -> list[str]:
    """Per (shape, B, T, S, used) with both timed: what 32 (8B) or 30 (SmolLM2) layers of it save per step."""
    layers = {"llama3.1-8b": 32, "smollm2-135m": 30}
    out = []
    for r in results:
        if r.get("ours_us") and r.get("sdpa_us"):
            n = layers[r["shape"]]
            out.append(f"{r['shape']} B={r['B']} T={r['T']} S={r['S']} used={r['used']}: {n} layers: SDPA "
                       f"{n * r['sdpa_us']:.0f} us, ours {n * r['ours_us']:.0f} us per step "
                       f"(saves {n * (r['sdpa_us'] - r['ours_us']):.0f} us, x{r['speedup_over_sdpa']:.2f})")
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _write(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
