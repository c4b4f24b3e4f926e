#!/usr/bin/env bash
# Issue 40: does a sharpened target (`eaglelab train --target-temperature 0.5`) train a drafter that greedy
# verification accepts more of? A controlled A/B on one GPU (H100 or H200): the same data, warm start (the shipped
# drafter, its draft vocabulary kept), shape, steps, seed and schedule, two trainings side by side on the GPU,
# differing only in the temperature of the target distribution the loss matches (1.0, the control, as every drafter
# so far; 0.5). Six back-to-back device calls, run from the repo root with STAGE and OUT set (send the next as soon as
# one returns: the machine stays warm ~30 s, and the data lives in ~/sharpen):
#
#   calls C x4     carry .carry/mr1 .. .carry/mr4, one a call (each with .whl)  STAGE=C: park a part of the GGUF
#   call S  carry .carry/mr5 .carry/assets .whl                                STAGE=S: join the GGUF; the target
#           writes prompts (user turns under benchmarks/synth_systems.txt's system messages, code and maths
#           questions); `distill --mix` answers them (short and long answers, code and maths, second turns); both
#           trainings start (time-limited, checkpointed)
#   call T  carry .carry/assets .whl                                           STAGE=T: both trainings resume to one
#           common length (planned from the slower one's measured rate); each drafter exported as two shards under
#           16 MiB ($OUT/t1.0-0000{1,2}-of-00002.safetensors, $OUT/t0.5-...; the index and JSON files in the
#           tarball); with ACC_S > 0 (seconds a run), the acceptance of each and of the shipped drafter on the
#           MT-bench first turns at the batch-1 tree (5/4/24 and a lookup branch of 16), float32, no compile
#   call U  carry .carry/assets .whl (if the budget has ~8 minutes left)      STAGE=U: `bench --figures` at batch 1
#           on the 80 MT-bench first turns (plain in the same process), one process each: the shipped drafter, then
#           each trained one (FIG_TEMPS) under a copy of the shipped one's profile (the same trees and kernels)
#
# Expected device time ~20 minutes held (four C calls ~10 s each warm, S 540 s, T 540 s, plus the start), U ~8 more;
# ~9 minutes of it training, both drafters at once.
# Afterwards (CPU): rejoin each drafter (`benchmarks/export_drafter.py` wrote the shards: load them into one
# model.safetensors or point the engine at the folder), then the float32 CPU acceptance of each, the same command
# with --device cpu: the figure a drafter is judged by here.
# A second batch continues from the shipped drafter (itself trained here at 0.5) on fresh data at a lower temperature:
#   SEED=2 TEMPS="0.5 0.25" FIG_TEMPS="0.25 0.5" (SEED seeds the prompts the target writes, SEED+1 the code and
#   maths questions, and the mix; the first batch ran with SEED=0, so the same seed would train on the same data).
#   Ran 2026-12-07 (benchmarks/results/h100_2026-12-07d): held-out flat, float32 MT-bench +0.8% for 0.5 (shipped).
# Knobs: SEED, STAGE_S, SYNTH_N, SYNTH_S, ASK_N, ASK_S, USER_N, LONG_N, TURN2_N, DISTILL_S, TRAIN_BS, LR, TEMPS (default
# "1.0 0.5"), EVAL_N, EVAL_EVERY, ACC_PROMPTS, ACC_S (each acceptance run's limit), FIG_TEMPS (U's drafters, "0.5 1.0"),
# FIG_NEXT_S (U's seconds kept for each run after the current, 80),
# FIG_ARGS (more `bench --figures` flags); for a dry run: DEVICE (cuda),
# DTYPE (bfloat16), SYNTH_BS, DISTILL_BS, MAX_NEW (caps every answer), TOTAL_STEPS (S's guess, 3000).
# Dry run on the CPU (benchmarks/dry_run_cpu.sh), tiny knobs:
#   export DRY=/tmp/drysharp SYNTH_N=8 SYNTH_S=60 ASK_N=4 ASK_S=60 USER_N=6 LONG_N=2 TURN2_N=4 MAX_NEW=16 \
#     SYNTH_BS=4 DISTILL_BS=8 DISTILL_S=60 TRAIN_BS=2 EVAL_N=2 EVAL_EVERY=2 TOTAL_STEPS=4 ACC_PROMPTS=1 ACC_S=200
#   T="bash benchmarks/dry_run_cpu.sh h100_drafter_sharpen.sh"
#   $T "C:.carry/mr1 .whl" "C:.carry/mr2 .whl" "C:.carry/mr3 .whl" "C:.carry/mr4 .whl"
#   STAGE_S=900 $T "S:.carry/mr5 .carry/assets .whl"; STAGE_S=900 $T "T:.carry/assets .whl"
#   awk 'NR % 10 == 1' .carry/assets/question.jsonl > $DRY/q.jsonl
#   STAGE_S=900 FIG_ARGS="--max-new-tokens 4 --questions $DRY/q.jsonl" $T "U:.carry/assets .whl"
STAGE=${STAGE:?set STAGE=C, S, T or U}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/sharpen; DATA=$W/distill
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} TEMPS=${TEMPS:-1.0 0.5} SEED=${SEED:-0}

train_args() {  # TEMP TOTAL_STEPS
  TRAIN=(--online --target default --data "$DATA" --out "$W/t$1" --checkpoint-dir "$W/ck_t$1" --init-from "$SHIPPED"
    --total-steps "$2" --batch-size "${TRAIN_BS:-32}" --lr "${LR:-1e-4}" --warmup-ratio 0.02 --max-grad-norm 0.5
    --ttt-length 7 --draft-vocab-size 12288 --target-temperature "$1" --max-length 1024 --checkpoint-every 200
    --log-every 50 --eval-every "${EVAL_EVERY:-400}" --eval-samples "${EVAL_N:-512}" --device "$DEVICE"
    --dtype "$DTYPE" --save-dtype bfloat16)
}

train_all() {  # LIMIT_S TOTAL_STEPS [--resume]: every temperature's training at once, side by side on the GPU
  local t pids=()
  for t in $TEMPS; do
    train_args "$t" "$2"
    log "train t$t: $1 s, schedule to step $2 ${3:-}"
    timeout -k 15 $(( $1 + 60 )) $EL train "${TRAIN[@]}" ${3:-} --time-limit "$1" > "$R/train_t${t}_$STAGE.txt" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; log "train pid $p rc=$?"; done
  for t in $TEMPS; do tail -8 "$R/train_t${t}_$STAGE.txt"; done
}

write_mix() {
  python3 - "$W/mix.json" "$W/synth" "$W/asks" "$SEED" "${USER_N:-60000}" "${LONG_N:-12000}" "${ASK_N:-20000}" \
    "${TURN2_N:-20000}" "${MAX_NEW:-0}" <<'PY'
import gzip, json, sys
from pathlib import Path
out, synth, asks = sys.argv[1:4]
seed, user_n, long_n, ask_n, turn2_n, max_new = [int(x) for x in sys.argv[4:]]
cap = lambda n: min(n, max_new) if max_new > 0 else n  # MAX_NEW: every answer capped (a dry run's knob)
first = Path(synth) / "prompts.jsonl.gz"
rows = gzip.open(first, "rt").read().splitlines() if first.is_file() else []
Path(synth + "_long").mkdir(exist_ok=True)
with gzip.open(Path(synth + "_long") / "prompts.jsonl.gz", "wt") as f:  # `long`: the prompts after the first user_n
    f.write("\n".join(rows[user_n:user_n + long_n]) + "\n")
parts = [{"name": "user", "prompts": synth, "limit": user_n, "max_new_tokens": cap(160)},
         {"name": "long", "prompts": synth + "_long", "max_new_tokens": cap(512)},
         {"name": "codemath", "prompts": asks, "limit": ask_n, "max_new_tokens": cap(384)},
         {"name": "turn2", "second_turn_of": "user", "limit": turn2_n, "max_new_tokens": cap(160),
          "max_prompt_tokens": 768}]
parts = [p for p in parts if p["name"] != "long" or rows[user_n:user_n + long_n]]
for p in [p for p in parts if "prompts" in p and not (Path(p["prompts"]) / "prompts.jsonl.gz").is_file()]:
    print(f"mix: no prompts in {p['prompts']} (its step failed): part {p['name']} left out")
    parts = [q for q in parts if q is not p and q.get("second_turn_of") != p["name"]]
Path(out).write_text(json.dumps({"seed": seed, "parts": parts}, indent=1))
print(f"mix: {len(rows)} synthesized prompts; user {min(user_n, len(rows))}, long {len(rows[user_n:user_n + long_n])}")
PY
}

acceptance() {  # NAME DRAFTER_DIR: the batch-1 tree on the MT-bench first turns, float32 (greedy: exact acceptance)
  local lim=${ACC_S:-0}
  [ "$lim" -gt 0 ] || return 0  # off unless asked: the CPU measures it afterwards, and T's time goes to training
  [ "$(left)" -gt $(( lim + 5 )) ] || { log "acc_$1 skipped: the stage's time is spent"; return; }
  TAIL=4 run "acc_$1" "$lim" python3 benchmarks/drafter_acceptance.py --set mtbench --draft "$2" --steps 5 --topk 4 \
    --draft-tokens 24 --lookup-tokens 16 --lookup-spill --prompts "${ACC_PROMPTS:-80}" --max-new-tokens 128 \
    --device "$DEVICE" --dtype float32 --no-compile --json "$R/acc_$1.json"
}

stage_c() { record_gpu; park_parts; }

stage_s() {
  join_gguf
  mkdir -p "$W"
  TAIL=6 run synthesize $(( ${SYNTH_S:-90} + 120 )) $EL synthesize --out "$W/synth" --count "${SYNTH_N:-72000}" \
    --batch-size "${SYNTH_BS:-2048}" --max-new-tokens 128 --top-p 1.0 --time-limit "${SYNTH_S:-90}" --seed "$SEED" \
    --device "$DEVICE" --dtype "$DTYPE" --systems-file benchmarks/synth_systems.txt
  TAIL=6 run synthesize_ask $(( ${ASK_S:-45} + 120 )) $EL synthesize --out "$W/asks" --count "${ASK_N:-20000}" \
    --batch-size "${SYNTH_BS:-2048}" --max-new-tokens 160 --top-p 1.0 --time-limit "${ASK_S:-45}" \
    --seed $(( SEED + 1 )) --device "$DEVICE" --dtype "$DTYPE" --ask code,maths
  cp "$W/synth/manifest.json" "$R/synth_manifest.json" 2>/dev/null; cp "$W/asks/manifest.json" "$R/asks_manifest.json" 2>/dev/null
  write_mix | tee "$R/mix.txt"; cp "$W/mix.json" "$R/"
  TAIL=12 run distill $(( ${DISTILL_S:-170} + 90 )) $EL distill --mix "$W/mix.json" --out "$DATA" \
    --batch-size "${DISTILL_BS:-1024}" --time-limit "${DISTILL_S:-170}" --device "$DEVICE" --dtype "$DTYPE"
  cp "$DATA/distill.json" "$R/" 2>/dev/null
  # the shipped drafter's own draft vocabulary as the data's (not one rebuilt from these answers): both drafters
  # start exactly where the shipped one is (every head row carried over), so what they gain is the training's
  python3 -c "import sys; from safetensors.torch import load_file; \
from eaglelab.engine.formats.specforge_data import VocabMapping, write_vocab_mapping; t = load_file(sys.argv[1]); \
write_vocab_mapping(sys.argv[2], VocabMapping(t['d2t'], t['t2d']))" "$SHIPPED/model.safetensors" "$DATA"
  train_all $(( $(left) - 75 )) "${TOTAL_STEPS:-3000}"  # a guess; T re-plans from the measured rate
}

stage_t() {
  [ -d "$W/ck_t${TEMPS%% *}" ] || { log "no checkpoint in $W: the machine went cold after call S"; exit 3; }
  local acc=$(( ${ACC_S:-0} > 0 ? 3 * ${ACC_S:-0} + 40 : 0 )) t
  local limit=$(( $(left) - acc - 60 ))
  local total; total=$(python3 - "$limit" $(for t in $TEMPS; do echo "$W/ck_t$t"; done) <<'PY'
import sys
from pathlib import Path
import torch
limit, dirs = float(sys.argv[1]), sys.argv[2:]
ends = []
for d in dirs:  # each run's steps so far and the steps its measured rate adds in the limit; the slower sets the length
    st = torch.load(sorted(Path(d).glob("step_*.pt"))[-1], map_location="cpu", weights_only=True)
    step, spent = st["position"]["step"], max(float(st.get("seconds", 0.0)), 1e-9)
    ends.append(step + int(0.9 * step / spent * limit))  # the rate leaves out evaluations and checkpoints
print(min(ends))
PY
)
  log "common schedule: step $total"
  train_all "$limit" "$total" --resume
  for t in $TEMPS; do
    [ -f "$W/t$t/model.safetensors" ] || { log "t$t: no drafter written"; continue; }
    python3 benchmarks/export_drafter.py "$W/t$t" "$R/t$t" && for f in "$R/t$t"/model-0000*.safetensors; do
      mv "$f" "$OUT/t$t-$(basename "$f" | sed 's/^model-//')"; done
    sha256sum "$W/t$t/model.safetensors" > "$R/t$t/model.sha256"
  done
  for t in $TEMPS; do [ -f "$W/t$t/model.safetensors" ] && acceptance "t$t" "$W/t$t"; done
  acceptance shipped "$SHIPPED"
}

stage_u() {  # the speed at batch 1 of the shipped drafter, then of each trained one (FIG_TEMPS, default "0.5 1.0")
  local t d which n
  local runs=("shipped:$SHIPPED")
  for t in ${FIG_TEMPS:-0.5 1.0}; do
    d=$W/t$t
    [ -f "$d/model.safetensors" ] || { log "no drafter in $d: the machine went cold after call T"; exit 3; }
    # the shipped drafter's profile (trees per batch bucket, kernels, compile, GEMV tilings) for this one, of the
    # same shape: both measured in the same regime (a drafter with no profile would run the default chain)
    python3 - "$SHIPPED/eaglelab_profiles.json" "$d" <<'PY'
import json, sys
from pathlib import Path
from eaglelab.profiles import drafter_digest
doc = json.loads(Path(sys.argv[1]).read_text())
for p in doc["profiles"]:
    p["drafter_sha256"] = drafter_digest(sys.argv[2])
Path(sys.argv[2], "eaglelab_profiles.json").write_text(json.dumps(doc, indent=1))
PY
    runs+=("t$t:$d")
  done
  n=${#runs[@]}
  for which in "${runs[@]}"; do  # the first compiles on a cold cache; the others find its graphs there
    n=$(( n - 1 ))
    TAIL=30 run "figures_${which%%:*}" $(( $(left) - ${FIG_NEXT_S:-80} * n )) $EL bench --figures --model default \
      --draft "${which#*:}" --device "$DEVICE" --batch-sizes 1 --code-prompts 0 --max-new-tokens 128 --repeats 1 \
      ${FIG_ARGS:-} --json "$R/figures_${which%%:*}.json"
  done
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; S|T) echo 540;; *) echo 480;; esac)}; watchdog "$0"
run_stage C S T U
