#!/usr/bin/env bash
# The ninth session's last GPU call (2026-12-01, after h200_v16.sh) on ONE H200, for #12: the draft's top-k. The 5/4/24
# profile (h200_2026-12-01i/A) spent 52 us of the draft's 238 us of kernels in the fused log-softmax + top-k at the
# shipped drafter's 12,288-token vocabulary (4 calls, one program per row: the one-pass path below TOP_K_ONE_PASS)
# and 9 us in the root's. This call times that step alone, one pass against two stages (benchmarks/topk_bench.py),
# then the speculative bench on SmolLM2's shape (random weights: costs only) with the threshold as shipped and with
# every vocabulary ranked in two stages (TOP_K_ONE_PASS set to 0 in the process), one after the other.
#   carry .whl .carry/assets      STAGE=D
STAGE=${STAGE:-D}
source "$(dirname "$0")/device_stage.sh"

scale_bench() {  # NAME ONE_PASS: 5/4/24 cycles on SmolLM2's shape, the shipped drafter's draft vocabulary
  TAIL=14 run "$1" $(( $(left) / ${3:-1} )) python3 -c "import sys; import eaglelab.engine.runtime.tree as t; \
t.TOP_K_ONE_PASS = int(sys.argv[1]); from eaglelab.cli import main; sys.exit(main(sys.argv[2:]))" "$2" \
    bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 --steps 5 --topk 4 --draft-tokens 24 \
    --batch-sizes 1 --prompts 2 --max-new-tokens 128 --repeats 3 --configs spec-compile-gemv-attn --no-micro \
    --json "$R/h200_$1.json"
}

stage_d() {
  record_gpu
  TAIL=20 run topk_bench 150 python3 benchmarks/topk_bench.py --vocab 12288,32000 --rows 1x1,1x4,8x4 --chunks 128,256 \
    --json "$R/h200_topk_bench.json"
  scale_bench spec_scale_shipped 16384 2
  scale_bench spec_scale_two_stage 0
}

export STAGE_S=${STAGE_S:-540}; watchdog "$0"
run_stage D
