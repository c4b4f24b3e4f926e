"""Registers, spills and shared memory of every GEMV tiling the tuner tries, compiled for Hopper (sm_90) without a GPU.

    python benchmarks/gemv_regs.py [--rows 1,4,24,64] [--arch 90]

Triton compiles ``gemv_kernel`` for the target named (no device needed: Triton ships ptxas and cuobjdump) and
cuobjdump reads each cubin's resource use. A tiling that spills (a STACK above 0) or holds ~255 registers a
thread runs few programs per SM; one that fails to compile is said. This is a static check for choosing
candidates before spending device time; the tuner's timings on the GPU decide (``gemv_bench.py``).
Needs Triton (``pip install triton``: it runs on a CPU-only machine).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as exc:
    raise SystemExit(f"gemv_regs.py needs Triton ({exc}): pip install triton (it runs without a GPU)") from None

from eaglelab.engine.model import gemv_kernels
from eaglelab.engine.model.gemv import candidates
from eaglelab.engine.model.gemv_tiling import padded_rows

SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
             "ticket_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32", "stride_xm": "i32",
             "stride_wn": "i32"}
# The arguments the JIT finds divisible by 16 in a real call (pointers from torch's allocator; N, K, strides and K's
# shares of every SmolLM2 and Llama shape), and specialises on: without that the compiler cannot prove loads
# aligned, and neither pipelines a loop's loads (cp.async) nor vectorises them, so the cubin would not be the GPU's.
ALIGNED = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "part_ptr", "ticket_ptr", "N", "K", "k_per_split", "stride_xm",
           "stride_wn")


def resources(rows: int, cfg, arch: int, scratch: str) -> tuple[int, int, int]:
    """(registers a thread, stack bytes a thread, shared bytes) of ``cfg``'s kernel at ``rows`` rows."""
    const = {"HAS_BIAS": False, "SPLITS": cfg.split_k, "BLOCK_M": padded_rows(rows, cfg.block_n),
             "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "STAGES": cfg.num_stages}
    sig = SIGNATURE | {k: "constexpr" for k in const}
    names = list(sig)
    aligned = {(names.index(k),): [["tt.divisibility", 16]] for k in ALIGNED}  # as the JIT specialises them
    src = ASTSource(fn=gemv_kernels.gemv_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in const.items()}, attrs=aligned)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    cubin = os.path.join(scratch, "gemv.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    tools = os.path.dirname(triton.knobs.nvidia.ptxas.path)
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", cubin],
                           capture_output=True, text=True, check=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return int(regs.group(1)), int(stack.group(1)) if stack else 0, kernel.metadata.shared


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,24,64", help="comma list of M")
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    args = p.parse_args()
    print(f"Triton {triton.__version__}, sm_{args.arch}; per tiling (block_n, block_k, split_k, warps, stages)")
    print(f"{'rows':>4}  {'tiling':<24} {'path':<10} {'regs':>5} {'stack':>6} {'shared':>7}")
    with tempfile.TemporaryDirectory() as scratch:
        for rows in (int(r) for r in args.rows.split(",")):
            for cfg in candidates(rows):
                path = "one row" if rows == 1 else "dot" if cfg.block_n >= 16 else "CUDA cores"
                try:
                    regs, stack, shared = resources(rows, cfg, args.arch, scratch)
                    print(f"{rows:>4}  {str(tuple(cfg)):<24} {path:<10} {regs:>5} {stack:>6} {shared:>7}")
                except Exception as exc:  # noqa: BLE001 - a tiling that does not compile is said, the rest go on
                    print(f"{rows:>4}  {str(tuple(cfg)):<24} {path:<10} failed: {type(exc).__name__}: {exc}"[:160])


if __name__ == "__main__":
    main()
