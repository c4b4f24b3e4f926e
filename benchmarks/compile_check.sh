#!/usr/bin/env bash
# GPU comparison of CUDA graphs with and without whole-phase torch.compile, run from the repo root on
# the GPU machine (bounded: about 4 minutes in all):
#
#   PYTHONPATH=$PWD OUT=/some/dir timeout 235 bash benchmarks/compile_check.sh
#
# One bench run per model shape (random weights, bfloat16): plain-graphs, plain-compile,
# spec-decode-graphs, spec-compile. SmolLM2-135M shape at batch 1 and 8, Llama-3.1-8B shape at
# batch 1. Each compile's time is printed once ("compiled decode [b=1] in ... s") and kept out of
# tok/s. The inductor cache starts empty on a fresh machine: these are cold-compile times.
# Figures go to $OUT/compile_*.json, the logs to $OUT/compile_*.txt.
# COMPILE_MODE=max-autotune-no-cudagraphs (optional, a second run) lets inductor tune its matmuls for the
# skinny decode shapes; its files are then named compile_*_autotune.*.
set -u
OUT=${OUT:-/tmp/compile_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-/tmp/elcache}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/compile_log.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
  2>&1 | tee "$OUT/compile_gpu.txt"

MODE=${COMPILE_MODE:-default}
SUF=$([ "$MODE" = default ] || echo _autotune)
EL="python3 -m eaglelab bench --draft default --prompts 2 --repeats 2 --seed 0 --dtype bfloat16 --no-micro --compile-mode $MODE"
CONFIGS=plain-graphs,plain-compile,spec-decode-graphs,spec-compile
log "bench smollm2-135m shape, bf16, batch 1 and 8"
timeout 140 $EL --scale-model smollm2-135m --batch-sizes 1,8 --max-new-tokens 64 --configs $CONFIGS \
  --json "$OUT/compile_smollm2_bf16$SUF.json" 2>&1 | tee "$OUT/compile_smollm2_bf16$SUF.txt" | grep -v "^\s*$" | tail -60
log "bench llama3.1-8b shape, bf16, batch 1"
timeout 85 $EL --scale-model llama3.1-8b --batch-sizes 1 --max-new-tokens 32 --configs $CONFIGS \
  --json "$OUT/compile_llama8b_bf16$SUF.json" 2>&1 | tee "$OUT/compile_llama8b_bf16$SUF.txt" | grep -v "^\s*$" | tail -40
log "done"
