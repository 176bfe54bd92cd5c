"""Embeddings beside generation: does a stream of embedding requests hold up decoding?

    python bench/embed_beside.py                     # starts its own server (demo model, --embeddings)
    python bench/embed_beside.py --rounds 5 --out bench/results/embed-beside.json

One streamed /completion at a time (128 tokens, greedy) is timed token by token, in
rounds that alternate "alone", "embed" (``--clients`` threads sending a 200-token
embedding input back to back the whole time) and "complete" (the same threads sending
the same text as one-token /completion requests: the load any other short request
puts on the steps). Reported: inter-token latency p50/p90 and tokens per second of the
stream, and input tokens per second of the load. The figure: embed/complete (1.0: an
embedding costs decoding what any request of its size costs), and embed/alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from soak import start_server  # bench/soak.py: a server of our own, ready

TEXT = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n" * 3


def stream(url: str, n: int) -> list[float]:
    body = {"prompt": "def main():", "n_predict": n, "temperature": 0, "ignore_eos": True, "stream": True,
            "cache_prompt": False}  # fmt: skip
    times = []
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                times.append(time.perf_counter())
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None)
    ap.add_argument("--port", type=int, default=18610)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    server_args = ["-np", "4", "-c", "8192", "--embeddings", "-t", "2"]
    proc = None if args.url else start_server(args.port, Path(tempfile.mkdtemp()), server_args)
    url = args.url or f"http://127.0.0.1:{args.port}"
    stream(url, 8)  # warm-up
    rows: dict[str, list] = {"alone": [], "embed": [], "complete": []}
    loads: dict[str, list] = {"embed": [], "complete": []}
    for _ in range(args.rounds):
        for mode in rows:
            stop, count = threading.Event(), [0]

            def load(stop=stop, count=count, mode=mode):
                while not stop.is_set():
                    if mode == "embed":
                        r = httpx.post(url + "/v1/embeddings", json={"input": TEXT}, timeout=120).json()
                        count[0] += r["usage"]["prompt_tokens"]
                    else:
                        r = httpx.post(url + "/completion", json={"prompt": TEXT, "n_predict": 1}, timeout=120).json()
                        count[0] += r["tokens_evaluated"]

            workers = [threading.Thread(target=load) for _ in range(args.clients if mode != "alone" else 0)]
            for w in workers:
                w.start()
            time.sleep(0.5 if workers else 0)
            t0 = time.perf_counter()
            times = stream(url, args.tokens)
            t1 = time.perf_counter()
            stop.set()
            for w in workers:
                w.join()
            gaps = [(b - a) * 1000 for a, b in zip(times[1:], times[2:])]
            rows[mode].append({"itl_ms": gaps, "tok_s": (len(times) - 1) / (t1 - t0)})
            if workers:
                loads[mode].append(count[0] / (t1 - t0 + 0.5))
    if proc:
        proc.terminate()
        proc.wait(30)

    def summary(mode: str) -> dict:
        gaps = sorted(g for r in rows[mode] for g in r["itl_ms"])
        return {
            "itl_p50_ms": statistics.median(gaps),
            "itl_p90_ms": gaps[int(0.9 * (len(gaps) - 1))],
            "tok_s": statistics.median(r["tok_s"] for r in rows[mode]),
        }

    out = {mode: summary(mode) for mode in rows}
    for mode in loads:
        out[mode]["load_tok_s"] = statistics.median(loads[mode])
    out |= {
        "embed_vs_complete_tok_s": out["embed"]["tok_s"] / out["complete"]["tok_s"],
        "embed_vs_alone_tok_s": out["embed"]["tok_s"] / out["alone"]["tok_s"],
        "clients": args.clients,
        "rounds": args.rounds,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
