#!/usr/bin/env bash
# The GPU batch of 2026-12-01's eleventh session on ONE H200 (device kind nvidia-h200), for #12. Replaces h200_v19.sh
# (never run): its B (the 24-prompt bench of the tenth session's last engine) is folded into this batch's last call,
# which measures whatever this session lands on top. Ran: A, B (its draft kernel did not compile), B2, C, D; output and
# figures in benchmarks/results/h200_2026-12-01l/ (2.00x over 24 prompts at 5/4/24).
#   - A (no GGUF): the GEMV alone on SmolLM2's shapes at 1, 4, 24 rows (the 17-64-row dot with 256-512-wide K steps,
#     untimed so far); the 5/4/24 cycle profiled kernel by kernel on SmolLM2's shape (random weights), with the
#     greedy pick ranked in blocks when compiled (`tree.greedy_token`, unmeasured); the GPU tests of the loop.
#   - B (after A's profile: the cycle's bookkeeping, 15 kernels and 38 us replayed, and each draft step's top-k,
#     log-softmax and selection, ~6 kernels, became three Triton ops in compiled phases: `engine/runtime/cycle_ops.py`):
#     the GGUF's part 1 parked; the GPU tests of the ops and of compiled phases in graphs; the 5/4/24 profile again
#     (against A: accept 9 + advance 6 kernels, 38 us; draft 120 kernels, 260 us).
#   - C (right after B): join; the 24-prompt bench at 5/4/24 (against 1.95x, h200_2026-12-01k); `run --compare` on
#     question 81 (against 2.24x).
#
#   call A  carry .carry/assets .whl                             STAGE=A
#   call B  carry .carry/m1 .carry/assets .whl                   STAGE=B
#   call B2 carry .carry/m1 .carry/assets .whl                   STAGE=B2 STAGE_S=240
#   call C  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=C
# The GGUF's parts: `xz -6` of it split at 58,000,000 bytes; the shipped drafter and docs/tp2_smollm2_h200x2.jsonl
# moved out of the tree for B and C (64 MiB).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  gemv_smollm2 60 1,4,24
  TAIL=6 run gpu_tests_runtime 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py \
    tests/engine/runtime/test_one_graph_cycle.py tests/engine/runtime/test_cuda_graphs.py tests/engine/runtime/test_readback.py \
    tests/engine/runtime/test_acceptance.py tests/engine/runtime/test_tree.py
  spec_profile 5 4 24
}

stage_b() {
  record_gpu
  park_part1
  TAIL=8 run gpu_tests $(( $(left) - 200 )) python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/engine/runtime/test_cycle_ops.py tests/engine/runtime/test_compile.py tests/engine/runtime/test_loop.py \
    tests/engine/runtime/test_one_graph_cycle.py tests/engine/runtime/test_acceptance.py tests/engine/runtime/test_tree.py
  spec_profile 5 4 24
}

# B2 (B failed: a draft kernel's global was not a constexpr, so the draft phase did not compile; fixed): the GPU tests
# alone, in two processes (B's test_loop capture failed after test_compile's failure in the same process), then C.
stage_b2() {
  record_gpu
  park_part1
  TAIL=8 run gpu_tests_ops 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_cycle_ops.py \
    tests/engine/runtime/test_compile.py
  TAIL=8 run gpu_tests_loop 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py \
    tests/engine/runtime/test_one_graph_cycle.py tests/engine/runtime/test_acceptance.py tests/engine/runtime/test_tree.py
}

stage_c() {
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

# D (right after C, on the warm machine): the 5/4/24 profile with the three ops compiled in (against A).
stage_d() {
  spec_profile 5 4 24
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = C ] && echo 585 || echo 400)}; watchdog "$0"
run_stage A B B2 C D
