#!/usr/bin/env bash
# The second drafter: chat-heavy prompts distilled by the target, a 12,288-token draft vocabulary, warm-started
# from the shipped drafter; two stages on ONE GPU (the caller sets CUDA_VISIBLE_DEVICES), results under $1.
#
#   STAGE=1 bash benchmarks/h200_drafter2.sh RESULTS_DIR   (<= 440 s) distill the prompts; first training piece
#   STAGE=2 bash benchmarks/h200_drafter2.sh RESULTS_DIR   (<= 520 s) resume training; export; measure
#
# Before (CPU, here): python -m eaglelab prompts --out .carry/prompts --count 150000   (8 MiB, ~3 min; carry it
# in the call of stage 1). The caller has the GGUF in the eaglelab cache and question.jsonl / HumanEval.jsonl.gz
# in the cache's assets (benchmarks/h200x2_batch.sh does both). Stage 2 needs ~ from stage 1 (the token ids and
# the checkpoint): the two calls must follow each other while the machine is warm.
#
# Why these numbers (H200, last session: distill 55k new tok/s at batch 512, training ~12 steps/s at batch 32):
#   N_PROMPTS 80000 x MAX_NEW 192: ~13M answer tokens, ~240 s of distill (the whole 150k would not fit with
#     training); the prompt file is shuffled, so the first 80k keep every source's share. The distill runs the
#     shortest prompts first: a stop at DISTILL_S would drop the longest, so the count leaves a margin.
#   VOCAB 12288: the shipped 8,192 leaves 8.3% of the target's MT-bench answer tokens outside the draft vocabulary
#     (18% on writing, 17% on extraction; benchmarks/drafter_diagnose.py); 12,288 is the most that keeps the drafter under 25 MB in bf16 (24.5 MB).
#   TOTAL_STEPS 3600 at batch 32 (~115k sequences, ~1.4 epochs): the LR schedule ends (LR 0) at the last step of
#     TRAIN1_S + TRAIN2_S seconds of training at ~12 steps/s; warm start from the shipped drafter, LR 3e-4.
#   Benches: chain 3 (--steps 3 --topk 1 --draft-tokens 4, the issue's chain) and tree 6/4/16 on MT-bench, chain 3 on
#     HumanEval, 50 prompts x 128 new tokens at batch 1, each against plain decoding in the same run; the shipped
#     drafter's MT-bench chain 3 in the same run as the baseline.
#
# Knobs: N_PROMPTS MAX_NEW DISTILL_BS DISTILL_S TRAIN1_S TRAIN2_S TOTAL_STEPS TRAIN_BS LR VOCAB EVAL_N ACC_PROMPTS
# BENCH_NEW DEVICE (cuda) DTYPE (bfloat16) PROMPTS (.carry/prompts) INIT (the shipped drafter) WORK (~/drafter2).
set -u
STAGE=${STAGE:?set STAGE=1 or 2}
RES=${1:?usage: STAGE=1|2 bash benchmarks/h200_drafter2.sh RESULTS_DIR}
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
export PYTHONUNBUFFERED=1
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T0=$(date +%s)
log() { echo "[drafter2 $STAGE $(( $(date +%s) - T0 ))s] $*" | tee -a "$RES/log.txt"; }
# run NAME LIMIT CMD...: bounded; whole output in $RES/NAME.txt, its tail echoed
run() { local name=$1 limit=$2; shift 2; log "$name"; timeout "$limit" "$@" > "$RES/$name.txt" 2>&1; log "$name rc=$?"; tail -${TAIL:-12} "$RES/$name.txt"; }
EL="python3 -m eaglelab"
DEV=${DEVICE:-cuda} DT=${DTYPE:-bfloat16}
SHIPPED=eaglelab/drafters/smollm2-135m-eagle3
W=${WORK:-$HOME/drafter2}; DATA=$W/distill CK=$W/ck D=$W/drafter
TRAIN=(--online --target default --data "$DATA" --out "$D" --checkpoint-dir "$CK" --init-from "${INIT:-$SHIPPED}"
  --total-steps "${TOTAL_STEPS:-3600}" --batch-size "${TRAIN_BS:-32}" --lr "${LR:-3e-4}" --warmup-ratio 0.02
  --max-grad-norm 0.5 --ttt-length 7 --draft-vocab-size "${VOCAB:-12288}" --max-length 1024 --checkpoint-every 200
  --log-every 50 --eval-every 400 --eval-samples "${EVAL_N:-512}" --tensorboard "$RES/tb" --device "$DEV"
  --dtype "$DT" --save-dtype bfloat16)

stage_1() {
  { nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"; } > "$RES/gpu.txt" 2>&1
  cp "${PROMPTS:-.carry/prompts}/manifest.json" "$RES/prompts_manifest.json" 2>/dev/null
  TAIL=6 run distill $(( ${DISTILL_S:-270} + 45 )) $EL distill --prompts "${PROMPTS:-.carry/prompts}" --out "$DATA" \
    --limit "${N_PROMPTS:-80000}" --max-new-tokens "${MAX_NEW:-192}" --batch-size "${DISTILL_BS:-512}" \
    --max-prompt-tokens 512 --time-limit "${DISTILL_S:-270}" --device "$DEV" --dtype "$DT"
  cp "$DATA/distill.json" "$RES/" 2>/dev/null
  TAIL=20 run train_1 $(( ${TRAIN1_S:-70} + 60 )) $EL train "${TRAIN[@]}" --time-limit "${TRAIN1_S:-70}"
}

stage_2() {
  if [ ! -d "$DATA/shards" ]; then
    log "no token ids in $W: the machine went cold after stage 1; run stage 1 again"; exit 3
  fi
  local resume=(); [ -n "$(ls "$CK"/step_*.pt 2>/dev/null)" ] && resume=(--resume)  # none: stage 1 was cut early
  TAIL=20 run train_2 $(( ${TRAIN2_S:-230} + 60 )) $EL train "${TRAIN[@]}" "${resume[@]}" --time-limit "${TRAIN2_S:-230}"
  export_drafter
  TAIL=6 run check_wiring 60 $EL check-wiring "$D" --device "$DEV"
  bench new mtbench chain3 3 1 4
  bench new mtbench tree6-4-16 6 4 16
  bench new humaneval chain3 3 1 4
  bench shipped mtbench chain3 3 1 4
}

bench() {  # WHICH SET NAME STEPS TOPK DRAFT_TOKENS
  local draft=$D; [ "$1" = shipped ] && draft=$SHIPPED
  TAIL=2 run "acc_$1_$2_$3" 90 python3 benchmarks/drafter_acceptance.py --set "$2" --draft "$draft" --steps "$4" \
    --topk "$5" --draft-tokens "$6" --prompts "${ACC_PROMPTS:-50}" --max-new-tokens "${BENCH_NEW:-128}" \
    --device "$DEV" --dtype "$DT" --json "$RES/acc_$1_$2_$3.json"
}

export_drafter() {  # $RES/export: the drafter in two shards under 16 MiB each (lm_head alone in the first)
  python3 benchmarks/export_drafter.py "$D" "$RES/export"
  log "export rc=$?"
}

case "$STAGE" in
  1) stage_1 ;;
  2) stage_2 ;;
  *) echo "STAGE must be 1 or 2" >&2; exit 2 ;;
esac
log done
