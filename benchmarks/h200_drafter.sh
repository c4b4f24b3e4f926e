#!/usr/bin/env bash
# The shipped EAGLE-3 drafter for SmolLM2-135M-Instruct (the fourth of its line), made on ONE H200 (device kind
# nvidia-h200) in three back-to-back device calls run from the repo root: this script ran as the third session's
# batch of 2026-12-01 (then named h200_v5.sh; raw output in benchmarks/results/h200_2026-12-01c/). Its call A then
# also profiled the engine and ran the GPU tests; those measured the engine, not the drafter, and are left out here.
# The training itself is benchmarks/drafter_stages.sh (stage 1: the target writes prompts, distill answers them, a
# first training piece; stage 2: training resumed, export, acceptance benches), driven through device_stage.sh.
# The machine stays warm ~30 s between calls, so ~ (the GGUF's first part, then the distilled token ids and the
# training checkpoint) survives only when the next call follows at once.
#
# Before (on any machine, CPU), besides what every batch carries (benchmarks/README.md):
#   python -m eaglelab prompts --out .carry/prompts --count 140000
#   .carry/prompts_rest: records 100,000.. of that file (the third drafter answered the first 100k):
#     mkdir -p .carry/prompts_rest && python3 -c "import gzip, itertools; src = gzip.open('.carry/prompts/prompts.jsonl.gz', 'rt'); \
#       gzip.open('.carry/prompts_rest/prompts.jsonl.gz', 'wt').writelines(itertools.islice(src, 100000, None))"
# The warm start is the drafter in the tree (INIT, default the shipped fourth); the fourth itself was warm-started
# from the third (`git show dca0b33:eaglelab/drafters/smollm2-135m-eagle3/...`): set INIT to a copy of it to retrace it.
#
#   call A  carry .carry/m1 .whl                                           STAGE=A  park the GGUF's part 1
#   call B  carry .carry/m2 .carry/shipped .carry/prompts_rest .carry/assets .whl
#                                                       STAGE=B  GGUF joined; drafter_stages.sh stage 1 with SYNTH_N:
#                                                                the target writes prompts, distill answers them and
#                                                                the rest of the corpus, a first training piece
#   call C  carry .carry/shipped .carry/assets .whl      STAGE=C  drafter_stages.sh stage 2 (training resumed, export,
#                                                                MT-bench chain 3 and tree 8/8/64, HumanEval chain 3);
#                                                                then bench tree 6/4/16 with every kernel on, the new
#                                                                drafter against plain in the same process
# Everything lands in $OUT/results_$STAGE.tar.gz (the drafter's shards beside it). Knobs: STAGE_S, SYNTH_N,
# SYNTH_S, DISTILL_S, TOTAL_STEPS (B), BENCH_S and SPEED_S (C); drafter_stages.sh's own (INIT, VOCAB, ...).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter3  # drafter_stages.sh's work folder (token ids, checkpoints, the drafter)

stage_a() {
  record_gpu
  park_part1
}

stage_b() {
  join_gguf
  # synthesis ~SYNTH_S, distill ~DISTILL_S (+ loading), the rest of the stage trains (schedule guess: TOTAL_STEPS)
  SYNTH_N=${SYNTH_N:-120000} SYNTH_S=${SYNTH_S:-130} DISTILL_S=${DISTILL_S:-230} N_PROMPTS=1000000 \
    PROMPTS=.carry/prompts_rest TOTAL_STEPS=${TOTAL_STEPS:-3400} drafter_stage1
}

stage_c() {
  drafter_stage2 "new:mtbench:chain3 new:mtbench:tree8-8-64 new:humaneval:chain3" ${SPEED_S:-120}  # then the speed bench below
  local draft=$SHIPPED; [ -f "$W/drafter/config.json" ] && draft=$W/drafter
  speed_bench bench_6-4-16 $(left) 6 4 16 "$draft"
}

before_tar() { keep_drafter_shards; }

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 330 || echo 585)}; watchdog "$0"
run_stage A B C
