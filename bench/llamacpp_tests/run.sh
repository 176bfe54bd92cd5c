#!/usr/bin/env bash
# llama.cpp's own server tests (tools/server/tests of the llama-cpp-python sdist that
# tests/gguf_tools.py pins) run against slotserve: bench/llamacpp_tests/llama-server
# stands in for llama-server. Their Python needs go into .venv (requests, wget,
# filelock, aiohttp); their Hugging Face models are mapped to local checkpoints
# (shim.py; a tiny checkpoint with FIM tokens for the infill preset).
#
#   bash bench/llamacpp_tests/run.sh                       # the issue's target files
#   FILES="unit/test_basic.py unit/test_metrics.py" bash bench/llamacpp_tests/run.sh
#   FILES=unit/test_vision_api.py bash bench/llamacpp_tests/run.sh   # images (a tiny random Gemma 3)
# Results: bench/results/llamacpp-tests-<date>/ (junit XML per file, summary.txt).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${SLOTSERVE_PEER_CACHE:-$HOME/.cache/slotserve-peer}
PY=${PYTHON:-$ROOT/.venv/bin/python}
FILES=${FILES:-unit/test_compat_anthropic.py unit/test_compat_oai_responses.py unit/test_metrics.py unit/test_security.py unit/test_basic.py unit/test_infill.py unit/test_embedding.py}
OUT=${OUT:-$ROOT/bench/results/llamacpp-tests-$(date +%Y-%m-%d)}
mkdir -p "$OUT"

if ! ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp >/dev/null 2>&1; then
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
import gguf_tools; gguf_tools.download_sdist(Path('$CACHE/src'))"
  tar xzf "$CACHE"/src/llama_cpp_python-*.tar.gz -C "$CACHE"
fi
TESTS=$(ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp/tools/server/tests | head -1)
"$PY" -m pip install -q requests wget filelock aiohttp

FIM="$CACHE/fim-model"
if [ ! -f "$FIM/tokenizer.json" ]; then
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
from checkpoints import add_fim_tokens, make_checkpoint; add_fim_tokens(make_checkpoint(Path('$FIM'), 'llama'))"
fi

VISION="$CACHE/vision-model"  # unit/test_vision_api.py's tinygemma3: a tiny random Gemma 3 with images
if [ ! -f "$VISION/model.safetensors" ]; then
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
from checkpoints import write_vision_tokenizer, make_gemma3_vision; f = Path('$VISION'); \
*ids, vocab = write_vision_tokenizer(f); make_gemma3_vision(f, *ids, vocab_size=vocab, eos_token_id=None, bos_token_id=None, pad_token_id=0)"
fi

GGUF="$CACHE/demo/demo.gguf"  # the demo model as a GGUF file, as the tests' presets are (bench/spec_peer.sh writes it)
if [ ! -f "$GGUF" ] && [ -x "$CACHE/venv/bin/python" ]; then
  mkdir -p "$CACHE/demo" && "$CACHE/venv/bin/python" "$ROOT/bench/gguf_export.py" "$ROOT/engine/demo_model" "$GGUF"
fi
[ -f "$GGUF" ] || GGUF="$ROOT/engine/demo_model"

ROUTER_GGUF="$CACHE/router-model/tiny.gguf"  # unit/test_router.py's cached repositories (shim.py links them here)
if [ ! -f "$ROUTER_GGUF" ]; then
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
from checkpoints import make_checkpoint; from gguf_tools import convert; f = Path('$CACHE/router-model'); \
convert(make_checkpoint(f / 'hf', 'llama'), f / 'tiny.gguf')"
fi

cd "$TESTS"
touch "$OUT/summary.txt"  # a line per file: a rerun replaces its own line
for f in $FILES; do
  name=$(basename "$f" .py)
  set +e
  SHIM_MODEL="$GGUF" SHIM_ROUTER_GGUF="$ROUTER_GGUF" SHIM_FIM_MODEL="$FIM" SHIM_VISION_MODEL="$VISION" LLAMA_SERVER_BIN_PATH="$ROOT/bench/llamacpp_tests/llama-server" PYTHONPATH="$ROOT" \
    "$PY" -m pytest -q -p no:cacheprovider "$f" --junitxml="$OUT/$name.xml" -o junit_family=xunit1 \
    > "$OUT/$name.log" 2>&1
  set -e
  sed -i "/^$name: /d" "$OUT/summary.txt"
  echo "$name: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
done
