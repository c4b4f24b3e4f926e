#!/usr/bin/env bash
# The prompt-lookup branch beside the EAGLE-3 tree (--lookup-tokens) on ONE H200 (device kind nvidia-h200): five
# back-to-back device calls sent as one message, run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh
# (sourced) does the staging. The GGUF travels in four parts (.carry/mq1..mq4), parked by the calls before R.
#
#   call T  carry .carry/mq1 .whl                 STAGE=T: the GPU tests of real graphs and compiled phases (the lookup
#           branch among them); the cycle's cost on SmolLM2's shape (random weights) without and with a branch of 8
#   call P  carry .carry/mq2 .whl                 STAGE=P: the 5/4/24 cycle with a branch of 8 profiled kernel by kernel
#   call C  carry .carry/mq3 .whl                 STAGE=C: parks part 3, nothing else
#   call R  carry .carry/mq4 .carry/assets .whl   STAGE=R: joins the GGUF; `bench --figures` at batch 1 (80 MT-bench
#           first turns by category, 40 HumanEval prompts; plain and speculative interleaved in each run), without a
#           lookup branch and with one of 8
#   call S  carry .carry/assets .whl              STAGE=S (right after R): the same figures with a branch of 16; batch 8
#           served (--continuous, the 80 as one queue) without and with a branch of 8
# (T's and P's scale-model runs need the MT-bench questions: .carry/assets, which those calls did not carry.)
#
# The second batch, after the shipped profile took a branch of 16 at batch 1 and of 8 at batch 8:
#   call U  carry .carry/mq1 .carry/assets .whl   STAGE=U: the cycle's phase costs on SmolLM2's shape without and
#           with a branch of 16 (on 2026-12-04 both were cut at 100 s by compile and GEMV tuning: give them ~150 s)
#   call C  carry .carry/mq2 .whl; call C carry .carry/mq3 .whl
#   call W  carry .carry/mq4 .carry/assets .whl   STAGE=W: joins; batch 32 served without and with a branch of 8;
#           batch 8 served with a branch of 16; the batch-1 figures with a branch of 32
#   call X  carry .carry/assets .whl              STAGE=X (right after W): `bench --figures` with no flag (the
#           profile's trees and branches) at batch 1, 8 and 32
#
# Next (not run yet): STAGE=Y (carry .carry/mq4 .carry/assets .whl after three parking calls) re-runs
# h200_2026-12-04c/R2's served command (batch 8 and 32 in one process) without a branch, then with the profile's: the
# served figures without a branch read 1.53x / 1.43x here against R2's 1.63x / 1.51x, each alone in its process.
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=T, P, C, R, S, U, W, X or Y}
source "$(dirname "$0")/device_stage.sh"

# figures NAME LIMIT EXTRA...: the shipped drafter against plain decoding at batch 1 (its profile's tree 5/4/24), every
# kernel on both sides, per MT-bench category and on code; $R/NAME.txt, $R/h200_figures_NAME.json (and .md)
figures() {
  local name=$1 limit=$2; shift 2
  TAIL=40 run "$name" "$limit" $EL bench --figures --model default --draft $SHIPPED --device cuda --batch-sizes 1 \
    --max-new-tokens 128 --repeats 2 "$@" --json "$R/h200_figures_$name.json"
}

# scale_cost NAME LIMIT EXTRA...: the 5/4/24 cycle and plain decoding on SmolLM2's shape (random weights, the shipped
# drafter's 12,288-token draft vocabulary), every kernel; phase costs (a random drafter: acceptance means nothing)
scale_cost() {
  local name=$1 limit=$2; shift 2
  TAIL=16 run "$name" "$limit" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps 5 --topk 4 --draft-tokens 24 --batch-sizes 1 --prompts 2 --max-new-tokens 128 --repeats 3 \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro "$@" --json "$R/h200_$name.json"
}

stage_t() {
  record_gpu
  park_parts
  TAIL=12 run gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_cuda_graphs.py \
    tests/engine/runtime/test_compile.py
  scale_cost scale_lookup0 120
  scale_cost scale_lookup8 $(left) --lookup-tokens 8
}

stage_p() {
  record_gpu
  park_parts
  TAIL=80 run spec_profile_lookup8 $(left) $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 \
    --seed 0 --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 8 --batch-sizes 1 --prompts 2 --max-new-tokens 64 \
    --repeats 1 --configs spec-compile-gemv-attn --no-micro --profile --json "$R/h200_spec_profile_lookup8.json"
}

stage_c() {
  park_parts
}

stage_r() {
  join_gguf
  figures b1_lookup0 270
  figures b1_lookup8 $(left) --lookup-tokens 8
}

# served_b8 NAME LIMIT EXTRA...: the 80 as one queue through 8 rows (the profile's batch-8 tree 4/4/12)
served_b8() {
  local name=$1 limit=$2; shift 2
  TAIL=40 run "$name" "$limit" $EL bench --model default --draft $SHIPPED --batch-sizes 8 --prompts 80 \
    --max-new-tokens 128 --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --continuous \
    --no-eos "$@" --json "$R/h200_smollm2_$name.json"
}

stage_s() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call R"; exit 3; }
  figures b1_lookup16 200 --lookup-tokens 16
  served_b8 served_b8_lookup0 140
  served_b8 served_b8_lookup8 $(left) --lookup-tokens 8
}

stage_u() {
  record_gpu
  park_parts
  scale_cost scale_lookup0 150
  scale_cost scale_lookup16 $(left) --lookup-tokens 16
}

# served NAME LIMIT BATCH EXTRA...: the 80 as one queue through BATCH rows (the profile's tree for that batch)
served() {
  local name=$1 limit=$2 batch=$3; shift 3
  TAIL=30 run "$name" "$limit" $EL bench --model default --draft $SHIPPED --batch-sizes "$batch" --prompts 80 \
    --max-new-tokens 128 --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --continuous \
    --no-eos "$@" --json "$R/h200_smollm2_$name.json"
}

stage_w() {
  join_gguf
  served served_b32_lookup0 110 32 --lookup-tokens 0
  served served_b32_lookup8 110 32 --lookup-tokens 8
  served served_b8_lookup16 100 8 --lookup-tokens 16
  figures b1_lookup32 $(left) --lookup-tokens 32
}

stage_x() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call W"; exit 3; }
  TAIL=60 run figures_defaults $(left) $EL bench --figures --model default --draft $SHIPPED --device cuda \
    --max-new-tokens 128 --repeats 2 --json "$R/h200_figures_defaults.json"
}

stage_y() {
  join_gguf
  served served_b8_32_lookup0 270 8,32 --lookup-tokens 0
  served served_b8_32_profile $(left) 8,32
}

export STAGE_S=${STAGE_S:-$(case $STAGE in T) echo 320;; P|U) echo 200;; C) echo 60;; W) echo 440;; X) echo 330;; *) echo 570;; esac)}
watchdog "$0"
run_stage T P C R S U W X Y
