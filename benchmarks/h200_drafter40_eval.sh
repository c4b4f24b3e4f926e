#!/usr/bin/env bash
# Issue 40's drafter (trained 2026-12-03, fourth session: benchmarks/results/h200_2026-12-03d/) measured on ONE H200
# as a user would run it: `eaglelab tune` for it (its own trees per batch bucket and GEMV tilings, the profile a
# drafter ships with), then `eaglelab bench --figures` (every MT-bench first turn per category, 20 HumanEval prompts,
# batch 1, 8, 32) on that profile, then the shipped drafter's figures on its shipped profile in the same session.
# The training batch's own figures ran the new drafter on the default chain of 3 (it had no profile yet) and stopped at
# their time limit: they say nothing about the drafter at its best tree.
#
# Six back-to-back device calls, sent in ONE message (benchmarks/README.md: the machine goes cold ~30 s after a call,
# and the parked files with it); run from the repo root with STAGE and OUT set. Expected device time ~27 minutes held
# (A+B+C ~110 s with the machine's start, D 590 s, E 480 s, F 420 s: the STAGE_S defaults).
#
#   call A  carry .carry/m1 .carry/d40p0 .carry/assets .whl                STAGE=A   parks GGUF part 1, drafter part 0
#   call B  carry .carry/m2 .carry/d40p1 .carry/assets .whl                STAGE=B   parks part 2, drafter part 1
#   call C  carry .carry/m3 .carry/d40p2 .carry/assets .whl                STAGE=C   joins the GGUF, parks drafter part 2
#   call D  carry .carry/d40p3 .carry/shipped .carry/assets .whl           STAGE=D   joins the drafter (sha256 checked);
#                                                                                    tune --batch-sizes 1,8,32 for it
#   call E  carry .carry/shipped .carry/assets .whl                        STAGE=E   bench --figures, new drafter
#   call F  carry .carry/shipped .carry/assets .whl                        STAGE=F   bench --figures, shipped drafter
#
# Before (CPU): `mv eaglelab/drafters/smollm2-135m-eagle3 .carry/shipped` (the tree is then ~11 MB; each call under
# the 64 MiB: A 55 MB), and .carry/d40pN holding drafter40.part_0N (15 MB byte parts of model.safetensors, as the
# training batch brought them back; d40p3 also holds config.json, eaglelab_training.json and drafter40.sha256). Move
# the shipped drafter back after F.
# Comes back: $OUT/results_$STAGE.tar.gz (D: tune.txt, h200_tune40.json, the record h200_tune40.jsonl, profile40.json =
# the profile tune saved for the drafter, to ship beside it as eaglelab_profiles.json; E and F: figures*.txt) and
# $OUT/figures40.{json,md} (E), $OUT/figures_shipped.{json,md} (F); a figures run cut short leaves its partial report.
# Knobs: STAGE_S, TUNE_ARGS (more tune flags), FIG_ARGS (more bench --figures flags), CODE_N (20), FIG_TOKENS (128);
# for a dry run DEVICE (cuda).
# Dry-run on the CPU with tiny knobs on 2026-12-03 (~8 min; every stage reached its end, E drafting the profile D's tune
# saved; .carry/shipped made with cp -r for it, not mv):
#   export DRY=/tmp/dryev MOVED_OUT=eaglelab/drafters/smollm2-135m-eagle3; T="bash benchmarks/dry_run_cpu.sh h200_drafter40_eval.sh"
#   awk 'NR % 10 == 1' .carry/assets/question.jsonl > /tmp/qdry.jsonl
#   $T "A:.carry/m1 .carry/d40p0 .carry/assets .whl" "B:.carry/m2 .carry/d40p1 .carry/assets .whl" \
#      "C:.carry/m3 .carry/d40p2 .carry/assets .whl"
#   STAGE_S=900 TUNE_ARGS="--candidates 3/1/4,2/2/4 --batch-sizes 1 --prompts 2 --max-new-tokens 8 --cost-tokens 4 \
#      --confirm 1" $T "D:.carry/d40p3 .carry/shipped .carry/assets .whl"
#   STAGE_S=900 FIG_TOKENS=8 CODE_N=1 FIG_ARGS="--batch-sizes 1 --questions /tmp/qdry.jsonl --repeats 1" \
#      $T "E:.carry/shipped .carry/assets .whl" "F:.carry/shipped .carry/assets .whl"
STAGE=${STAGE:?set STAGE=A, B, C, D, E or F}
source "$(dirname "$0")/device_stage.sh"

NEW=$HOME/d40/drafter DEVICE=${DEVICE:-cuda}

park_drafter() {  # this call's byte parts of the new drafter (and its config, card and sha256 in d40p3) into ~/d40
  local f
  mkdir -p ~/d40
  for f in .carry/d40p*/*; do [ -f "$f" ] && cp "$f" ~/d40/ && log "parked $(basename "$f")"; done
  return 0
}

join_drafter() {
  park_drafter
  mkdir -p "$NEW"
  cat ~/d40/drafter40.part_* > "$NEW/model.safetensors" && cp ~/d40/config.json ~/d40/eaglelab_training.json "$NEW/"
  local want got
  want=$(cut -d' ' -f1 ~/d40/drafter40.sha256); got=$(sha256sum "$NEW/model.safetensors" | cut -d' ' -f1)
  echo "$got" | tee "$R/drafter40_sha.txt"
  [ "$want" = "$got" ] || { log "drafter parts joined to $got, expected $want: a part is missing (machine cold?)"; exit 3; }
}

figures() {  # NAME DRAFTER: every MT-bench first turn and CODE_N HumanEval prompts, batch 1, 8, 32, on its profile
  TAIL=40 run "$1" $(left) $EL bench --figures --model default --draft "$2" --device "$DEVICE" \
    --max-new-tokens "${FIG_TOKENS:-128}" --repeats 2 --code-prompts "${CODE_N:-20}" ${FIG_ARGS:-} \
    --json "$OUT/$1.json"
}

stage_a() { record_gpu; park_parts; park_drafter; }
stage_b() { park_parts; park_drafter; }
stage_c() { join_gguf; park_drafter; }

stage_d() {
  [ -f "$GGUF" ] || { log "no GGUF in $A: the machine went cold after call C"; exit 3; }
  join_drafter
  TAIL=60 run tune $(left) $EL tune --model default --draft "$NEW" --device "$DEVICE" --batch-sizes 1,8,32 \
    --json "$R/h200_tune40.json" --record "$R/h200_tune40.jsonl" ${TUNE_ARGS:-}
  local p
  for p in "$EAGLELAB_CACHE"/profiles/*.json; do [ -f "$p" ] && cp "$p" "$R/profile40.json"; done
  [ -f "$R/profile40.json" ] || log "tune saved no profile: E runs the default tree"
}

stage_e() {
  [ -f "$NEW/model.safetensors" ] || { log "no drafter in $NEW: the machine went cold after call D"; exit 3; }
  figures figures40 "$NEW"
}

stage_f() {
  [ -f "$GGUF" ] || { log "no GGUF in $A: the machine went cold"; exit 3; }
  figures figures_shipped "$SHIPPED"
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in A|B|C) echo 200;; D) echo 590;; E) echo 480;; *) echo 420;; esac)}
watchdog "$0"
run_stage A B C D E F
