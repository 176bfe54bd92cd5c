#!/usr/bin/env bash
# Speculative decoding by n-gram lookup (bench/spec_bench.py), slotserve beside
# llama-server on the same GGUF of the embedded demo model (bench/gguf_export.py), each
# without speculation and with `--spec-type ngram-simple` at its defaults (n = 12,
# m = 48 on both); one server at a time. Needs bench/peer_llamacpp.sh's build first
# (BUILD_ONLY=1 bash bench/peer_llamacpp.sh).
#
#   bash bench/spec_peer.sh                      # rows llama llama-ngram ours ours-ngram; c = 1, 4, 8
#   CONCURRENCY="1 8" ROWS="ours ours-ngram" bash bench/spec_peer.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
D=$CACHE/demo
GGUF=$D/demo.gguf
ROWS=${ROWS:-llama llama-ngram ours ours-ngram}
CONCURRENCY=${CONCURRENCY:-1 4 8}
ARGS=(-np 8 -c 32768 -t 2)
mkdir -p "$D"
[ -f "$GGUF" ] || "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$ROOT/engine/demo_model" "$GGUF"

source "$ROOT/bench/serve_lib.sh"

run_row() {  # name port -- command...
  local name=$1 port=$2
  shift 3
  start_server "$D/spec-$name.log" "$port" -- "$@"
  for c in $CONCURRENCY; do
    echo "== $name c=$c" >&2
    "$PY" "$ROOT/bench/spec_bench.py" "http://127.0.0.1:$port" --concurrency "$c" --requests 14 --new 128 |
      tee "$D/spec-$name-c$c.json"
  done
  stop_server
}

cd "$ROOT"
for row in $ROWS; do
  case $row in
    llama) run_row llama 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui -m "$GGUF" ;;
    llama-ngram) run_row llama-ngram 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui \
      -m "$GGUF" --spec-type ngram-simple ;;
    ours) run_row ours 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" ;;
    ours-ngram) run_row ours-ngram 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" \
      --spec-type ngram-simple ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
done
