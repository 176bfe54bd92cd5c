#!/usr/bin/env bash
# slotserve beside llama.cpp's llama-server on the same checkpoint, same machine.
#
#   bash bench/peer_llamacpp.sh                  # concurrency 1,8,32, 2 rounds each
#   CONCURRENCY=1,8 ROUNDS=1 bash bench/peer_llamacpp.sh
#
# Builds llama-server from the llama-cpp-python source distribution into a cache
# folder outside the repository (SLOTSERVE_PEER_CACHE, default ~/.cache/slotserve-peer),
# writes the bench checkpoint of bench/engine_bench.py (88M Llama, float32) as a
# float32 GGUF with the gguf package of that tree (bench/gguf_export.py), then runs
# bench/serve_bench.py against each server in turn (never both at once: 2 cores),
# both with 32 slots, the same context and 2 threads, and prints the ratios.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
CONCURRENCY=${CONCURRENCY:-1,8,32}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
SLOTS=32
CTX=8192
mkdir -p "$CACHE"

build_llama_server() {
  [ -x "$CACHE/llama-server" ] && return
  (cd "$CACHE" && "$PY" -m pip download -q --no-binary :all: --no-deps llama-cpp-python -d src)
  tar xzf "$CACHE"/src/llama_cpp_python-*.tar.gz -C "$CACHE"
  local tree
  tree=$(ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  cmake -S "$tree" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  cmake --build "$CACHE/build" --target llama-server -j "$(nproc)"
  cp "$CACHE/build/bin/llama-server" "$CACHE/llama-server"
  ln -sfn "$tree" "$CACHE/tree"
}

export_gguf() {
  [ -f "$CACHE/bench.gguf" ] && return
  if [ ! -x "$CACHE/venv/bin/python" ]; then
    python3 -m venv "$CACHE/venv"
    "$CACHE/venv/bin/pip" install -q "$CACHE/tree/gguf-py" safetensors numpy
  fi
  rm -rf "$CACHE/ckpt"
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench'); import engine_bench as b; \
from pathlib import Path; p = Path('$CACHE/ckpt'); p.mkdir(); b.build_checkpoint(p, b.SHAPE)"
  "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$CACHE/ckpt" "$CACHE/bench.gguf"
}

wait_ready() {  # url: ready when a one-token completion succeeds
  for _ in $(seq 1 600); do
    curl -sf "$1/v1/completions" -H 'Content-Type: application/json' \
      -d '{"prompt": [1, 2, 3], "max_tokens": 1}' > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server at $1 did not come up" >&2
  return 1
}

bench_one() {  # name url out -- command...
  local name=$1 url=$2 out=$3
  shift 4
  "$@" > "$CACHE/$name.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
  wait_ready "$url"
  echo "== $name" >&2
  "$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency "$CONCURRENCY" --rounds "$ROUNDS" | tail -1 > "$out"
  kill "$SERVER_PID" 2> /dev/null || true
  wait "$SERVER_PID" 2> /dev/null || true
  trap - EXIT
}

build_llama_server
export_gguf
KV_UNIFIED=""
"$CACHE/llama-server" --help 2>&1 | grep -q -- "--kv-unified" && KV_UNIFIED="--kv-unified"

bench_one llama-server http://127.0.0.1:8191 "$CACHE/llama.json" -- \
  "$CACHE/llama-server" -m "$CACHE/bench.gguf" --port 8191 -np $SLOTS -c $CTX -t "$THREADS" -tb "$THREADS" \
  $KV_UNIFIED --no-webui
bench_one slotserve http://127.0.0.1:8192 "$CACHE/slotserve.json" -- \
  "$PY" -m server.cli serve -m "$CACHE/ckpt" --port 8192 -np $SLOTS -c $CTX -t "$THREADS"

"$PY" - "$CACHE/slotserve.json" "$CACHE/llama.json" << 'EOF'
import json, sys
ours, theirs = (json.load(open(p))["levels"] for p in sys.argv[1:3])
print(f"{'conc':>4} {'slotserve tok/s':>15} {'llama tok/s':>11} {'ratio':>6}  {'TTFT p50 ms (ours/llama)':>26} {'ratio':>6}"
      f"  {'ITL p50 ms (ours/llama)':>24}")
for a, b in zip(ours, theirs):
    print(f"{a['concurrency']:>4} {a['output_tok_s']:>15.1f} {b['output_tok_s']:>11.1f} "
          f"{a['output_tok_s'] / b['output_tok_s']:>5.2f}x  {a['ttft_ms_p50']:>12.1f} / {b['ttft_ms_p50']:<11.1f} "
          f"{a['ttft_ms_p50'] / b['ttft_ms_p50']:>5.2f}x  {a['itl_ms_p50']:>10.2f} / {b['itl_ms_p50']:<11.2f}")
print(json.dumps({"slotserve": ours, "llama-server": theirs}))
EOF
