#!/usr/bin/env bash
# The router's cost: one model served directly and through router mode (--models-dir
# with that one model; the router's child is the same server), the same closed-loop
# load (bench/serve_bench.py) against each in turn, 2 threads; TTFT and tokens/s ratios.
# PAIRS pairs, each direct then router, so drift over the run falls on both alike; the
# ratio reported is each pair's, and their median.
#
#   bash bench/router_bench.sh                      # concurrency 1,8, 3 rounds, 3 pairs
#   CONCURRENCY=8 ROUNDS=4 PAIRS=5 bash bench/router_bench.sh
#   ROUTER_TREE=/tmp/other-checkout bash bench/router_bench.sh   # the router from another tree (A/B)
# Results: bench/results/router-<date>.json (every row, each pair's ratios, the medians).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
CONCURRENCY=${CONCURRENCY:-1,8}
ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-3}
ROUTER_TREE=${ROUTER_TREE:-$ROOT}
M="$CACHE/router-bench"
mkdir -p "$M/models"
if [ ! -f "$M/models/bench/config.json" ]; then
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench'); import engine_bench as b; \
from pathlib import Path; p = Path('$M/models/bench'); p.mkdir(exist_ok=True); b.build_checkpoint(p, b.SHAPES['88m'])"
fi
source "$ROOT/bench/serve_lib.sh"
FLAGS=(-np 8 -c 8192 -t 2 --metrics)
row() {  # name port -- command...
  local name=$1 port=$2
  shift 3
  start_server "$M/$name.log" "$port" -- "$@"
  local before; before=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")  # the process's own CPU ticks
  "$PY" "$ROOT/bench/serve_bench.py" "http://127.0.0.1:$port" --model bench --concurrency "$CONCURRENCY" \
    --rounds "$ROUNDS" --prompt 128 --new 64 | tail -1 > "$M/$name.json"
  awk -v b="$before" -v hz="$(getconf CLK_TCK)" '{print ($14 + $15 - b) / hz}' "/proc/$SERVER_PID/stat" > "$M/$name.cpu"
  stop_server
}
for i in $(seq 1 "$PAIRS"); do
  row "direct-$i" 8193 -- "$PY" -m server.cli serve -m "$M/models/bench" --port 8193 "${FLAGS[@]}"
  (cd "$ROUTER_TREE" && row "router-$i" 8194 -- "$PY" -m server.cli serve --models-dir "$M/models" --port 8194 "${FLAGS[@]}")
done
"$PY" - "$M" "$PAIRS" "$ROOT/bench/results/router-$(date +%Y-%m-%d).json" <<'PY'
import json, statistics, sys
from pathlib import Path
m, pairs, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rows = {f"{n}-{i}": json.loads((m / f"{n}-{i}.json").read_text()) for i in range(1, pairs + 1) for n in ("direct", "router")}
for name, row in rows.items():  # the direct server's CPU seconds, or the router process's alone (not its child's)
    row["process_cpu_s"] = float((m / f"{name}.cpu").read_text())
keys = ("output_tok_s", "ttft_ms_p50", "ttft_ms_p90", "itl_ms_p50")
per_pair = []
for i in range(1, pairs + 1):
    for d, r in zip(rows[f"direct-{i}"]["levels"], rows[f"router-{i}"]["levels"]):
        per_pair.append({"pair": i, "concurrency": d["concurrency"], **{k: round(r[k] / d[k], 3) for k in keys}})
medians = []
for c in sorted({p["concurrency"] for p in per_pair}):
    mine = [p for p in per_pair if p["concurrency"] == c]
    medians.append({"concurrency": c, **{k: round(statistics.median(p[k] for p in mine), 3) for k in keys}})
    print(json.dumps(medians[-1]))
cpu = {n: statistics.median(rows[f"{n}-{i}"]["process_cpu_s"] for i in range(1, pairs + 1)) for n in ("direct", "router")}
print(json.dumps({"median_process_cpu_s": cpu}))
out.write_text(json.dumps({"rows": rows, "router_over_direct": per_pair, "median": medians, "median_process_cpu_s": cpu}, indent=1))
PY
