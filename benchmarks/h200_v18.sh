#!/usr/bin/env bash
# The GPU batch of 2026-12-01's tenth session on ONE H200 (device kind nvidia-h200), for #12.
# Its first calls (h200_v17.sh A, B: h200_2026-12-01j) measured 1.93x over 24 MT-bench prompts (5/4/24) and found the
# GEMV's CUDA-core tilings slower than the dot at 24 rows (7-9 us against 3.2-5.0). Landed after them, measured here:
#   - split-K GEMV shares added by the last program of each block in the same launch (was a second kernel), and
#     the dot split along K at 17-64 rows (a verify's 24): more programs, a share of x each;
#   - the draft's log-softmax folded into its top-k's own passes (each block's max and sum of exponentials), the
#     drafter's extend handing on logits: no softmax launches of their own.
#   - A: the GGUF's part 1 parked; the GPU tests of what changed; the GEMV alone on SmolLM2's shapes at 1, 4, 24
#     rows; the 5/4/24 cycle on SmolLM2's shape (random weights; h200_2026-12-01j/A: verify 0.964, draft 0.274,
#     extend 0.064 ms, decode 0.827).
#   - B (right after A): join; the 24-prompt bench at 5/4/24 (against 1.93x); `run --compare` on question 81
#     (against 2.19x).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
# The GGUF's parts: `xz -6` of it split at 58,000,000 bytes; the shipped drafter and docs/tp2_smollm2_h200x2.jsonl
# moved out of the tree for both calls (64 MiB).
STAGE=${STAGE:?set STAGE=A or B}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  gemv_smollm2 90 1,4,24
  spec_scale 170
  TAIL=6 run gpu_tests_runtime 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py \
    tests/engine/runtime/test_one_graph_cycle.py tests/engine/runtime/test_cuda_graphs.py tests/engine/runtime/test_readback.py \
    tests/engine/runtime/test_acceptance.py
  TAIL=6 run gpu_tests_more $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_compile.py \
    tests/engine/model/test_gemv.py
}

stage_b() {
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 440 || echo 585)}; watchdog "$0"
run_stage A B
