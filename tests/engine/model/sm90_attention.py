"""Compile the decode attention's kernels for an H100/H200 (sm_90) without a GPU, as the planner cuts them,
and read what each needs: shared memory (Triton's metadata) and ptxas's register report
(``test_decode_attention.py`` runs this module in a subprocess; it needs Triton, whose wheel carries ptxas). Prints
one line per cut: ``<shape> B=<b> T=<t> S=<s> <plan> shared=<bytes> spills=<bytes>``; a decode's and a verify of
24's split cuts over 2,048 slots at batch 1 again with the splits merged in the same launch (``merged <shape> ...``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from eaglelab.engine.model import decode_attention as A
from eaglelab.engine.model import decode_attention_kernels as K

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "mask_ptr": "*u8", "out_ptr": "*bf16",
            "acc_ptr": "*fp32", "ml_ptr": "*fp32", "ticket_ptr": "*i32"}


SHAPES = {"llama3.1-8b": (32, 8, 128), "smollm2-135m": (9, 3, 64), "head-dim-256": (16, 4, 256)}  # NH, KVH, D


def compile_kernel(fn, constants: dict, num_warps: int):
    """``fn`` compiled for sm_90 with these constexprs (every other int argument an i32)."""
    names = fn.arg_names
    constants = {"PDL": False} | constants  # launched dependently or not: test_pdl.py compiles both
    signature = {n: "constexpr" if n in constants else POINTERS.get(n, "fp32" if n == "qk_scale" else "i32")
                 for n in names}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": 1})


def spills(ptx: str) -> int:
    """Bytes ptxas spills for this PTX (its -v report)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True)
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stderr))


def main() -> None:
    assert A.ROW_BLOCK == K.MAX_BLOCK_M, (A.ROW_BLOCK, K.MAX_BLOCK_M)  # the planner counts the kernel's row programs
    for shape, (NH, KVH, D) in SHAPES.items():
        for B in (1, 8):
            for T in (1, 16, 24, 64):  # a decode, a verify of 16, of 24 and of 64 tree nodes
                for S in (128, 2048):
                    rows = NH // KVH * T
                    p = A.plan(B, KVH, S, 132, rows=rows, head_dim=D)
                    rounds = -(-(-(-S // p.block_s)) // p.splits)
                    block_m = min(max(16, triton.next_power_of_2(rows)), K.MAX_BLOCK_M)
                    cut = {"BLOCK_M": block_m, "BLOCK_S": p.block_s, "HEAD_D": D, "SPLITS": p.splits,
                           "ROUNDS": rounds, "PARTIAL": p.splits > 1, "ROW_BLOCKS": -(-rows // block_m)}
                    kernel = compile_kernel(K.attention_kernel, cut, p.num_warps)
                    print(f"{shape} B={B} T={T} S={S} {tuple(p)} shared={kernel.metadata.shared} "
                          f"spills={spills(kernel.asm['ptx'])}", flush=True)
                    if p.splits > 1 and B == 1 and T in (1, 24) and S == 2048:  # merged in the launch (ONE_LAUNCH_ROWS)
                        kernel = compile_kernel(K.attention_kernel, cut | {"MERGE": True}, p.num_warps)
                        print(f"merged {shape} B={B} T={T} S={S} {tuple(p)} shared={kernel.metadata.shared} "
                              f"spills={spills(kernel.asm['ptx'])}", flush=True)
    kernel = compile_kernel(K.attention_combine_kernel, {"BLOCK_SPLITS": 16, "HEAD_D": 128}, 1)
    print(f"combine shared={kernel.metadata.shared} spills={spills(kernel.asm['ptx'])}")


if __name__ == "__main__":
    main()
