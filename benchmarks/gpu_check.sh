#!/usr/bin/env bash
# GPU smoke check of the phase graphs and compiled layers, run from the repo root on the GPU machine:
#
#   PYTHONPATH=$PWD OUT=/some/dir bash benchmarks/gpu_check.sh
#
# 1. the GPU tests (`pytest -m gpu`): real CUDA graphs give the eager tokens, capture is sync-free;
# 2. a short bench on random-weight models of the SmolLM2-135M and Llama-3.1-8B shapes (no GGUF needed):
#    plain eager / plain graphs / plain graphs + torch.compile / speculative (phase graphs, +compile),
#    batch 1, float32 for the same-tokens check on the small shape, bfloat16 on the 8B shape.
# Every step is bounded with `timeout`; figures go to $OUT/*.json and the log. About 4 minutes.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-/tmp/elcache}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
  2>&1 | tee "$OUT/gpu.txt"

log "pytest -m gpu"
timeout 90 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests --ignore=tests/tui 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"

EL="python3 -m eaglelab bench --micro --draft default --batch-sizes 1 --prompts 2 --repeats 2 --seed 0"
CONFIGS=plain-eager,plain-graphs,plain-compile,spec-decode-graphs,spec-compile
log "bench smollm2-135m shape, float32 (compile shown once: first use compiles, later runs load the cache)"
timeout 75 $EL --scale-model smollm2-135m --dtype float32 --max-new-tokens 64 --configs $CONFIGS \
  --json "$OUT/smollm2_fp32.json" 2>&1 | tail -40 | tee "$OUT/bench_smollm2_fp32.txt"
log "bench smollm2-135m shape, bfloat16"
timeout 50 $EL --scale-model smollm2-135m --dtype bfloat16 --max-new-tokens 64 --configs $CONFIGS \
  --json "$OUT/smollm2_bf16.json" 2>&1 | tail -40 | tee "$OUT/bench_smollm2_bf16.txt"
log "bench llama3.1-8b shape, bfloat16"
timeout 75 $EL --scale-model llama3.1-8b --dtype bfloat16 --max-new-tokens 32 --configs $CONFIGS \
  --json "$OUT/llama8b_bf16.json" 2>&1 | tail -40 | tee "$OUT/bench_llama8b_bf16.txt"
log "done"
