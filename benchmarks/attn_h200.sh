#!/usr/bin/env bash
# The Triton decode attention on the GPU machine, run from the repo root, in bounded parts (each < 10 minutes;
# the first two matter most):
#
#   OUT=/some/dir timeout 290 bash benchmarks/attn_h200.sh kernel   # ~2-4 min
#   OUT=/some/dir timeout 590 bash benchmarks/attn_h200.sh e2e      # ~3-6 min (two whole-phase compiles, cold)
#   OUT=/some/dir timeout 590 bash benchmarks/attn_h200.sh spec     # ~4-8 min
#   OUT=/some/dir timeout 590 bash benchmarks/attn_h200.sh smol     # ~4-8 min
#
# kernel: benchmarks/attn_bench.py (8B and SmolLM2 attention shapes, batch 1 and 8, T 1 and 4, 128 and 2048 static
#         slots with 100 or 1000 in use: error vs an fp32 reference, time of SDPA with the bool mask (the engine's
#         path) vs our kernel by CUDA-graph replay, ratio), then --sweep on the 8B decode at batch 1 (every plan:
#         checks the planner's choice), then the GPU test of the kernel (eager, compiled, captured).
# e2e:    eaglelab bench on the llama3.1-8b scale model (random weights, bf16), plain decoding at batch 1:
#         plain-compile-gemv against plain-compile-gemv-attn in one run. The figure: batch 1 as a share
#         of the 286.5 tok/s weight-bandwidth bound, end to end and per decode step (the headline prints both).
# spec:   the speculative pair on the same model at batch 1 (a random drafter: cost only, acceptance means
#         nothing), then plain at batch 8.
# smol:   the SmolLM2 scale model, plain and speculative, batch 1 and 8.
# Files go to $OUT/attn_*.json and $OUT/attn_*.txt.
set -u
OUT=${OUT:-/tmp/attn_h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-$PWD/runs/elcache} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 \
  | tee "$OUT/attn_gpu.txt"
BENCH="python3 -m eaglelab bench --dtype bfloat16 --seed 0 --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro"

case "${1:-kernel}" in
kernel)
  timeout 100 python3 benchmarks/attn_bench.py --json "$OUT/attn_kernel.json" 2>&1 | tee "$OUT/attn_kernel.txt"
  timeout 110 python3 benchmarks/attn_bench.py --shapes llama3.1-8b --batch 1 --rows 1 --sweep \
    --json "$OUT/attn_sweep.json" 2>&1 | tee "$OUT/attn_sweep.txt" | tail -8
  timeout 70 python3 -m pytest -q tests/engine/model/test_decode_attention.py -m gpu -p no:cacheprovider 2>&1 \
    | tail -30 | tee "$OUT/attn_gpu_test.txt"
  ;;
e2e)
  timeout 570 $BENCH --scale-model llama3.1-8b --draft none --batch-sizes 1 \
    --configs plain-compile-gemv,plain-compile-gemv-attn --json "$OUT/attn_e2e_llama8b.json" 2>&1 \
    | tee "$OUT/attn_e2e_llama8b.txt" | grep -v "^\s*$" | tail -40
  ;;
spec)
  timeout 300 $BENCH --scale-model llama3.1-8b --batch-sizes 1 --configs spec-compile-gemv,spec-compile-gemv-attn \
    --json "$OUT/attn_e2e_llama8b_spec.json" 2>&1 | tee "$OUT/attn_e2e_llama8b_spec.txt" | grep -v "^\s*$" | tail -25
  timeout 270 $BENCH --scale-model llama3.1-8b --draft none --batch-sizes 8 \
    --configs plain-compile-gemv,plain-compile-gemv-attn --json "$OUT/attn_e2e_llama8b_bs8.json" 2>&1 \
    | tee "$OUT/attn_e2e_llama8b_bs8.txt" | grep -v "^\s*$" | tail -25
  ;;
smol)
  timeout 570 $BENCH --scale-model smollm2-135m --batch-sizes 1,8 \
    --configs plain-compile-gemv,plain-compile-gemv-attn,spec-compile-gemv,spec-compile-gemv-attn \
    --json "$OUT/attn_e2e_smollm2.json" 2>&1 | tee "$OUT/attn_e2e_smollm2.txt" | grep -v "^\s*$" | tail -30
  ;;
*)
  echo "usage: attn_h200.sh kernel|e2e|spec|smol" >&2; exit 2
  ;;
esac
