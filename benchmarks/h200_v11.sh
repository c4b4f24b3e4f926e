#!/usr/bin/env bash
# The third GPU batch of 2026-12-01's sixth session (run: benchmarks/results/h200_2026-12-01f, calls E and F) on ONE
# H200 (device kind nvidia-h200), after h200_v10.sh measured
# the probes at 0.967 of unobserved tok/s with the one-graph cycle (target 0.97): the observed cycle's graph now records
# 6 timing events a replay instead of 10 (each part's end is the next part's start). It measures:
#   - E: the GGUF's part 1 parked; the one-graph cycle's GPU test (which checks the chained events);
#   - F: the probes' cost again (same command as h200_v10.sh call D); tree 5/4/16 with --compile-prefill again
#     (h200_v9.sh call B: 2.00x), plain in the same process.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
#   call E  carry .carry/m1 .carry/assets .whl                   STAGE=E
#   call F  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=F
# Knobs: STAGE_S.
STAGE=${STAGE:?set STAGE=E or F}
source "$(dirname "$0")/device_stage.sh"

stage_e() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  TAIL=6 run gpu_test_cycle 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_one_graph_cycle.py
}

stage_f() {
  join_gguf
  TAIL=8 run probe_overhead 150 python3 benchmarks/probe_overhead.py --device cuda --steps 5 --topk 4 \
    --draft-tokens 16 --max-new-tokens 128 --repeats 7
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_5-4-16_prefill $(left) 5 4 16 $SHIPPED
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = E ] && echo 150 || echo 330)}; watchdog "$0"
run_stage E F
