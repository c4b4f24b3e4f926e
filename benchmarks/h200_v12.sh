#!/usr/bin/env bash
# The next GPU batch (planned 2026-12-01, sixth session; NOT YET RUN) on ONE H200 (device kind nvidia-h200), for #12:
# the GEMV and the decode attention now take up to 64 rows (a verify of a wide tree; each shape kept on cuBLAS /
# SDPA where those are faster), unmeasured. The verify cliff it aims at: 0.91 ms at 16 tokens, 1.24-1.27 ms at 24-64
# (both kernels left at 17 rows); trees past 16 tokens accept more (8/8/64: 4.16; 4/4/12: 3.17).
#   - A: the GGUF's part 1 parked; the model's GPU tests (the kernels' new 24/64-row cases); both kernels alone at
#     1-64 rows on SmolLM2's shapes against F.linear / SDPA;
#   - A also: where the 8B shape's decode step spends its 4.35 ms, kernel by kernel (80.2% of the bound a step;
#     79.0% end to end: the issue asks 80%);
#   - B: join; trees past 16 tokens with every kernel and the prompt compiled, plain in the same process each.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
# Knobs: STAGE_S.
STAGE=${STAGE:?set STAGE=A or B}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  TAIL=8 run gpu_tests_model 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/model/test_gemv.py \
    tests/engine/model/test_decode_attention.py
  TAIL=12 run gemv_smollm2 100 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,16,24,32,64 \
    --json "$R/h200_gemv_smollm2.json"
  TAIL=20 run attn_smollm2 100 python3 benchmarks/attn_bench.py --shapes smollm2-135m --batch 1 --rows 1,16,24,32,64 \
    --slots 2048 --used 300 --json "$R/h200_attn_smollm2.json"
  TAIL=60 run profile_8b $(left) $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 \
    --batch-sizes 1 --prompts 2 --max-new-tokens 64 --repeats 2 --configs plain-compile-gemv-attn --no-micro --profile \
    --json "$R/h200_profile_8b.json"
}

stage_b() {
  join_gguf
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_5-4-24 200 5 4 24 $SHIPPED
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_6-4-32 150 6 4 32 $SHIPPED
  BENCH_EXTRA=--compile-prefill TAIL=16 speed_bench bench_8-8-64 $(left) 8 8 64 $SHIPPED
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 560 || echo 585)}; watchdog "$0"
run_stage A B
