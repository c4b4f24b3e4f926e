#!/usr/bin/env bash
# The fused draft step (issue 40: the draft phase <= 0.2x a decode; engine/model/draft_step.py) on the real model at
# batch 1, against the draft step left to the compiler in the same bench process (`spec-unfused-gemv-attn`), plain
# decoding beside; and the GEMV tilings cache across two bench processes (gpu_loop_gaps.sh's stage K, folded in).
# Run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging.
#
#   call M  carry .whl (no model: random weights)                           STAGE=M: the GPU tests of the fused
#           step, then benchmarks/draft_step_bench.py (one step fused against the compiled reference, each op alone)
#   calls C, C, C  carry .carry/mq1, .carry/mq2, .carry/mq3 (each with .whl)   STAGE=C: park a part of the GGUF
#   call F  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=F: joins the GGUF; the GPU tests
#           of the fused step (tests/engine/model/test_draft_step.py); `bench --phase-costs` at batch 1, 10 MT-bench
#           first turns, 5/4/24 + 16, plain / fused / unfused interleaved, from an empty eaglelab cache (~/f_cache)
#   call G  carry .carry/assets .whl (right after F, the machine warm)         STAGE=G: the same bench again on
#           F's cache (the second process: the GEMV tilings and compiled graphs found, not made); then
#           `bench --figures --batch-sizes 1` (80 MT-bench first turns by category, 40 HumanEval prompts) as `run`
#           decodes (fused), and the same with EAGLELAB_FUSED_DRAFT=0
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S, DEVICE (cuda), AB_PROMPTS (10).
STAGE=${STAGE:?set STAGE=M, C, F or G}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}
TREE="--steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16"
FRESH=$HOME/f_cache  # F's eaglelab cache, G's too: models and assets copied in, no tilings, no compiled graphs

stage_m() {
  record_gpu
  [ -n "${SKIP_TESTS:-}" ] || TAIL=30 run gpu_tests 200 python3 -m pytest -q -m gpu tests/engine/model/test_draft_step.py \
    -p no:cacheprovider
  TAIL=40 run draft_step_bench $(left) python3 benchmarks/draft_step_bench.py --json "$R/draft_step_bench.json" ${SWEEP:+--sweep}
}

stage_c() {
  park_parts
}

# ab NAME LIMIT: plain, fused and unfused at batch 1 in one bench process on $FRESH; $R/NAME.txt, $R/NAME.json
ab() {
  TAIL=60 run "$1" "$2" env EAGLELAB_CACHE="$FRESH" $EL bench --model default --draft $SHIPPED --device "$DEVICE" \
    $TREE --batch-sizes 1 --prompts ${AB_PROMPTS:-10} --max-new-tokens 128 --repeats 2 --no-micro --phase-costs \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn,spec-unfused-gemv-attn --json "$R/$1.json"
}

stage_f() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  TAIL=30 run gpu_tests 200 python3 -m pytest -q -m gpu tests/engine/model/test_draft_step.py -p no:cacheprovider
  rm -rf "$FRESH"; mkdir -p "$FRESH"
  cp -r "$EAGLELAB_CACHE/models" "$EAGLELAB_CACHE/assets" "$FRESH/" 2>/dev/null
  ab ab_cold $(left)
  cp "$FRESH/gemv_tilings.json" "$R/" 2>/dev/null
}

stage_g() {
  record_gpu
  ab ab_warm 200
  local fig="--figures --model default --draft $SHIPPED --device $DEVICE --batch-sizes 1 --max-new-tokens 128"
  TAIL=40 run figures_fused 190 env EAGLELAB_CACHE="$FRESH" $EL bench $fig --json "$R/figures_fused.json"
  TAIL=40 run figures_unfused $(left) env EAGLELAB_CACHE="$FRESH" EAGLELAB_FUSED_DRAFT=0 $EL bench $fig \
    --json "$R/figures_unfused.json"
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; *) echo 580;; esac)}; watchdog "$0"
run_stage M C F G
