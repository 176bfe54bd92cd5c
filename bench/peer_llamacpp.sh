#!/usr/bin/env bash
# slotserve beside llama.cpp's llama-server on the same checkpoint, same machine, in
# every configuration worth comparing; ratios are against the best llama-server row.
#
#   bash bench/peer_llamacpp.sh                  # concurrency 1,8,32, 2 rounds each
#   CONCURRENCY=1,8 ROUNDS=1 bash bench/peer_llamacpp.sh
#   BUILD_ONLY=1 bash bench/peer_llamacpp.sh     # build llama-server and the GGUFs, run nothing
#   ROWS="llama-f16 slotserve" bash bench/peer_llamacpp.sh   # (re)run some rows, keep the others
#   PROMPT=512 NEW=16 CTX=32768 CONCURRENCY=1,8 TAG=-pp512 bash bench/peer_llamacpp.sh   # prefill TTFT
#   ROWS="llama-q4_k_m ours-q4_k_m" bash bench/peer_llamacpp.sh  # same-file rows (quantized GGUFs)
#   MODEL=1b ROWS="llama-q8_0 ours-q8_0" bash bench/peer_llamacpp.sh  # the ~1B Llama shape
#
# Builds llama-server and llama-quantize from the llama-cpp-python source distribution
# (the version tests/gguf_tools.py pins) into a cache
# folder outside the repository (SLOTSERVE_PEER_CACHE, default ~/.cache/slotserve-peer),
# writes the bench checkpoint of bench/engine_bench.py (88M Llama, float32) as an F32
# and an F16 GGUF with the gguf package of that tree (bench/gguf_export.py), then runs
# bench/serve_bench.py against each server in turn (never two at once: 2 cores), all
# with 32 slots, a context in which every stream holds prompt + output (-c 16384: 512
# cells per slot) and 2 threads. Rows:
#   llama-f32          llama-server, F32, per-stream KV (its default)
#   llama-f32-unified  llama-server, F32, --kv-unified (attends over the whole cache)
#   llama-f16          llama-server, F16 weights, per-stream KV
#   slotserve          slotserve's default (per-stream KV, float32)
#   slotserve-unified  slotserve --kv-unified (the row closest to llama-f32-unified)
# and the same-file rows, both servers given one GGUF (F16 from gguf_export.py; Q8_0,
# Q4_K_M, Q5_K_M, Q6_K, Q4_0, IQ4_XS written by that tree's llama-quantize from the F32 GGUF):
#   llama-<type> ours-<type>, <type> one of f16 q8_0 q4_k_m q5_k_m q6_k q4_0 iq4_xs
# Every row also records the server's resident memory (VmRSS) after its run and its peak (VmHWM).
# MODEL=88m (default: bench/engine_bench.py's SHAPE) or MODEL=1b (hidden 2048, 16 layers,
# 32/8 heads, FFN 8192: where reading the weights dominates); each has its own folder.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
CONCURRENCY=${CONCURRENCY:-1,8,32}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
SLOTS=32
CTX=${CTX:-16384}
PROMPT=${PROMPT:-128}
NEW=${NEW:-128}
TAG=${TAG:-}  # suffix of the result files: runs with other prompts keep their own
MODEL=${MODEL:-88m}
M="$CACHE/$MODEL"  # this model's checkpoint, GGUFs and results
mkdir -p "$M"

build_llama_server() {
  [ -x "$CACHE/llama-server" ] && [ -x "$CACHE/llama-quantize" ] && [ -x "$CACHE/llama-perplexity" ] && return
  # the llama-cpp-python sdist the tests' converter comes from (tests/gguf_tools.py: pinned, sha256-checked)
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
import gguf_tools; gguf_tools.download_sdist(Path('$CACHE/src'))"
  tar xzf "$CACHE"/src/llama_cpp_python-*.tar.gz -C "$CACHE"
  local tree
  tree=$(ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  # A CPU that lists AMX whose kernel does not enable its tile state (XTILEDATA, bit 18 of
  # arch_prctl's ARCH_GET_XCOMP_SUPP; seen in VMs): -march=native would compile AMX code
  # that dies of SIGILL, so it is left out (llama.cpp's best build that runs there).
  local noamx=""
  if grep -qw amx_tile /proc/cpuinfo && ! "$PY" -c "import ctypes, sys; m = ctypes.c_uint64(); \
libc = ctypes.CDLL(None); libc.syscall(158, 0x1022, ctypes.byref(m)); sys.exit(0 if m.value >> 18 & 1 else 1)"; then
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  fi
  cmake -S "$tree" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  cmake --build "$CACHE/build" --target llama-server llama-quantize llama-perplexity -j "$(nproc)"
  cp "$CACHE/build/bin/llama-server" "$CACHE/build/bin/llama-quantize" "$CACHE/build/bin/llama-perplexity" "$CACHE/"
  ln -sfn "$tree" "$CACHE/tree"
}

export_gguf() {
  if [ ! -x "$CACHE/venv/bin/python" ]; then
    python3 -m venv "$CACHE/venv"
    "$CACHE/venv/bin/pip" install -q "$CACHE/tree/gguf-py" safetensors numpy
  fi
  if [ ! -f "$M/ckpt/config.json" ]; then
    rm -rf "$M/ckpt"
    "$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench'); import engine_bench as b; \
from pathlib import Path; p = Path('$M/ckpt'); p.mkdir(); b.build_checkpoint(p, b.SHAPES['$MODEL'])"
  fi
  [ -f "$M/bench.gguf" ] || "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$M/ckpt" "$M/bench.gguf"
  [ -f "$M/bench-f16.gguf" ] ||
    "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$M/ckpt" "$M/bench-f16.gguf" f16
  local q
  for q in q8_0 q4_k_m q5_k_m q6_k q4_0 iq4_xs; do
    [ -f "$M/bench-$q.gguf" ] || "$CACHE/llama-quantize" "$M/bench.gguf" "$M/bench-$q.gguf" "${q^^}" "$THREADS" > "$M/quantize-$q.log" 2>&1
  done
}

source "$ROOT/bench/serve_lib.sh"

bench_one() {  # name url out -- command...
  local name=$1 url=$2 out=$3
  shift 4
  start_server "$M/$name$TAG.log" "${url##*:}" -- "$@"
  echo "== $name" >&2
  if ! "$PY" "$ROOT/bench/serve_bench.py" "$url" --concurrency "$CONCURRENCY" --rounds "$ROUNDS" \
    --prompt "$PROMPT" --new "$NEW" > "$out.tmp"; then
    echo "$name failed: see $M/$name$TAG.log" >&2  # one failing row must not lose the others
  else
    local rss hwm
    rss=$(awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")
    hwm=$(awk '/^VmHWM:/ {print $2 * 1024}' "/proc/$SERVER_PID/status")
    tail -1 "$out.tmp" | "$PY" -c "import json, sys; r = json.load(sys.stdin); \
r.update(rss_bytes=$rss, peak_rss_bytes=$hwm); print(json.dumps(r))" > "$out"
  fi
  rm -f "$out.tmp"
  stop_server
}

build_llama_server
export_gguf
[ -n "${BUILD_ONLY:-}" ] && exit 0
ROWS=${ROWS:-llama-f32 llama-f32-unified llama-f16 slotserve slotserve-unified}
want() { [[ " $ROWS " == *" $1 "* ]]; }
for row in $ROWS; do rm -f "$M/$row$TAG.json"; done
LLAMA=("$CACHE/llama-server" --port 8191 -np $SLOTS -c "$CTX" -t "$THREADS" -tb "$THREADS" --no-webui)
OURS=("$PY" -m server.cli serve --port 8192 -np $SLOTS -c "$CTX" -t "$THREADS")

want llama-f32 && bench_one llama-f32 http://127.0.0.1:8191 "$M/llama-f32$TAG.json" -- \
  "${LLAMA[@]}" -m "$M/bench.gguf"
want llama-f32-unified && bench_one llama-f32-unified http://127.0.0.1:8191 "$M/llama-f32-unified$TAG.json" -- \
  "${LLAMA[@]}" -m "$M/bench.gguf" --kv-unified
want slotserve && bench_one slotserve http://127.0.0.1:8192 "$M/slotserve$TAG.json" -- "${OURS[@]}" -m "$M/ckpt"
want slotserve-unified && bench_one slotserve-unified http://127.0.0.1:8192 "$M/slotserve-unified$TAG.json" -- \
  "${OURS[@]}" -m "$M/ckpt" --kv-unified
for q in f16 q8_0 q4_k_m q5_k_m q6_k q4_0 iq4_xs; do  # the same file for both servers
  want "llama-$q" && bench_one "llama-$q" http://127.0.0.1:8191 "$M/llama-$q$TAG.json" -- \
    "${LLAMA[@]}" -m "$M/bench-$q.gguf"
  want "ours-$q" && bench_one "ours-$q" http://127.0.0.1:8192 "$M/ours-$q$TAG.json" -- \
    "${OURS[@]}" -m "$M/bench-$q.gguf"
done

"$PY" "$ROOT/bench/peer_table.py" "$M" "$TAG"
