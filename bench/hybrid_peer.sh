#!/usr/bin/env bash
# Issue 52's figures: slotserve beside llama-server on the same Qwen3.5-like GGUF (Q8_0,
# random weights at bench shapes: bench/hybrid_models.py), one server at a time, both
# with -np 8 -c 32768 (4,096 cells a stream; llama-server's default per-stream KV) -t 2.
# Needs llama-server from bench/peer_llamacpp.sh (BUILD_ONLY=1 bash bench/peer_llamacpp.sh).
#
#   bash bench/hybrid_peer.sh                           # both models, both rows
#   MODELS=moe ROWS=ours bash bench/hybrid_peer.sh
#
# Per model and row, into $CACHE/hybrid/<model>-<row>.json (one JSON object):
#   conversation: bench/conversation.py (8 turns, 2,000-token system prompt, 200 new
#                 tokens a turn, 32-token answers, then the last answer regenerated)
#   rerendered:   the same with each answer's last 8 tokens written differently in the
#                 next turn's history (as chat templates do)
#   decode:       bench/serve_bench.py, 128-token prompts, 64 new tokens, c = 1 and 8
#   ttft512:      bench/serve_bench.py, 512-token prompts, 4 new tokens, c = 1
#   rss:          the server's VmRSS after the runs, and its peak (VmHWM)
# and for the row "ours", speculation: bench/spec_bench.py --workload repeat at c = 1
# against a second slotserve with --spec-type ngram-simple (spec_plain / spec_ngram).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$CACHE/hybrid
MODELS=${MODELS:-dense moe}
ROWS=${ROWS:-llama ours}
ARGS=(-np 8 -c 32768 -t 2)
mkdir -p "$OUT"
"$PY" "$ROOT/bench/hybrid_models.py" "$OUT" > /dev/null

source "$ROOT/bench/serve_lib.sh"

measure() {  # model row port -- command...
  local model=$1 row=$2 port=$3 url="http://127.0.0.1:$3" parts=()
  shift 4
  start_server "$OUT/$model-$row.log" "$port" -- "$@"
  echo "== $model $row" >&2
  parts+=("\"conversation\": $("$PY" "$ROOT/bench/conversation.py" "$url")")
  parts+=("\"rerendered\": $("$PY" "$ROOT/bench/conversation.py" "$url" --rerender 8)")
  parts+=("\"decode\": $("$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency 1,8 --rounds 1 --prompt 128 --new 64 \
    | tail -1)")
  parts+=("\"ttft512\": $("$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency 1 --rounds 3 --prompt 512 --new 4 \
    | tail -1)")
  parts+=("\"rss_bytes\": $(awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")")
  parts+=("\"peak_rss_bytes\": $(awk '/^VmHWM:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")")
  if [ "$row" = ours ]; then
    parts+=("\"spec_plain\": $("$PY" "$ROOT/bench/spec_bench.py" "$url" --workload repeat --concurrency 1 \
      --requests 4 --new 128 | tail -1)")
    stop_server
    start_server "$OUT/$model-ours-spec.log" "$port" -- "$@" --spec-type ngram-simple --spec-ngram-simple-size-n 3
    parts+=("\"spec_ngram\": $("$PY" "$ROOT/bench/spec_bench.py" "$url" --workload repeat --concurrency 1 \
      --requests 4 --new 128 | tail -1)")
  fi
  stop_server
  (IFS=,; echo "{${parts[*]}}") | tee "$OUT/$model-$row.json"
}

cd "$ROOT"
for model in $MODELS; do
  gguf=$OUT/$model-q8_0.gguf
  for row in $ROWS; do
    case $row in
      llama) measure "$model" llama 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui -m "$gguf" ;;
      ours) measure "$model" ours 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" -m "$gguf" ;;
      *) echo "unknown row $row" >&2; exit 2 ;;
    esac
  done
done
