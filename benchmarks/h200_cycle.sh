#!/usr/bin/env bash
# Issue 40's cycle cost with the lookup branch on ONE H200 (device kind nvidia-h200), run from the repo root with STAGE
# and OUT set; benchmarks/device_stage.sh (sourced) does the staging.
#
#   call P  carry .carry/assets .whl   STAGE=P: the profile's batch-1 cycle (5/4/24, a branch of 16) and batch-8 cycle
#           (4/4/12, a branch of 8) profiled kernel by kernel on SmolLM2's shape (random weights, the shipped
#           drafter's 12,288-token draft vocabulary); the GEMV and the decode attention alone at the rows those
#           verifies and drafts take (1, 4, 8, 16, 40, 64 rows; batch 8 x 20 rows)
#   call Q  carry .carry/assets .carry/base .whl   STAGE=Q, at commit 1b1d539 (the tree that had GemvConfig.block_m; reverted
#           after this call: no gain): the GEMV cutting a verify's rows in blocks (block_m):
#           its GPU tests; the GEMV alone at 1-64 rows, every tiling timed; the batch-1 cycle (5/4/24, a branch of 16:
#           40 verify rows) on SmolLM2's shape with this tree's GEMV and with the one before (.carry/base: `git
#           archive 25fe4a8 engine eaglelab probes tui`, the drafter's weights left out), each in its own process
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=P or Q}
source "$(dirname "$0")/device_stage.sh"

# cycle_profile NAME LIMIT BATCH STEPS TOPK DRAFT_TOKENS LOOKUP: one speculative cycle's phases profiled kernel by
# kernel (and one decode step), SmolLM2's shape with random weights
cycle_profile() {
  local name=$1 limit=$2 batch=$3
  TAIL=90 run "$name" "$limit" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps "$4" --topk "$5" --draft-tokens "$6" --lookup-tokens "$7" --batch-sizes "$batch" --prompts "$batch" \
    --max-new-tokens 64 --repeats 1 --configs spec-compile-gemv-attn --no-micro --profile --json "$R/h200_$name.json"
}

stage_p() {
  record_gpu
  cycle_profile profile_b1_5-4-24_l16 190 1 5 4 24 16
  cycle_profile profile_b8_4-4-12_l8 190 8 4 4 12 8
  TAIL=60 run gemv_rows 60 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,8,16,40,64 \
    --json "$R/h200_gemv_rows.json"
  TAIL=40 run attn_rows $(left) python3 benchmarks/attn_bench.py --shapes smollm2-135m --batch 1,8 --rows 1,4,20,40 \
    --slots 640 --used 300 --json "$R/h200_attn_rows.json"
}

# scale_cycle NAME LIMIT: the batch-1 cycle (5/4/24, a branch of 16) and plain decoding on SmolLM2's shape with random
# weights, every kernel, interleaved in one process; run from the current directory's tree
scale_cycle() {
  local name=$1 limit=$2
  TAIL=24 run "$name" "$limit" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16 --batch-sizes 1 --prompts 4 --max-new-tokens 128 \
    --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --json "$R/h200_$name.json"
}

stage_q() {
  record_gpu
  TAIL=12 run gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/model/test_gemv.py
  TAIL=70 run gemv_rows 70 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,8,32,40,64 \
    --json "$R/h200_gemv_rows.json"
  scale_cycle scale_cut 170
  ( cd .carry/base && for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
    PYTHONPATH=$PWD:$SITE scale_cycle scale_base $(left) )
}

export STAGE_S=${STAGE_S:-570}
watchdog "$0"
run_stage P Q
