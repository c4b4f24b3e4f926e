#!/usr/bin/env bash
# Session batch of 2026-12-03 (second session), as four back-to-back device calls on ONE H200 (device kind
# nvidia-h200), run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging,
# benchmarks/README.md says what to carry. The default model's GGUF travels in three parts (calls K, L, C).
#
#   - K (no GGUF): the MLA drafter's GPU tests (CUDA graphs per phase and the compiled one-graph cycle); a scaled-down
#     Kimi-K2.5 trained as a language model on the Python standard library's sources and written with INT4 experts
#     as Kimi ships them (benchmarks/kimi_target.py). Parks part 1.
#   - L (right after K, the target still on the machine): the seed incident on its own architecture: an MLA drafter
#     trained on that target by `eaglelab train --online --layout mla`, incident 2 replayed four ways with
#     check-wiring's verdicts (benchmarks/kimi_incident.py). Parks part 2.
#   - C (right after L): joins the GGUF; `eaglelab tune --device cuda --batch-sizes 1,8,32` on a cold compile cache
#     (the goal: under 10 minutes, tok/s within 10% at batch 1, 8 and 32).
#   - D (right after C): `eaglelab bench` with no flag on a cold compile cache (goal <= 180 s); then speculation per
#     MT-bench category and on code prompts at batch 1, 8 and 32 with the shipped drafter (the baseline of the
#     >= 2.5x issue).
#
#   call K  carry .carry/m1 .carry/assets .whl     STAGE=K
#   call L  carry .carry/m2 .carry/assets .whl     STAGE=L
#   call C  carry .carry/m3 .carry/assets .whl     STAGE=C
#   call D  carry .carry/assets .whl               STAGE=D
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s), TARGET_S and DRAFT_S
# (K's and L's training budgets, s).
STAGE=${STAGE:?set STAGE=K, L, C or D}
source "$(dirname "$0")/device_stage.sh"
KIMI=/root/kimi

# cold: a fresh compile cache for the command that follows (inductor's and Triton's), so its wall time is a
# first-run figure; the GEMV tuner's cache (under EAGLELAB_CACHE) is cleared too
cold() {
  export TORCHINDUCTOR_CACHE_DIR=/root/cold_$1/inductor TRITON_CACHE_DIR=/root/cold_$1/triton
  rm -rf /root/cold_$1 "$EAGLELAB_CACHE"/gemv* "$EAGLELAB_CACHE"/profiles; mkdir -p /root/cold_$1
}

stage_k() {
  record_gpu
  park_parts
  TAIL=12 run gpu_tests_mla 130 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_mla_gpu.py
  rm -rf "$KIMI"
  TAIL=30 run kimi_target $(left) python3 benchmarks/kimi_target.py --out "$KIMI" --device cuda --train-s "${TARGET_S:-150}"
  cp "$KIMI"/target_summary.json "$R/" 2>/dev/null
}

stage_l() {
  park_parts
  [ -f "$KIMI/target_summary.json" ] || { log "no target in $KIMI: the machine went cold after call K"; exit 3; }
  TAIL=40 run kimi_incident $(left) python3 benchmarks/kimi_incident.py --work "$KIMI" --device cuda \
    --train-s "${DRAFT_S:-120}"
  cp "$KIMI"/incident2.json "$R/" 2>/dev/null
}

stage_c() {
  join_gguf
  cold tune
  TAIL=80 run tune $(left) $EL tune --device cuda --batch-sizes 1,8,32 --json "$R/h200_tune.json" \
    --record "$R/h200_tune.jsonl"
}

stage_d() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call C"; exit 3; }
  rm -rf "$EAGLELAB_CACHE"/profiles  # the shipped profile, not C's tuned one
  cold bench
  TAIL=60 run bench_default 260 $EL bench --json "$R/h200_bench_default.json"
  TAIL=60 run figures40 $(left) $EL bench --figures --model default --draft $SHIPPED --device cuda \
    --max-new-tokens 128 --repeats 2 --json "$R/h200_figures40.json"
}

before_tar() {
  local p
  for p in "$EAGLELAB_CACHE"/profiles/*.json; do [ -f "$p" ] && cp "$p" "$OUT/tuned_profile.json"; done
  [ -f "$KIMI/incident2/drafter/model.safetensors" ] && cp -r "$KIMI/incident2/drafter" "$OUT/kimi_drafter"
  return 0
}

export STAGE_S=${STAGE_S:-570}; watchdog "$0"
run_stage K L C D
