#!/usr/bin/env bash
# The GPU batch of the eighth session (2026-12-01) on ONE H200 (device kind nvidia-h200), for #12. The seventh
# session found that bench's batch-1 rows had timed two prompts; its one fair figure is 5/4/24 over 24 MT-bench
# prompts, each timed: 1.74x, the prompt not compiled. Since then: a speculative run stopped by length no longer
# launches one extra cycle after its last (the lagged stop check waits for the cycle in flight near the budget's
# end), and bench prints what a request costs besides its cycles (the prompt's forward, the drafter's extend over it).
#   - A: the GGUF's part 1 parked; each phase of a 5/4/24 speculative cycle profiled kernel by kernel on SmolLM2's
#     shape (random weights: `bench --scale-model smollm2-135m --profile`), for the draft phase's next cut.
#   - B: join; 24 prompts each timed (two passes), every kernel, the prompt compiled: 5/4/24 and 4/4/12; then
#     `eaglelab run --compare` on question 81 (the seventh session read 0.91-0.97x there while bench read ~2x).
#   - C: 5/4/16 the same way; 5/4/24 with the prompt not compiled (the seventh session's call I, re-run: what the
#     extra cycle cost); 5/4/24 at batch 8.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
#   call A  carry .carry/m1 .whl                                  STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl     STAGE=B
#   call C  carry .carry/shipped .carry/assets .whl               STAGE=C   (the GGUF joined in B is still there)
# Knobs: STAGE_S.
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  spec_profile 5 4 24
}

# fair NAME LIMIT STEPS TOPK DRAFT_TOKENS [BATCH] [EXTRA...]: plain and speculative in one process, every kernel on
# both sides, 24 MT-bench prompts x 128 tokens, each prompt timed in each of two passes
fair() {
  local name=$1 limit=$2 s=$3 k=$4 n=$5 b=$6; shift 6
  TAIL=24 run "$name" "$limit" $EL bench --model default --draft $SHIPPED --steps "$s" --topk "$k" --draft-tokens "$n" \
    --batch-sizes "$b" --prompts 24 --max-new-tokens 128 --repeats 2 --no-micro \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn "$@" --json "$R/h200_smollm2_$name.json"
}

stage_b() {
  join_gguf
  fair p24_5-4-24_cp 240 5 4 24 1 --compile-prefill
  fair p24_4-4-12_cp 170 4 4 12 1 --compile-prefill
  TAIL=40 run run_compare_q81 $(left) $EL run --device cuda --steps 5 --topk 4 --draft-tokens 24 --max-new-tokens 128 \
    --cuda-graphs --compile --gemv --decode-attn --compile-prefill --compare "$Q81"
}

stage_c() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call B"; exit 3; }
  fair p24_5-4-16_cp 200 5 4 16 1 --compile-prefill
  fair p24_5-4-24 170 5 4 24 1
  fair p24_5-4-24_b8_cp $(left) 5 4 24 8 --compile-prefill
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in A) echo 300;; *) echo 585;; esac)}; watchdog "$0"
run_stage A B C
