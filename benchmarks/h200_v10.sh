#!/usr/bin/env bash
# The second GPU batch of 2026-12-01's sixth session (run: benchmarks/results/h200_2026-12-01f, calls C and D) on ONE
# H200 (device kind nvidia-h200), after h200_v9.sh
# (which measured --compile-prefill: 2.00x / 2.01x) found two faults:
#   - probe_overhead.py built a runner per engine, so every timed run captured its graphs again (the one-graph
#     cycle captures two when observed, one when not: the ratio read 0.708); it now shares one runner (captured in
#     the warm-up), as one server's requests do;
#   - the lagged-loop GPU test read a per-phase status ("advance") that the one-graph cycle never sets.
# It measures:
#   - C: the GGUF's part 1 parked; the fixed GPU test; the llama3.1-8b shape end to end with --compile-prefill
#     against without (the prefill was ~2% of that run, and its 77.9% of the bound missed 80% by 2 points);
#   - D: the probes' cost with the one-graph cycle (shared runner); the shipped drafter at 4/4/12 with
#     --compile-prefill at batch 1 and 8, plain in the same process.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
#   call C  carry .carry/m1 .carry/assets .whl                   STAGE=C
#   call D  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=D
# Knobs: STAGE_S.
STAGE=${STAGE:?set STAGE=C or D}
source "$(dirname "$0")/device_stage.sh"

bench_8b() {  # bench_8b NAME LIMIT [EXTRA...]
  local name=$1 limit=$2; shift 2
  TAIL=14 run "$name" "$limit" $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1 \
    --prompts 2 --configs plain-compile-gemv-attn --max-new-tokens 64 --repeats 2 --no-micro "$@" --json "$R/h200_$name.json"
}

stage_c() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  TAIL=6 run gpu_test_loop 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py
  bench_8b bench_8b_prefill 200 --compile-prefill
  bench_8b bench_8b $(left)
}

stage_d() {
  join_gguf
  TAIL=8 run probe_overhead 150 python3 benchmarks/probe_overhead.py --device cuda --steps 5 --topk 4 \
    --draft-tokens 16 --max-new-tokens 128 --repeats 7
  BENCH_EXTRA="--compile-prefill --batch-sizes 1,8" TAIL=24 speed_bench bench_4-4-12_prefill_b8 $(left) 4 4 12 $SHIPPED
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = C ] && echo 500 || echo 480)}; watchdog "$0"
run_stage C D
