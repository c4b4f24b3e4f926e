#!/usr/bin/env bash
# Train the EAGLE-3 drafter shipped for SmolLM2-135M-Instruct (the default target), on one GPU.
#
#   examples/train_default_drafter.sh [WORK_DIR]
#
# 1. prompts (CPU, ~1 min): 50k distinct prompts built offline (self-instruct seed topics x templates x
#    style modifiers, templated tasks, Python's reference manual, docstrings of the standard library and
#    installed packages), none sharing a 13-word window with MT-bench or HumanEval; ~3.4 MB gzip JSONL
#    with a manifest of sources and counts.
# 2. distill: the target's own greedy answers (self-distillation), up to 256 tokens, in batches of 512
#    rows with CUDA graphs; token ids only (~35 MB of shards). Re-running resumes (done prompts are
#    skipped); DISTILL_S bounds one run.
# 3. train --online: the target computes its aux states (SpecForge's default layers [1, 14, 26], SGLang
#    convention = hs[2], hs[15], hs[27]) and final hidden states per batch, so nothing but token ids is
#    stored. TTT length 7 (weights 0.8^i), draft vocabulary 8192, AdamW with cosine schedule, bf16.
#    Every 100 steps: simulated accepted length and per-position acceptance on 512 held-out samples
#    (console and TensorBoard). TRAIN_S bounds one run: it stops at a step boundary with a checkpoint,
#    and re-running the same command with RESUME=1 continues bit-identically.
#    The result goes to eaglelab/drafters/smollm2-135m-eagle3 (config.json + model.safetensors, ~19 MiB
#    in bf16, and eaglelab_training.json: data, sizes, steps, device time, last acceptance).
set -euo pipefail

WORK=${1:-/tmp/eaglelab-drafter}
OUT=eaglelab/drafters/smollm2-135m-eagle3
EAGLELAB=${EAGLELAB:-eaglelab}   # or: "python3 -m eaglelab"

[ -f "$WORK/prompts/prompts.jsonl.gz" ] || $EAGLELAB prompts --out "$WORK/prompts" --count 50000

$EAGLELAB distill --prompts "$WORK/prompts" --out "$WORK/distill" --model default \
    --max-new-tokens 256 --batch-size 512 --max-prompt-tokens 512 \
    --device cuda --dtype bfloat16 ${DISTILL_S:+--time-limit "$DISTILL_S"}

$EAGLELAB train --online --target default --data "$WORK/distill" --out "$OUT" --checkpoint-dir "$WORK/ck" \
    --epochs 2 --batch-size 64 --lr 6e-4 --warmup-ratio 0.02 --max-grad-norm 0.5 \
    --ttt-length 7 --draft-vocab-size 8192 --max-length 1024 \
    --checkpoint-every 200 --log-every 20 --eval-every 100 --eval-samples 512 --tensorboard "$WORK/tb" \
    --device cuda --dtype bfloat16 --save-dtype bfloat16 ${TRAIN_S:+--time-limit "$TRAIN_S"} ${RESUME:+--resume}

ls -la "$OUT"
