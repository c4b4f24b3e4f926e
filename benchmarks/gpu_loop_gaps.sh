#!/usr/bin/env bash
# Where a batch-1 speculative cycle's end-to-end time goes beside its phases (issue 40): on the H200 the phases of
# 5/4/24 + a branch of 16 add up to ~1.28 ms, a cycle end to end ~1.43 ms. benchmarks/loop_gaps.py traces whole
# requests (device busy against the host's wall time, the gaps, the kernels of a cycle); bench's phase costs for the
# same tree in the same call. Run from the repo root with STAGE and OUT set; benchmarks/device_stage.sh (sourced)
# does the staging.
#
#   calls C, C, C  carry .carry/mq1, .carry/mq2, .carry/mq3 (each with .whl)   STAGE=C: park a part of the GGUF
#                  (since 2026-12-07 five parts: C carries .carry/mr1 .. mr4, the joining call mr5; benchmarks/README.md)
#   call X  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=X: joins the GGUF; loop_gaps.py
#           on the first 10 MT-bench first turns, 128 tokens, EOS ignored, plain against 5/4/24 + 16; then
#           `bench --phase-costs` of the same pair and tree
#   call K  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=K: joins the GGUF; the same
#           bench at batch 1 (10 prompts) in two processes, one after the other, from an empty eaglelab cache: the
#           second should take the GEMV tilings the first tuned (eaglelab/gemv_cache.py: no tuning, the compile
#           cache hit); each report's "where the time went" says so. Not run yet.
#   call I  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=I: joins the GGUF;
#           `bench --figures --batch-sizes 1` as `run` decodes (80 MT-bench first turns by category; FIG_EXTRA, e.g.
#           `--code-prompts 0 --repeats 1` to fit a short budget), each figure with its 95% interval over the prompts;
#           tried once (C, C, C, I on 2026-12-05): the machine stopped answering, nothing came back; ran after Q on
#           2026-12-06 (below). I_PHASES=1: then bench's phase costs of Q's four columns (10 prompts); FIG_AB: the
#           figures (and phases) under benchmarks/ab_constants.py's switches (e.g. `--combo-kernels off`);
#           FIG_NAME: their files' name (figures_b1). C, C, C, I (I_PHASES=1),
#           I twice more (FIG_EXTRA "--repeats 1 --batch-sizes 8,32 --code-prompts 0", combo kernels on, then off by
#           FIG_AB) and I at batch 1 off: benchmarks/results/h100_2026-12-06d (thirteenth session).
#   call P  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=P: joins the GGUF; a chain of
#           121 SmolLM2-shaped GEMVs in one graph plain / PDL / PDL + early weights (benchmarks/pdl_bench.py); the GPU
#           test of dependent launches (tests/engine/model/test_pdl.py: the same tokens with and without); one bench
#           process at batch 1 (PDL_PROMPTS, 10) with plain and 5/4/24 + 16, each without and with --pdl
#           (`*-pdl` columns: every kernel of the captured phases launched dependently), phase costs; then batch 8
#           if time is left. Ran 2026-12-05 on one H100 at f7d6bc8 (benchmarks/results/h100_2026-12-05f/P).
#   call Q  carry .carry/mq4 .carry/assets .whl (right after the third C)      STAGE=Q: joins the GGUF; P's batch-1
#           bench again with the `*-pdl` columns' GEMV tuned apart, in chains of dependent launches (TritonGemv pdl:
#           where cuBLAS is a few tenths of a microsecond faster alone, our kernel keeps the chain); loop_gaps.py on
#           the two `*-pdl` columns (4 prompts): every kernel left outside the chain, per step and per cycle; batch 8
#           if time is left. Then I on the same warm machine. Ran 2026-12-06 on one H100 at 923be96: C, C, C, Q, I
#           (benchmarks/results/h100_2026-12-06/QI; I with FIG_EXTRA="--repeats 1", 95 s warm).
#   call E  carry .carry/assets .whl (no GGUF: SmolLM2's shape with random weights)   STAGE=E: the chain of
#           benchmarks/pdl_bench.py with one and two weight tiles loaded before the PDL wait; then bench's phase costs
#           of the two `*-pdl` columns (5/4/24, batch 1) in four processes, EARLY_TILES 1, 2, 1, 2 (the op's
#           constant, set in each process by benchmarks/ab_constants.py): what loading a second tile early does to a verify
#           and a decode. Ran 2026-12-06 (eleventh session) on one H100 (benchmarks/results/h100_2026-12-06b/E: two
#           tiles make a decode cheaper and a verify dearer).
#   call F  carry .carry/assets .whl (no GGUF)   STAGE=F: the GPU test of the same tokens with and without --pdl,
#           then E's phase costs (with the lookup branch of 16, and a speculative column without --pdl) under the row
#           rule that followed (gemv_kernels.early_tiles: two tiles at one row, one at more) against one tile at every
#           row, and with a verify's logits handed on in bf16 against float32: six processes.
#           Ran 2026-12-06 (twelfth session) twice (benchmarks/results/h100_2026-12-06c/F1, F2).
#   call G  carry .carry/assets .whl (no GGUF)   STAGE=G: bench's phase costs (plain and 5/4/24 + 16, compiled, no
#           --pdl) in processes G_RUNS: `shared` (main: a compiled forward's mask made once, layers.shared), `per-layer`
#           (as before: inductor builds it again for each layer's attention op), `combo` (`shared` with inductor's
#           combo kernels: compile.COMBO_KERNELS); each kind's first process compiles from a cold cache
#           (~100-140 s), a repeat ~30 s.
#           Ran 2026-12-06 (twelfth session, benchmarks/results/h100_2026-12-06c/G).
#   call H  carry .carry/assets .whl (no GGUF)   STAGE=H: the GPU tests of combo kernels' tokens (without and, on a
#           Hopper GPU, with --pdl), of a draft step's expansion in one launch and of split attention merged in its
#           own launch; then phase costs of the plain and `*-pdl` pairs in H_RUNS processes, each a `+` of: `combo`
#           (compile.COMBO_KERNELS and COMBO_WITH_PDL on), `nocombo`, `expand1` (cycle_kernels.EXPAND_ONE_LAUNCH),
#           `attn1` (decode_attention_kernels.ONE_LAUNCH). The first four processes decide; the repeats run as
#           time allows (the tests ~250 s and the four ~400 s on a bare machine: two calls on a warm one, the
#           second with H_TESTS=0). Ran 2026-12-06 (thirteenth session) on one H100 in two calls (H_RUNS "combo
#           combo+expand1+attn1 nocombo ..." then "nocombo combo+expand1+attn1"; benchmarks/results/h100_2026-12-06d/H1,
#           H2): combo kernels on since, the two one-launch kernels left off.
#   call J  carry .carry/assets .whl (no GGUF)   STAGE=J: bench's phase costs (plain and 5/4/24 with no lookup
#           branch: the 24-node verify issue 40 names) in J_RUNS processes, `base` (main) or `rows16` (split
#           attention merged in its own launch where a KV head has at most 16 query rows: a decode, a draft step;
#           decode_attention_kernels.ONE_LAUNCH_ROWS). ~110 s the first on a bare machine, ~35 s each after.
#           Ran 2026-12-06 (thirteenth session) on one H100 with the session's last 154 s: `base_1`, `rows16_2`
#           (benchmarks/results/h100_2026-12-06d/J): 16 rows on since. J_TILINGS ('bn,bk,split,warps,stages;...'):
#           first benchmarks/gemv_bench.py times them beside the tuner's candidates (rows 2, 4, 24, 40), then a J_RUNS
#           entry `tilings` is a process whose GEMV tuner holds them too (benchmarks/ab_constants.py --gemv-tilings).
#   call L  carry .carry/assets .whl (no GGUF)   STAGE=L: `bench --profile` of plain and 5/4/24 with no lookup branch
#           (the 24-node verify of issue 40), batch 1 (L_BATCHES), compiled with every kernel: each phase of a cycle
#           kernel by kernel, and a decode step of the same kernels beside the verify at its context (where the
#           verify's cost over a decode goes); with --phase-costs, the replayed phases beside them. L_EXTRA: more
#           bench flags (a later tree flag wins), L_NAME: the files' name. Ran 2026-12-06 (fifteenth session) on one
#           H100: L1, then L8 (L_BATCHES=8, L_EXTRA="--steps 4 --topk 4 --draft-tokens 12 --lookup-tokens 8"),
#           benchmarks/results/h100_2026-12-06e.
# Ran 2026-12-05 on one H100 each: C, C, C, X twice (benchmarks/results/h100_2026-12-05d/X1, X2), and C, C, C, Y at
# b15739b (the collector and read-ahead A/B, reverted: Y/).
#   call S  carry .carry/assets .whl (no GGUF)   STAGE=S: a split GEMV tiling's K shares added by the compiled code
#           that reads the output (gemv.SHARES, on in main) against added in the kernel: `bench --phase-costs
#           --profile` of plain and 5/4/24 with no lookup branch, batch 1, compiled with every kernel, in S_RUNS
#           processes (default "tickets shares": `tickets` under ab_constants --gemv-shares off, `shares` on), then
#           benchmarks/gemv_bench.py --shares (each way's tuner pick at 1, 4 and 24 rows, alone and in a compiled
#           reader) as time allows. S_EXTRA: more bench flags. S_TILINGS ('bn,bk,split,warps,stages;...'): first
#           gemv_bench.py --shares times them at 4 and 24 rows, then an S_RUNS entry `tilings` is `shares` with them
#           among the tuner's candidates at 2..64 rows (ab_constants --gemv-tilings). S_TEST=1: first the GPU test of
#           the GEMV (tests/engine/model/test_gemv.py -k cuda); S_RUNS="" and S_BENCH=0 leave out the rest.
#   call R  carry .carry/assets .whl (no GGUF)   STAGE=R: the GEMV past 64 rows (`rows256`: ab_constants --gemv-max-rows
#           256, a batch's verify cut into blocks of 64 rows; main since) against cuBLAS there (`rows64`: 64).
#           First `bench --phase-costs` of plain and the batch-8 tree (4/4/12 + 8) at batch 8 on SmolLM2's shape
#           with random weights, in R_RUNS processes (default "rows256 rows64"; R_RUN_S seconds each at most, 220),
#           each tuning its own GEMV (the tilings cache emptied first); R_EXTRA: more bench flags (a later tree or
#           batch flag wins). Then, as time allows: R_GEMV=1 (default) benchmarks/gemv_bench.py --shares on
#           SmolLM2's shapes at 8, 96 and 160 rows (a decode at batch 8, the verify at batch 32 of 2/1/3 and at
#           batch 8 of 4/4/12 + 8); R_TEST=1 the GPU tests of the GEMV (every tiling at 1-160 rows) and of combo
#           kernels' tokens (the compiled phases route q/k/v and gate/up by gemv.reader_adds), R_TEST=gemv or
#           combo one of them. Ran 2026-12-07 (nineteenth session) on one H100: C + R (R_TEST=1), C, C, I twice
#           (FIG_AB "--gemv-max-rows 256", then 64 as main was), R at batch 32 (R_RUNS "rows64 rows256" R_GEMV=0
#           R_EXTRA="--steps 2 --topk 1 --draft-tokens 3 --lookup-tokens 0 --batch-sizes 32 --prompts 32"):
#           benchmarks/results/h100_2026-12-07 (a verify 5% cheaper at batch 8 and 32; the whole range on since).
# Everything lands in $OUT/results_$STAGE.tar.gz. Knobs: STAGE_S, DEVICE (cuda), GAPS_PROMPTS (10), PHASE_COSTS (1;
# 0: loop_gaps alone), GAPS_EXTRA (more loop_gaps/bench flags, e.g. for a dry run), GAPS (1; 0: stage Q without
# loop_gaps.py).
STAGE=${STAGE:?set STAGE=C, X, K, I, P, Q, E, F, G, H, J, L, S or R}
source "$(dirname "$0")/device_stage.sh"
DEVICE=${DEVICE:-cuda}
TREE="--steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16"

stage_c() {
  park_parts
}

stage_x() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  TAIL=60 run loop_gaps 330 python3 benchmarks/loop_gaps.py --model default --draft $SHIPPED --device "$DEVICE" \
    $TREE --prompts ${GAPS_PROMPTS:-10} --max-new-tokens 128 --json "$R/loop_gaps.json" ${GAPS_EXTRA:-}
  [ "${PHASE_COSTS:-1}" = 1 ] || return 0
  TAIL=40 run phase_costs $(left) $EL bench --model default --draft $SHIPPED --device "$DEVICE" $TREE \
    --batch-sizes 1 --prompts 10 --max-new-tokens 128 --repeats 2 --no-micro --phase-costs \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/phase_costs.json" ${GAPS_EXTRA:-}
}

# K: two cold-cache processes in turn (the inductor and GEMV caches start empty in a fresh EAGLELAB_CACHE)
stage_k() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  export EAGLELAB_CACHE_FRESH=$HOME/k_cache; rm -rf "$EAGLELAB_CACHE_FRESH"; mkdir -p "$EAGLELAB_CACHE_FRESH"
  cp -r "$EAGLELAB_CACHE/models" "$EAGLELAB_CACHE/assets" "$EAGLELAB_CACHE_FRESH/" 2>/dev/null
  local n
  for n in first second; do
    TAIL=8 run "cold_$n" 250 env EAGLELAB_CACHE="$EAGLELAB_CACHE_FRESH" $EL bench --model default --draft $SHIPPED \
      --device "$DEVICE" $TREE --batch-sizes 1 --prompts 10 --max-new-tokens 128 --repeats 2 --no-micro \
      --no-phase-costs --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/cold_$n.json"
  done
  cp "$EAGLELAB_CACHE_FRESH/gemv_tilings.json" "$R/" 2>/dev/null
}

stage_i() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  local el=$EL  # FIG_AB: benchmarks/ab_constants.py's switches for the figures and phases, e.g. `--combo-kernels off`
  [ -n "${FIG_AB:-}" ] && el="python3 benchmarks/ab_constants.py $FIG_AB --"
  local name=${FIG_NAME:-figures_b1}  # e.g. figures_b8_32 beside FIG_EXTRA="--batch-sizes 8,32"
  TAIL=45 run "$name" $(left) $el bench --figures --model default --draft $SHIPPED --device "$DEVICE" \
    --batch-sizes 1 --max-new-tokens 128 --json "$R/$name.json" ${FIG_EXTRA:-}
  # I_PHASES=1: then the phase costs of the pair with and without --pdl (Q's columns, 10 prompts), as time allows
  [ "${I_PHASES:-0}" = 1 ] && [ "$(left)" -gt 60 ] && TAIL=30 run phases_b1 "$(left)" $el bench --model default \
    --draft $SHIPPED --device "$DEVICE" $TREE --batch-sizes 1 --prompts 10 --max-new-tokens 128 --repeats 2 \
    --no-micro --phase-costs --json "$R/phases_b1.json" \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn,plain-compile-gemv-attn-pdl,spec-compile-gemv-attn-pdl
  return 0
}

# P: the same pair with and without dependent launches, interleaved in one process
stage_p() {
  record_gpu
  if [ "$DEVICE" = cuda ]; then TAIL=8 run pdl_chain 90 python3 benchmarks/pdl_bench.py --json "$R/pdl_chain.json"
  else TAIL=4 run pdl_chain 120 env TRITON_INTERPRET=1 python3 benchmarks/pdl_bench.py --check; fi  # a CPU dry run
  TAIL=20 run pdl_test 150 python3 -m pytest -q -m gpu tests/engine/model/test_pdl.py -p no:cacheprovider
  [ -f "$GGUF" ] || join_gguf
  local cols=plain-compile-gemv-attn,plain-compile-gemv-attn-pdl,spec-compile-gemv-attn,spec-compile-gemv-attn-pdl
  TAIL=45 run pdl_b1 300 $EL bench --model default --draft $SHIPPED --device "$DEVICE" $TREE --batch-sizes 1 \
    --prompts ${PDL_PROMPTS:-10} --max-new-tokens 128 --repeats 2 --no-micro --phase-costs --configs $cols \
    --json "$R/pdl_b1.json"
  TAIL=30 run pdl_b8 $(left) $EL bench --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes 8 \
    --prompts 16 --max-new-tokens 128 --repeats 2 --no-micro --no-phase-costs --configs $cols --json "$R/pdl_b8.json"
}

# Q: P's pair again, the *-pdl columns with a GEMV tuned in dependent launches; what is left outside their chains
stage_q() {
  record_gpu
  [ -f "$GGUF" ] || join_gguf
  local cols=plain-compile-gemv-attn,plain-compile-gemv-attn-pdl,spec-compile-gemv-attn,spec-compile-gemv-attn-pdl
  TAIL=45 run pdl_b1 260 $EL bench --model default --draft $SHIPPED --device "$DEVICE" $TREE --batch-sizes 1 \
    --prompts ${PDL_PROMPTS:-10} --max-new-tokens 128 --repeats 2 --no-micro --phase-costs --configs $cols \
    --json "$R/pdl_b1.json"
  [ "${GAPS:-1}" = 0 ] || TAIL=70 run chain_gaps 150 python3 benchmarks/loop_gaps.py --model default --draft $SHIPPED --device "$DEVICE" \
    $TREE --prompts 4 --max-new-tokens 128 --timed 1 --stack-requests 0 --top 25 \
    --configs plain-compile-gemv-attn-pdl,spec-compile-gemv-attn-pdl --json "$R/chain_gaps.json" ${GAPS_EXTRA:-}
  TAIL=30 run pdl_b8 $(left) $EL bench --model default --draft $SHIPPED --device "$DEVICE" --batch-sizes 8 \
    --prompts 16 --max-new-tokens 128 --repeats 2 --no-micro --no-phase-costs --configs $cols --json "$R/pdl_b8.json"
}

# E: one weight tile or two before the PDL wait, alone and in the phases (random weights: the costs, not the text)
stage_e() {
  record_gpu
  if [ "$DEVICE" = cuda ]; then TAIL=8 run pdl_chain2 120 python3 benchmarks/pdl_bench.py --rows 1,4,24,40 --replays 100 \
    --json "$R/pdl_chain2.json"
  else TAIL=8 run pdl_chain2 200 env TRITON_INTERPRET=1 python3 benchmarks/pdl_bench.py --check; fi  # a CPU dry run
  local t n=0
  for t in 1 2 1 2; do
    n=$((n + 1))
    TAIL=14 run "early${t}_$n" 150 python3 benchmarks/ab_constants.py --early-tiles "$t" -- bench --scale-model smollm2-135m --draft-vocab 12288 \
      --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 5 --topk 4 --draft-tokens 24 --batch-sizes 1 --prompts 4 \
      --max-new-tokens ${EARLY_TOKENS:-64} --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn-pdl,spec-compile-gemv-attn-pdl --json "$R/early${t}_$n.json"
  done
}

# F: the row rule (two early tiles at one row, one at more: gemv_kernels.early_tiles) against one tile at every row,
# and the verify and draft steps handing their logits on in bf16 against float32 (Transformer.logits and
# Eagle3Network.head with float32=False; the old way patched back in by benchmarks/ab_constants.py), six processes: rule, one, rule + float32
# logits, twice (the logits pair first, then the rule's, as time allows); first the GPU test of the same tokens with
# and without dependent launches
stage_f() {
  record_gpu
  [ "${F_TEST:-1}" = 0 ] || TAIL=12 run pdl_test 150 python3 -m pytest -q -m gpu tests/engine/model/test_pdl.py \
    -p no:cacheprovider
  local t n=0 wide limit
  # the most wanted first: a short budget cuts the rest. A process compiles from a cold inductor cache what no
  # earlier one compiled (the first ~200 s on a bare machine, a float32-logits one ~100 s more, a warm one ~60 s)
  for t in ${F_RUNS:-2:bf16 2:f32 2:bf16 2:f32 1:bf16 1:bf16}; do
    n=$((n + 1))
    [ "$(left)" -gt 45 ] || break
    wide=$([ "${t#*:}" = f32 ] && echo --float32-logits)
    limit=$(case $n in 1) echo 250;; 2) echo 200;; *) echo 120;; esac)
    [ "$limit" -lt "$(left)" ] || limit=$(left)
    TAIL=14 run "onerow${t/:/_}_$n" "$limit" python3 benchmarks/ab_constants.py \
      --one-row-tiles "${t%:*}" $wide -- bench --scale-model smollm2-135m \
      --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 5 --topk 4 --draft-tokens 24 \
      --lookup-tokens 16 --batch-sizes 1 --prompts 4 --max-new-tokens ${EARLY_TOKENS:-64} --repeats 1 --no-micro \
      --phase-costs --configs plain-compile-gemv-attn-pdl,spec-compile-gemv-attn-pdl,spec-compile-gemv-attn \
      --json "$R/onerow${t/:/_}_$n.json"
    [ $n != 1 ] || kernel_sources
  done
  [ "$(left)" -gt 60 ] || return 0
  TAIL=70 run cycle_kernels $(left) python3 benchmarks/loop_gaps.py --scale-model smollm2-135m --draft-vocab 12288 \
    --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 16 \
    --prompts 2 --max-new-tokens 64 --timed 1 --stack-requests 0 --top 60 \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/cycle_kernels.json"
}

stage_g() {
  record_gpu
  local t n=0 flag limit
  for t in ${G_RUNS:-shared per-layer combo shared per-layer combo}; do
    n=$((n + 1))
    [ "$(left)" -gt 40 ] || break
    flag=$(case $t in per-layer) echo --mask-per-layer --combo-kernels off;; combo) echo --combo-kernels on;;
           *) echo --combo-kernels off;; esac)
    limit=$([ $n -le 3 ] && echo 200 || echo 90)
    [ "$limit" -lt "$(left)" ] || limit=$(left)
    TAIL=12 run "${t}_$n" "$limit" python3 benchmarks/ab_constants.py $flag -- bench --scale-model smollm2-135m \
      --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" $TREE --batch-sizes 1 --prompts 4 \
      --max-new-tokens 64 --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/${t}_$n.json"
    [ $n = 3 ] || continue
    kernel_sources  # every kind compiled by now
    # the same tokens with and without --pdl, compiled with GEMV and decode attention: the shared mask on a GPU
    [ "$(left)" -gt 150 ] && TAIL=12 run pdl_test 150 python3 -m pytest -q -m gpu tests/engine/model/test_pdl.py \
      -p no:cacheprovider
  done
}

stage_h() {
  record_gpu
  if [ "${H_TESTS:-1}" != 0 ]; then
    TAIL=14 run combo_test 240 python3 -m pytest -q -m gpu tests/engine/runtime/test_compile.py -k combo \
      -p no:cacheprovider
    TAIL=8 run one_launch_tests 150 python3 -m pytest -q -m gpu tests/engine/runtime/test_cycle_ops.py \
      tests/engine/model/test_decode_attention.py -k "expansion or sdpa_on_cuda" -p no:cacheprovider
  fi
  local t n=0 flags part
  for t in ${H_RUNS:-combo nocombo combo+expand1 combo+attn1 combo nocombo combo+expand1 combo+attn1}; do
    n=$((n + 1))
    [ "$(left)" -gt 40 ] || break
    flags=""
    for part in ${t//+/ }; do
      flags+=" $(case $part in combo) echo --combo-kernels on --combo-with-pdl;; nocombo) echo --combo-kernels off;;
                 expand1) echo --expand-one-launch on;; attn1) echo --attention-one-launch on;; esac)"
    done
    # shellcheck disable=SC2086
    TAIL=12 run "${t}_$n" "$(left)" python3 benchmarks/ab_constants.py $flags -- bench --scale-model smollm2-135m \
      --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" $TREE --batch-sizes 1 --prompts 4 \
      --max-new-tokens 64 --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn,spec-compile-gemv-attn,plain-compile-gemv-attn-pdl,spec-compile-gemv-attn-pdl \
      --json "$R/${t}_$n.json"
  done
}

stage_j() {
  record_gpu
  local t n=0 flags
  if [ -n "${J_TILINGS:-}" ]; then  # the extra GEMV tilings alone first, beside the tuner's candidates
    TAIL=40 run gemv_tilings 90 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 2,4,24,40 \
      --shapes o,down,qkv,gate_up --tilings "$J_TILINGS" --json "$R/gemv_tilings.json"
  fi
  for t in ${J_RUNS:-base rows16 base rows16}; do
    n=$((n + 1))
    [ "$(left)" -gt 30 ] || break
    flags=""; [ "$t" = rows16 ] && flags="--attention-one-launch-rows 16"
    [ "$t" = tilings ] && flags="--gemv-tilings ${J_TILINGS:?set J_TILINGS for a tilings run}"
    # shellcheck disable=SC2086
    TAIL=12 run "${t}_$n" "$(left)" python3 benchmarks/ab_constants.py $flags -- bench --scale-model smollm2-135m \
      --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 5 --topk 4 --draft-tokens 24 \
      --lookup-tokens 0 --batch-sizes 1 --prompts 4 --max-new-tokens 64 --repeats 1 --no-micro --phase-costs \
      --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/${t}_$n.json" ${J_EXTRA:-}
  done
}

stage_l() {
  record_gpu
  local name=${L_NAME:-profile_5-4-24}  # e.g. profile_4-4-12_l8 for another tree in L_EXTRA
  TAIL=150 run "$name" "$(left)" $EL bench --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 \
    --seed 0 --device "$DEVICE" --steps 5 --topk 4 --draft-tokens 24 --lookup-tokens 0 --batch-sizes "${L_BATCHES:-1}" \
    --prompts 4 --max-new-tokens 64 --repeats 1 --no-micro --phase-costs --profile \
    --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/$name.json" ${L_EXTRA:-}
}

stage_s() {
  record_gpu
  local t n=0 way
  if [ "${S_TEST:-0}" = 1 ]; then  # the GPU test of the GEMV: every tiling, the shares added outside and compiled
    TAIL=12 run gemv_test 240 python3 -m pytest -q -m gpu tests/engine/model/test_gemv.py -k cuda -p no:cacheprovider
  fi
  if [ -n "${S_TILINGS:-}" ]; then  # the extra tilings alone first (split ones as their shares' kernel)
    TAIL=40 run gemv_tilings 100 python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 4,24 \
      --shapes o,down,qkv --shares --tilings "$S_TILINGS" --json "$R/gemv_tilings.json"
  fi
  for t in ${S_RUNS-tickets shares}; do  # S_RUNS="": no bench process
    n=$((n + 1))
    [ "$(left)" -gt 60 ] || break
    case "$t" in
      shares) way="--gemv-shares on";;
      tickets) way="--gemv-shares off";;
      tilings) way="--gemv-shares on --gemv-tilings ${S_TILINGS:?set S_TILINGS for a tilings run}";;
      *) log "S_RUNS: $t is not shares, tickets or tilings"; return 2;;
    esac
    # each process tunes its own shapes: the tilings cache is keyed by the setup, not by the candidates, so a
    # `tilings` process after a `shares` one would take its choices untimed (as tilings_3 of h100_2026-12-06f/S2 did)
    rm -f "$EAGLELAB_CACHE/gemv_tilings.json"
    # shellcheck disable=SC2086
    TAIL=60 run "${t}_$n" "$(left)" python3 benchmarks/ab_constants.py $way -- bench \
      --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 5 --topk 4 \
      --draft-tokens 24 --lookup-tokens 0 --batch-sizes 1 --prompts 4 --max-new-tokens 64 --repeats 1 --no-micro \
      --phase-costs --profile --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/${t}_$n.json" \
      ${S_EXTRA:-}
  done
  [ "$(left)" -gt 40 ] && [ "${S_BENCH:-1}" = 1 ] || return 0
  TAIL=60 run gemv_shares "$(left)" python3 benchmarks/gemv_bench.py --model smollm2-135m --rows 1,4,24 \
    --shapes o,down,qkv,gate_up --shares --json "$R/gemv_shares.json"
}

stage_r() {
  record_gpu
  local t n=0 way limit
  for t in ${R_RUNS-rows256 rows64}; do  # first: a short budget cuts the tests and gemv_bench.py instead
    n=$((n + 1))
    [ "$(left)" -gt 60 ] || break
    case "$t" in
      rows256) way="--gemv-max-rows 256";;
      rows64) way="--gemv-max-rows 64";;
      *) log "R_RUNS: $t is not rows256 or rows64"; return 2;;
    esac
    limit=${R_RUN_S:-220}; [ "$limit" -lt "$(left)" ] || limit=$(left)
    rm -f "$EAGLELAB_CACHE/gemv_tilings.json"  # each process tunes its own shapes
    # shellcheck disable=SC2086
    TAIL=40 run "${t}_$n" "$limit" python3 benchmarks/ab_constants.py $way -- bench \
      --scale-model smollm2-135m --draft-vocab 12288 --dtype bfloat16 --seed 0 --device "$DEVICE" --steps 4 --topk 4 \
      --draft-tokens 12 --lookup-tokens 8 --batch-sizes 8 --prompts 8 --max-new-tokens 64 --repeats 1 --no-micro \
      --phase-costs --configs plain-compile-gemv-attn,spec-compile-gemv-attn --json "$R/${t}_$n.json" ${R_EXTRA:-}
  done
  [ "${R_GEMV:-1}" = 1 ] && [ "$(left)" -gt 40 ] && TAIL=60 run gemv_rows "$(left)" python3 benchmarks/gemv_bench.py \
    --model smollm2-135m --rows 8,96,160 --shapes o,down,qkv,gate_up --shares --json "$R/gemv_rows.json"
  case "${R_TEST:-0}" in 1|gemv)
    [ "$(left)" -gt 60 ] && TAIL=12 run gemv_test "$(left)" python3 -m pytest -q -m gpu tests/engine/model/test_gemv.py \
      -k cuda -p no:cacheprovider;;
  esac
  case "${R_TEST:-0}" in 1|combo)
    [ "$(left)" -gt 60 ] && TAIL=12 run combo_test "$(left)" python3 -m pytest -q -m gpu \
      tests/engine/runtime/test_compile.py -k combo -p no:cacheprovider;;
  esac
  return 0
}

kernel_sources() {  # the source of every Triton kernel inductor made so far (read on a CPU beside a trace's names)
  local d found=""
  for d in "${TORCHINDUCTOR_CACHE_DIR:-}" "$EAGLELAB_CACHE/inductor" "/tmp/torchinductor_$(whoami)"; do
    [ -n "$d" ] && [ -d "$d" ] || continue
    log "inductor cache $d: $(find "$d" -type f | wc -l) files, $(du -sh "$d" | cut -f1)"
    found="$found $d"
  done
  # shellcheck disable=SC2086
  [ -n "$found" ] && find $found -name '*.py' -type f -exec grep -l 'triton' {} + 2>/dev/null |
    tar czf "$R/inductor_kernels.tar.gz" -T - 2>/dev/null
  log "kernel sources: $(tar tzf "$R/inductor_kernels.tar.gz" 2>/dev/null | wc -l) files"
}

export STAGE_S=${STAGE_S:-$(case "$STAGE" in C) echo 120;; *) echo 580;; esac)}; watchdog "$0"
run_stage C X K I P Q E F G H J L S R
