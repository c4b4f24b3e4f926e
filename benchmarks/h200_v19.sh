#!/usr/bin/env bash
# A GPU batch planned 2026-12-01 in the tenth session and never run: h200_v20.sh took its place (its calls A and B) on ONE H200 (device kind nvidia-h200), for #12.
# The tenth session measured 1.95x over 24 MT-bench prompts (5/4/24, the prompt compiled; h200_2026-12-01k): verify
# 0.956, draft 0.262, extend 0.057 ms against a 0.807 ms decode. Landed after its last call, unmeasured there: the
# greedy pick (a verify's 24 rows and a decode's one over SmolLM2's 49,152 logits) ranked in blocks when compiled
# (`tree.greedy_token`; inductor's argmax was one program per row, ~9-10 us a call). It speeds plain decoding as
# much as speculation: the figure to watch is both tok/s, not the ratio.
#   - A: the GGUF's part 1 parked; the GEMV alone on SmolLM2's shapes at 1, 4, 24 rows (the 17-64-row dot with
#     256-512-wide K steps, added untimed); the 5/4/24 cycle profiled kernel by kernel on SmolLM2's shape (where the
#     1.28 ms goes now; `spec_profile`).
#   - B (right after A): join; the 24-prompt bench at 5/4/24 (against 1.95x, 2,371.5 / 1,214.9 tok/s);
#     `run --compare` on question 81 (against 2.24x).
#   - C (no GGUF: a quick check on its own, ~3 min with a cold start; the tenth session's last 204 device seconds
#     were too few to start one): the 5/4/24 cycle and plain decoding on SmolLM2's shape (random weights) after the
#     greedy pick's change, against h200_2026-12-01k/A/spec_scale.txt (decode 0.816 ms, requests 108.5 / 172.4 ms).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
#   call C  carry .carry/assets .whl                             STAGE=C STAGE_S=140
# The GGUF's parts: `xz -6` of it split at 58,000,000 bytes; the shipped drafter and docs/tp2_smollm2_h200x2.jsonl
# moved out of the tree for both calls (64 MiB).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  gemv_smollm2 60 1,4,24
  spec_profile 5 4 24
}

stage_b() {
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

stage_c() {
  spec_scale $(left)
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 280 || echo 585)}; watchdog "$0"
run_stage A B C
