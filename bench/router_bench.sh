#!/usr/bin/env bash
# The router's cost: one model served directly and through router mode (--models-dir
# with that one model; the router's child is the same server), the same closed-loop
# load (bench/serve_bench.py) against each in turn, 2 threads; TTFT and tokens/s ratios.
#
#   bash bench/router_bench.sh                      # concurrency 1,8, 2 rounds
#   CONCURRENCY=1 ROUNDS=4 bash bench/router_bench.sh
# Results: bench/results/router-<date>.json (both rows and the ratios).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
CONCURRENCY=${CONCURRENCY:-1,8}
ROUNDS=${ROUNDS:-2}
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
  "$PY" "$ROOT/bench/serve_bench.py" "http://127.0.0.1:$port" --model bench --concurrency "$CONCURRENCY" \
    --rounds "$ROUNDS" --prompt 128 --new 64 | tail -1 > "$M/$name.json"
  stop_server
}
row direct 8193 -- "$PY" -m server.cli serve -m "$M/models/bench" --port 8193 "${FLAGS[@]}"
row router 8194 -- "$PY" -m server.cli serve --models-dir "$M/models" --port 8194 "${FLAGS[@]}"
"$PY" - "$M" "$ROOT/bench/results/router-$(date +%Y-%m-%d).json" <<'PY'
import json, sys
from pathlib import Path
m, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = {n: json.loads((m / f"{n}.json").read_text()) for n in ("direct", "router")}
ratios = []
for d, r in zip(rows["direct"]["levels"], rows["router"]["levels"]):
    ratio = {k: r[k] / d[k] for k in d if isinstance(d[k], (int, float)) and d[k] and k in r}
    ratios.append({"concurrency": d.get("concurrency"), **{k: round(v, 3) for k, v in ratio.items()}})
    print(json.dumps(ratios[-1]))
out.write_text(json.dumps({"rows": rows, "router_over_direct": ratios}, indent=1))
PY
