#!/usr/bin/env bash
# A GPU batch (planned 2026-12-01, fifth session; run in the sixth: benchmarks/results/h200_2026-12-01f, calls A and B) on ONE H200 (device kind nvidia-h200), for #12:
#   - A: the GGUF's part 1 parked; the runtime's and model's GPU tests with the time they need (the fifth session's
#     call A gave them 45 s: 2 passed before the limit);
#   - B: the fastest trees of the fifth session (5/4/16 and 4/4/12, one graph per cycle: 1.94x) again, now with
#     --compile-prefill against without, same process each (the prompt's phases uncompiled cost ~3.8 ms of eager
#     kernels a request: twice the weight on speculation's 128 tokens as on plain decoding's); the probes' cost with
#     the one-graph cycle (two alternating graphs with in-graph timing events when observed, one without).
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
# Before (here, CPU): .carry/m1/smolpart_00 + .carry/m2/smolpart_01 (the GGUF, xz, split); the big tracked files
# moved out of the tree (the shipped drafter travels as .carry/shipped); .carry/assets; .whl.
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
# Knobs: STAGE_S.
STAGE=${STAGE:?set STAGE=A or B}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  TAIL=15 run gpu_tests $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime tests/engine/model
}

stage_b() {
  join_gguf
  # the first compiles each padded prompt width once (plain and speculative runners alike; inductor's disk cache
  # serves the second runner and the later benches)
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_5-4-16_prefill 240 5 4 16 $SHIPPED
  TAIL=16 speed_bench bench_5-4-16 90 5 4 16 $SHIPPED
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_4-4-12_prefill 150 4 4 12 $SHIPPED
  TAIL=8 run probe_overhead $(left) python3 benchmarks/probe_overhead.py --device cuda --steps 5 --topk 4 \
    --draft-tokens 16 --max-new-tokens 128 --repeats 7
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 300 || echo 585)}; watchdog "$0"
run_stage A B
