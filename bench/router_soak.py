"""Router mode under churn (issues 39 and 50): three models in a folder and a fourth
from a preset, behind ``--models-max 2``, the router configured the way llama.cpp's
container images are (environment variables only: ``LLAMA_ARG_MODELS_DIR``,
``LLAMA_ARG_MODELS_PRESET``, ``LLAMA_API_KEY``, ...), its API key on, slot files and a
shared disk tier on. 32 clients stream greedy completions spread over the models for
DURATION seconds while
- a churner unloads and loads models (every 5 s),
- a killer SIGKILLs a child while it is loading (every 20 s): the requests waiting for
  that load get its error (503 "failed to load"), which the soak causes,
- a reloader rewrites the preset and posts ``/models/reload`` (every 15 s), taking
  the preset's model away and back and changing another's flags, with requests queued
  for both: those for the model taken away get 404, which the soak causes.
Every stream is compared with the answer of its model served alone (a plain server per
model, asked first, one request at a time). Also the first request to a cold model
against that model's load time. After the router exits: no process of the soak's left,
no temporary file left in the slot and cache folders. Prints one JSON line; ``ok`` is
whether every check held (no 5xx beside those the soak causes, every 200 exact).

    python bench/router_soak.py                       # 300 s, 32 clients
    DURATION=60 CLIENTS=8 python bench/router_soak.py
Each server's log: $LOG_DIR (default the temporary folder)/router-soak-PORT.log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The sea was", "Once upon a time", "In the morning the", "She opened the door and"]
MODELS = ("alpha", "beta", "gamma")
PRESET_MODEL = "delta"  # alpha's weights, from the preset; taken away and back by the reloader
SERVED = (*MODELS, PRESET_MODEL)
KEY = "soak-key"
N_NEW = 16


def start(args: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "-np", "4", "-c", "2048", *args]
    log = Path(os.environ.get("LOG_DIR", tempfile.gettempdir())) / f"router-soak-{port}.log"
    full = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server {args} did not start")


def preset_text(folder: Path, with_delta: bool, gamma_ctx: int) -> str:
    text = f"[gamma]\nctx-size = {gamma_ctx}\n"
    if with_delta:
        text += f"\n[{PRESET_MODEL}]\nmodel = {folder / 'alpha'}\n"
    return text


async def stream(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, headers: dict | None = None
) -> tuple[int, str]:
    body = {"model": model, "prompt": prompt, "max_tokens": N_NEW, "temperature": 0, "stream": True}
    text = []
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            body = await r.aread()
            return r.status_code, body.decode(errors="replace")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return 200, "".join(text)


async def soak(url: str, want: dict, duration: float, n_clients: int, folder: Path, preset: Path) -> dict:
    counts = {"requests": 0, "exact": 0, "mismatch": 0, "status": {}, "errors": 0, "loads": 0, "unloads": 0}
    counts |= {"kills": 0, "reloads": 0, "caused_503": 0, "caused_404": 0, "other_5xx": 0}
    waits: list[float] = []  # each request's whole time (queued for a model included)
    deadline = time.monotonic() + duration
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=300, headers=auth) as client:

        async def worker(i: int) -> None:
            k = i
            while time.monotonic() < deadline:
                model, prompt = SERVED[k % len(SERVED)], PROMPTS[(k // len(SERVED)) % len(PROMPTS)]
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
                elif code == 503 and "while loading" in text:
                    counts["caused_503"] += 1  # a load the killer cut
                elif code == 404 and model == PRESET_MODEL:
                    counts["caused_404"] += 1  # taken away by the reloader
                elif code >= 500:
                    counts["other_5xx"] += 1
                    print(f"5xx: {code} {text[:300]}", file=sys.stderr)

        async def churner() -> None:
            k = 0
            while time.monotonic() < deadline:
                await asyncio.sleep(5)
                model = MODELS[k % 3]
                k += 1
                action = "unload" if k % 2 else "load"
                r = await client.post(f"{url}/models/{action}", json={"model": model})
                counts[action + "s"] += r.status_code == 200

        async def killer() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(20)
                while time.monotonic() < deadline:  # the next child seen loading
                    listed = (await client.get(url + "/models")).json()["data"]
                    loading = [
                        m["status"]["pid"] for m in listed if m["status"]["value"] == "loading" and "pid" in m["status"]
                    ]
                    if loading:
                        os.kill(loading[0], signal.SIGKILL)
                        counts["kills"] += 1
                        break
                    await asyncio.sleep(0.05)

        async def reloader() -> None:
            k = 0
            while time.monotonic() < deadline:
                await asyncio.sleep(15)
                k += 1
                preset.write_text(preset_text(folder, with_delta=k % 2 == 0, gamma_ctx=1024 if k % 4 < 2 else 2048))
                r = await client.post(url + "/models/reload")
                counts["reloads"] += r.status_code == 200

        await asyncio.gather(churner(), killer(), reloader(), *(worker(i) for i in range(n_clients)))
    waits.sort()
    counts["request_s_p50"] = round(waits[len(waits) // 2], 2) if waits else None
    counts["request_s_max"] = round(waits[-1], 2) if waits else None
    return counts


def processes_of(folder: Path) -> list[int]:
    """Live processes whose command line names the soak's folder (its children)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(folder) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                if "State:\tZ" not in (entry / "status").read_text():
                    out.append(int(entry.name))
        except OSError:
            pass
    return out


def main() -> None:
    duration, n_clients = float(os.environ.get("DURATION", 300)), int(os.environ.get("CLIENTS", 32))
    sys.path.insert(0, str(ROOT / "tests"))
    from checkpoints import make_checkpoint

    work = Path(tempfile.mkdtemp())
    folder, slots, cache, preset = work / "models", work / "slots", work / "cache", work / "preset.ini"
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
    for prompt in PROMPTS:
        want[PRESET_MODEL, prompt] = want["alpha", prompt]
    preset.write_text(preset_text(folder, with_delta=True, gamma_ctx=2048))
    env = {  # no router flag on the command line: llama.cpp's container images are set up this way
        "LLAMA_ARG_MODELS_DIR": str(folder),
        "LLAMA_ARG_MODELS_PRESET": str(preset),
        "LLAMA_ARG_MODELS_MAX": "2",
        "LLAMA_API_KEY": KEY,
        "SLOTSERVE_SLOT_SAVE_PATH": str(slots),
        "SLOTSERVE_CACHE_DISK": str(cache),
    }
    router = start(["--cache-ram", "1"], 8310, env)
    url, auth = "http://127.0.0.1:8310", {"Authorization": f"Bearer {KEY}"}
    try:
        t0 = time.monotonic()
        httpx.post(url + "/models/load", json={"model": "alpha"}, headers=auth, timeout=300)
        load_s = time.monotonic() - t0
        httpx.post(url + "/models/unload", json={"model": "alpha"}, headers=auth, timeout=300)
        t0 = time.monotonic()
        body = {"model": "alpha", "prompt": "x", "max_tokens": 1}
        cold = httpx.post(url + "/v1/completions", json=body, headers=auth, timeout=300)
        cold_s = time.monotonic() - t0
        counts = asyncio.run(soak(url, want, duration, n_clients, folder, preset))
    finally:
        router.terminate()
        router.wait(120)
    time.sleep(2)  # children told by the kernel (PR_SET_PDEATHSIG) are gone by now, or are leftovers
    left = processes_of(folder)
    tmp = sorted(str(p) for d in (slots, cache) if d.exists() for p in d.rglob("*.tmp"))
    ok = counts["other_5xx"] == 0 and counts["mismatch"] == 0 and counts["errors"] == 0 and not left and not tmp
    head = {
        "duration_s": duration,
        "clients": n_clients,
        "load_s": round(load_s, 2),
        "cold_request_s": round(cold_s, 2),
    }
    tail = {"processes_left": left, "tmp_left": tmp, "router_exit": router.returncode, "ok": ok}
    print(json.dumps({**head, "cold_status": cold.status_code, **counts, **tail}))


async def _one(url: str, model: str, prompt: str) -> tuple[int, str]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await stream(client, url, model, prompt)


if __name__ == "__main__":
    main()
