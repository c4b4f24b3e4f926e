#!/usr/bin/env bash
# The ninth session's GPU batch (2026-12-01) on ONE H200 (device kind nvidia-h200), for #12: h200_v15.sh as planned
# by the eighth session, its stages reordered so that the 24-prompt bench comes first and `run`'s host time is
# profiled. The eighth session measured 1.81x over 24 MT-bench prompts (5/4/24, the prompt compiled) and `eaglelab
# run --compare` at 0.66-0.98x for a prompt bench times at ~2x. Landed after its last call, unmeasured: the result
# read in a few copies (was two syncs a cycle), the observed pass as long as the timed ones, `run`'s warm-up of two
# cycles and a garbage collection after captures that compiled.
#   - A: the GGUF's part 1 parked; each phase of a 5/4/24 cycle profiled kernel by kernel on SmolLM2's shape (random
#     weights, the shipped drafter's 12,288-token draft vocabulary; its compiles warm inductor's cache for B).
#   - B: join; the 24-prompt bench at 5/4/24 (the read-back change); `run --compare` on question 81 with a record
#     (per-cycle host stamps: a gap between cycles shows there).
#   - C (right after B): the same run under cProfile (where the host's time goes between cycles: the spec run spent
#     65-130 ms beyond its ~46 ms of cycles); 5/8/32 over 24 prompts (the CPU's trees: accepts 3.38 against 3.20 at
#     5/4/24); question 82 with a record.
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
#   call C  carry .carry/shipped .carry/assets .whl              STAGE=C
# The GGUF's parts: `xz -6` of it split at 58,000,000 bytes (part 1 with the tree is under 64 MiB; part 2 leaves room
# for the shipped drafter, moved out of the tree for the calls).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  spec_profile 5 4 24
}

profiled_run() {  # NAME LIMIT PROMPT: `run` under cProfile, its 40 costliest functions by own and by total time
  TAIL=40 run "$1" "$2" python3 -m cProfile -o "$R/$1.prof" -m eaglelab run $RUN_ARGS "$3"
  python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(40); s.sort_stats('cumulative').print_stats(60)" \
    "$R/$1.prof" > "$R/$1_stats.txt" 2>&1 && rm -f "$R/$1.prof"
}

stage_b() {  # cold compiles: the bench pair took ~400 s from a cold cache in the eighth session
  join_gguf
  fair_cp p24_5-4-24_cp 420 5 4 24
  compare_run run_compare_q81 $(left) "$Q81"
}

stage_c() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call B"; exit 3; }
  profiled_run run_q81_cprofile 150 "$Q81"
  fair_cp p24_5-8-32_cp 330 5 8 32
  compare_run run_compare_q82 $(left) "$Q82"
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 280 || echo 585)}; watchdog "$0"
run_stage A B C
