"""KV layouts: the unified block pool beside per-stream caches, and what sliding
windows save.

    python bench/layout_bench.py                  # all three parts
    python bench/layout_bench.py --part serve     # through the server only

Parts:
- ``serve``: engine_bench.py's 88M-parameter checkpoint, one server per layout
  (``-np 32 -c 8192 -t 2``, ``--kv-unified`` then ``--no-kv-unified``, one after the
  other), bench/serve_bench.py at concurrency 1, 8 and 32 (prompts of 128 tokens, 128
  greedy output tokens, 2 requests per worker): tok/s, TTFT p50, ITL p50.
- ``step``: the same checkpoint offline, 32 sequences decoding at a context of ~200:
  median time of a decode step and of its attention (the view: gather + SDPA) per layout;
  and the cost of a 200-token prefix copy (``seq_cp``) between slots per layout.
- ``rss``: the server's RSS with ``-c 131072`` (3 GiB of cache for this checkpoint),
  idle after start-up and then holding 8 slots of 1,500 prompt tokens each.
- ``bytes``: KV bytes per slot of a Gemma-3-4B-shaped model (34 layers, 5 local per
  global, 4 KV heads x 256, window 1,024, bfloat16) at an 8k context: iSWA rings,
  ``--swa-full`` and every layer full, from the memory's own accounting (no allocation:
  tensors on the meta device).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import SHAPE, build_checkpoint  # noqa: E402

LAYOUTS = {"unified": "--kv-unified", "stream": "--no-kv-unified"}


def serve(folder: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from server_proc import ServerProcess

    out = {}
    for name, flag in LAYOUTS.items():
        args = ("-m", str(folder), "-np", "32", "-c", "8192", "-t", "2", flag)
        with ServerProcess(*args) as srv:
            srv.wait_ready(300)
            cmd = [sys.executable, str(ROOT / "bench/serve_bench.py"), srv.url, "--concurrency", "1,8,32"]
            run = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[name] = json.loads(run.stdout.strip().splitlines()[-1])["levels"]
            print(name, json.dumps(out[name]), flush=True)
    return out


def step(folder: Path) -> dict:
    from engine import Engine, SamplingParams
    from memory import kv_view

    out = {}
    for name in LAYOUTS:
        engine = Engine.from_pretrained(
            str(folder), n_ctx=8192, n_seq_max=32, kv_unified=name == "unified", n_threads=2
        )
        params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
        for i in range(32):
            engine.add_sequence(list(range(1, 129)), params, seq_id=i)
        while any(s.n_pending > 1 for s in engine.running):
            engine.step()
        attend_s: list[float] = []
        real = kv_view.GroupedKVView.attend

        def timed(self, *a, real=real, attend_s=attend_s, **kw):
            t = time.perf_counter()
            r = real(self, *a, **kw)
            attend_s.append(time.perf_counter() - t)
            return r

        kv_view.GroupedKVView.attend = timed
        steps = []
        for _ in range(30):
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
        kv_view.GroupedKVView.attend = real
        n_layers = len(engine.layer_specs)
        per_step = [sum(attend_s[i : i + n_layers]) for i in range(0, len(attend_s), n_layers)]
        for seq in list(engine.running):
            engine.abort(seq)
        engine.memory.seq_rm(-1)
        engine.add_sequence(list(range(1, 201)), SamplingParams(max_tokens=1), seq_id=0)
        while engine.has_work:
            engine.step()
        copies = []
        for _ in range(10):
            t = time.perf_counter()
            engine.memory.seq_cp(0, 1, 0, 200)
            copies.append(time.perf_counter() - t)
        out[name] = {
            "decode_step_ms": statistics.median(steps) * 1e3,
            "attention_ms_per_step": statistics.median(per_step) * 1e3,
            "prefix_copy_200_ms": statistics.median(copies) * 1e3,
        }
        print(name, json.dumps(out[name]), flush=True)
    return out


def rss(folder: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    import httpx
    from server_proc import ServerProcess

    def mb(pid: int) -> float:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(x.split()[1] for x in status.splitlines() if x.startswith("VmRSS:"))) / 1024

    out = {}
    for name, flag in LAYOUTS.items():
        with ServerProcess("-m", str(folder), "-np", "8", "-c", "131072", "-t", "2", flag) as srv:
            srv.wait_ready(300)
            memory = httpx.get(srv.url + "/props").json()["memory"]
            idle = mb(srv.proc.pid)
            for slot in range(8):
                body = {"prompt": [1 + (slot * 7 + i) % 200 for i in range(1500)], "n_predict": 1, "id_slot": slot}
                httpx.post(srv.url + "/completion", json=body, timeout=600).raise_for_status()
            out[name] = {
                "cache_mib": memory["bytes_total"] / 2**20,
                "idle_rss_mb": idle,
                "busy_rss_mb": mb(srv.proc.pid),
            }
        print(name, json.dumps(out[name]), flush=True)
    return out


def kv_bytes() -> dict:
    from memory import FullAttentionSpec, MemoryConfig, SlidingWindowSpec, build_memory

    n_layers, kvh, hd, window, ctx = 34, 4, 256, 1024, 8192
    dtype = torch.bfloat16
    local = SlidingWindowSpec(kvh, hd, dtype, window)
    glob = FullAttentionSpec(kvh, hd, dtype)
    gemma3 = [glob if (i + 1) % 6 == 0 else local for i in range(n_layers)]
    all_full = [glob] * n_layers
    out = {}
    for name, specs, swa_full in (("iswa", gemma3, False), ("swa_full", gemma3, True), ("all_full", all_full, False)):
        cfg = MemoryConfig(ctx, 1, 16, "meta", "unified", swa_full=swa_full, max_step=512)
        usage = build_memory(specs, cfg).usage()
        out[name] = {"bytes_per_slot": usage.bytes_total, "groups": [(g.kind, g.n_layers) for g in usage.groups]}
        print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "serve", "step", "bytes", "rss"], default="all")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict = {}
    if args.part in ("all", "bytes"):
        results["bytes"] = kv_bytes()
    if args.part in ("all", "serve", "step", "rss"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "bench88m"
            build_checkpoint(folder, SHAPE)
            if args.part in ("all", "step"):
                results["step"] = step(folder)
            if args.part in ("all", "serve"):
                results["serve"] = serve(folder)
            if args.part in ("all", "rss"):
                results["rss"] = rss(folder)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
