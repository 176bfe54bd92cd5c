"""Soak: mixed load against one server for a long time; does anything grow?

    python bench/soak.py --minutes 30            # starts its own server (demo model)
    python bench/soak.py --minutes 30 --out soak.json

Workers loop over a weighted mix: streams (a third of them cancelled mid-way), plain
and chat completions with n > 1, llama-server /completion, slot save / restore / erase
(some with nowait), slot file listing and deletion, and bad requests (malformed JSON,
out-of-range fields, bad file names, unknown routes, oversized bodies). Reported at the
start (after a warm-up) and at the end (after the load, once idle): the server's RSS,
open file descriptors, threads, KV blocks in use (idle caches included; they are
bounded by the pool) and slot files on disk; RSS once a minute in between; every
status by code, and each 5xx with its message. 503s from the bounded queue are
documented behaviour and counted apart from other 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORDS = "def class return import while for if else yield lambda async await with try except".split()


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    field = lambda name: int(next(line.split()[1] for line in status.splitlines() if line.startswith(name)))  # noqa: E731
    return {"rss_mb": field("VmRSS:") / 1024, "threads": field("Threads:"), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


class Soak:
    def __init__(self, url: str, pid: int, save_dir: Path, n_slots: int):
        self.url, self.pid, self.save_dir, self.n_slots = url, pid, save_dir, n_slots
        self.statuses: Counter = Counter()
        self.errors_5xx: Counter = Counter()
        self.ops: Counter = Counter()
        self.rss: list[tuple[float, float]] = []

    def prompt(self) -> str:
        return " ".join(random.choice(WORDS) for _ in range(random.randint(3, 60)))

    def record(self, op: str, r: httpx.Response) -> None:
        self.ops[op] += 1
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            try:
                message = r.json()["error"]["message"][:80]
            except Exception:  # noqa: BLE001 - the body itself is what we report
                message = r.text[:80]
            self.errors_5xx[f"{r.status_code} {op}: {message}"] += 1

    async def stream(self, c: httpx.AsyncClient) -> None:
        body = {"prompt": self.prompt(), "max_tokens": random.randint(8, 96), "stream": True, "ignore_eos": True}
        cut = random.random() < 0.33
        async with c.stream("POST", "/v1/completions", json=body) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if cut and n >= 3:
                    break  # the client goes away mid-stream
            self.record("stream_cut" if cut else "stream", r)

    async def complete(self, c: httpx.AsyncClient) -> None:
        body = {"prompt": self.prompt(), "max_tokens": random.randint(4, 48), "n": random.choice([1, 2, 3])}
        self.record("completion", await c.post("/v1/completions", json=body))

    async def chat(self, c: httpx.AsyncClient) -> None:
        body = {"messages": [{"role": "user", "content": self.prompt()}], "max_tokens": 24, "n": random.choice([1, 2])}
        self.record("chat", await c.post("/v1/chat/completions", json=body))

    async def native(self, c: httpx.AsyncClient) -> None:
        body = {"prompt": self.prompt(), "n_predict": 16, "id_slot": random.randrange(-1, self.n_slots)}
        self.record("native", await c.post("/completion", json=body))

    async def slot_file(self, c: httpx.AsyncClient) -> None:
        slot, name = random.randrange(self.n_slots), f"soak-{random.randrange(6)}.slot"
        action = random.choice(["save", "save", "restore", "erase"])
        params = {"action": action, **({"nowait": "true"} if random.random() < 0.3 else {})}
        self.record(f"slot_{action}", await c.post(f"/slots/{slot}", params=params, json={"filename": name}))
        if random.random() < 0.1:
            self.record("slot_delete", await c.delete(f"/slots/files/{name}"))
            self.record("slot_list", await c.get("/slots/files"))

    async def bad(self, c: httpx.AsyncClient) -> None:
        kind = random.randrange(6)
        if kind == 0:
            r = await c.post(
                "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"}
            )
        elif kind == 1:
            r = await c.post("/v1/completions", json={"prompt": "x", "temperature": "hot", "n": 99})
        elif kind == 2:
            r = await c.post("/slots/0", params={"action": "save"}, json={"filename": "../escape"})
        elif kind == 3:
            r = await c.get("/nowhere")
        elif kind == 4:
            r = await c.post("/v1/completions", content=b"x" * (9 << 20))
        else:
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": 5}]})
        self.record("bad", r)

    async def worker(self, deadline: float) -> None:
        actions = [self.stream] * 4 + [self.complete] * 2 + [self.chat, self.native, self.slot_file, self.bad]
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as c:
            while time.monotonic() < deadline:
                action = random.choice(actions)
                try:
                    await action(c)
                except httpx.HTTPError as exc:  # e.g. a 413 that closes the connection mid-upload
                    self.statuses[f"transport {action.__name__}: {type(exc).__name__}"] += 1

    async def sample_rss(self, deadline: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            self.rss.append((round((time.monotonic() - t0) / 60, 1), round(proc_stats(self.pid)["rss_mb"], 1)))
            await asyncio.sleep(60)

    def snapshot(self) -> dict:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        files = [p for p in self.save_dir.iterdir()] if self.save_dir.exists() else []
        return {
            **proc_stats(self.pid),
            "kv_blocks_used": metric(text, "slotserve_kv_cache_blocks_used"),
            "kv_blocks_capacity": metric(text, "slotserve_kv_cache_blocks_capacity"),
            "kv_usage_ratio_running": metric(text, "slotserve_kv_cache_usage_ratio"),
            "requests_running": metric(text, "slotserve_requests_running"),
            "slot_files": len(files),
            "stray_temporaries": sum(p.name.startswith(".") for p in files),
        }

    async def run(self, minutes: float, workers: int) -> dict:
        await asyncio.gather(*(self.worker(time.monotonic() + 20) for _ in range(workers)))  # warm-up
        await self.wait_idle()
        start = self.snapshot()
        deadline = time.monotonic() + minutes * 60
        await asyncio.gather(self.sample_rss(deadline), *(self.worker(deadline) for _ in range(workers)))
        await self.wait_idle()
        end = self.snapshot()
        return {
            "minutes": minutes,
            "workers": workers,
            "start": start,
            "end": end,
            "rss_per_minute": self.rss,
            "operations": dict(self.ops),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=str)},
            "errors_5xx": dict(self.errors_5xx),
        }

    async def wait_idle(self) -> None:
        for _ in range(600):
            if metric(httpx.get(self.url + "/metrics", timeout=30).text, "slotserve_requests_running") == 0:
                return
            await asyncio.sleep(0.1)


def start_server(port: int, save_dir: Path, args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--slot-save-path", str(save_dir), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    random.seed(args.seed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    save_dir = Path(tempfile.mkdtemp(prefix="soak-slots-"))
    server_args = ["-np", str(args.slots), "-c", "4096", "--max-queue", "8", "-t", "1", "--stall-timeout", "30"]
    proc = start_server(port, save_dir, server_args)
    try:
        soak = Soak(f"http://127.0.0.1:{port}", proc.pid, save_dir, args.slots)
        report = asyncio.run(soak.run(args.minutes, args.workers))
    finally:
        proc.send_signal(signal.SIGTERM)
        report_exit = proc.wait(60)
    report["server"] = " ".join(server_args)
    report["exit_code_after_sigterm"] = report_exit
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
