#!/usr/bin/env bash
# Continuous batching on ONE H200 (device kind nvidia-h200), four back-to-back device calls sent as one message, run
# from the repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging.
#
#   - A (no GGUF needed): the GPU tests of serving, the CUDA graphs and the decode attention (the new serving path on
#     real graphs; the 8B verify's attention cuts under tree masks); the Llama-3.1-8B shape end to end, speculative
#     with the Triton decode attention against SDPA in the same run, batch 1 and 8 (the verify's phase time is the
#     attention cut's end-to-end figure). Parks the GGUF's part 1.
#   - B: parks part 2; a CUDA smoke of `bench --continuous` on SmolLM2's shape (random weights: the path, not a figure).
#   - C: parks part 3, nothing else.
#   - D: joins the GGUF; the shipped drafter on every MT-bench first turn (80) at batch 8 and 32, plain against
#     speculative in the same process, first in batches (the prompts in groups of 8 / 32, each running until its
#     longest row ends), then served continuously (`--continuous`: each request's row refilled as it ends).
#
#   call A  carry .carry/mq1 .carry/assets .whl   STAGE=A
#   call B  carry .carry/mq2 .whl                 STAGE=B
#   call C  carry .carry/mq3 .whl                 STAGE=C
#   call D  carry .carry/mq4 .carry/assets .whl   STAGE=D
#   call E  carry .carry/assets .whl              STAGE=E (optional, right after D)
# STAGE=T (carry a part and .whl) parks it as C does and runs the GPU tests of serving, of the graph runner and of
# compiled phases in graphs; STAGE=F (carry .whl) the 8B shape's verify of a 5/4/24 tree against SDPA.
#
# The refill batch of 2026-12-04 (the uncompiled prompt on the compiled pieces; free rows waiting for each other):
#   call T  carry .carry/mq1 .whl                 STAGE=T
#   call C  carry .carry/mq2 .whl                 STAGE=C
#   call C  carry .carry/mq3 .whl                 STAGE=C
#   call R  carry .carry/mq4 .carry/assets .whl   STAGE=R: batch 8 and 32 in batches, then served (a quarter of the
#           batch's free rows wait for each other: the default)
#   call S  carry .carry/assets .whl              STAGE=S (right after R): batch 1 on the 80; batch 8 and 32 served
#           refilling each free row at once (--refill-rows 1)
# and a third (C with mq1, mq2, mq3; then V with mq4 and assets): batch 8 served at the trees 5/4/24 and 3/2/6.
# The GGUF travels in four parts here (.carry/mq1..mq4, ~22.6 MB each): the device counts the tree in disk blocks
# (38.5 MB of them on 2026-12-04, the shipped drafter in it), so a ~30 MB part no longer fits beside it in 64 MiB.
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=A, B, C, D, E, F or T}
source "$(dirname "$0")/device_stage.sh"

# serve_bench NAME LIMIT EXTRA...: the shipped drafter against plain decoding (each at its profile's tree) on the 80
# MT-bench first turns at batch 8 and 32, 128 tokens, every kernel; $R/NAME.txt, $R/h200_smollm2_NAME.json
serve_bench() {
  local name=$1 limit=$2; shift 2
  TAIL=40 run "$name" "$limit" $EL bench --model default --draft $SHIPPED --batch-sizes 8,32 --prompts 80 \
    --max-new-tokens 128 --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --no-eos \
    "$@" --json "$R/h200_smollm2_$name.json"  # EOS ignored, as these ran before --continuous honoured it by default
}

stage_a() {
  record_gpu
  park_parts
  TAIL=12 run gpu_tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_serve.py \
    tests/engine/runtime/test_cuda_graphs.py tests/engine/model/test_decode_attention.py
  TAIL=40 run bench_8b_spec $(left) $EL bench --scale-model llama3.1-8b --dtype bfloat16 --seed 0 --batch-sizes 1,8 \
    --configs spec-compile-gemv,spec-compile-gemv-attn --prompts 2 --max-new-tokens 64 --repeats 2 --no-micro \
    --json "$R/h200_8b_spec_attn.json"
}

stage_b() {
  record_gpu
  park_parts
  TAIL=30 run serve_smoke $(left) $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --continuous --batch-sizes 8 --prompts 24 --max-new-tokens 64 --repeats 1 \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --json "$R/h200_serve_smoke.json"
}

stage_c() {
  park_parts
}

# T: parks the part carried, then the GPU tests of serving and of the graph runner in one process (serving's first: the
# order in which a collection inside a capture showed up in call A)
stage_t() {
  record_gpu
  park_parts
  TAIL=12 run gpu_tests_t $(left) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_serve.py \
    tests/engine/runtime/test_cuda_graphs.py tests/engine/runtime/test_loop.py tests/engine/runtime/test_compile.py
}

# R: joins the GGUF; batch 8 and 32 in batches, then served with the default refill (a quarter of the batch waits
# for each other)
stage_r() {
  join_gguf
  serve_bench batched 250
  serve_bench served $(left) --continuous
}

# S (right after R, the model still in the cache): batch 1 on all 80 (the prompt's cost on the compiled pieces, the
# day's b1 ratio); batch 8 and 32 served with each free row refilled at once (--refill-rows 1, the engine before)
stage_s() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call R"; exit 3; }
  serve_bench b1 230 --batch-sizes 1
  serve_bench served_r1 $(left) --continuous --refill-rows 1
}

# V: joins the GGUF; batch 8 served (the default refill) at the batch-1 tree 5/4/24 and at 3/2/6: whether serving,
# which no longer waits for a batch's slowest row, wants another tree at batch 8 than batches did (4/4/12)
stage_v() {
  join_gguf
  serve_bench served_b8_5-4-24 260 --continuous --batch-sizes 8 --steps 5 --topk 4 --draft-tokens 24
  serve_bench served_b8_3-2-6 $(left) --continuous --batch-sizes 8 --steps 3 --topk 2 --draft-tokens 6
}

# F (no GGUF): the 8B shape's verify of a 5/4/24 tree (96 query rows a KV head: the planner's 8B cuts of 2026-12-04)
# with the Triton decode attention against SDPA, batch 1
stage_f() {
  record_gpu
  TAIL=30 run bench_8b_tree $(left) $EL bench --scale-model llama3.1-8b --dtype bfloat16 --seed 0 --batch-sizes 1 \
    --steps 5 --topk 4 --draft-tokens 24 --configs spec-compile-gemv,spec-compile-gemv-attn --prompts 2 \
    --max-new-tokens 64 --repeats 2 --no-micro --json "$R/h200_8b_tree_attn.json"
}

# E (right after D, the model still in the cache): batch 8 served with the batch-1 tree 5/4/24, the tree that
# batches of 8 lost to their stragglers; MT-bench at batch 1 for the same day's baseline
stage_e() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call D"; exit 3; }
  serve_bench served_5-4-24 200 --continuous --batch-sizes 8 --steps 5 --topk 4 --draft-tokens 24
  serve_bench b1 $(left) --batch-sizes 1
}

stage_d() {
  join_gguf
  TAIL=6 run gpu_tests_d 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/runtime/test_serve.py
  serve_bench batched 270
  serve_bench served $(left) --continuous
}

export STAGE_S=${STAGE_S:-$(case $STAGE in B) echo 200;; T) echo 300;; C) echo 60;; E|S) echo 420;; *) echo 570;; esac)}
watchdog "$0"
run_stage A B C D E F T R S V
