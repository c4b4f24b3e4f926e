#!/usr/bin/env bash
# The next GPU batch (planned 2026-12-01, fourth session; not yet run) on ONE H200 (device kind nvidia-h200):
#   - the draft phase profiled with the shipped head's 12,288-token vocabulary (`bench --draft-vocab`) and with the
#     random drafter's default 32,000, where `top_k` now ranks in two stages (the fourth session measured one
#     pass there: ~29 us a step);
#   - speed benches, the shipped drafter, tree 6/4/16 and 5/4/16 (the fourth session: 1.82x, 1.86x);
#   - CAPACITY for #13: a drafter with a wider MLP paid for with draft-vocabulary rows (INTERMEDIATE 2304,
#     VOCAB 10240: 24.76 MB, the shipped 1536 x 12,288 is 24.48 MB), warm-started function-preservingly from the
#     shipped one, on the 220,324 target-written prompts of the last two sessions (no new synthesis). Why not
#     2816 x 8,192 (24.15 MB): the shipped 12,288 tokens hold only 95.6% of plain greedy's MT-bench answer tokens
#     (93.4% STEM, 93.8% extraction; `cpu_2026-12-01d`), and every token outside them is a sure rejection.
# Back-to-back device calls from the repo root (the machine stays warm ~30 s between calls).
#
# Before (here, CPU): .carry/m1/smolpart_00 + .carry/m2/smolpart_01 (the GGUF, xz, split); the big tracked files
# moved out of the tree (the shipped drafter travels as .carry/shipped); .carry/synth_sys (163,968 prompts written
# under 30 system messages: prompts.jsonl.xz, 7.4 MB, + manifest.json) and .carry/synth (56,356, 3.7 MB; parked in
# call A: call B's carry would pass 64 MiB); .carry/assets; .whl.
#
#   call A  carry .carry/m1 .carry/synth .carry/assets .whl                     STAGE=A  (66.2 MB with the tree)
#   call B  carry .carry/m2 .carry/shipped .carry/synth_sys .carry/assets .whl  STAGE=B  (64.9 MB)
#   call C  carry .carry/shipped .carry/assets .whl                             STAGE=C
# Knobs: INTERMEDIATE (2304), VOCAB (10240), DISTILL_S (240), STAGE_S, BENCH_S, SPEED_S.
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter3
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
  TAIL=16 speed_bench bench_6-4-16_shipped 120 6 4 16 $SHIPPED
  TAIL=16 speed_bench bench_5-4-16_shipped 120 5 4 16 $SHIPPED
  SYNTH_N=0 DISTILL_S=${DISTILL_S:-240} N_PROMPTS=1000000 PROMPTS="$HOME/synth_sys $HOME/synth_prev" \
    TOTAL_STEPS=${TOTAL_STEPS:-4000} drafter_stage1
}

stage_c() {
  drafter_stage2 "new:mtbench:chain3 new:mtbench:tree8-8-64 new:humaneval:chain3" ${SPEED_S:-130}  # then the speed bench below
  [ -f "$W/drafter/config.json" ] && TAIL=16 speed_bench bench_6-4-16_wide 120 6 4 16 "$W/drafter"
}

before_tar() { keep_drafter_shards; }

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 330 || echo 585)}; watchdog "$0"
run_stage A B C
