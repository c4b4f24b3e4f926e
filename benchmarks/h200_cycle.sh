#!/usr/bin/env bash
# Issue 40's cycle cost with the lookup branch on ONE H200 (device kind nvidia-h200), run from the repo root with STAGE
# and OUT set; benchmarks/device_stage.sh (sourced) does the staging.
#
#   call P  carry .carry/assets .whl   STAGE=P: the profile's batch-1 cycle (5/4/24, a branch of 16) and batch-8 cycle
#           (4/4/12, a branch of 8) profiled kernel by kernel on SmolLM2's shape (random weights, the shipped
#           drafter's 12,288-token draft vocabulary); the GEMV and the decode attention alone at the rows those
#           verifies and drafts take (1, 4, 8, 16, 40, 64 rows; batch 8 x 20 rows)
#   call Q  carry .carry/assets .carry/base .whl   STAGE=Q, at commit 1b1d539 (the tree that had GemvConfig.block_m; reverted
#           after this call: no gain): the GEMV cutting a verify's rows in blocks (block_m):
#           its GPU tests; the GEMV alone at 1-64 rows, every tiling timed; the batch-1 cycle (5/4/24, a branch of 16:
#           40 verify rows) on SmolLM2's shape with this tree's GEMV and with the one before (.carry/base: `git
#           archive 25fe4a8 engine eaglelab probes tui`, the drafter's weights left out), each in its own process
#   calls C, C, C  carry .carry/mq1, .carry/mq2, .carry/mq3 (each with .whl)   STAGE=C: park a part of the GGUF
#   call R  carry .carry/mq4 .carry/assets .whl   STAGE=R: joins the GGUF; the real model at batch 1 over the 80
#           MT-bench first turns (plain and speculative interleaved, 2 passes), a branch of 16 beside the trees 5/4/24
#           (the profile's), 5/4/48 and 6/4/48 (a verify of 64 rows costs about one of 40: h200_2026-12-04e/P)
#   call S  carry .carry/assets .whl (right after R)   STAGE=S: the same with 4/4/48; then `bench --figures` at batch 1
#           (by category, and 40 HumanEval prompts) with the tree of R and S whose passes gave the best median speedup
#           (on 2026-12-04 the pick read reports only, which R's two cut runs lacked: it took 4/4/48, not 5/4/48)
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s).
STAGE=${STAGE:?set STAGE=P, Q, C, R or S}
source "$(dirname "$0")/device_stage.sh"

# cycle_profile NAME LIMIT BATCH STEPS TOPK DRAFT_TOKENS LOOKUP: one speculative cycle's phases profiled kernel by
# kernel (and one decode step), SmolLM2's shape with random weights
cycle_profile() {
  local name=$1 limit=$2 batch=$3
  TAIL=90 run "$name" "$limit" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps "$4" --topk "$5" --draft-tokens "$6" --lookup-tokens "$7" --batch-sizes "$batch" --prompts "$batch" \
    --max-new-tokens 64 --repeats 1 --configs spec-compile-gemv-attn --no-micro --profile --json "$R/h200_$name.json"
}

stage_p() {
  record_gpu
  cycle_profile profile_b1_5-4-24_l16 190 1 5 4 24 16
  cycle_profile profile_b8_4-4-12_l8 190 8 4 4 12 8
  TAIL=60 run gemv_rows 60 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,8,16,40,64 \
    --json "$R/h200_gemv_rows.json"
  TAIL=40 run attn_rows $(left) python3 benchmarks/attn_bench.py --shapes smollm2-135m --batch 1,8 --rows 1,4,20,40 \
    --slots 640 --used 300 --json "$R/h200_attn_rows.json"
}

# scale_cycle NAME LIMIT: the batch-1 cycle (5/4/24, a branch of 16) and plain decoding on SmolLM2's shape with random
# weights, every kernel, interleaved in one process; run from the current directory's tree
scale_cycle() {
  local name=$1 limit=$2
  TAIL=24 run "$name" "$limit" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 \
    --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16 --batch-sizes 1 --prompts 4 --max-new-tokens 128 \
    --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro --json "$R/h200_$name.json"
}

stage_q() {
  record_gpu
  TAIL=12 run gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/model/test_gemv.py
  TAIL=70 run gemv_rows 70 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,8,32,40,64 \
    --json "$R/h200_gemv_rows.json"
  scale_cycle scale_cut 170
  ( cd .carry/base && for p in engine probes tui; do ln -sfn ../$p eaglelab/$p; done
    PYTHONPATH=$PWD:$SITE scale_cycle scale_base $(left) )
}

stage_c() {
  park_parts
}

# tree_b1 S K N LIMIT: the shipped drafter at S/K/N with a branch of 16 against plain decoding, batch 1, the 80
# MT-bench first turns, 128 tokens; $R/b1_S-K-N_l16.txt, $R/h200_b1_S-K-N_l16.json
tree_b1() {
  local name=b1_$1-$2-$3_l16
  TAIL=22 run "$name" "$4" $EL bench --model default --draft $SHIPPED --batch-sizes 1 --prompts 80 \
    --max-new-tokens 128 --repeats 2 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro \
    --steps "$1" --topk "$2" --draft-tokens "$3" --lookup-tokens 16 --json "$R/h200_$name.json"
}

stage_r() {
  record_gpu
  join_gguf
  tree_b1 5 4 24 125
  tree_b1 5 4 48 130
  tree_b1 6 4 48 $(left)
}

stage_s() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call R"; exit 3; }
  tree_b1 4 4 48 130
  cp ~/best_trees/* "$R/" 2>/dev/null
  local best
  best=$(python3 - "$R" <<'PY'
import glob, re, statistics, sys
# each run's passes as its log prints them, so a run its limit cut after a pass still counts
best = None
for f in glob.glob(sys.argv[1] + "/b1_*_l16.txt"):
    tree = re.search(r"b1_(\d+)-(\d+)-(\d+)_l16", f).groups()
    ratios = [float(s) / float(p) for p, s in re.findall(
        r"pass \d+/\d+: plain-compile-gemv-attn ([\d.]+), spec-compile-gemv-attn ([\d.]+) tok/s", open(f).read())]
    if ratios and (best is None or statistics.median(ratios) > best[0]):
        best = (statistics.median(ratios), " ".join(tree))
print(best[1] if best else "5 4 24")
PY
)
  log "best tree by speedup: $best"
  set -- $best
  TAIL=60 run "figures_b1_$1-$2-$3_l16" $(left) $EL bench --figures --model default --draft $SHIPPED --device cuda \
    --batch-sizes 1 --max-new-tokens 128 --repeats 2 --steps "$1" --topk "$2" --draft-tokens "$3" --lookup-tokens 16 \
    --json "$R/h200_figures_b1_$1-$2-$3_l16.json"
}

# R's results stay on the machine for S's choice (R's tarball leaves with R)
before_tar() {
  if [ "$STAGE" = R ]; then mkdir -p ~/best_trees && cp "$R"/b1_*_l16.txt ~/best_trees/ 2>/dev/null; fi
  return 0
}

export STAGE_S=${STAGE_S:-$(case $STAGE in C) echo 60;; R) echo 430;; S) echo 310;; *) echo 570;; esac)}
watchdog "$0"
run_stage P Q C R S
