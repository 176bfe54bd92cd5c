#!/usr/bin/env bash
# Speculation on against off, alternated (VM timing drifts by 10-30 % between runs a
# minute apart, so one run per row cannot show a 5 % difference): two slotserve
# servers on the same GGUF, one plain and one with $SPEC, both up at once (an idle one
# sleeps on a condition variable), then bench/spec_bench.py against each in turn,
# $ROUNDS times per workload and concurrency. Prints one JSON line per run.
#
#   bash bench/spec_ab.sh                                   # ngram-simple n = 3; c = 1, 32; 3 rounds
#   SPEC="--spec-type ngram-simple" CONCURRENCY=32 bash bench/spec_ab.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
GGUF=${GGUF:-$CACHE/demo/demo.gguf}
SPEC=${SPEC:---spec-type ngram-simple --spec-ngram-simple-size-n 3}
CONCURRENCY=${CONCURRENCY:-1 32}
WORKLOADS=${WORKLOADS:-repeat complete}
ROUNDS=${ROUNDS:-3}
ARGS=(-np 32 -c 32768 -t 2 -m "$GGUF")
cd "$ROOT"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# shellcheck disable=SC2086
for spec in "" "$SPEC"; do
  port=$((8195 + ${#pids[@]}))
  setsid "$PY" -m server.cli serve --port "$port" "${ARGS[@]}" $spec > "/tmp/spec-ab-$port.log" 2>&1 < /dev/null &
  pids+=($!)
done
for port in 8195 8196; do
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
    sleep 0.5
  done
done
for w in $WORKLOADS; do
  for c in $CONCURRENCY; do
    for r in $(seq 1 "$ROUNDS"); do
      for port in 8195 8196; do
        row=$([ "$port" = 8195 ] && echo off || echo on)
        "$PY" bench/spec_bench.py "http://127.0.0.1:$port" --concurrency "$c" --workload "$w" \
          --requests "$((4 * c > 14 ? 4 * c : 14))" --new 128 | sed "s/^{/{\"row\": \"$row\", \"round\": $r, /"
      done
    done
  done
done
