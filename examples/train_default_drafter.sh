#!/usr/bin/env bash
# Train the EAGLE-3 drafter shipped for SmolLM2-135M-Instruct (the default target), on one GPU.
#
#   examples/train_default_drafter.sh [WORK_DIR]
#
# 1. prompts (CPU, ~30 s): 140k distinct prompts built offline (chat requests of the eight MT-bench kinds and
#    follow-ups from our own slot lists, 65%; self-instruct seed topics x templates x style modifiers,
#    templated tasks, Python's reference manual, docstrings of the standard library and installed packages),
#    none sharing a 13-word window with MT-bench or HumanEval; ~7.5 MiB gzip JSONL with a manifest of
#    sources and counts.
# 1b. synthesize (GPU): prompts the target writes itself, its own user turns sampled from the chat template's
#    text before a user message (temperature 1.0, batches of 2048), screened, deduplicated and checked against
#    MT-bench and HumanEval like the corpus. (H200: 56k kept in 128 s.) They lead the distill's list, so the
#    first 100k answered are all of them and the corpus after; the shipped (fourth) drafter was warm-started
#    from the third (trained on the corpus' first 100k) and trained on 56k of these + the corpus' last 40k.
# 2. distill: the target's own greedy answers (self-distillation), up to 160 tokens, in batches of 1024
#    rows with CUDA graphs, one prompt-length class at a time; token ids only. Re-running resumes (done
#    prompts are skipped); DISTILL_S bounds one run. (H200: 100k prompts in 132 s.)
# 3. train --online: the target computes its aux states (SpecForge's default layers [1, 14, 26], SGLang
#    convention = hs[2], hs[15], hs[27]) and final hidden states per batch, so nothing but token ids is
#    stored. TTT length 7 (weights 0.8^i), draft vocabulary 12,288, AdamW with a cosine schedule ending at
#    TOTAL_STEPS (5365: the shipped drafter's, ~3.4 passes at batch 64), bf16. Every 400 steps: simulated
#    accepted length and per-position acceptance on 512 held-out samples (console and TensorBoard).
#    TRAIN_S bounds one run: it stops at a step boundary with a checkpoint, and re-running the same command
#    with RESUME=1 continues bit-identically. INIT=DIR warm-starts from a trained drafter (the shipped one
#    was warm-started from its predecessor). (H200: ~9.7 steps/s.)
#    The result goes to eaglelab/drafters/smollm2-135m-eagle3 (config.json + model.safetensors, 23.3 MiB
#    in bf16, and eaglelab_training.json: data, sizes, steps, device time, last acceptance).
set -euo pipefail

WORK=${1:-/tmp/eaglelab-drafter}
OUT=eaglelab/drafters/smollm2-135m-eagle3
EAGLELAB=${EAGLELAB:-eaglelab}   # or: "python3 -m eaglelab"

[ -f "$WORK/prompts/prompts.jsonl.gz" ] || $EAGLELAB prompts --out "$WORK/prompts" --count 140000
[ -f "$WORK/synth/prompts.jsonl.gz" ] || $EAGLELAB synthesize --out "$WORK/synth" --count "${SYNTH_N:-60000}" \
    --batch-size 2048 --max-new-tokens 128 --top-p 1.0 --device cuda --dtype bfloat16 ${SYNTH_S:+--time-limit "$SYNTH_S"}

$EAGLELAB distill --prompts "$WORK/synth" "$WORK/prompts" --out "$WORK/distill" --model default \
    --limit 100000 --max-new-tokens 160 --batch-size 1024 --max-prompt-tokens 512 \
    --device cuda --dtype bfloat16 ${DISTILL_S:+--time-limit "$DISTILL_S"}

$EAGLELAB train --online --target default --data "$WORK/distill" --out "$OUT" --checkpoint-dir "$WORK/ck" \
    --total-steps "${TOTAL_STEPS:-5365}" --batch-size 64 --lr 4e-4 --warmup-ratio 0.02 --max-grad-norm 0.5 \
    --ttt-length 7 --draft-vocab-size 12288 --max-length 768 ${INIT:+--init-from "$INIT"} \
    --checkpoint-every 200 --log-every 50 --eval-every 400 --eval-samples 512 --tensorboard "$WORK/tb" \
    --device cuda --dtype bfloat16 --save-dtype bfloat16 ${TRAIN_S:+--time-limit "$TRAIN_S"} ${RESUME:+--resume}

ls -la "$OUT"
