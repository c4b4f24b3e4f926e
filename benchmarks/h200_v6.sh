#!/usr/bin/env bash
# The GPU batch of 2026-12-01 (fourth session) on ONE H200 (device kind nvidia-h200): the draft phase without
# ATen's top-k and sort kernels (the tree now ranks with fused reductions), profiled phase by phase and benched
# against plain decoding; a fifth drafter trained on more of the target's own prompts, written under 30 kinds of
# system message (`synthesize --systems-file benchmarks/synth_systems.txt`) besides the 56k of the last session.
# Back-to-back device calls from the repo root; the machine stays warm ~30 s between calls, so ~ (the GGUF's first
# part, then the distilled token ids and the training checkpoint) survives only when the next call follows at once.
#
# Before (here, CPU): the GGUF xz'd and split: .carry/m1/smolpart_00 (60,000,000 B), .carry/m2/smolpart_01; the big
# tracked files moved out of the tree (the shipped drafter travels as .carry/shipped); .carry/synth: the 56,356
# target-written prompts of the last session; .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz; .whl.
#
#   call A  carry .carry/m1 .carry/assets .whl           STAGE=A  park GGUF part 1; bench --profile of a speculative
#                                                                cycle (SmolLM2 shape, random weights, tree 6/4/16,
#                                                                compiled + GEMV + decode attention), as the last
#                                                                session's (draft then: 257 kernels, 505 us); the GPU
#                                                                tests of the runtime
#   call B  carry .carry/m2 .carry/shipped .carry/synth .carry/assets .whl
#                                                       STAGE=B  GGUF joined; h200_drafter3.sh stage 1: synthesis under
#                                                                the system messages, distill (new + last session's
#                                                                target-written prompts), a first training piece
#   call C  carry .carry/shipped .carry/assets .whl      STAGE=C  stage 2 (training resumed, export, MT-bench chain 3 and
#                                                                tree 8/8/64, HumanEval chain 3); bench tree 6/4/16
#                                                                with every kernel on, spec against plain, one process
# Everything lands in $OUT/results_$STAGE.tar.gz (the drafter's two shards beside it).
# Knobs: STAGE_S, SYNTH_N, SYNTH_S, DISTILL_S, TOTAL_STEPS (B), BENCH_S and SPEED_S (C).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter3  # h200_drafter3.sh's work folder (token ids, checkpoints, the drafter)

stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  # 1. a speculative cycle phase by phase and kernel by kernel (random weights: costs only), the last session's command
  TAIL=90 run spec_profile 230 $EL bench --scale-model smollm2-135m --steps 6 --topk 4 --draft-tokens 16 --batch-sizes 1 \
    --configs spec-compile-gemv-attn --profile --prompts 2 --max-new-tokens 64 --no-micro --json "$R/h200_spec_profile.json"
  # 2. the runtime's GPU tests (the tree's ranking runs in every compiled draft phase) in what is left
  TAIL=15 run gpu_tests $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime tests/engine/model
}

stage_b() {
  join_gguf
  SYNTH_N=${SYNTH_N:-200000} SYNTH_S=${SYNTH_S:-170} SYNTH_SEED=7 SYNTH_SYSTEMS=benchmarks/synth_systems.txt \
    DISTILL_S=${DISTILL_S:-170} N_PROMPTS=1000000 PROMPTS=.carry/synth TOTAL_STEPS=${TOTAL_STEPS:-3400} drafter_stage1
}

stage_c() {
  drafter_stage2 "new:mtbench:chain3 new:mtbench:tree8-8-64 new:humaneval:chain3" ${SPEED_S:-130}  # then the speed bench below
  local draft=$SHIPPED; [ -f "$W/drafter/config.json" ] && draft=$W/drafter
  speed_bench bench_6-4-16 $(left) 6 4 16 "$draft"
}

before_tar() { keep_drafter_shards; }

export STAGE_S=${STAGE_S:-$([ "$STAGE" = A ] && echo 330 || echo 585)}; watchdog "$0"
run_stage A B C
