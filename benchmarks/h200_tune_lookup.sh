#!/usr/bin/env bash
# `eaglelab tune` measuring lookup branches beside its trees, on ONE H200 (device kind nvidia-h200). Ran
# 2026-12-05 (C, T, U: benchmarks/results/h200_2026-12-05/); then C, J, K, L, G on an H100, the only GPU lent
# (benchmarks/results/h100_2026-12-05/: J's R half cut by its limit, G's tests in the wrong order); C, H, I, G on
# another H100 (benchmarks/results/h100_2026-12-05b/); C, T, V (cut by its limit), W on a third H100
# (benchmarks/results/h100_2026-12-05c/). On an H200: T with branches beside every tree, V, N and W still to run.
# Run from the repo root with
# STAGE and OUT set; benchmarks/device_stage.sh (sourced) does the staging.
#
#   calls C, C, C  carry .carry/mq1, .carry/mq2, .carry/mq3 (each with .whl)   STAGE=C: park a part of the GGUF
#   call T  carry .carry/mq4 .carry/assets .whl   STAGE=T: joins the GGUF; then `eaglelab tune --batch-sizes 1` on
#           the shipped drafter, cold, with the default branch (16) beside each confirmed tree (2026-12-05: beside the
#           best predicted only): does the profile it writes keep a branch, and at what ratio against the shipped
#           profile's 2.18-2.19x (h200_2026-12-04d)? (T_TESTS=1: every GPU test first, as on 2026-12-05, when they took
#           the stage's time; call G runs them on their own now)
#   call U  carry .carry/assets .whl (right after T: the GGUF and the inductor cache stay on the warm machine)
#           STAGE=U: `bench --figures` with no tree flag at batch 1 over the 80 MT-bench first turns: the tree (and
#           branch) T's profile chose, as a user gets it after a tune, against plain decoding in the same run
#   call V  carry .carry/assets .whl (right after U)   STAGE=V: `eaglelab tune --batch-sizes 8,32` (a branch of 8
#           beside each best tree); its profile keeps T's batch-1 bucket (same regime: tune merges)
#   calls R, S  carry .carry/assets .whl (right after T or U: the GGUF stays on the warm machine)   STAGE=R, S:
#           `bench --figures` at batch 1 on the shipped profile's tree, 5/4/24 + a branch of 16, without (R) and with
#           (S) --lookup-spill (rows whose last token is new verify the drafter's best 40 nodes instead of the
#           branch): does the second tree selection in the captured draft phase cost less than the 2-3% more tokens
#           a cycle it gave on the CPU (benchmarks/results/cpu_2026-12-05c/)? Each against plain decoding in its run.
#   call J  carry .carry/mq4 .carry/assets .whl (in place of T, U, R, S; 2026-12-05, second session)   STAGE=J: joins
#           the GGUF; R's and S's figures; then the 80 MT-bench first turns served through 8 rows, plain against
#           speculative, with `--eos` (each row ends at the model's EOS, at most 512 tokens: plain's rows no longer
#           all end at one step) and without it (128 tokens, EOS ignored: the method of h200_2026-12-04d's 1.61x),
#           then through 32 rows with `--eos` in what is left
#   calls K, L  carry .carry/assets .whl (right after J)   STAGE=K: J's batch-8 pair on the H200 profile's batch-8
#           tree named (4/4/12 + 8: a GPU with no profile drafts the default chain), --eos up to 512 and 128 tokens
#           EOS ignored; STAGE=L: the same tree with --eos up to 128 (K's token budget, plain no longer in lockstep)
#   call H  carry .carry/mq4 .carry/assets .whl (after C, C, C)   STAGE=H: joins the GGUF; the spill's A/B at batch 1
#           on one machine; batch 8 served with --eos up to 128 tokens on the profile's tree, refilled by 2 and by 1
#   call I  carry .carry/assets .whl (right after H)   STAGE=I: batch 32 served with --eos; batch 8 with --eos, spilling
#   call N  carry .carry/mq4 .carry/assets .whl (after C, C, C)   STAGE=N: joins the GGUF; `bench` with no tree flag at
#           batch 1 over the 80 MT-bench first turns (the profile's tree, its branch spilling by default)
#   call W  carry .carry/mq4 .carry/assets .whl (after C, C, C)   STAGE=W: joins the GGUF; `bench --figures` with no
#           tree flag at batch 1, then batch 8 and 32 served with --eos up to 128 tokens: the defaults on this GPU
#           (T, U, V may follow it on the warm machine: T joins the GGUF only where it is not there)
#   call E  carry .carry/mq4 .carry/assets .whl (after C, C, C; .carry/assets .whl where a call before joined the GGUF)
#           STAGE=E: joins the GGUF unless there; `bench --figures` at batch 8 and 32 with no tree flag, then at batch 8
#           on another tree (E_FLAGS, E_NAME)
#   call G  carry .whl   STAGE=G: the 10 GPU tests no call has reached (the whole set takes more than 290 s on a
#           fresh H200: 28 of 38 passed in that time, twice); no GGUF needed
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S (the stage's time limit, s); TUNE_EXTRA and FIG_EXTRA
# (more flags for tune and bench: the candidates and branches a tune measures, fewer prompts and tokens for a dry run),
# T_BATCHES and V_BATCHES (T's and V's batch sizes: 1; 8,32), FIG_NAME (U's file name, figures_b1_tuned); for a dry
# run DEVICE (cuda).
#
# Before (CPU): the GGUF parts .carry/mq1..mq4 and .carry/assets as benchmarks/README.md says; `.whl` with gguf.
# Check the carried sizes and the stages' order on the CPU first:
#   DRY=/tmp/drytl DEVICE=cpu TUNE_EXTRA="--prompts 2 --max-new-tokens 16 --cost-tokens 4 --lookup-tokens 4" \
#   FIG_EXTRA="--code-prompts 2 --max-new-tokens 16" bash benchmarks/dry_run_cpu.sh h200_tune_lookup.sh "C:.carry/mq1 .whl" "C:.carry/mq2 .whl" \
#     "C:.carry/mq3 .whl" "T:.carry/mq4 .carry/assets .whl" "U:.carry/assets .whl" "V:.carry/assets .whl"
STAGE=${STAGE:?set STAGE=C, T, U, R, S, J, K, L, H, I, N, W, V, G or E}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}

stage_c() {
  park_parts
}

# tune_at NAME LIMIT BATCH_SIZES: a cold tune on the shipped drafter, its JSON, record and profile kept
tune_at() {
  TAIL=60 run "$1" "$2" $EL tune --device "$DEVICE" --draft $SHIPPED --batch-sizes "$3" --json "$R/h200_$1.json" \
    --record "$R/h200_$1.jsonl" ${TUNE_EXTRA:-}
  cp "$EAGLELAB_CACHE"/profiles/*.json "$R/" 2>/dev/null
  return 0
}

stage_t() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf  # after W the joined GGUF is on the warm machine
  [ -n "${T_TESTS:-}" ] && TAIL=15 run gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/tui
  local b=${T_BATCHES:-1}  # e.g. T_BATCHES=8: the batch-8 tune first
  tune_at "tune_b${b//,/_}" $(left) "$b"
}

# the 10 GPU tests no call has reached (test_mla_gpu's compiled cycle onwards in collection order), alone: named
# before `tests` they still ran in collection order (h100_2026-12-05/G: the first 10 of 38 again)
stage_g() {
  record_gpu
  local t=tests/engine/runtime
  TAIL=40 run gpu_tests_rest $(left) python3 -m pytest -v -m gpu -p no:cacheprovider -rs --durations=15 \
    $t/test_mla_gpu.py::test_compiled_one_graph_cycle_gives_plain_greedy $t/test_one_graph_cycle.py $t/test_readback.py \
    $t/test_serve.py $t/test_tp_compile.py $t/test_verification.py tests/engine/training/test_train.py \
    tests/examples/test_incidents.py
}

stage_u() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call T"; exit 3; }
  local name=${FIG_NAME:-figures_b1_tuned}  # e.g. figures_b8_32_tuned beside FIG_EXTRA="--batch-sizes 8,32"
  TAIL=60 run "$name" $(left) $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1 --max-new-tokens 128 --repeats 2 --json "$R/h200_$name.json" ${FIG_EXTRA:-}
}

# figures_tree NAME [FLAGS]: bench --figures at batch 1 on 5/4/24 + 16 (the shipped H200 profile's batch-1 choice)
figures_tree() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold"; exit 3; }
  local name=$1; shift
  TAIL=60 run "$name" ${FIG_LIMIT:-$(left)} $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1 --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16 "$@" --max-new-tokens 128 --repeats 2 \
    --json "$R/h200_$name.json" ${FIG_EXTRA:-}
}
stage_r() {
  figures_tree figures_b1_branch16
}
stage_s() {
  figures_tree figures_b1_branch16_spill --lookup-spill
}
# served NAME LIMIT BATCH_SIZES MAX_NEW EXTRA...: the 80 MT-bench first turns as one queue through each batch size's
# rows (the profile's tree for it), plain against speculative interleaved; EOS ignored unless EXTRA says --eos (the
# runs without it were made before `--continuous` honoured EOS by default)
served() {
  local name=$1 limit=$2 batches=$3 max_new=$4; shift 4
  TAIL=40 run "$name" "$limit" $EL bench --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes "$batches" \
    --prompts 80 --max-new-tokens "$max_new" --repeats 3 --configs plain-compile-gemv-attn,spec-compile-gemv-attn \
    --no-micro --continuous --no-eos "$@" --json "$R/h200_$name.json" ${SERVED_EXTRA:-}
}
stage_j() {
  record_gpu
  join_gguf
  FIG_LIMIT=260 figures_tree figures_b1_branch16  # a cold compile first: 150 s cut it (h100_2026-12-05/J)
  FIG_LIMIT=150 figures_tree figures_b1_branch16_spill --lookup-spill
  served served_b8_eos512 150 8 512 --eos
  served served_b8_128 120 8 128
  served served_b32_eos512 $(left) 32 512 --eos
}
B8_TREE="--steps 4 --topk 4 --draft-tokens 12 --lookup-tokens 8"  # the H200 profile's batch-8 bucket
# K: J's batch-8 pair on the tree the shipped profile takes at batch 8 (4/4/12 + a branch of 8), named: J ran on an
# H100, which then drafted the default chain (a GPU without a profile now takes its family's, eaglelab/profiles.py)
stage_k() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call J"; exit 3; }
  served served_b8_eos512_4-4-12-8 150 8 512 --eos $B8_TREE
  served served_b8_128_4-4-12-8 $(left) 8 128 $B8_TREE
}
# L: K's tree served with --eos at 128 tokens: K's token budget, plain's rows no longer ending in lockstep
stage_l() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call K"; exit 3; }
  served served_b8_eos128_4-4-12-8 $(left) 8 128 --eos $B8_TREE
}
# H (2026-12-05, fifth session; in place of J on the next GPU): joins the GGUF; the spill's A/B at batch 1 on one
# machine (J's run without it was cut while compiling, so its 2.34x has no same-machine partner): without the flag
# first (it compiles, cold), then with it; then batch 8 served with --eos up to 128 tokens on the profile's tree
# (no tree flag: the H200 profile's batch-8 bucket, or its family's on another Hopper), and with free rows
# refilled one at a time (--refill-rows 1: with rows ending at EOS they free up one by one)
stage_h() {
  record_gpu
  join_gguf
  FIG_LIMIT=250 figures_tree figures_b1_branch16
  FIG_LIMIT=150 figures_tree figures_b1_branch16_spill --lookup-spill
  served served_b8_eos128 110 8 128 --eos
  served served_b8_eos128_refill1 $(left) 8 128 --eos --refill-rows 1
}
# I (right after H): batch 32 served with --eos up to 128 tokens on the profile's tree; batch 8 with --eos and the
# spill (the profile's 4/4/12 has 52 candidates for 12 + 8 rows)
stage_i() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call H"; exit 3; }
  served served_b32_eos128 200 32 128 --eos
  served served_b8_eos128_spill $(left) 8 128 --eos --lookup-spill
}
# N (after C, C, C; 2026-12-05, fifth session): joins the GGUF; `bench` with no tree flag at batch 1 over the 80
# MT-bench first turns, plain against speculative: what a user gets once the branch spills by default
stage_n() {
  record_gpu
  join_gguf
  TAIL=40 run bench_b1_default $(left) $EL bench --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes 1 \
    --prompts 80 --max-new-tokens 128 --repeats 2 --configs plain-compile-gemv-attn,spec-compile-gemv-attn --no-micro \
    --json "$R/h200_bench_b1_default.json" ${SERVED_EXTRA:-}
}
# W (after C, C, C; 2026-12-05, sixth session): joins the GGUF; what a user gets with no tree flag on the reference
# GPU since the branch spills by default: `bench --figures` at batch 1 (80 MT-bench first turns by category, 40
# HumanEval prompts), then the 80 served through 8 and 32 rows with `--eos` up to 128 tokens (h100_2026-12-05b's method)
stage_w() {
  record_gpu
  join_gguf
  TAIL=60 run figures_b1_default 260 $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1 --max-new-tokens 128 --repeats 2 --json "$R/h200_figures_b1_default.json" ${FIG_EXTRA:-}
  served served_b8_eos128 160 8 128 --eos
  served served_b32_eos128 $(left) 32 128 --eos
}
# E (after C, C, C; 2026-12-06, fourteenth session, not run yet): joins the GGUF unless a call before did; `bench
# --figures` at batch 8 and 32 with no tree flag (the profile's 4/4/12 + 8 and chain of 2), then at batch 8 on E_FLAGS
# (another batch-8 tree, E_NAME its files' name), each against plain decoding in its run
stage_e() {
  : "${E_NAME:?set E_NAME}" "${E_FLAGS:?set E_FLAGS}"  # before anything runs
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  TAIL=60 run figures_b8_32 ${E_BASE_S:-200} $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 8,32 --max-new-tokens 128 --repeats 2 --json "$R/h200_figures_b8_32.json" ${FIG_EXTRA:-}
  TAIL=60 run "$E_NAME" $(left) $EL bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 8 $E_FLAGS --max-new-tokens 128 --repeats 2 --json "$R/h200_$E_NAME.json" ${FIG_EXTRA:-}
}
stage_v() {
  [ -f "$GGUF" ] || { log "no GGUF in the cache: the machine went cold after call U"; exit 3; }
  local b=${V_BATCHES:-8,32}  # e.g. V_BATCHES=8: batch 8 alone (its family's bucket stays at 32)
  tune_at "tune_b${b//,/_}" $(left) "$b"
}

export STAGE_S=${STAGE_S:-$(case $STAGE in C) echo 60;; *) echo 570;; esac)}
watchdog "$0"
run_stage C T U R S J K L H I N W V G E
