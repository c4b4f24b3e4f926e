"""Time the layer-streamed forward on a ``kimi-like`` checkpoint written to disk (random weights).

Writes an HF-format, sharded checkpoint of the kimi-like preset ("gpu" widths: Kimi-K2's hidden
size, 64 MLA heads, vocabulary; 32 routed experts of width 512), one shard per decoder layer, with
``--layers`` decoder layers (61 for the whole depth), evicts it from the page cache
(posix_fadvise DONTNEED, so layers are read from the disk, not from memory), then runs
``StreamedTarget.run`` over ``--texts`` x ``--tokens`` tokens and prints one JSON object: seconds
per layer (each: read + build + forward of one layer, the next one prefetched), GB per layer, peak
host RSS and peak GPU memory, against the bytes of the whole checkpoint.

    python benchmarks/streamed_kimi_like.py --out /tmp/kimi --layers 6 --device cuda --json-out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch


def write_checkpoint(out: Path, layers: int, device: str, width: str = "gpu", seed: int = 0) -> tuple[dict, int]:
    """Shards model-<i>.safetensors (one per decoder layer, plus one for embedding/norm/head) and the index."""
    from safetensors.torch import save_file

    from eaglelab.engine.model.weights import checkpoint_shapes
    from eaglelab.engine.model.config import ModelConfig
    from eaglelab.engine.model.moe import kimi_like_config

    cfg_dict = kimi_like_config(width, num_hidden_layers=layers)
    shapes = checkpoint_shapes(ModelConfig.from_dict(cfg_dict))
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[str]] = {}
    for name in shapes:
        key = name.split(".")[1] if name.startswith("layers.") else "rest"
        groups.setdefault(key, []).append(name)
    g = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for key, names in groups.items():
        fname = f"model-{key}.safetensors"
        tensors = {}
        for n in names:
            shape = shapes[n]
            if len(shape) >= 2:
                t = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16) * 0.02
            else:
                t = (torch.ones if "norm" in n else torch.zeros)(shape, device=device, dtype=torch.bfloat16)
            if n.endswith("gate.weight") or "e_score_correction_bias" in n:
                t = t.float()
            full = n if n.startswith("lm_head") else "model." + n
            tensors[full] = t.cpu().contiguous()
            weight_map[full] = fname
        save_file(tensors, str(out / fname))
        total += (out / fname).stat().st_size
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg_dict))
    return cfg_dict, total


def evict(out: Path) -> None:
    for f in out.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the checkpoint")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--texts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", default="gpu", choices=("gpu", "cpu"), help="kimi-like widths (cpu: a smoke test)")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args()
    from eaglelab.engine.formats.streamed import StreamedTarget

    t0 = time.perf_counter()
    cfg, total = write_checkpoint(Path(args.out), args.layers, args.device, args.width)
    write_s = time.perf_counter() - t0
    evict(Path(args.out))
    ids = torch.randint(0, cfg["vocab_size"], (args.texts, args.tokens), generator=torch.Generator().manual_seed(0))
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    st = StreamedTarget(args.out, device=args.device, dtype=torch.bfloat16)
    res = st.run(ids, progress=lambda i, n, s: print(f"layer {i}/{n}: {s:.2f} s", flush=True))
    run_s = time.perf_counter() - t1
    layer_bytes = [f.stat().st_size for f in Path(args.out).glob("model-[0-9]*.safetensors")]
    out = {
        "hardware": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "width": args.width, "device": args.device, "dtype": "bfloat16", "layers": args.layers, "texts": args.texts, "tokens": args.tokens,
        "checkpoint_gb": total / 1e9, "layer_gb_mean": sum(layer_bytes) / len(layer_bytes) / 1e9,
        "write_seconds": write_s, "run_seconds": run_s,
        "seconds_per_layer": res.seconds_per_layer,
        "seconds_per_layer_median": sorted(res.seconds_per_layer)[len(res.seconds_per_layer) // 2],
        "peak_param_gb_model": res.peak_bytes / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if args.device.startswith("cuda") else None,
        "states_gb": sum(h.numel() * h.element_size() for h in res.hidden_states) / 1e9,
        "kimi_k2_layer_gb_fp8": 16.4,  # 384 experts x 3 x 2048 x 7168 + attention, 1 byte each: for extrapolation
    }
    print(json.dumps(out, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
