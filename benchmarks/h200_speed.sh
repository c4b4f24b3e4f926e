#!/usr/bin/env bash
# The H200 speed figures of docs/figures.md, as four device calls on ONE H200 (device kind nvidia-h200), run from the
# repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging, benchmarks/README.md says
# what to carry.
#
# Honest status: assembled on 2026-12-03 from the stages of the session batch scripts that measured these figures
# (h200_v4.sh, h200_v10.sh, h200_v12.sh, h200_v20.sh; removed from the tree, kept in git history:
# `git show 387cce3:benchmarks/h200_v20.sh`).
# Each command below is the one that made the figure named beside it, with the limits it ran under; this script as
# a whole has not been run in this form.
#
#   - A (no GGUF needed): the GEMV and the decode attention alone on SmolLM2's shapes; the 5/4/24 cycle profiled
#     kernel by kernel on SmolLM2's shape with random weights ("Where a cycle's time goes": h200_2026-12-01l/D); the
#     engine's GPU tests. Parks the GGUF's part 1 for call B.
#   - B (right after A): the headline, 24 MT-bench prompts at 5/4/24 against plain decoding (2.00x, h200_2026-12-01l/C);
#     `eaglelab run --compare` on MT-bench question 81 (2.34x, the same call).
#   - C (no GGUF): the Llama-3.1-8B shape end to end, share of the weight-bandwidth bound (h200_2026-12-01b/A and
#     h200_2026-12-01g/D, E); the GEMV and the decode attention alone on its shapes (h200_2026-12-01/A_tp_gemv/gemv,
#     h200_2026-12-01b/A).
#   - D (right after B, while the machine still holds the converted model): the probes' cost (0.977,
#     h200_2026-12-01f/F); batch 8 at 4/4/12 (1.44x, h200_2026-12-01f/D).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
#   call C  carry .carry/assets .whl                             STAGE=C
#   call D  carry .carry/shipped .carry/assets .whl              STAGE=D
# The GGUF now travels in three parts (benchmarks/README.md): park part 2 with a call that runs nothing else
# (`h200_defaults.sh` STAGE=B does) between A and B, and carry .carry/m3 in B instead of .carry/m2.
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=A, B, C or D}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  gemv_smollm2 60 1,4,24
  TAIL=20 run attn_smollm2 100 python3 benchmarks/attn_bench.py --shapes smollm2-135m --rows 1,16,24,32,64 --slots 2048 \
    --used 300 --json "$R/h200_attn_smollm2.json"
  TAIL=8 run gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime tests/engine/model
  spec_profile 5 4 24
}

stage_b() {
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

stage_c() {
  record_gpu
  TAIL=40 run bench_8b 300 $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1 \
    --prompts 2 --configs plain-compile,plain-compile-gemv,plain-compile-gemv-attn --max-new-tokens 64 --repeats 2 \
    --no-micro --json "$R/h200_8b_bench.json"
  TAIL=14 run bench_8b_prefill 150 $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 \
    --batch-sizes 1 --prompts 2 --configs plain-compile-gemv-attn --max-new-tokens 64 --repeats 3 --no-micro \
    --compile-prefill --json "$R/h200_8b_bench_prefill.json"
  TAIL=40 run gemv_8b 60 python3 benchmarks/gemv_bench.py --json "$R/h200_gemv_8b.json"
  TAIL=40 run attn_kernel $(left) python3 benchmarks/attn_bench.py --json "$R/h200_attn_kernel.json"
}

stage_d() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call B"; exit 3; }
  TAIL=8 run probe_overhead 150 python3 benchmarks/probe_overhead.py --device cuda --steps 5 --topk 4 \
    --draft-tokens 16 --max-new-tokens 128 --repeats 7
  BENCH_EXTRA="--compile-prefill --batch-sizes 1,8" TAIL=24 speed_bench bench_4-4-12_prefill_b8 $(left) 4 4 12 $SHIPPED
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = B ] && echo 585 || echo 500)}; watchdog "$0"
run_stage A B C D
