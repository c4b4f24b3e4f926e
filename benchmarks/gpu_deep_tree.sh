#!/usr/bin/env bash
# A sixth draft step at batch 1 for the shipped drafter (the second sharpening batch's, since the evening of
# 2026-12-07): on the CPU, float32, 6/4/32 + a spilling lookup branch of 16 accepts 3.5% more than the profile's
# 5/4/24 + 16 on the 80 MT-bench first turns and 2.7% more on 40 HumanEval problems
# (benchmarks/results/cpu_2026-12-07d/); what the step and 8 more verified rows cost is a GPU's to say. Ran on one
# H100 (C x4, gpu_loop_gaps.sh I, D with D_PROFILE=0, P; benchmarks/results/h100_2026-12-07e/): 2.43x against 2.47x,
# a sixth step 45-51 us, so the profile keeps 5/4/24. Run from the
# repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging (benchmarks/README.md:
# five GGUF parts, .carry/mr1 .. mr5).
#
#   call P      carry .carry/assets .whl (no GGUF: SmolLM2's shape with random weights)   STAGE=P: `bench
#               --phase-costs` of plain decoding and each of P_TREES (default 5/4/24 6/4/32 6/4/24, each with a
#               spilling lookup branch of 16) at batch 1, one process a tree (~110 s the first process on a bare
#               machine, ~40-60 s each after)
#   calls C x4  carry .carry/mr1 .. .carry/mr4 (each with .whl)             STAGE=C: park a part of the GGUF
#   call D      carry .carry/mr5 .carry/assets .whl (right after the Cs)     STAGE=D: joins the GGUF; `bench --figures
#               --batch-sizes 1` at the profile's tree and at DEEP_TREE (default 6/4/32 + 16, spilling), one process
#               each (3 passes, plain in each, ~410 s; D_PROFILE=0: the deep tree alone, ~200 s)
# The shipped drafter's other missing figures take the existing stages on the same warm machine after the Cs (each
# joins the GGUF from the parked parts when it carries .carry/mr5): `bench --figures` at batch 1, 8 and 32 is
# benchmarks/gpu_loop_gaps.sh STAGE=I with FIG_NAME=figures_b1_8_32 FIG_EXTRA="--batch-sizes 1,8,32"; `eaglelab tune`
# (the deeper batch-1 candidates included, its profile brought back) is benchmarks/h200_tune_lookup.sh STAGE=T,
# then V for batch 8 and 32.
STAGE=${STAGE:?set STAGE=C, D or P}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}

stage_c() {
  park_parts
}

stage_d() {
  record_gpu
  if [ ! -f "$GGUF" ]; then
    [ "$(ls ~/m/smolpart_* 2>/dev/null | wc -l)" -ge 4 ] || { log "the machine went cold: run the four C calls first"; exit 3; }
    join_gguf
  fi
  local deep=${DEEP_TREE:---steps 6 --topk 4 --draft-tokens 32 --lookup-tokens 16 --lookup-spill}
  # D_PROFILE=0: the deep tree alone (the profile's tree measured by gpu_loop_gaps.sh STAGE=I on the same machine)
  [ "${D_PROFILE:-1}" = 1 ] && TAIL=30 run figures_b1 "$(( $(left) < 200 ? $(left) : 200 ))" $EL bench --figures --model default --draft $SHIPPED \
    --device "$DEVICE" --batch-sizes 1 --max-new-tokens 128 --json "$R/figures_b1.json"
  # shellcheck disable=SC2086
  TAIL=30 run figures_b1_deep "$(left)" $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1 --max-new-tokens 128 --json "$R/figures_b1_deep.json" $deep
}

stage_p() {
  record_gpu
  local t s k n
  for t in ${P_TREES:-5/4/24 6/4/32 6/4/24}; do
    [ "$(left)" -gt 40 ] || break
    IFS=/ read -r s k n <<< "$t"
    TAIL=14 run "phases_${s}-${k}-${n}" "$(left)" $EL bench --scale-model smollm2-135m --draft-vocab 12288 \
      --dtype bfloat16 --seed 0 --device "$DEVICE" --steps "$s" --topk "$k" --draft-tokens "$n" --lookup-tokens 16 \
      --lookup-spill --batch-sizes 1 --prompts 4 --max-new-tokens 64 --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/phases_${s}-${k}-${n}.json"
  done
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; *) echo 580;; esac)}; watchdog "$0"
run_stage C D P
