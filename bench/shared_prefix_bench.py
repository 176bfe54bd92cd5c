"""Many users, one system prompt: ``--users`` requests through llama-server's native
``/completion``, each a shared ``--system-words`` system prompt (seeded text) and a
question of its own, ``--workers`` at a time; against any server that speaks it
(slotserve or llama-server). Prints JSON: the system prompt's tokens, the prompt tokens
computed over all requests (``timings.prompt_n``) and reused (``timings.cache_n``), how
many tokens of the shared start were computed (per request: system tokens - cache_n,
when positive), and the wall time.

    python bench/shared_prefix_bench.py http://127.0.0.1:8080 --users 64 --workers 8
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from multiturn import WORDS


def text(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("url")
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--system-words", type=int, default=100, help="~500 tokens with the bench tokenizer")
    ap.add_argument("--question-words", type=int, default=16)
    ap.add_argument("--new", type=int, default=16)
    args = ap.parse_args()
    system = "System: " + text(0, args.system_words) + "\n"
    client = httpx.Client(base_url=args.url, timeout=600)
    n_system = len(client.post("/tokenize", json={"content": system}).json()["tokens"])

    def ask(user: int) -> dict:
        prompt = system + f"User {user}: " + text(1000 + user, args.question_words) + "\nAssistant:"
        body = {"prompt": prompt, "n_predict": args.new, "temperature": 0, "cache_prompt": True}
        r = httpx.post(args.url + "/completion", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["timings"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        timings = list(pool.map(ask, range(args.users)))
    wall = time.perf_counter() - t0
    computed = sum(t["prompt_n"] for t in timings)
    reused = sum(t.get("cache_n", 0) for t in timings)
    system_computed = sum(max(0, n_system - t.get("cache_n", 0)) for t in timings)  # the shared start's part
    out = {
        "url": args.url,
        "users": args.users,
        "workers": args.workers,
        "system_tokens": n_system,
        "prompt_tokens_computed": computed,
        "prompt_tokens_reused": reused,
        "system_tokens_computed": system_computed,
        "wall_s": round(wall, 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
