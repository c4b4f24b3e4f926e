#!/usr/bin/env bash
# Ran whole on 2026-12-03 (fourth session: benchmarks/results/h200_2026-12-03d/, the drafter trained; its figures in E
# ran the default chain, the drafter having no profile: benchmarks/h200_drafter40_eval.sh measures it on its own).
# Ran again on 2026-12-04 for a drafter as cheap to draft with as the shipped one's head (benchmarks/results/
# h200_2026-12-04/): the same data, the shipped 12,288-token draft vocabulary, the MLP at 4,608, LR 1e-4 (the warm
# start's lesson of 12-03), the figures at the shipped batch-1 tree only:
#   VOCAB=12288 INTERMEDIATE=4608 LR=1e-4 SHIPPED_FIGS=0 FIG_S=300 \
#     FIG_ARGS="--batch-sizes 1 --steps 5 --topk 4 --draft-tokens 24"     (each call: STAGE=A..E as below)
# Send all five calls in ONE message (benchmarks/README.md). The planned batch of issue 40's better drafter for SmolLM2-135M-Instruct: five back-to-back device
# calls on ONE H200 (device kind nvidia-h200), run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh
# (sourced) does the staging. Expected device time: ~29.5 minutes held (A+B ~100 s with the
# machine's start, C 480 s, D and E 580 s each: the STAGE_S defaults): it needs a session with the whole 30-minute budget and nothing else on it.
# A session with less: run C to E with smaller SYNTH_N / ASK_N / *_S knobs (every piece is time-limited and resumes).
#
#   - A: parks GGUF part 1 (and records the GPU). B (right after A): parks part 2.
#   - C (right after B): joins the GGUF; the target writes prompts: user turns under the 30 system messages of
#     benchmarks/synth_systems.txt (SYNTH_N in SYNTH_S) and code and maths questions (`synthesize --ask code,maths`,
#     ASK_N in ASK_S); then `distill --mix` starts on the mix below (time-limited, resumed in D).
#   - D (right after C): the distill resumes and ends; the first training piece.
#   - E (right after D): training resumed to the end of its schedule; export; check-wiring; then the figures:
#     `eaglelab bench --figures` (every MT-bench first turn per category, 40 HumanEval prompts, batch 1, 8, 32) for
#     the new drafter, and the shipped one at batch 1 as the same-session baseline if time is left.
#
#   call A  carry .carry/m1 .carry/assets .whl                                        STAGE=A
#   call B  carry .carry/m2 .carry/assets .whl                                        STAGE=B
#   call C  carry .carry/m3 .carry/prompts_rest .carry/assets .whl                     STAGE=C
#   call D  carry .carry/shipped .carry/assets .whl                                   STAGE=D
#   call E  carry .carry/shipped .carry/assets .whl                                   STAGE=E
# Before (CPU): .carry/prompts_rest as benchmarks/h200_drafter.sh makes it (corpus prompts no drafter answered, 2.2 MB),
# and `mv eaglelab/drafters/smollm2-135m-eagle3 .carry/shipped` for the whole batch (move it back after E): call C
# carries 43 MB with the tree at ~11 MB, 68 MB (over 64 MiB) with the drafter's 24.5 MB in the tree or carried; D and E
# carry it, and device_stage.sh puts it back in place there (the warm start and the same-session baseline).
# Everything lands in $OUT/results_$STAGE.tar.gz; E also writes the drafter's model.safetensors in byte parts of 15 MB
# ($OUT/drafter40.part_00..03; its config.json and card in the tarball) and the figures as $OUT/figures40.{json,md}
# and $OUT/figures_shipped.{json,md}.
#
# The mix (`distill --mix`, engine/training/distill_mix.py), ~36 M answer tokens (the fourth drafter: 12.6 M) at the
# fourth's 102.8k new tok/s ~350 s of generation:
#   user      the target's user turns, first USER_N, answers up to 160 tokens (as the shipped drafter's)
#   long      the next LONG_N of them, answers up to 512 tokens (long answers: MT-bench writing and STEM run long)
#   codemath  the target's code and maths questions, answers up to 384 tokens (code runs long)
#   corpus    .carry/prompts_rest, copied to ~/drafter40/corpus (the templated corpus no drafter answered), CORPUS_N, up to 160 tokens
#   turn2     second turns of `user` (the answer kept as text, one of 20 generic follow-ups), TURN2_N, up to 160
#             tokens, prompts up to 768 tokens
# HumanEval and MT-bench stay out: every synthesized prompt sharing a 13-word window with either is dropped.
#
# The drafter (60 MB cap, issue 40): `--intermediate-size 4608 --draft-vocab-size 32768` = 58.86 MB in bf16
# (drafter_size; each MLP unit 3,456 bytes, each draft token 1,160): the MLP three times the target's and a draft
# vocabulary that holds ~all of plain greedy's MT-bench tokens (12,288 held 95.6%; the sixth drafter showed a smaller
# vocabulary gives back what a wider MLP gains). Other pairs under 60 MB: 3072 x 36864 (58.30), 6144 x 24576
# (54.66), 4864 x 32768 (59.74). Warm-started from the shipped drafter (rows of tokens both vocabularies hold carry
# over, new ones mapped; the MLP widened keeping its function). TRAIN_BS 32 (the TTT's [B, T, V_draft] float32
# log-probabilities grow with the vocabulary: 64 rows at 12,288 took ~55 GB), LR 3e-4; ~900 s of training over D
# and E (the fourth: 447 s), the cosine schedule ending at the last step E's time allows (drafter_stages.sh's
# planned_steps). Per-position acceptance over anchors and over the engine's cycles is logged every 400 steps and
# kept in the card (eaglelab_training.json: acceptance, acceptance_history).
# Knobs: STAGE_S SYNTH_N SYNTH_S ASK_N ASK_S USER_N LONG_N CORPUS_N TURN2_N DISTILL_S TRAIN_BS LR VOCAB INTERMEDIATE
# FIG_S (E: the figures' limit, default 300); for a dry run: DEVICE (cuda), DTYPE (bfloat16), SYNTH_BS (2048),
# DISTILL_BS (1024), MAX_NEW (caps every mix part's answer length), TOTAL_STEPS (D's guess, 4000), EVAL_N (512),
# EVAL_EVERY (400), CW_S (check-wiring's limit, 45), FIG_TOKENS (128), FIG_ARGS (more `bench --figures` flags).
# Dry-run on CPU with tiny knobs on 2026-12-03: every stage reached its end
# (~20 min on 2 shared cores; E's check-wiring alone took 4 min on the CPU, past its 45 s: CW_S=300 below; repeat it
# after changing this script, .carry/ made as above but with cp -r, not mv; drafter40.part_* rejoin to the sha256):
#   export DRY=/tmp/dry40 MOVED_OUT=eaglelab/drafters/smollm2-135m-eagle3 SYNTH_BS=4 DISTILL_BS=8 TRAIN_BS=2 EVAL_N=2 EVAL_EVERY=2
#   T="bash benchmarks/dry_run_cpu.sh h200_drafter40.sh"; mkdir -p $DRY; awk 'NR % 10 == 1' .carry/assets/question.jsonl > $DRY/q.jsonl
#   $T "A:.carry/m1 .carry/assets .whl" "B:.carry/m2 .carry/assets .whl"
#   SYNTH_N=8 SYNTH_S=90 ASK_N=4 ASK_S=90 USER_N=6 LONG_N=2 CORPUS_N=4 TURN2_N=4 MAX_NEW=16 \
#     $T "C:.carry/m3 .carry/prompts_rest .carry/assets .whl"
#   STAGE_S=300 DISTILL_S=60 TOTAL_STEPS=4 $T "D:.carry/shipped .carry/assets .whl"
#   STAGE_S=760 CW_S=300 FIG_S=640 FIG_TOKENS=8 FIG_ARGS="--batch-sizes 1 --code-prompts 2 --questions $DRY/q.jsonl" \
#     $T "E:.carry/shipped .carry/assets .whl"
STAGE=${STAGE:?set STAGE=A, B, C, D or E}
source "$(dirname "$0")/device_stage.sh"

W=$HOME/drafter40; DATA=$W/distill CK=$W/ck D=$W/drafter
VOCAB=${VOCAB:-32768} INTERMEDIATE=${INTERMEDIATE:-4608} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}

train_args() {  # TOTAL_STEPS
  TRAIN=(--online --target default --data "$DATA" --out "$D" --checkpoint-dir "$CK" --init-from "$SHIPPED"
    --total-steps "$1" --batch-size "${TRAIN_BS:-32}" --lr "${LR:-3e-4}" --warmup-ratio 0.02 --max-grad-norm 0.5
    --ttt-length 7 --draft-vocab-size "$VOCAB" --intermediate-size "$INTERMEDIATE" --max-size-mb 60
    --max-length 1024 --checkpoint-every 200 --log-every 50 --eval-every "${EVAL_EVERY:-400}"
    --eval-samples "${EVAL_N:-512}" --tensorboard "$R/tb" --device "$DEVICE" --dtype "$DTYPE" --save-dtype bfloat16)
}

write_mix() {
  local u=${USER_N:-80000}
  mkdir -p "$W/corpus"; cp .carry/prompts_rest/prompts.jsonl.gz "$W/corpus/"  # D reads the mix's files again
  python3 - "$W/mix.json" "$W/synth" "$W/asks" "$W/corpus" "$u" "${LONG_N:-16000}" "${ASK_N:-30000}" \
    "${CORPUS_N:-30000}" "${TURN2_N:-30000}" "${MAX_NEW:-0}" <<'PY'
import gzip, json, sys
from pathlib import Path
out, synth, asks, corpus = sys.argv[1:5]
user_n, long_n, ask_n, corpus_n, turn2_n, max_new = [int(x) for x in sys.argv[5:]]
cap = lambda n: min(n, max_new) if max_new > 0 else n  # MAX_NEW: every part's answer length capped (a dry run's knob)
# `long` takes the synthesized prompts after the first user_n: written as their own prompts file
first = Path(synth) / "prompts.jsonl.gz"
rows = gzip.open(first, "rt").read().splitlines() if first.is_file() else []
Path(synth + "_long").mkdir(exist_ok=True)
with gzip.open(Path(synth + "_long") / "prompts.jsonl.gz", "wt") as f:
    f.write("\n".join(rows[user_n:user_n + long_n]) + "\n")
parts = [{"name": "user", "prompts": synth, "limit": user_n, "max_new_tokens": cap(160)},
         {"name": "long", "prompts": synth + "_long", "max_new_tokens": cap(512)},
         {"name": "codemath", "prompts": asks, "limit": ask_n, "max_new_tokens": cap(384)},
         {"name": "corpus", "prompts": corpus, "limit": corpus_n, "max_new_tokens": cap(160)},
         {"name": "turn2", "second_turn_of": "user", "limit": turn2_n, "max_new_tokens": cap(160),
          "max_prompt_tokens": 768}]
parts = [p for p in parts if p["name"] != "long" or rows[user_n:user_n + long_n]]  # too few synthesized: no long part
for p in [p for p in parts if "prompts" in p and not (Path(p["prompts"]) / "prompts.jsonl.gz").is_file()]:
    print(f"mix: no prompts in {p['prompts']} (its step failed): part {p['name']} left out")
    parts = [q for q in parts if q is not p and q.get("second_turn_of") != p["name"]]
Path(out).write_text(json.dumps({"seed": 0, "parts": parts}, indent=1))
print(f"mix: {len(rows)} synthesized prompts; user {min(user_n, len(rows))}, long {len(rows[user_n:user_n + long_n])}")
PY
}

distill_mix() {  # LIMIT_S
  TAIL=12 run "distill_$STAGE" $(( $1 + 90 )) $EL distill --mix "$W/mix.json" --out "$DATA" \
    --batch-size "${DISTILL_BS:-1024}" --time-limit "$1" --device "$DEVICE" --dtype "$DTYPE"
  cp "$DATA/distill.json" "$R/" 2>/dev/null
}

stage_a() { record_gpu; park_parts; }
stage_b() { park_parts; }

stage_c() {
  join_gguf
  TAIL=6 run synthesize $(( ${SYNTH_S:-110} + 60 )) $EL synthesize --out "$W/synth" --count "${SYNTH_N:-96000}" \
    --batch-size "${SYNTH_BS:-2048}" --max-new-tokens 128 --top-p 1.0 --time-limit "${SYNTH_S:-110}" --device "$DEVICE" \
    --dtype "$DTYPE" \
    --systems-file benchmarks/synth_systems.txt
  TAIL=6 run synthesize_ask $(( ${ASK_S:-60} + 60 )) $EL synthesize --out "$W/asks" --count "${ASK_N:-30000}" \
    --batch-size "${SYNTH_BS:-2048}" --max-new-tokens 160 --top-p 1.0 --time-limit "${ASK_S:-60}" --seed 1 --device "$DEVICE" \
    --dtype "$DTYPE" --ask code,maths
  cp "$W/synth/manifest.json" "$R/synth_manifest.json"; cp "$W/asks/manifest.json" "$R/asks_manifest.json"
  write_mix | tee "$R/mix.txt"; cp "$W/mix.json" "$R/"
  distill_mix $(( $(left) - 100 ))
}

stage_d() {
  [ -f "$W/mix.json" ] || { log "no mix in $W: the machine went cold after call C"; exit 3; }
  distill_mix ${DISTILL_S:-240}
  local left=$(( $(left) - 45 ))
  train_args "${TOTAL_STEPS:-4000}"  # a guess; E re-plans from D's measured steps/s
  TAIL=20 run train_1 $(( left + 30 )) $EL train "${TRAIN[@]}" --time-limit "$left"
}

stage_e() {
  [ -d "$CK" ] || { log "no checkpoint in $W: the machine went cold after call D"; exit 3; }
  local fig=${FIG_S:-300}
  local left=$(( $(left) - fig - 60 ))
  local total; total=$(python3 - "$CK" "$left" <<'PY'
import sys
from pathlib import Path
import torch
found = sorted(Path(sys.argv[1]).glob("step_*.pt"))
st = torch.load(found[-1], map_location="cpu", weights_only=True)
step, spent = st["position"]["step"], max(float(st.get("seconds", 0.0)), 1e-9)
print(step + int(0.92 * step / spent * float(sys.argv[2])))  # the rate leaves out evaluations and checkpoints
PY
)
  log "train_2: $left s, schedule to step $total"
  train_args "$total"
  TAIL=20 run train_2 $(( left + 30 )) $EL train "${TRAIN[@]}" --resume --time-limit "$left"
  # 58.86 MB with a 37.7 MB lm_head: no two shards fit the tool's 16 MiB a file, so the file comes back in byte parts
  # (here: cat $OUT/drafter40.part_* > model.safetensors; sha256 in $R/drafter40.sha256)
  [ -f "$D/model.safetensors" ] && split -b 15000000 -d "$D/model.safetensors" "$OUT/drafter40.part_" \
    && sha256sum "$D/model.safetensors" > "$R/drafter40.sha256"
  cp "$D"/eaglelab_training.json "$D"/config.json "$R/" 2>/dev/null
  TAIL=6 run check_wiring "${CW_S:-45}" $EL check-wiring "$D" --target default --device "$DEVICE"
  local keep=90; [ "${SHIPPED_FIGS:-1}" = 0 ] && keep=0  # the shipped drafter's baseline after it, or nothing
  TAIL=40 run figures40 $(( $(left) - keep )) $EL bench --figures --model default --draft "$D" --device "$DEVICE" \
    --max-new-tokens "${FIG_TOKENS:-128}" --repeats 2 ${FIG_ARGS:-} --json "$OUT/figures40.json"
  # SHIPPED_FIGS=0: no same-session baseline (a batch whose budget ends with the new drafter's figures)
  if [ "${SHIPPED_FIGS:-1}" != 0 ] && [ "$(left)" -gt 60 ]; then
    TAIL=30 run figures_shipped $(left) $EL bench --figures --model default --draft "$SHIPPED" --device "$DEVICE" \
      --batch-sizes 1 --max-new-tokens "${FIG_TOKENS:-128}" --repeats 2 ${FIG_ARGS:-} --json "$OUT/figures_shipped.json"
  fi
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in A|B) echo 240;; C) echo 480;; *) echo 580;; esac)}; watchdog "$0"
run_stage A B C D E
