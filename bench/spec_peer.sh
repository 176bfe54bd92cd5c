#!/usr/bin/env bash
# Speculative decoding (bench/spec_bench.py), slotserve beside llama-server on the same
# GGUF of the embedded demo model (bench/gguf_export.py), each without speculation,
# with `--spec-type ngram-simple` at its defaults (n = 12, m = 48 on both), the same
# with n = 3 (rows *-ngram3), and with a
# draft model (`-md`, the same draft GGUF on both: the demo model's smaller sibling,
# trained by scripts/train_demo.py into $DRAFT if missing, ~8 minutes); one server at a
# time. Needs bench/peer_llamacpp.sh's build first (BUILD_ONLY=1 bash bench/peer_llamacpp.sh).
#
#   bash bench/spec_peer.sh          # every row (llama*, ours*); c = 1, 8, 32; workloads repeat, complete
#   CONCURRENCY="1 8" ROWS="ours ours-ngram" bash bench/spec_peer.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
D=$CACHE/demo
GGUF=$D/demo.gguf
ROWS=${ROWS:-llama llama-ngram llama-ngram3 llama-draft ours ours-ngram ours-ngram3 ours-draft}
CONCURRENCY=${CONCURRENCY:-1 8 32}
WORKLOADS=${WORKLOADS:-repeat complete}
DRAFT=${DRAFT:-$HOME/.cache/slotserve-bench/demo-draft}
DRAFT_ARGS=(--spec-draft-n-max "${DRAFT_N_MAX:-8}" --spec-draft-p-min "${DRAFT_P_MIN:-0.5}")
ARGS=(-np 32 -c 32768 -t 2)
mkdir -p "$D"
[ -f "$GGUF" ] || "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$ROOT/engine/demo_model" "$GGUF"
[ -f "$DRAFT/model.safetensors" ] || "$PY" "$ROOT/scripts/train_demo.py" --minutes 8 --hidden 128 --layers 2 \
  --heads 2 --kv-heads 1 --ffn 352 --tokenizer "$ROOT/engine/demo_model" --out "$DRAFT"
[ -f "$D/draft.gguf" ] || "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$DRAFT" "$D/draft.gguf"

source "$ROOT/bench/serve_lib.sh"

run_row() {  # name port -- command...
  local name=$1 port=$2
  shift 3
  start_server "$D/spec-$name.log" "$port" -- "$@"
  for w in $WORKLOADS; do
    for c in $CONCURRENCY; do
      echo "== $name $w c=$c" >&2
      "$PY" "$ROOT/bench/spec_bench.py" "http://127.0.0.1:$port" --concurrency "$c" --workload "$w" \
        --requests "$((4 * c > 14 ? 4 * c : 14))" --new 128 | tee "$D/spec-$name-$w-c$c.json"
    done
  done
  stop_server
}

cd "$ROOT"
for row in $ROWS; do
  case $row in
    llama) run_row llama 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui -m "$GGUF" ;;
    llama-ngram) run_row llama-ngram 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui \
      -m "$GGUF" --spec-type ngram-simple ;;
    llama-ngram3) run_row llama-ngram3 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui \
      -m "$GGUF" --spec-type ngram-simple --spec-ngram-simple-size-n 3 ;;
    llama-draft) run_row llama-draft 8191 -- "$CACHE/llama-server" --port 8191 "${ARGS[@]}" -tb 2 --no-webui \
      -m "$GGUF" --spec-type draft-simple -md "$D/draft.gguf" "${DRAFT_ARGS[@]}" ;;
    ours) run_row ours 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" ;;
    ours-ngram) run_row ours-ngram 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" \
      --spec-type ngram-simple ;;
    ours-ngram3) run_row ours-ngram3 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" \
      --spec-type ngram-simple --spec-ngram-simple-size-n 3 ;;
    ours-draft) run_row ours-draft 8193 -- "$PY" -m server.cli serve --port 8193 "${ARGS[@]}" -m "$GGUF" \
      --spec-type draft-simple -md "$D/draft.gguf" "${DRAFT_ARGS[@]}" ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
done
