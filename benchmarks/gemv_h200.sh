#!/usr/bin/env bash
# The Triton GEMV on the GPU machine, run from the repo root, in two bounded parts (each < 10 minutes):
#
#   OUT=/some/dir timeout 290 bash benchmarks/gemv_h200.sh kernel   # ~2-3 min
#   OUT=/some/dir timeout 590 bash benchmarks/gemv_h200.sh e2e      # ~5-8 min
#
# kernel: benchmarks/gemv_bench.py (the Llama-3.1-8B projection shapes at M = 1, 4, 8, 16: error vs an fp32
#         reference, time of F.linear vs our tuned GEMV vs every tiling, GB/s, % of 4.8 TB/s), then the GPU
#         tests of the kernel (tests/engine/model/test_gemv.py -m gpu: eager, compiled, captured).
# e2e:    eaglelab bench on the llama3.1-8b scale model (random weights, bf16), batch 1 and 8, plain decoding
#         with CUDA graphs, with and without whole-phase torch.compile, each with and without the GEMV, in one
#         run (the same prompts, the same process): the figure is plain-compile-gemv at batch 1 as a
#         share of the weight-bandwidth bound (15.0 GB per token at 4.3 TB/s = 286.5 tok/s): the headline
#         prints it for every plain config, end to end and per decode step.
# Files go to $OUT/gemv_*.json and $OUT/gemv_*.txt.
set -u
OUT=${OUT:-/tmp/gemv_h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-$PWD/runs/elcache} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 \
  | tee "$OUT/gemv_gpu.txt"

case "${1:-kernel}" in
kernel)
  timeout 150 python3 benchmarks/gemv_bench.py --json "$OUT/gemv_kernel.json" 2>&1 | tee "$OUT/gemv_kernel.txt"
  timeout 120 python3 -m pytest -q tests/engine/model/test_gemv.py -m gpu -p no:cacheprovider 2>&1 \
    | tail -30 | tee "$OUT/gemv_gpu_test.txt"
  ;;
e2e)
  timeout 560 python3 -m eaglelab bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 \
    --batch-sizes 1,8 --configs plain-graphs,plain-graphs-gemv,plain-compile,plain-compile-gemv \
    --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro --json "$OUT/gemv_e2e_llama8b.json" 2>&1 \
    | tee "$OUT/gemv_e2e_llama8b.txt" | grep -v "^\s*$" | tail -60
  ;;
*)
  echo "usage: gemv_h200.sh kernel|e2e" >&2; exit 2
  ;;
esac
