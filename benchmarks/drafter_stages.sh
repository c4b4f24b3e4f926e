#!/usr/bin/env bash
# Training an EAGLE-3 drafter for the default model on one GPU, in two stages of under ten minutes each (the recipe of
# examples/train_default_drafter.sh, bounded for device calls): a wider chat mix (a follow-up kind, more topics, chat
# 65%) and, with SYNTH_N, prompts the target writes itself, distilled by the target in batches of 1024 rows, trained
# at batch 64, warm-started from the shipped drafter. Written as the third drafter's script (then named
# h200_drafter3.sh); the third, fourth (shipped), fifth and sixth drafters were all made with it. The caller sets
# CUDA_VISIBLE_DEVICES; results under $1. benchmarks/h200_drafter.sh calls it through device_stage.sh.
#
#   STAGE=1 bash benchmarks/drafter_stages.sh RESULTS_DIR   (<= 440 s) distill the prompts; first training piece
#   STAGE=2 bash benchmarks/drafter_stages.sh RESULTS_DIR   (<= 520 s) resume training; export; measure
#
# Before (CPU, here): python -m eaglelab prompts --out .carry/prompts --count 140000   (< 8 MiB; carry it in the call
# of stage 1). The caller has the GGUF in the eaglelab cache and question.jsonl / HumanEval.jsonl.gz in the cache's
# assets (device_stage.sh's join_gguf and asset copies do both). Stage 2 needs ~ from stage 1 (the token ids and the
# checkpoint): the two calls must follow each other while the machine is warm.
#
# Each stage keeps to its own budget (STAGE1_S 425, STAGE2_S 505: the callers' limits less a margin): the training
# pieces get what the distill and the benches leave, so a faster or slower GPU changes the amount trained, never
# the end of the stage.
#
# Why these numbers (last session, H200: distill 34k new tok/s at batch 512, ~13 ms per decode step of 512 rows;
# training ~12 steps/s at batch 32, ~83 ms a step, most of it launching the TTT's ~2k small kernels):
#   DISTILL_BS 1024: one static cache at a time now (a new prompt-length class frees the last), so 1024 rows fit
#     with room (~17 GB of KV for the 512-token class); MAX_NEW 160 (was 192): the benches read 128 new tokens, and
#     a batch runs until its longest answer ends, so the cap sets the time per batch: ~20% more prompts per second.
#   N_PROMPTS 100000 in DISTILL_S 320: ~300 prompts/s if the throughput holds; the distill runs the shortest prompts
#     first, so a stop at the limit drops the longest; the rest of the 140k file is never used. The distill's own
#     limit counts its generation loop only: loading and tokenizing (now ~1,500 prompts/s on one core; the chat
#     template used to be compiled per prompt, ~90/s) come before it, hence the 90 s margin of its timeout.
#   Prompt-length classes 64/128/192/256/512 (decode attends over the whole static cache of its class).
#   TRAIN_BS 64, LR 4e-4 (3e-4 x sqrt 2): twice the sequences per launch of the same kernels (the step was
#     launch-bound); the batch's host copy is now page-locked, so it no longer waits for the GPU each step.
#     TOTAL_STEPS is set in stage 2 from the measured steps/s of stage 1 (the checkpoint holds step and seconds), so
#     the cosine schedule ends (LR 0) at the last step the time allows; before that, a guess (TOTAL_STEPS 2400).
#     Memory at 64 rows of 768 tokens: ~55 GB (7 TTT steps of [64, T, 12288] float32 log-probabilities and the
#     masked attention's weights); 128 rows would come close to the H200's 141 GB on the longest batches.
#   VOCAB 12288 (as the shipped drafter; 24.5 MB in bf16, under 25 MB). INTERMEDIATE (unset: the target's 1536) widens
#     the drafter's MLP (`train --intermediate-size`): the warm start keeps the init's units and adds new ones with
#     zero down_proj columns, so step 0 computes what INIT did. Each MLP unit costs 3,456 bytes in bf16, each draft
#     token 1,160; the largest vocabulary (a multiple of 1024) under 25 MB (10^6 bytes, headers included) per width:
#     1536 x 12288 (24.48 MB), 1792 x 11264 (24.18), 2048 x 10240 (23.88), 2304 x 10240 (24.76), 2560 x 9216 (24.46),
#     2816 x 8192 (24.15), 3072 x 7168 (23.85), 3328 x 7168 (24.74), 3584 x 6144 (24.43). MAX_MB (25) refuses an
#     over-budget pair before training, naming the pairs that fit. Stage 1 and stage 2 must get the same
#     INTERMEDIATE and VOCAB (the checkpoint holds the shapes).
#   Benches, 40 prompts x 128 new tokens at batch 1 (5 per MT-bench category), each against plain decoding in the
#     same run (~40 s each, ~75 s for one that compiles new shapes; BENCH_S 290 keeps room for five and the export):
#     MT-bench chain 3 (--steps 3 --topk 1 --draft-tokens 4, the issue's chain), trees 6/4/16 and 8/8/64 (on an H200 at
#     batch 1 a 135M target verifies 64 tokens in about the time of 16, so the wider tree costs little and shows how
#     far the accepted length goes), HumanEval chain 3 (the second held-out set), the shipped drafter's MT-bench
#     chain 3 (the same-run baseline).
#
# The target's own prompts (SYNTH_N > 0, `eaglelab synthesize`; 2026-12-01, third session): the shipped drafter
# accepted 2.0 tokens a cycle (chain 3, CPU) on 24 such prompts, 2.0 on 24 MT-bench prompts and 2.6 on 24 unseen
# prompts of its own corpus, i.e. they are as far from its training data as the benchmark is; sampled at temperature SYNTH_T (1.0) and top-p SYNTH_TOP_P (1.0: no
# vocabulary sort per step) in batches of SYNTH_BS (2048) for SYNTH_S seconds; PROMPTS may then list more prompt
# directories (e.g. the corpus prompts drafter3 never answered), distilled after them in one run.
# SYNTH_SYSTEMS names a file of system messages (`synthesize --systems-file`): batch b is conditioned on line b mod n.
# Knobs: SYNTH_N SYNTH_S SYNTH_SYSTEMS SYNTH_BS SYNTH_NEW SYNTH_T SYNTH_TOP_P SYNTH_SEED BENCHES (default: all five) N_PROMPTS MAX_NEW DISTILL_BS DISTILL_S STAGE1_S STAGE2_S BENCH_S BENCH_CAP (150 s a bench: a drafter of new shapes compiles ~60 s of it) TOTAL_STEPS TRAIN_BS LR VOCAB INTERMEDIATE MAX_MB EVAL_N
# ACC_PROMPTS BENCH_NEW DEVICE (cuda) DTYPE (bfloat16) PROMPTS (.carry/prompts) INIT (the shipped drafter) WORK
# (~/drafter3).
set -u
STAGE=${STAGE:?set STAGE=1 or 2}
RES=${1:?usage: STAGE=1|2 bash benchmarks/drafter_stages.sh RESULTS_DIR}
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
export PYTHONUNBUFFERED=1
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[drafter3 $STAGE $(elapsed)s] $*" | tee -a "$RES/log.txt"; }
# run NAME LIMIT CMD...: bounded; whole output in $RES/NAME.txt, its tail echoed
run() { local name=$1 limit=$2; shift 2; log "$name (limit ${limit}s)"; timeout "$limit" "$@" > "$RES/$name.txt" 2>&1; log "$name rc=$?"; tail -${TAIL:-12} "$RES/$name.txt"; }
EL="python3 -m eaglelab"
DEV=${DEVICE:-cuda} DT=${DTYPE:-bfloat16}
SHIPPED=eaglelab/drafters/smollm2-135m-eagle3
W=${WORK:-$HOME/drafter3}; DATA=$W/distill CK=$W/ck D=$W/drafter
BS=${TRAIN_BS:-64}
train_args() {  # TOTAL_STEPS
  TRAIN=(--online --target default --data "$DATA" --out "$D" --checkpoint-dir "$CK" --init-from "${INIT:-$SHIPPED}"
    --total-steps "$1" --batch-size "$BS" --lr "${LR:-4e-4}" --warmup-ratio 0.02 --max-grad-norm 0.5 --ttt-length 7
    --draft-vocab-size "${VOCAB:-12288}" ${INTERMEDIATE:+--intermediate-size "$INTERMEDIATE"} --max-size-mb "${MAX_MB:-25}"
    --max-length 768 --checkpoint-every 200 --log-every 50 --eval-every 400
    --eval-samples "${EVAL_N:-512}" --tensorboard "$RES/tb" --device "$DEV" --dtype "$DT" --save-dtype bfloat16)
}

stage_1() {
  { nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"; } > "$RES/gpu.txt" 2>&1
  cp "${PROMPTS:-.carry/prompts}/manifest.json" "$RES/prompts_manifest.json" 2>/dev/null
  local plist=(${PROMPTS:-.carry/prompts})  # several prompt directories: answered together, in this order
  if [ "${SYNTH_N:-0}" -gt 0 ]; then  # the target writes prompts first (its own user turns); they lead the list
    TAIL=6 run synthesize $(( ${SYNTH_S:-150} + 60 )) $EL synthesize --out "$W/synth" --count "$SYNTH_N" \
      --batch-size "${SYNTH_BS:-2048}" --max-new-tokens "${SYNTH_NEW:-128}" --temperature "${SYNTH_T:-1.0}" \
      --top-p "${SYNTH_TOP_P:-1.0}" --time-limit "${SYNTH_S:-150}" --seed "${SYNTH_SEED:-0}" --device "$DEV" --dtype "$DT" \
      ${SYNTH_SYSTEMS:+--systems-file "$SYNTH_SYSTEMS"}
    cp "$W/synth/manifest.json" "$RES/synth_manifest.json" 2>/dev/null
    cp "$W/synth/prompts.jsonl.gz" "$RES/synth_prompts.jsonl.gz" 2>/dev/null  # small (~100 bytes a prompt, gz)
    [ -f "$W/synth/prompts.jsonl.gz" ] && plist=("$W/synth" "${plist[@]}")
  fi
  local ds=${DISTILL_S:-320}
  TAIL=6 run distill $(( ds + 90 )) $EL distill --prompts "${plist[@]}" --out "$DATA" \
    --limit "${N_PROMPTS:-100000}" --max-new-tokens "${MAX_NEW:-160}" --batch-size "${DISTILL_BS:-1024}" \
    --max-prompt-tokens 512 --time-limit "$ds" --device "$DEV" --dtype "$DT"
  cp "$DATA/distill.json" "$RES/" 2>/dev/null
  # what is left of the stage, less ~35 s for the trainer's start (data, target, draft vocabulary) and its save
  local left=$(( ${STAGE1_S:-425} - $(elapsed) - 35 ))
  if [ "$left" -lt 15 ]; then log "no time left for a first training piece ($left s); stage 2 trains from step 0"; return; fi
  train_args "${TOTAL_STEPS:-2400}"
  TAIL=20 run train_1 $(( left + 30 )) $EL train "${TRAIN[@]}" --time-limit "$left"
}

# the steps the schedule should end at: the checkpoint's step + its measured steps/s x the seconds this piece has
planned_steps() {  # SECONDS_OF_TRAINING
  python3 - "$CK" "$1" "${TOTAL_STEPS:-2400}" <<'PY'
import sys
from pathlib import Path
import torch
ck, secs, default = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
found = sorted(ck.glob("step_*.pt"))
if not found:
    print(default); print(f"no checkpoint: TOTAL_STEPS {default}", file=sys.stderr); sys.exit()
st = torch.load(found[-1], map_location="cpu", weights_only=True)
step, spent = st["position"]["step"], float(st.get("seconds", 0.0))
if step < 20 or spent <= 0:
    print(default); print(f"step {step} in {spent:.0f} s: too little to measure; TOTAL_STEPS {default}", file=sys.stderr); sys.exit()
rate = step / spent
total = step + int(0.92 * rate * secs)  # the rate leaves out evaluations and checkpoints
print(total)
print(f"step {step} after {spent:.0f} s of training = {rate:.2f} steps/s; {secs:.0f} s more -> TOTAL_STEPS {total}", file=sys.stderr)
PY
}

stage_2() {
  if [ ! -d "$DATA/shards" ]; then
    log "no token ids in $W: the machine went cold after stage 1; run stage 1 again"; exit 3
  fi
  # the benches, export and check-wiring need ~BENCH_S; the trainer's start and save ~35 s
  local left=$(( ${STAGE2_S:-505} - $(elapsed) - ${BENCH_S:-290} - 35 ))
  local resume=(); [ -n "$(ls "$CK"/step_*.pt 2>/dev/null)" ] && resume=(--resume)  # none: stage 1 did not train
  if [ "$left" -ge 15 ]; then
    local total; total=$(planned_steps "$left" 2>>"$RES/log.txt")
    log "train_2: $left s, schedule to step $total"
    train_args "$total"
    TAIL=20 run train_2 $(( left + 30 )) $EL train "${TRAIN[@]}" "${resume[@]}" --time-limit "$left"
  else
    log "no time left for training in stage 2 ($left s)"
  fi
  export_drafter
  TAIL=6 run check_wiring 45 $EL check-wiring "$D" --device "$DEV"
  # BENCHES: which of them run here (WHICH:SET:NAME; a caller may run the others on another GPU at once)
  local all="new:mtbench:chain3 new:mtbench:tree6-4-16 new:mtbench:tree8-8-64 new:humaneval:chain3 shipped:mtbench:chain3"
  for b in ${BENCHES:-$all}; do
    case "${b##*:}" in
      chain3) bench ${b//:/ } 3 1 4 ;;
      tree6-4-16) bench ${b//:/ } 6 4 16 ;;
      tree8-8-64) bench ${b//:/ } 8 8 64 ;;
      *) log "unknown bench $b" ;;
    esac
  done
}

bench() {  # WHICH SET NAME STEPS TOPK DRAFT_TOKENS
  local draft=$D; [ "$1" = shipped ] && draft=$SHIPPED
  local limit=$(( ${STAGE2_S:-505} - $(elapsed) ))
  [ "$limit" -gt "${BENCH_CAP:-150}" ] && limit=${BENCH_CAP:-150}
  if [ "$limit" -lt 20 ]; then log "acc_$1_$2_$3 skipped: the stage's time is spent"; return; fi
  TAIL=2 run "acc_$1_$2_$3" "$limit" python3 benchmarks/drafter_acceptance.py --set "$2" --draft "$draft" --steps "$4" \
    --topk "$5" --draft-tokens "$6" --prompts "${ACC_PROMPTS:-40}" --max-new-tokens "${BENCH_NEW:-128}" \
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
