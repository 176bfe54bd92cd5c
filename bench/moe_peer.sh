#!/usr/bin/env bash
# Issue 53's figures: slotserve beside llama-server on the same mixture-of-experts GGUF
# (random weights at bench shapes: bench/moe_models.py), one server at a time, both with
# -np 32 -c 32768 (1,024 cells a stream; llama-server's default per-stream KV) -t 2.
# Needs llama-server (and llama-quantize, for the MXFP4 file) from bench/peer_llamacpp.sh
# (BUILD_ONLY=1 bash bench/peer_llamacpp.sh).
#
#   bash bench/moe_peer.sh                                   # every file, both rows
#   FILES="gpt_oss-mxfp4" ROWS=ours bash bench/moe_peer.sh
#
# Per file and row, into $CACHE/moe/<file>-<row>.json (one JSON object):
#   decode:  bench/serve_bench.py, 128-token prompts, 64 new tokens, c = 1, 8 and 32 ($ROUNDS requests
#            a worker), after a warm-up of 8 requests at once on other prompts (both alike)
#   ttft512: bench/serve_bench.py, 512-token prompts, 4 new tokens, c = 1
#   rss:     the server's VmRSS after the runs, and its peak (VmHWM)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$CACHE/moe
FILES=${FILES:-gpt_oss-q8_0 gpt_oss-mxfp4 gpt_oss-q4_k_m qwen3_moe-q8_0 qwen3_moe-q4_k_m}
ROWS=${ROWS:-llama ours}
CONC=${CONC:-1,8,32}
ROUNDS=${ROUNDS:-2}  # requests per worker
ARGS=(-np 32 -c 32768 -t 2)
mkdir -p "$OUT"
"$PY" "$ROOT/bench/moe_models.py" "$OUT" > /dev/null

source "$ROOT/bench/serve_lib.sh"

measure() {  # file row port -- command...
  local file=$1 row=$2 port=$3 url="http://127.0.0.1:$3" parts=()
  shift 4
  start_server "$OUT/$file-$row.log" "$port" -- "$@"
  echo "== $file $row" >&2
  parts+=("\"decode\": $("$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency "$CONC" --rounds "$ROUNDS" --prompt 128 \
    --new 64 --warmup 8 | tail -1)")
  parts+=("\"ttft512\": $("$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency 1 --rounds 3 --prompt 512 --new 4 \
    | tail -1)")
  parts+=("\"rss_bytes\": $(awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")")
  parts+=("\"peak_rss_bytes\": $(awk '/^VmHWM:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")")
  stop_server
  (IFS=,; echo "{${parts[*]}}") | tee "$OUT/$file-$row.json"
}

cd "$ROOT"
for file in $FILES; do
  gguf=$OUT/$file.gguf
  [ -f "$gguf" ] || { echo "no $gguf (llama-quantize missing?)" >&2; continue; }
  for row in $ROWS; do
    case $row in
      llama) measure "$file" llama 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui -m "$gguf" ;;
      ours) measure "$file" ours 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" -m "$gguf" ;;
      *) echo "unknown row $row" >&2; exit 2 ;;
    esac
  done
done
