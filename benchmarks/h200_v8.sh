#!/usr/bin/env bash
# The GPU batch of 2026-12-01 (fifth session) on ONE H200 (device kind nvidia-h200): the plan of the fourth session (never run)
# plus the ONE-GRAPH CYCLE (#12): the whole speculative cycle (draft, verify, accept, draft-extend, advance) replayed
# as one CUDA graph, against the same cycle as five graphs (config spec-phases-gemv-attn; it ran as
# spec-compile-gemv-attn-phases, renamed after), same process:
#   - A: the GGUF's part 1 and last sessions' prompts parked; the draft phase profiled at the shipped head's 12,288
#     draft tokens and at 32,000 (the two-stage top-k, not yet measured on a GPU); the runtime's GPU tests (the one-graph
#     cycle's real capture with external timing events among them);
#   - B: speed bench 6/4/16 with the shipped drafter (plain, one-graph cycle, a graph per phase); then for #13 the
#     WIDE drafter (INTERMEDIATE 2304 x VOCAB 10240, 24.76 MB, warm-started function-preservingly from the shipped
#     one) distilled on the 220,324 target-written prompts of the last two sessions and trained (piece 1);
#   - C: its training resumed (piece 2), exported, acceptance benches (MT-bench chain 3 and tree 8/8/64, HumanEval
#     chain 3), its speed bench;
#   - D (if device time is left, machine still warm): speed benches 5/4/16 and 8/8/64 with the shipped drafter.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
# Before (here, CPU): .carry/m1/smolpart_00 + .carry/m2/smolpart_01 (the GGUF, xz, split); the big tracked files
# moved out of the tree (the shipped drafter travels as .carry/shipped); .carry/synth_sys (163,968 prompts written
# under 30 system messages: prompts.jsonl.xz, 7.4 MB, + manifest.json) and .carry/synth (56,356, 3.7 MB; parked in
# call A: call B's carry would pass 64 MiB); .carry/assets; .whl.
#
#   call A  carry .carry/m1 .carry/synth .carry/assets .whl                     STAGE=A
#   call B  carry .carry/m2 .carry/shipped .carry/synth_sys .carry/assets .whl  STAGE=B
#   call C  carry .carry/shipped .carry/assets .whl                             STAGE=C
#   call D  carry .carry/shipped .carry/assets .whl                             STAGE=D  (the GGUF still in the cache)
# Knobs: INTERMEDIATE (2304), VOCAB (10240), DISTILL_S (240), STAGE_S, BENCH_S, SPEED_S.
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter3
ALL3=plain-compile-gemv-attn,spec-compile-gemv-attn,spec-phases-gemv-attn
export INTERMEDIATE=${INTERMEDIATE:-2304} VOCAB=${VOCAB:-10240}

stage_a() {
  record_gpu
  mkdir -p ~/m ~/synth_prev && cp .carry/m1/smolpart_00 ~/m/ && cp .carry/synth/* ~/synth_prev/ && log "part 1 and the prompts parked"
  for v in 12288 32000; do
    TAIL=40 run "spec_profile_v$v" 140 $EL bench --scale-model smollm2-135m --draft-vocab $v --steps 6 --topk 4 \
      --draft-tokens 16 --batch-sizes 1 --configs spec-compile-gemv-attn --profile --prompts 2 --max-new-tokens 64 \
      --no-micro --json "$R/h200_spec_profile_v$v.json"
  done
  TAIL=15 run gpu_tests $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime
}

stage_b() {
  join_gguf
  mkdir -p ~/synth_sys && cp .carry/synth_sys/manifest.json ~/synth_sys/ \
    && xz -dc .carry/synth_sys/prompts.jsonl.xz | gzip -1 > ~/synth_sys/prompts.jsonl.gz || exit 1
  TAIL=20 CONFIGS=$ALL3 speed_bench bench_6-4-16_shipped 170 6 4 16 $SHIPPED
  SYNTH_N=0 DISTILL_S=${DISTILL_S:-240} N_PROMPTS=1000000 PROMPTS="$HOME/synth_sys $HOME/synth_prev" \
    TOTAL_STEPS=${TOTAL_STEPS:-4000} drafter_stage1
}

stage_c() {
  drafter_stage2 "new:mtbench:chain3 new:mtbench:tree8-8-64 new:humaneval:chain3" ${SPEED_S:-130}  # then the speed bench below
  [ -f "$W/drafter/config.json" ] && TAIL=16 speed_bench bench_6-4-16_wide 120 6 4 16 "$W/drafter"
}

stage_d() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold"; exit 3; }
  TAIL=16 speed_bench bench_5-4-16_shipped 110 5 4 16 $SHIPPED
  TAIL=16 speed_bench bench_8-8-64_shipped $(left) 8 8 64 $SHIPPED
}

before_tar() { keep_drafter_shards; }

export STAGE_S=${STAGE_S:-$(case $STAGE in A) echo 330;; D) echo 240;; *) echo 585;; esac)}; watchdog "$0"
run_stage A B C D
