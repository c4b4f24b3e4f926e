#!/usr/bin/env bash
# A GPU batch planned 2026-12-01 in the ninth session on ONE H200 (device kind nvidia-h200), for #12; calls A and B
# ran in the tenth (h200_2026-12-01j: the CUDA-core tilings lose at 24 rows, 1.93x), C did not (its premise failed).
# The ninth session measured 1.89x over 24 MT-bench prompts (5/4/24, the prompt compiled; h200_2026-12-01i) and found
# the verify's 0.16 ms over a decode to be its matmuls at 24 rows (the dot's tilings and cuBLAS at 1.5-1.9x a one-row
# GEMV of the same weights). Landed after its last real-model call, unmeasured there: the draft's top-k in two stages
# at the shipped drafter's 12,288 (the draft phase 0.292 -> 0.271 ms on SmolLM2's shape), and the GEMV's CUDA-core
# tilings for 2-64 rows (checked under Triton's interpreter only).
#   - A: the GGUF's part 1 parked; the GEMV alone on SmolLM2's shapes at 1, 4, 24, 32 rows, every tiling timed (do
#     the CUDA-core tilings make 24 rows cost what one does?); the 5/4/24 cycle on SmolLM2's shape (random weights).
#   - B: join; the 24-prompt bench at 5/4/24 (against 1.89x); `run --compare` on question 81 (against 2.16x).
#   - C (right after B, if the verify got cheaper): 6/4/32 and 8/8/64 over 24 prompts (wider trees pay when a verify
#     of many rows costs what a decode does).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
#   call C  carry .carry/shipped .carry/assets .whl              STAGE=C
# The GGUF's parts: `xz -6` of it split at 58,000,000 bytes (part 1 with the tree is under 64 MiB; part 2 leaves room
# for the shipped drafter, moved out of the tree for calls A and B along with docs/tp2_smollm2_h200x2.jsonl).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  gemv_smollm2 120 1,4,24,32
  spec_scale $(left)
}

stage_b() {
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

stage_c() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call B"; exit 3; }
  fair_cp p24_6-4-32_cp 300 6 4 32
  fair_cp p24_8-8-64_cp $(left) 8 8 64
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 280 || echo 585)}; watchdog "$0"
run_stage A B C
