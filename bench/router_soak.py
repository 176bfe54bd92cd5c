"""Router mode under churn (issue 39's target): three models in a folder behind
``--models-max 2``, 32 clients streaming greedy completions spread over the three for
DURATION seconds while a churner unloads and loads models in between; every stream is
compared with the answer of its model served alone (a plain server per model, asked
first, one request at a time). Also the first request to a cold model against that
model's load time. Prints one JSON line.

    python bench/router_soak.py                       # 300 s, 32 clients
    DURATION=60 CLIENTS=8 python bench/router_soak.py
Each server's log: $LOG_DIR (default the temporary folder)/router-soak-PORT.log.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The sea was", "Once upon a time", "In the morning the", "She opened the door and"]
MODELS = ("alpha", "beta", "gamma")
N_NEW = 16


def start(args: list[str], port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "-np", "4", "-c", "2048", *args]
    log = Path(os.environ.get("LOG_DIR", tempfile.gettempdir())) / f"router-soak-{port}.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server {args} did not start")


async def stream(client: httpx.AsyncClient, url: str, model: str, prompt: str) -> tuple[int, str]:
    body = {"model": model, "prompt": prompt, "max_tokens": N_NEW, "temperature": 0, "stream": True}
    text = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, ""
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return 200, "".join(text)


async def soak(url: str, want: dict, duration: float, n_clients: int) -> dict:
    counts = {"requests": 0, "exact": 0, "mismatch": 0, "status": {}, "errors": 0, "loads": 0, "unloads": 0}
    waits: list[float] = []  # each request's whole time (queued for a model included)
    deadline = time.monotonic() + duration
    async with httpx.AsyncClient(timeout=300) as client:

        async def worker(i: int) -> None:
            k = i
            while time.monotonic() < deadline:
                model, prompt = MODELS[k % 3], PROMPTS[(k // 3) % len(PROMPTS)]
                k += 1
                t0 = time.monotonic()
                try:
                    code, text = await stream(client, url, model, prompt)
                    waits.append(time.monotonic() - t0)
                except httpx.HTTPError:
                    counts["errors"] += 1
                    continue
                counts["requests"] += 1
                counts["status"][code] = counts["status"].get(code, 0) + 1
                if code == 200:
                    counts["exact" if text == want[model, prompt] else "mismatch"] += 1

        async def churner() -> None:
            k = 0
            while time.monotonic() < deadline:
                await asyncio.sleep(5)
                model = MODELS[k % 3]
                k += 1
                action = "unload" if k % 2 else "load"
                r = await client.post(f"{url}/models/{action}", json={"model": model})
                counts[action + "s"] += r.status_code == 200

        await asyncio.gather(churner(), *(worker(i) for i in range(n_clients)))
    waits.sort()
    counts["request_s_p50"] = round(waits[len(waits) // 2], 2) if waits else None
    counts["request_s_max"] = round(waits[-1], 2) if waits else None
    return counts


def main() -> None:
    duration, n_clients = float(os.environ.get("DURATION", 300)), int(os.environ.get("CLIENTS", 32))
    sys.path.insert(0, str(ROOT / "tests"))
    from checkpoints import make_checkpoint

    folder = Path(tempfile.mkdtemp()) / "models"
    for seed, name in enumerate(MODELS):
        make_checkpoint(folder / name, "llama", seed=seed)
    want = {}
    for port, name in enumerate(MODELS, 8301):  # each model alone, one request at a time
        proc = start(["-m", str(folder / name)], port)
        try:
            for prompt in PROMPTS:
                code, text = asyncio.run(_one(f"http://127.0.0.1:{port}", name, prompt))
                want[name, prompt] = text
        finally:
            proc.terminate()
            proc.wait(30)
    router = start(["--models-dir", str(folder), "--models-max", "2"], 8310)
    url = "http://127.0.0.1:8310"
    try:
        t0 = time.monotonic()
        httpx.post(url + "/models/load", json={"model": "alpha"}, timeout=300)
        load_s = time.monotonic() - t0
        httpx.post(url + "/models/unload", json={"model": "alpha"}, timeout=300)
        t0 = time.monotonic()
        cold = httpx.post(url + "/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 1}, timeout=300)
        cold_s = time.monotonic() - t0
        counts = asyncio.run(soak(url, want, duration, n_clients))
    finally:
        router.terminate()
        router.wait(60)
    print(json.dumps({"duration_s": duration, "clients": n_clients, "load_s": round(load_s, 2),
                      "cold_request_s": round(cold_s, 2), "cold_status": cold.status_code, **counts}))  # fmt: skip


async def _one(url: str, model: str, prompt: str) -> tuple[int, str]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await stream(client, url, model, prompt)


if __name__ == "__main__":
    main()
