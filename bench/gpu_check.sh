#!/usr/bin/env bash
# Issue 40's one command on the GPU machine, from the repository root (under 10 minutes):
#   1. the CUDA tests (tests/test_cuda.py) and the static decode tests;
#   2. engine decode tok/s at batch 1 / 8 / 32 / 64 against the floor, per decode mode
#      (bench/gpu_bench.py: graphs, static eager, general path), launches per step;
#   3. the server at 1 and 64 streams (bench/serve_bench.py), prompt 512, 128 new tokens,
#      two requests per stream.
# MODES=graphs bash bench/gpu_check.sh: the engine bench in that mode alone (a shorter run).
# Python packages the machine lacks (fastapi, uvicorn, pydantic ...) come as wheels in
# .whl/ (see docs/benchmarks.md, "On a GPU"). Results go to $OUT (default /tmp/gpu_check).
set -u
OUT=${OUT:-/tmp/gpu_check}
MODEL=${MODEL:-/tmp/slotserve-1b}
PORT=${PORT:-8091}
MODES=${MODES:-graphs,graphs_torch,static_eager,general}  # bench/gpu_bench.py's decode modes
STEP=${STEP:-8192}  # the server's -b / -ub (vLLM's max_num_batched_tokens on a large GPU)
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

echo "== 1. tests"
t0=$(date +%s)
python3 -m pytest -o addopts="" -p no:cacheprovider --timeout 300 -q -rs \
  tests/test_cuda.py tests/test_static_decode.py -s 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|error|largest|FAIL|Error" | tail -25
echo "tests: $(( $(date +%s) - t0 )) s"

echo "== 2. engine"
t0=$(date +%s)
python3 bench/gpu_bench.py --out "$OUT" --model "$MODEL" --modes "$MODES" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\{|Loading|Writing"
echo "engine bench: $(( $(date +%s) - t0 )) s"

echo "== 3. server"
t0=$(date +%s)
setsid python3 -m server.cli serve -m "$MODEL" -np 64 -c $((64 * 700)) -b "$STEP" -ub "$STEP" --port "$PORT" \
  --metrics > "$OUT/server.log" 2>&1 < /dev/null &
SERVER=$!
for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 $SERVER 2> /dev/null || break
  sleep 0.5
done
curl -s "http://127.0.0.1:$PORT/props" | python3 -c 'import json,sys; print("props.device:", json.load(sys.stdin).get("device"))'
python3 bench/serve_bench.py "http://127.0.0.1:$PORT" --concurrency 1,64 --rounds 2 --prompt 512 --new 128 \
  --vocab 32000 2> "$OUT/serve.err" | tee "$OUT/serve.jsonl" | head -2
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^slotserve_cache_config_info" | head -2
kill $SERVER 2> /dev/null
wait $SERVER 2> /dev/null
grep -E "KV cache|captured|error|Error" "$OUT/server.log" | head -5
echo "server: $(( $(date +%s) - t0 )) s"
