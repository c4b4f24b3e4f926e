"""One EAGLE-3 draft step on CUDA, fused (``engine/model/draft_step.py``) against the reference the compiler makes of
``Eagle3Network.forward`` + ``tree.expand_step``, each captured in a CUDA graph and replayed; and each fused op on its
own. SmolLM2's drafter shape (H 576, 9/3 heads of 64, MLP 1,536, a 12,288-token draft vocabulary), random weights,
bf16, one batch row, topk 4, 300 committed slots; the attention SDPA on both sides (the step's matmuls and the work
around them are what differ).

    python benchmarks/draft_step_bench.py [--replays 600] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


BACK_TO_BACK = 20  # replays between two events


def replayed_us(fn, replays: int) -> float:
    """Microseconds a replay of ``fn`` captured in a CUDA graph (warmed up first): the median over groups of
    :data:`BACK_TO_BACK` replays launched back to back, each group's time over its replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(max(1, replays // BACK_TO_BACK)):  # back to back: the host's launch of one replay hidden
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BACK_TO_BACK):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / BACK_TO_BACK)
    return statistics.median(times)


def sweep(module, ops: dict, replays: int) -> dict[str, float]:
    """Each op timed under other tilings (the module's block sizes and loads ahead patched in turn; the ops read them
    per call); -> "sweep OP SETTING": us, the fastest of each op printed."""
    base = {"BLOCK_K": module.BLOCK_K, "STAGES": module.STAGES, "PAIRS": module.PAIRS, "BLOCK_V": module.BLOCK_V,
            "BLOCK_N": dict(module.BLOCK_N)}
    found = {}
    for op, fn in ops.items():
        widths = [16, 32, 64] if op != "head" else [32, 64, 128]
        best = None
        for bk in (64, 128, 256, 512, 1024):
            for stages in (1, 2, 3):
                for bn in widths:
                    module.BLOCK_K, module.STAGES = bk, stages
                    module.BLOCK_N = {**base["BLOCK_N"], op: bn}
                    module.PAIRS = module.BLOCK_V = bn if op == "qkv" else base["PAIRS"]
                    try:
                        us = replayed_us(fn, replays // 3)
                    except Exception as exc:  # noqa: BLE001 - a tiling that does not compile (shared memory)
                        print(f"  {op} block_k {bk} stages {stages} n {bn}: {type(exc).__name__}")
                        continue
                    found[f"sweep {op} block_k {bk} stages {stages} n {bn}"] = us
                    if best is None or us < best[0]:
                        best = (us, bk, stages, bn)
        print(f"  fastest {op}: {best[0]:.1f} us at block_k {best[1]}, stages {best[2]}, n {best[3]}")
        module.BLOCK_K, module.STAGES, module.PAIRS, module.BLOCK_V = (base[k] for k in ("BLOCK_K", "STAGES", "PAIRS",
                                                                                         "BLOCK_V"))
        module.BLOCK_N = dict(base["BLOCK_N"])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=600)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time each op under other tilings (block sizes, "
                    "loads ahead) and print the fastest")
    args = ap.parse_args()

    from eaglelab.engine.core.kv_cache import KVCache
    from eaglelab.engine.model import draft_step
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime import cycle_ops
    from eaglelab.engine.runtime.tree import expand_step

    assert draft_step.load() and cycle_ops.load(), (draft_step.reason, cycle_ops.reason)
    dev, B, K, F, S = torch.device("cuda"), 1, 4, 4, 512
    model = build_scale_model("smollm2-135m", seed=0).model
    net, _ = random_eagle3(model, seed=1, draft_vocab=12288)
    net = net.to(dev, torch.bfloat16)
    net.embed.to(dev, torch.bfloat16)
    draft_step.prepare(net)
    gen = torch.Generator(device=dev).manual_seed(0)
    H = net.config.hidden_size
    lengths = torch.tensor([300], device=dev)
    tokens = torch.randint(0, net.config.vocab_size, (B, K), device=dev, generator=gen)
    parent = torch.randint(0, F, (B, K), device=dev, generator=gen)
    hidden = torch.randn(B, F, H, device=dev, generator=gen, dtype=torch.bfloat16)
    positions, slots = (lengths + 2)[:, None].expand(B, K), lengths[:, None] + 8 + torch.arange(K, device=dev)
    mask = (torch.arange(S, device=dev)[None, None, :] < lengths[:, None, None]).expand(B, K, S).clone()
    mask[0, torch.arange(K), slots[0]] = True
    scores = -torch.rand(B, K, device=dev, generator=gen)
    cache = KVCache(1, B, net.config.num_kv_heads, S, net.config.head_dim, dtype=torch.bfloat16, device=dev)
    none = type("NoKernels", (), {"attention": None})()

    def fused():
        nxt, blocks = draft_step.forward(net, tokens, hidden, parent, positions, cache, slots, mask, none)
        return nxt, cycle_ops.tree_select(scores, blocks, K)

    def reference(tokens, hidden, parent, positions, slots, mask, scores):
        feats = hidden.gather(1, parent[..., None].expand(-1, -1, H))
        out, logits = net(tokens, feats, positions, cache, slots, mask)
        exp = expand_step(scores, logits, K)
        return out, exp.tokens, exp.scores, exp.selected

    compiled = torch.compile(reference, fullgraph=True)
    with torch.no_grad():
        results = {"fused step": replayed_us(fused, args.replays),
                   "reference step (compiled)": replayed_us(
                       lambda: compiled(tokens, hidden, parent, positions, slots, mask, scores), args.replays)}
        # each fused op on its own, fed as the step feeds it
        R, NH, D, I = B * K, net.config.num_heads, net.config.head_dim, net.config.intermediate_size
        layer, attn, mlp = net.midlayer, net.midlayer.self_attn, net.midlayer.mlp
        flat = [t.reshape(R).contiguous() for t in (tokens, positions, slots)]
        par = parent.reshape(R).contiguous()
        ops = torch.ops.eaglelab
        qkv = lambda: ops.draft_qkv(flat[0], net.embed.weight, hidden, par, layer.input_layernorm.weight,  # noqa: E731
                                    layer.hidden_norm.weight, attn.qkv.fused_weight(), flat[1], net.rotary.inv_freq,
                                    flat[2], cache.k, cache.v, NH, 1e-5, 1.0)
        out = torch.randn(B, NH, K, D, device=dev, dtype=torch.bfloat16)
        h = torch.randn(R, H, device=dev, dtype=torch.bfloat16)
        a = torch.randn(R, I, device=dev, dtype=torch.bfloat16)
        results["op qkv + rotary + cache"] = replayed_us(qkv, args.replays)
        results["op o + residual"] = replayed_us(lambda: ops.draft_rows(
            out, None, None, attn.o_proj.weight, hidden, par, K, D, [out.stride(0), out.stride(2), out.stride(1)],
            [hidden.stride(0), hidden.stride(1)], 0.0, "residual", draft_step.BLOCK_N["o"]), args.replays)
        results["op norm + gate/up + swiglu"] = replayed_us(lambda: ops.draft_rows(
            h, None, layer.post_attention_layernorm.weight, mlp.gate_up.fused_weight(), None, None, K, H,
            [K * H, H, 0], [0, 0], 1e-5, "swiglu", draft_step.BLOCK_N["gate_up"]), args.replays)
        results["op down + residual"] = replayed_us(lambda: ops.draft_rows(
            a, None, None, mlp.down_proj.weight, h, None, K, I, [K * I, I, 0], [K * H, H], 0.0, "residual",
            draft_step.BLOCK_N["down"]), args.replays)
        results["op norm + head + block ranks"] = replayed_us(lambda: ops.draft_head(
            h, net.norm.weight, net.lm_head.weight, K, 1e-5, draft_step.BLOCK_N["head"]), args.replays)
        blocks = ops.draft_head(h, net.norm.weight, net.lm_head.weight, K, 1e-5, draft_step.BLOCK_N["head"])
        results["op tree_select"] = replayed_us(lambda: cycle_ops.tree_select(scores, blocks, K), args.replays)
        logits = torch.randn(B, K, 12288, device=dev)
        results["(reference) tree_expand on logits"] = replayed_us(lambda: cycle_ops.tree_expand(scores, logits, K),
                                                                 args.replays)
        results["(reference) head F.linear"] = replayed_us(lambda: torch.nn.functional.linear(h, net.lm_head.weight),
                                                           args.replays)
        if args.sweep:
            results.update(sweep(draft_step, {
                "qkv": qkv,
                "o": lambda: ops.draft_rows(out, None, None, attn.o_proj.weight, hidden, par, K, D,
                                            [out.stride(0), out.stride(2), out.stride(1)],
                                            [hidden.stride(0), hidden.stride(1)], 0.0, "residual",
                                            draft_step.BLOCK_N["o"]),
                "gate_up": lambda: ops.draft_rows(h, None, layer.post_attention_layernorm.weight,
                                                  mlp.gate_up.fused_weight(), None, None, K, H, [K * H, H, 0], [0, 0],
                                                  1e-5, "swiglu", draft_step.BLOCK_N["gate_up"]),
                "down": lambda: ops.draft_rows(a, None, None, mlp.down_proj.weight, h, None, K, I, [K * I, I, 0],
                                               [K * H, H], 0.0, "residual", draft_step.BLOCK_N["down"]),
                "head": lambda: ops.draft_head(h, net.norm.weight, net.lm_head.weight, K, 1e-5,
                                               draft_step.BLOCK_N["head"]),
            }, args.replays))
    gpu = torch.cuda.get_device_name()
    print(f"draft step, SmolLM2's drafter shape, bf16, {R} rows, {gpu}, torch {torch.__version__}; CUDA graphs replayed "
          f"{BACK_TO_BACK} at a time, the median of {args.replays // BACK_TO_BACK} such groups")
    for name, us in results.items():
        print(f"  {us:8.1f} us  {name}")
    ratio = results["reference step (compiled)"] / results["fused step"]
    print(f"  fused step {ratio:.2f}x faster than the compiled reference (same run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "rows": R, "us": results}, f, indent=1)


if __name__ == "__main__":
    main()
