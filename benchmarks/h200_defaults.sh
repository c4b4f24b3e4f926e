#!/usr/bin/env bash
# What a new user gets on one H200 with no flags (docs/figures.md, "Defaults"), as four back-to-back device calls on
# ONE H200 (device kind nvidia-h200), run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh
# (sourced) does the staging, benchmarks/README.md says what to carry. The default model's GGUF travels in three
# parts of ~30 MB (`split -b 30200000` of its xz), so that no call has to move tracked files out of the tree.
#
#   - A (no GGUF): the engine's GPU tests (runtime, model: the cycle written once, the kernels, capture, compile);
#     incident 1 on the Llama-3.1-8B shape (random weights: a decode that is not launch-bound), with the seed's
#     figures beside. Parks part 1.
#   - B (right after A): parks part 2, nothing else (a short call: the machine stays warm ~30 s between calls).
#   - C (right after B): joins the GGUF; `eaglelab run --device cuda PROMPT` with no other flag, on the README's
#     prompt and on MT-bench question 81 (the shipped profile's tree and kernels); `eaglelab bench` with no flag.
#   - D (right after C, the converted model still on the machine): `eaglelab tune --device cuda --batch-sizes 1,8,32`
#     in run's regime; the profile it writes comes back as $OUT/tuned_profile.json.
#
#   call A  carry .carry/m1 .carry/assets .whl     STAGE=A
#   call B  carry .carry/m2 .carry/assets .whl     STAGE=B
#   call C  carry .carry/m3 .carry/assets .whl     STAGE=C
#   call D  carry .carry/assets .whl               STAGE=D
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=A, B, C or D}
source "$(dirname "$0")/device_stage.sh"
PROMPT="Give three tips for staying healthy."

stage_a() {
  record_gpu
  park_parts
  TAIL=12 run gpu_tests_runtime 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime \
    --ignore tests/engine/runtime/test_cycle_ops.py --ignore tests/engine/runtime/test_tp_compile.py
  TAIL=12 run gpu_tests_ops 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_cycle_ops.py
  TAIL=12 run gpu_tests_model 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/model
  TAIL=40 run incident_8b $(left) python3 examples/incident_verify_eager.py --device cuda --scale-model llama3.1-8b
}

stage_b() {
  park_parts
}

stage_c() {
  join_gguf
  TAIL=40 run run_default 170 $EL run --device cuda --record "$R/run_default.jsonl" "$PROMPT"
  TAIL=40 run run_default_q81 120 $EL run --device cuda --record "$R/run_default_q81.jsonl" "$Q81"
  TAIL=60 run bench_default $(left) $EL bench --json "$R/h200_bench_default.json"
}

stage_d() {
  [ -f "$GGUF" ] || { log "no GGUF: the machine went cold after call C"; exit 3; }
  TAIL=80 run tune $(left) $EL tune --device cuda --batch-sizes 1,8,32 --json "$R/h200_tune.json" \
    --record "$R/h200_tune.jsonl"
}

before_tar() {
  local p
  for p in "$EAGLELAB_CACHE"/profiles/*.json; do [ -f "$p" ] && cp "$p" "$OUT/tuned_profile.json"; done
  return 0
}

export STAGE_S=${STAGE_S:-$([ "$STAGE" = B ] && echo 60 || echo 570)}; watchdog "$0"
run_stage A B C D
