#!/usr/bin/env bash
# The GPU batch of 2026-12-01's eleventh session on ONE H200 (device kind nvidia-h200), for #12. Replaces h200_v19.sh
# (never run): its B (the 24-prompt bench of the tenth session's last engine) is folded into this batch's last call,
# which measures whatever this session lands on top.
#   - A (no GGUF): the GEMV alone on SmolLM2's shapes at 1, 4, 24 rows (the 17-64-row dot with 256-512-wide K steps,
#     untimed so far); the 5/4/24 cycle profiled kernel by kernel on SmolLM2's shape (random weights), with the
#     greedy pick ranked in blocks when compiled (`tree.greedy_token`, unmeasured); the GPU tests of the loop.
#   - B, C: see below (written after A).
#
#   call A  carry .carry/assets .whl                             STAGE=A
STAGE=${STAGE:?set STAGE=A}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  gemv_smollm2 60 1,4,24
  TAIL=6 run gpu_tests_runtime 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py \
    tests/engine/runtime/test_one_graph_cycle.py tests/engine/runtime/test_cuda_graphs.py tests/engine/runtime/test_readback.py \
    tests/engine/runtime/test_acceptance.py tests/engine/runtime/test_tree.py
  spec_profile 5 4 24
}

export STAGE_S=${STAGE_S:-330}; watchdog "$0"
run_stage A
