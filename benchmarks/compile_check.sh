#!/usr/bin/env bash
# GPU comparison of CUDA graphs with and without whole-phase torch.compile, run from the repo root on
# the GPU machine (bounded: about 5 minutes in all):
#
#   PYTHONPATH=$PWD OUT=/some/dir timeout 320 bash benchmarks/compile_check.sh
#
# Bench runs (random weights, bfloat16), each comparing plain-graphs, plain-compile,
# spec-decode-graphs and spec-compile: SmolLM2-135M shape at batch 1, Llama-3.1-8B shape at batch 1,
# SmolLM2-135M shape at batch 8 (one run per point: a slow compile costs only its own point). Each
# compile's time is printed once ("compiled decode [b=1] in ... s") and kept out of tok/s. The inductor cache starts empty on a fresh machine: these are cold-compile times.
# Figures go to $OUT/compile_*.json, the logs to $OUT/compile_*.txt.
# COMPILE_MODE=max-autotune-no-cudagraphs (optional, a second run) lets inductor tune its matmuls for the
# skinny decode shapes; its files are then named compile_*_autotune.*.
set -u
OUT=${OUT:-/tmp/compile_check}
mkdir -p "$OUT"
# The cache sits in the ignored runs/ folder: on a machine still warm, a second run loads the kernels.
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-$PWD/runs/elcache}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/compile_log.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
  2>&1 | tee "$OUT/compile_gpu.txt"

MODE=${COMPILE_MODE:-default}
SUF=$([ "$MODE" = default ] || echo _autotune)
EL="python3 -m eaglelab bench --draft default --prompts 2 --repeats 2 --seed 0 --dtype bfloat16 --no-micro --compile-mode $MODE"
CONFIGS=plain-graphs,plain-compile,spec-decode-graphs,spec-compile
bench() {  # NAME SECONDS ARGS...: one bench run, its JSON and its log under $OUT
  local name=$1 secs=$2; shift 2
  log "bench $name (timeout ${secs}s)"
  timeout "$secs" $EL "$@" --configs $CONFIGS --json "$OUT/compile_$name$SUF.json" 2>&1 \
    | tee "$OUT/compile_$name$SUF.txt" | grep -v "^\s*$" | tail -45
}
bench smollm2_bf16_bs1 140 --scale-model smollm2-135m --batch-sizes 1 --max-new-tokens 64
bench llama8b_bf16_bs1 100 --scale-model llama3.1-8b --batch-sizes 1 --max-new-tokens 32
bench smollm2_bf16_bs8 70 --scale-model smollm2-135m --batch-sizes 8 --max-new-tokens 64
log "done"
