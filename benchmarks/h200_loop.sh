#!/usr/bin/env bash
# The host loop's figures (issue: speculation that pays on the H200): run on one H200 from the repo root,
# after the default model is in place (as benchmarks/h200_final.sh stage E sets it up). Writes into
# ${OUT:-.}/r. About 6 minutes after the first compile (inductor's on-disk cache then serves the rest).
#
#   1. the GPU tests of the loop (in-graph bookkeeping, lagged stop check, graphs == eager)
#   2. bench, bs 1 and 8: plain-graphs / plain-compile / spec-decode-graphs / spec-compile end to end
#      (the rows to set against the 2026-11-30 run: plain-compile bs 1 772.3 tok/s end to end, decode
#      phase 1.047 ms median)
#   3. decode_profile, default model and the llama3.1-8b scale model: kernels of one step, the replayed
#      step, end-to-end tok/s against the same engine stopping at once (same-run baseline)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for p in engine probes tui; do [ -e eaglelab/$p ] || ln -sfn ../$p eaglelab/$p; done  # the subpackages, as a checkout maps them
R=${OUT:-.}/r; mkdir -p "$R"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$R/$name.txt" 2>&1; echo "$name rc=$?"; tail -25 "$R/$name.txt"; }
EL="python3 -m eaglelab"

run loop_gpu_tests 300 python3 -m pytest -q -m gpu tests/engine/runtime/test_loop.py tests/engine/runtime/test_cuda_graphs.py \
  tests/engine/runtime/test_readback.py tests/engine/runtime/test_compile.py -p no:cacheprovider
run bench_loop 400 $EL bench --model default --batch-sizes 1,8 --prompts 8 --max-new-tokens 128 \
  --configs plain-graphs,plain-compile,spec-decode-graphs,spec-compile --no-micro --json "$R/h200_loop_bench.json"
run decode_profile_smollm2 240 python3 benchmarks/decode_profile.py --model default --tokens 128 --json "$R/h200_decode_profile_smollm2.json"
run decode_profile_8b 300 python3 benchmarks/decode_profile.py --model llama3.1-8b --tokens 128 --json "$R/h200_decode_profile_8b.json"
