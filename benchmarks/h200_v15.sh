#!/usr/bin/env bash
# The next GPU batch (planned 2026-12-01, eighth session; NOT YET RUN) on ONE H200 (device kind nvidia-h200), for #12.
# The eighth session measured 1.81x over 24 MT-bench prompts (5/4/24, the prompt compiled; h200_2026-12-01h) and
# found `eaglelab run --compare` still reading 0.66-0.98x for a prompt bench times at ~2x. Landed after its last
# call, unmeasured: `run` warms up two cycles before its clock starts, and a capture that compiled ends with a full
# garbage collection inside its set-up time. This batch checks both, and profiles the cycle for the next cut.
#   - A: the GGUF's part 1 parked; each phase of a 5/4/24 speculative cycle profiled kernel by kernel on SmolLM2's
#     shape (random weights: `bench --scale-model smollm2-135m --profile`; carries the MT-bench questions, which
#     the eighth session's call A lacked).
#   - B: join; `run --compare` on questions 81 and 82 (the eighth session: 0.66-0.98x and 0.81x), each with a
#     record, whose per-cycle host stamps show any gap between cycles. D (optional): 5/4/24 at batch 8.
# Budget: A ~280 s, B ~560 s (cold compiles: a `run` with the prompt compiled takes ~170 s of set-up the first
# time, ~85 s from the disk cache; give each command its own generous limit, as the eighth session's B overran).
#
#   - C (right after B, the GGUF and the compile cache still there): 5/8/32 over 24 prompts at batch 1, the prompt
#     compiled, beside 5/4/24 again (`cpu_2026-12-01h_trees`: 5/8/32 accepts 3.38 against 3.20; predicted ~+3%).
#
#   call A  carry .carry/m1 .carry/assets .whl                   STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B
#   call C  carry .carry/shipped .carry/assets .whl              STAGE=C
#   call D  carry .carry/shipped .carry/assets .whl              STAGE=D   (batch 8, if time is left)
STAGE=${STAGE:?set STAGE=A, B, C or D}
source "$(dirname "$0")/device_stage.sh"

stage_a() {
  record_gpu
  park_part1
  spec_profile 5 4 24
}

stage_b() {
  join_gguf
  compare_run run_compare_q81 320 "$Q81"  # cold: ~170 s of set-up for the speculative engine, ~60 s for plain
  compare_run run_compare_q82 $(left) "$Q82"
}

stage_d() {  # batch 8, if device time is left after C
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold"; exit 3; }
  TAIL=24 run p24_5-4-24_b8_cp $(left) $EL bench --model default --draft $SHIPPED --steps 5 --topk 4 --draft-tokens 24 \
    --batch-sizes 8 --prompts 24 --max-new-tokens 128 --repeats 2 --no-micro --compile-prefill \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/h200_smollm2_p24_5-4-24_b8_cp.json"
}

stage_c() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call B"; exit 3; }
  fair_cp p24_5-8-32_cp 330 5 8 32
  fair_cp p24_5-4-24_cp $(left) 5 4 24
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 280 || echo 585)}; watchdog "$0"
run_stage A B C D
