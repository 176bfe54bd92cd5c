#!/usr/bin/env bash
# More conversations than slots (bench/multiturn.py), slotserve beside llama-server on
# the same GGUF, each with its prompt cache on (both default to 8192 MiB of host RAM)
# and off; one server at a time (2 cores). Needs bench/peer_llamacpp.sh's build first
# (BUILD_ONLY=1 bash bench/peer_llamacpp.sh): llama-server and the 88M bench GGUF.
#
#   bash bench/turns_peer.sh                       # every row
#   ROWS="ours ours-cram0" bash bench/turns_peer.sh
#
# Rows: llama (default), llama-cram0 (-cram 0), ours (default), ours-cram0 (--cache-ram 0),
# and (not in the default set) ours-disk (--cache-ram 0 with the disk tier in a fresh
# folder: every saved state through a file), ours-q8 (-ctk q8_0 -ctv q8_0);
# all -np 4 -c 8192 -t 2. Results: one JSON line per row in $CACHE/88m/turns-<row>.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
M=$CACHE/88m
GGUF=${GGUF:-$M/bench.gguf}
ROWS=${ROWS:-llama llama-cram0 ours ours-cram0}
ARGS=(-np 4 -c 8192 -t 2)

source "$ROOT/bench/serve_lib.sh"

run_row() {  # name port -- command...
  local name=$1 port=$2
  shift 3
  start_server "$M/turns-$name.log" "$port" -- "$@"
  echo "== $name" >&2
  "$PY" "$ROOT/bench/multiturn.py" "http://127.0.0.1:$port" | tee "$M/turns-$name.json"
  stop_server
}

cd "$ROOT"
for row in $ROWS; do
  case $row in
    llama) run_row llama 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui -m "$GGUF" ;;
    llama-cram0) run_row llama-cram0 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui \
      -m "$GGUF" -cram 0 ;;
    ours) run_row ours 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" -m "$GGUF" ;;
    ours-cram0) run_row ours-cram0 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" -m "$GGUF" \
      --cache-ram 0 ;;
    ours-disk) rm -rf "$M/turns-disk" && run_row ours-disk 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" \
      -m "$GGUF" --cache-ram 0 --cache-disk "$M/turns-disk" ;;
    ours-q8) run_row ours-q8 8192 -- "$PY" -m server.cli serve --port 8192 "${ARGS[@]}" -m "$GGUF" \
      -ctk q8_0 -ctv q8_0 ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
done
