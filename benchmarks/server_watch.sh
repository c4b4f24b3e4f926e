#!/usr/bin/env bash
# Check `eaglelab tui --server` / `eaglelab report` against a real vLLM or SGLang server (needs a GPU
# machine with vLLM or SGLang installed; run from the repo root). It starts the server on the default
# model with the shipped drafter, sends a fixed load, saves /metrics before and after and the log,
# and writes what `eaglelab report` makes of each into $OUT.
#
#   ENGINE=sglang bash benchmarks/server_watch.sh      # or ENGINE=vllm
#
# Knobs (environment): ENGINE (sglang|vllm), MODEL (an HF-format dir; default: the converted default
# model in the eaglelab cache), DRAFT (default: the shipped drafter), PORT, REQUESTS, MAX_TOKENS, OUT.
# The plain-decoding baseline comes from the same script with SPEC=0 (same load, no drafter).
set -u
ENGINE=${ENGINE:-sglang}
MODEL=${MODEL:-$HOME/.cache/eaglelab/models/SmolLM2-135M-Instruct}
DRAFT=${DRAFT:-eaglelab/drafters/smollm2-135m-eagle3}
PORT=${PORT:-30000}
REQUESTS=${REQUESTS:-64}
MAX_TOKENS=${MAX_TOKENS:-256}
SPEC=${SPEC:-1}
OUT=${OUT:-runs/server_watch_${ENGINE}_spec${SPEC}}
mkdir -p "$OUT"
URL=http://127.0.0.1:$PORT

if [ "$ENGINE" = sglang ]; then
  ARGS=(python3 -m sglang.launch_server --model-path "$MODEL" --port "$PORT" --enable-metrics)
  [ "$SPEC" = 1 ] && ARGS+=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT"
                            --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
else
  ARGS=(vllm serve "$MODEL" --port "$PORT" --cudagraph-metrics)
  [ "$SPEC" = 1 ] && ARGS+=(--speculative-config "{\"method\": \"eagle3\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": 3}")
fi
"${ARGS[@]}" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
python3 -m eaglelab wait-ready "$URL" --log "$OUT/server.log" || exit 1

curl -s "$URL/metrics" > "$OUT/metrics_before.txt"
START=$(date +%s.%N)
for i in $(seq 1 "$REQUESTS"); do
  curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"Write a short story about a lighthouse keeper, number $i.\", \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}" \
    > /dev/null &
  [ $((i % 8)) = 0 ] && wait   # batches of 8 concurrent requests
done
wait
END=$(date +%s.%N)
curl -s "$URL/metrics" > "$OUT/metrics_after.txt"
echo "load: $REQUESTS requests x $MAX_TOKENS tokens in $(echo "$END - $START" | bc) s" | tee "$OUT/load.txt"

python3 -m eaglelab report "$OUT/metrics_after.txt" --json > "$OUT/report_metrics.json"
python3 -m eaglelab report "$OUT/server.log" --json > "$OUT/report_log.json"
python3 -m eaglelab report "$URL" --window 5 --json > "$OUT/report_url_idle.json"
echo "saved to $OUT"
