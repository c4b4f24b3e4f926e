#!/usr/bin/env bash
# A batch that sheds its ended rows onto a smaller batch bucket (engine/runtime/shrink.py), measured (issue 40): at
# batch 8 with EOS ignored ~19-24% of the speculative rows x cycles made nothing (a group runs until its slowest row
# has its 128 tokens; benchmarks/results/cpu_2026-12-07e/); shed, those cycles run on the buckets 4, 2, 1. Then the
# prompt's phases compiled at batch 1 (`--compile-prefill`), against the default on the same machine. Run from the
# repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging (benchmarks/README.md: five
# GGUF parts, .carry/mr1 .. mr5).
#
#   calls C x4  carry .carry/mr1 .. .carry/mr4 (each with .whl)             STAGE=C: park a part of the GGUF
#   call T      carry .carry/mr5 .carry/assets .whl (right after the Cs)     STAGE=T: joins the GGUF; the GPU tests of
#               a shrinking batch, continuous batching and the loop (real CUDA graphs); then `bench --figures
#               --batch-sizes 8,32` (80 MT-bench first turns and 40 HumanEval problems, 3 passes) with rows shed
#   call W      carry .carry/assets .whl (the same warm machine)             STAGE=W: the same figures with every
#               batch kept whole until its last row ends (benchmarks/ab_constants.py --shrink off)
#   call S      carry .carry/mr5 .carry/assets .whl (right after the Cs)     STAGE=S: `bench` at batch 8 and 32 on
#               the 80 MT-bench first turns, plain, shed (spec-compile-gemv-attn) and whole (its `-whole` twin)
#               interleaved in one process, 3 passes (T and W ran with bench capturing only the buckets 8 and 32,
#               so batch 8 never shed: bench captures every power of two since)
#   call B      carry .carry/assets .whl (the same warm machine)             STAGE=B: `bench --figures --batch-sizes
#               1` as it is, then with `--compile-prefill` (each its own process; 3 passes)
STAGE=${STAGE:?set STAGE=C, T, W, S or B}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}

stage_c() {
  park_parts
}

need_gguf() {
  [ -f "$GGUF" ] && return 0
  [ "$(ls ~/m/smolpart_* 2>/dev/null | wc -l)" -ge 4 ] || { log "the machine went cold: run the four C calls first"; exit 3; }
  join_gguf
}

figures() {  # NAME LIMIT "COMMAND PREFIX" BENCH_FLAGS...: `bench --figures` of the shipped drafter, 128 tokens
  local name=$1 limit=$2 prefix=$3; shift 3
  # shellcheck disable=SC2086
  TAIL=${FIG_TAIL:-40} run "$name" "$limit" $prefix bench --figures --model default --draft $SHIPPED \
    --device "$DEVICE" --max-new-tokens 128 --json "$R/$name.json" ${FIG_EXTRA:-} "$@"
}

stage_t() {
  record_gpu
  need_gguf
  TAIL=25 run gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_shrink.py \
    tests/engine/runtime/test_serve.py tests/engine/runtime/test_loop.py
  figures figures_b8_32_shed "$(left)" "$EL" --batch-sizes 8,32
}

stage_w() {
  record_gpu
  need_gguf
  figures figures_b8_32_whole "$(left)" "python3 benchmarks/ab_constants.py --shrink off --" --batch-sizes 8,32
}

# S: batch 8 and 32 (the profile's trees), plain, shed and whole interleaved in one bench process (80 MT-bench first
# turns, 3 passes): the A/B on the same clock
stage_s() {
  record_gpu
  need_gguf
  TAIL=60 run bench_b8_32 "$(left)" $EL bench --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes 8,32 \
    --prompts 80 --max-new-tokens 128 --repeats 3 --no-micro --json "$R/bench_b8_32.json" \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn,spec-compile-gemv-attn-whole
}

stage_b() {
  record_gpu
  need_gguf
  figures figures_b1 "$(( $(left) < 230 ? $(left) : 230 ))" "$EL" --batch-sizes 1
  figures figures_b1_compiled_prompt "$(left)" "$EL" --batch-sizes 1 --compile-prefill
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; *) echo 580;; esac)}; watchdog "$0"
run_stage C T W S B
