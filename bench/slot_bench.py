"""What a slot restore saves: a long conversation restored from its slot file instead of
prefilled again.

    python bench/slot_bench.py                  # bench model of engine_bench.py, 4,000 tokens
    python bench/slot_bench.py --tokens 1000 --small

Starts ``slotserve serve`` on the engine_bench checkpoint (context raised to fit),
then: a cold request of --tokens random prompt tokens (1 new token), save the slot,
erase it, restore it, and the same request again. Prints JSON with the wall times and
the ratio cold / (restore + warm request).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench  # noqa: E402


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("server not ready")


def timed(fn) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = fn()
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed, r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--small", action="store_true", help="the small shape (a quick run)")
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--json", type=Path, default=None, help="also write the result here (bench/plot.py reads it)")
    args = ap.parse_args()
    shape = dict(engine_bench.SMALL if args.small else engine_bench.SHAPE)
    shape["max_position_embeddings"] = max(shape["max_position_embeddings"], args.tokens + 64)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, slots = Path(tmp) / "ckpt", Path(tmp) / "slots"
        engine_bench.build_checkpoint(ckpt, shape)
        url = f"http://127.0.0.1:{args.port}"
        cmd = [sys.executable, "-m", "server.cli", "serve", "-m", str(ckpt), "--port", str(args.port)]
        cmd += ["-np", "2", "-c", str(2 * (args.tokens + 256)), "--slot-save-path", str(slots)]  # per-slot context
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(url, proc)
            rng = random.Random(0)
            prompt = [rng.randrange(shape["vocab_size"]) for _ in range(args.tokens)]
            body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "ignore_eos": True, "id_slot": 0}
            with httpx.Client(timeout=600) as c:
                action = lambda name, **b: c.post(f"{url}/slots/0", params={"action": name}, json=b or None)  # noqa: E731
                cold_s, cold = timed(lambda: c.post(url + "/completion", json=body))
                _, saved = timed(lambda: action("save", filename="conv.slot"))
                timed(lambda: action("erase"))
                restore_s, restored = timed(lambda: action("restore", filename="conv.slot"))
                warm_s, warm = timed(lambda: c.post(url + "/completion", json=body))
        finally:
            proc.terminate()
            proc.wait(30)
    result = {
        "prompt_tokens": args.tokens,
        "file_bytes": saved["n_written"],
        "cold_request_s": round(cold_s, 3),
        "save_ms": round(saved["timings"]["save_ms"], 1),
        "restore_request_s": round(restore_s, 3),
        "restore_ms": round(restored["timings"]["restore_ms"], 1),
        "warm_request_s": round(warm_s, 3),
        "warm_tokens_cached": warm["tokens_cached"],
        "cold_over_restore_plus_warm": round(cold_s / (restore_s + warm_s), 1),
        "cold_tokens_cached": cold["tokens_cached"],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
