#!/usr/bin/env bash
# A check (2026-12-01, seventh session) on ONE H200 (device kind nvidia-h200): h200_v12.sh measured trees past 16
# tokens with the GEMV and the decode attention taking up to 64 rows, and their accepted lengths jumped at batch 1
# (5/4/24: 4.31; 8/8/64: 5.08 against 4.16 before) while batch 8 read 3.38 for 5/4/24. Batch 1 alone sends a verify
# of 17-64 rows through the GEMV, and prompts of <= 64 tokens through both kernels. Which of them, if any, changes
# the text? `eaglelab run --compare` on MT-bench's first question (53 prompt tokens: a prompt the kernels now take),
# 5/4/24, every kernel on, then one kernel off at a time, then the prompt left uncompiled: the mean accepted length,
# whether the speculative text is plain greedy's, and both texts, each run.
#   call A  carry .carry/m1 .whl                                   STAGE=A   (the GGUF's part 1 parked)
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl      STAGE=B
#   call C  carry .carry/m1 .whl                                   STAGE=A   (again: the machine had gone cold)
#   call D  carry .carry/m2 .carry/shipped .carry/assets .whl      STAGE=D
# D (after B found the texts move with the prompt's kernels, not the verify's): 5/4/24 on 24 MT-bench prompts, each timed (bench
# times one prompt per repeat at batch 1: the earlier batch-1 figures timed 2 prompts), so
# one prompt's text falling into a loop weighs less; the prompt left uncompiled (fewer compiles: the budget's end).
STAGE=${STAGE:?set STAGE=A, B or D}
source "$(dirname "$0")/device_stage.sh"
Q1="Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions."

stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
}

spec_run() {  # NAME LIMIT FLAGS...
  local name=$1 limit=$2; shift 2
  TAIL=24 run "$name" "$limit" $EL run --device cuda --steps 5 --topk 4 --draft-tokens 24 --max-new-tokens 128 \
    --cuda-graphs --compile --compare "$@" "$Q1"
}

stage_b() {
  join_gguf
  spec_run run_all 150 --gemv --decode-attn --compile-prefill
  spec_run run_no_gemv 110 --no-gemv --decode-attn --compile-prefill
  spec_run run_no_attn 110 --gemv --no-decode-attn --compile-prefill
  spec_run run_all_eager_prompt $(left) --gemv --decode-attn --no-compile-prefill
}

stage_d() {
  join_gguf
  TAIL=16 run bench_5-4-24_p24 $(left) $EL bench --model default --draft $SHIPPED --steps 5 --topk 4 --draft-tokens 24 \
    --batch-sizes 1 --prompts 24 --max-new-tokens 128 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro \
    --repeats 24 --json "$R/h200_smollm2_bench_5-4-24_p24.json"
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in A) echo 60;; D) echo 205;; *) echo 560;; esac)}; watchdog "$0"
run_stage A B D
