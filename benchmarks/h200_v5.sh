#!/usr/bin/env bash
# The GPU batch of 2026-12-01 (third session) on ONE H200 (device kind nvidia-h200): the fourth drafter, trained on
# prompts the target writes itself (`eaglelab synthesize`) plus the corpus prompts drafter3 never answered; the
# speculative phases profiled kernel by kernel; the GPU tests after the last review's mends. Back-to-back device
# calls from the repo root; the machine stays warm ~30 s between calls, so ~ (the GGUF's first part, then the
# distilled token ids and the training checkpoint) survives only when the next call follows at once.
#
# Before (here, CPU):
#   the GGUF xz'd and split 60,000,000 + rest: .carry/m1/smolpart_00, .carry/m2/smolpart_01 (a call carries at most
#     64 MiB with the tree); the big tracked files moved out of the tree for the batch (the shipped drafter travels
#     as .carry/shipped); .carry/prompts_rest: records 100000.. of the corpus-v3 prompts file (drafter3 answered the
#     first 100k); .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz; .whl: the gguf wheel
#
#   call A  carry .carry/m1 .carry/assets .whl           STAGE=A  park GGUF part 1; bench --profile of a speculative
#                                                                cycle (SmolLM2 shape, random weights, tree 6/4/16,
#                                                                compiled + GEMV + decode attention): the draft
#                                                                phase kernel by kernel; every GPU test
#   call B  carry .carry/m2 .carry/shipped .carry/prompts_rest .carry/assets .whl
#                                                       STAGE=B  GGUF joined; h200_drafter3.sh stage 1 with SYNTH_N:
#                                                                the target writes prompts, distill answers them and
#                                                                the rest of the corpus, a first training piece
#   call C  carry .carry/shipped .carry/assets .whl      STAGE=C  h200_drafter3.sh stage 2 (training resumed, export,
#                                                                MT-bench chain 3 and tree 8/8/64, HumanEval chain 3);
#                                                                then bench tree 6/4/16 with every kernel on, the new
#                                                                drafter against plain in the same process
# Everything lands in $OUT/results_$STAGE.tar.gz (the drafter's two shards beside it). Knobs: STAGE_S, SYNTH_N,
# SYNTH_S, DISTILL_S, TOTAL_STEPS (B), BENCH_S and SPEED_S (C).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter3  # h200_drafter3.sh's work folder (token ids, checkpoints, the drafter)

stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  # 1. where a speculative cycle's time goes, phase by phase and kernel by kernel (random weights: costs only)
  TAIL=80 run spec_profile 170 $EL bench --scale-model smollm2-135m --steps 6 --topk 4 --draft-tokens 16 --batch-sizes 1 \
    --configs spec-compile-gemv-attn --profile --prompts 2 --max-new-tokens 64 --no-micro --json "$R/h200_spec_profile.json"
  # 2. every GPU test (the review's mends: the GEMV tuner's timer, the shared compile-and-capture check) in what is
  #    left; the incident example needs the default model, which arrives in call B
  TAIL=15 run gpu_tests $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/tui \
    --deselect tests/examples/test_incidents.py::test_verify_eager_example_on_gpu_names_verify_as_the_cause
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
