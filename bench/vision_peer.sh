#!/usr/bin/env bash
# An image prompt's encode + prefill: slotserve beside llama-server (--mmproj) on the same
# GGUF + projector files, one server at a time, 2 threads, one slot (bench/vision_bench.py
# describes the checkpoint and the requests). Ratios are against llama-server's row.
#
#   bash bench/vision_peer.sh                 # Gemma 3: F32 GGUF + F32 projector
#   N=3 bash bench/vision_peer.sh
#   FAMILY=qwen35 bash bench/vision_peer.sh   # Qwen3.5 (issue 52): Q8_0 GGUF + F16 projector
#
# Needs llama-server built by bench/peer_llamacpp.sh (BUILD_ONLY=1) in SLOTSERVE_PEER_CACHE.
# Results: $CACHE/vision-1b/{llama,ours,ours-folder}.json and bench/results/vision-peer-<date>.json.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
N=${N:-5}
THREADS=${THREADS:-2}
FAMILY=${FAMILY:-gemma3}
if [ "$FAMILY" = qwen35 ]; then
  M="$CACHE/vision-qwen35" TEXT=("q8_0" "--no-mtp") VISION=f16
else
  M="$CACHE/vision-1b" TEXT=("f32") VISION=f32
fi
[ -x "$CACHE/llama-server" ] || { echo "build llama-server first: BUILD_ONLY=1 bash bench/peer_llamacpp.sh" >&2; exit 1; }
[ -f "$M/hf/config.json" ] || "$PY" "$ROOT/bench/vision_bench.py" build "$M/hf" --family "$FAMILY"
if [ ! -f "$M/mmproj.gguf" ]; then
  text_args=""
  for a in "${TEXT[@]:1}"; do text_args+="'$a', "; done
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from gguf_tools import _run_converters; \
_run_converters([[('convert_hf_to_gguf.py', ['--outfile', '$M/model.gguf', '--outtype', '${TEXT[0]}', ${text_args}'$M/hf']), \
('convert_hf_to_gguf.py', ['--outfile', '$M/mmproj.gguf', '--outtype', '$VISION', '--mmproj', '$M/hf'])]])"
fi

source "$ROOT/bench/serve_lib.sh"
row() {  # name port -- command...
  local name=$1 port=$2
  shift 3
  start_server "$M/$name.log" "$port" -- "$@"
  echo "== $name" >&2
  "$PY" "$ROOT/bench/vision_bench.py" run "http://127.0.0.1:$port" --n "$N" > "$M/$name.json" || echo "$name failed" >&2
  stop_server
}
# llama-server draws a random media marker unless LLAMA_MEDIA_MARKER names one (its tests set it too)
LLAMA_MEDIA_MARKER="<__media__>" row llama 8191 -- "$CACHE/llama-server" --port 8191 -m "$M/model.gguf" --mmproj "$M/mmproj.gguf" \
  -np 1 -c 4096 -t "$THREADS" -tb "$THREADS" --no-webui
row ours 8192 -- "$PY" -m server.cli serve --port 8192 -m "$M/model.gguf" --mmproj "$M/mmproj.gguf" \
  -np 1 -c 4096 -t "$THREADS"
row ours-folder 8192 -- "$PY" -m server.cli serve --port 8192 -m "$M/hf" -np 1 -c 4096 -t "$THREADS"

"$PY" - "$M" "$ROOT/bench/results/vision-peer-$FAMILY-$(date +%Y-%m-%d).json" <<'PY'
import json, sys
from pathlib import Path
m, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(m.glob("*.json"))}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
best = rows["llama"]["wall_ms_median"]
for name, r in rows.items():
    print(f"{name:12s} encode+prefill {r['wall_ms_median']:8.1f} ms  ({r['wall_ms_median'] / best:.2f}x llama-server)  "
          f"follow-up {r['follow_up_wall_ms']:7.1f} ms, prompt_n {r['follow_up_prompt_n']}")
out.write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))
PY
