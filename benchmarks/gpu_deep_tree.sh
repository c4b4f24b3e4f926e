#!/usr/bin/env bash
# The shipped drafter (the second sharpening batch's, since the evening of 2026-12-07) as an H100 user meets it:
# its figures at batch 1, 8 and 32 under the profile it ships (the H200's stands in for Hopper), then `eaglelab tune`
# on this H100 (its own trees per batch size, written to the cache's profile), then the figures again and the
# served regime under that profile. Run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh
# (sourced) does the staging (benchmarks/README.md: five GGUF parts, .carry/mr1 .. mr5).
#
#   calls C x4  carry .carry/mr1 .. .carry/mr4 (each with .whl)             STAGE=C: park a part of the GGUF
#   call F      carry .carry/mr5 .carry/assets .whl (right after the Cs)     STAGE=F: joins the GGUF; `bench --figures`
#               at batch 1, 8 and 32 (80 MT-bench first turns, 40 HumanEval problems, 3 passes, no tree flag: the
#               profile the drafter ships, or the one T wrote); FIG_NAME names its files (figures_b1_8_32),
#               FIG_EXTRA adds flags (~330 s warm)
#   call D      carry .carry/mr5 .carry/assets .whl (right after the Cs)     STAGE=D: joins the GGUF; a deeper batch-1
#               tree against the profile's, each `bench --figures --batch-sizes 1` in its own process (3 passes,
#               plain in each): first the profile's tree (figures_b1), then DEEP_TREE (default 6/4/32 + a spilling
#               lookup branch of 16: on the CPU's replay of the 80 MT-bench first turns 6/4/32 accepts 6.1% more than
#               5/4/24 on the same cycles, 6/4/24 3.6%); then, as time allows, batch 8 and 32 under the profile
#               (one pass)
#   call P      carry .carry/assets .whl (no GGUF: SmolLM2's shape with random weights)   STAGE=P: `bench
#               --phase-costs` of plain decoding and each of P_TREES (default 5/4/24 6/4/32 6/4/24, each with a
#               spilling lookup branch of 16) at batch 1, one process a tree: what a sixth draft step and 8 more
#               verified rows cost, for the float32 acceptance on the CPU to turn into a speedup (~110 s the first
#               process on a bare machine, ~40-60 s each after)
#   call T      carry .carry/mr5 .carry/assets .whl                          STAGE=T: `eaglelab tune` at TUNE_BATCHES
#               (default 1) over TUNE_CANDIDATES (default: tune's own and deeper batch-1 trees), saved into this
#               machine's cache as the drafter's H100 profile (a second T at 8,32 merges into it); the profile file
#               and the tune's JSON and report come back
#   call E      carry .carry/mr5 .carry/assets .whl                          STAGE=E: served with rows ending at EOS
#               (`--continuous --eos`, up to 128 tokens) at E_BATCHES (default 8), the 80 MT-bench first turns,
#               3 passes, no tree flag
# Each later call joins the GGUF again if the machine went cold (it then needs the four C calls first).
STAGE=${STAGE:?set STAGE=C, F, D, P, T or E}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}
PROFILE_DIR=$EAGLELAB_CACHE/profiles

stage_c() {
  park_parts
}

need_model() {
  record_gpu
  [ -f "$GGUF" ] && return 0
  [ "$(ls ~/m/smolpart_* 2>/dev/null | wc -l)" -ge 4 ] || { log "the machine went cold: run the four C calls first"; exit 3; }
  join_gguf
}

keep_profiles() {  # the cache's tuned profiles (if any) beside the stage's results
  [ -d "$PROFILE_DIR" ] && cp -r "$PROFILE_DIR" "$R/profiles"
  return 0
}

stage_f() {
  need_model
  local name=${FIG_NAME:-figures_b1_8_32}
  TAIL=60 run "$name" "$(left)" $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1,8,32 --max-new-tokens 128 --json "$R/$name.json" ${FIG_EXTRA:-}
  keep_profiles
}

stage_d() {
  need_model
  local deep=${DEEP_TREE:---steps 6 --topk 4 --draft-tokens 32 --lookup-tokens 16 --lookup-spill}
  TAIL=30 run figures_b1 "$(( $(left) < 200 ? $(left) : 200 ))" $EL bench --figures --model default --draft $SHIPPED \
    --device "$DEVICE" --batch-sizes 1 --max-new-tokens 128 --json "$R/figures_b1.json"
  TAIL=30 run figures_b1_deep "$(( $(left) < 210 ? $(left) : 210 ))" $EL bench --figures --model default \
    --draft $SHIPPED --device "$DEVICE" --batch-sizes 1 --max-new-tokens 128 --json "$R/figures_b1_deep.json" $deep
  [ "$(left)" -gt 90 ] && TAIL=30 run figures_b8_32 "$(left)" $EL bench --figures --model default --draft $SHIPPED \
    --device "$DEVICE" --batch-sizes 8,32 --repeats 1 --max-new-tokens 128 --json "$R/figures_b8_32.json"
  keep_profiles
}

stage_p() {
  record_gpu
  local t
  for t in ${P_TREES:-5/4/24 6/4/32 6/4/24}; do
    [ "$(left)" -gt 40 ] || break
    IFS=/ read -r s k n <<< "$t"
    TAIL=14 run "phases_${s}-${k}-${n}" "$(left)" $EL bench --scale-model smollm2-135m --draft-vocab 12288 \
      --dtype bfloat16 --seed 0 --device "$DEVICE" --steps "$s" --topk "$k" --draft-tokens "$n" --lookup-tokens 16 \
      --lookup-spill --batch-sizes 1 --prompts 4 --max-new-tokens 64 --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/phases_${s}-${k}-${n}.json"
  done
}

stage_t() {
  need_model
  local b=${TUNE_BATCHES:-1} name
  name=tune_b${b//,/_}
  local cands=${TUNE_CANDIDATES:-}
  [ -z "$cands" ] && [ "$b" = 1 ] && cands=3/1/4,4/4/12,5/4/16,5/4/24,5/4/32,6/4/24,6/4/32
  TAIL=60 run "$name" "$(left)" $EL tune --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes "$b" \
    ${cands:+--candidates $cands} --record "$R/$name.jsonl" --json "$R/$name.json" ${TUNE_EXTRA:-}
  keep_profiles
}

stage_e() {
  need_model
  local b=${E_BATCHES:-8}
  TAIL=40 run "served_eos_b${b//,/_}" "$(left)" $EL bench --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes "$b" --prompts 80 --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro \
    --continuous --eos --max-new-tokens 128 --json "$R/served_eos_b${b//,/_}.json" ${E_EXTRA:-}
  keep_profiles
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; *) echo 580;; esac)}; watchdog "$0"
run_stage C F D P T E
