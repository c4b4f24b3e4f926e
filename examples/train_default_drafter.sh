#!/usr/bin/env bash
# Train the EAGLE-3 drafter shipped for SmolLM2-135M-Instruct (the default target), on one GPU.
#
#   examples/train_default_drafter.sh [DATA_DIR] [CHECKPOINT_DIR]
#
# 1. capture: 3000 training prompts (Python's reference manual, stdlib docstrings, self-instruct
#    seed topics; never MT-bench), the target's own greedy responses (self-distillation, up to 512
#    tokens), its hidden states at SpecForge's default layers [1, 14, 26] (SGLang convention =
#    hs[2], hs[15], hs[27]) in bf16, in SpecForge's offline format. ~10 GB on disk.
#    Re-running resumes (existing samples are kept).
# 2. train: TTT length 7 (weights 0.8^i), draft vocabulary 8192, AdamW with cosine schedule,
#    bf16 autocast; checkpoints every 200 steps (re-run with --resume after an interruption).
#    The result goes to eaglelab/drafters/smollm2-135m-eagle3 (config.json + model.safetensors,
#    ~19 MiB in bf16), where `eaglelab run` picks it up as the default drafter.
#
# Measured on an H200 with a SmolLM2-shaped target: capture ~5.6k generated tok/s at batch 256;
# training ~0.1-0.3 s per step of 16 sequences.
set -euo pipefail

DATA=${1:-/tmp/eaglelab-smollm2-data}
CKPT=${2:-/tmp/eaglelab-smollm2-checkpoints}
OUT=eaglelab/drafters/smollm2-135m-eagle3
EAGLELAB=${EAGLELAB:-eaglelab}   # or: "python3 -m eaglelab"

$EAGLELAB capture --model default --out "$DATA" \
    --prompts 3000 --max-new-tokens 512 --max-length 2048 \
    --batch-size 256 --device cuda --dtype bfloat16 --draft-vocab-size 8192 --seed 0

$EAGLELAB train --data "$DATA" --out "$OUT" --checkpoint-dir "$CKPT" \
    --epochs 10 --batch-size 16 --lr 3e-4 --warmup-ratio 0.015 --max-grad-norm 0.5 \
    --ttt-length 7 --draft-vocab-size 8192 --max-length 2048 \
    --checkpoint-every 200 --log-every 10 --tensorboard "$CKPT/tb" \
    --device cuda --dtype bfloat16 --save-dtype bfloat16 ${RESUME:+--resume}

ls -la "$OUT"
