"""Closed-loop load against any OpenAI-compatible server; prints JSON.

    python bench/serve_bench.py http://127.0.0.1:8080
    python bench/serve_bench.py URL --concurrency 1,8,32 --prompt 128 --new 128 --rounds 2

Each of ``c`` workers sends streaming /v1/completions requests one after the other
(prompt: --prompt random token ids, --new output tokens, ignore_eos, greedy) until
``c * rounds`` requests are done. Reported per concurrency: output tokens/s over the
wall time, time to first token (TTFT) and inter-token latency (ITL) p50/p90 in ms.
Token counts come from the stream's usage (``stream_options.include_usage``), else
from the number of content chunks. Against slotserve, each level also reports the mean
engine step time and the share of it the engine thread spent off the CPU (waiting for
the GIL or preempted), from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def one_request(client: httpx.AsyncClient, model: str, prompt: list[int], n_new: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": n_new,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stamps, usage = [], None
    for attempt in range(3):
        try:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event.get("choices"):
                        stamps.append(time.perf_counter())
                    if event.get("usage"):
                        usage = event["usage"]
            break
        except httpx.RemoteProtocolError:
            # a kept-alive connection the server had just closed (llama-server closes idle
            # ones after 5 s): nothing was answered, so send again; time still runs from t0
            if stamps or attempt == 2:
                raise
    n_tokens = usage["completion_tokens"] if usage else len(stamps)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft": stamps[0] - t0 if stamps else float("nan"), "itl": gaps, "tokens": n_tokens}


async def run_level(url, model, concurrency, rounds, n_prompt, n_new, vocab, headers=None, seed=0) -> dict:
    rng = random.Random(concurrency + 1000 * seed)  # seed 0: the measured prompts; others: warm-up ones
    prompts = [[rng.randrange(1, vocab) for _ in range(n_prompt)] for _ in range(concurrency * rounds)]
    results: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers=headers) as client:

        async def worker():
            while prompts:
                results.append(await one_request(client, model, prompts.pop(), n_new))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ttft = [r["ttft"] * 1000 for r in results]
    itl = [g * 1000 for r in results for g in r["itl"]]
    n_out = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "output_tokens": n_out,
        "wall_s": round(wall, 3),
        "output_tok_s": round(n_out / wall, 2),
        "ttft_ms_p50": round(quantile(ttft, 0.5), 1),
        "ttft_ms_p90": round(quantile(ttft, 0.9), 1),
        "itl_ms_p50": round(quantile(itl, 0.5), 2),
        "itl_ms_p90": round(quantile(itl, 0.9), 2),
        "itl_ms_mean": round(statistics.fmean(itl), 2) if itl else None,
    }


CLOCK = (
    "slotserve_engine_steps",
    "slotserve_engine_step_seconds",
    "slotserve_engine_step_cpu_seconds",
    "slotserve_engine_decode_steps",
    "slotserve_engine_decode_step_seconds",
)


def engine_clock(url: str, headers: dict) -> tuple[float, ...] | None:
    """slotserve's step clock from /metrics (steps, wall s, engine-thread CPU s), or
    None for a server that has none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    except (httpx.HTTPError, ValueError):
        return None
    names = [n + "_total" for n in CLOCK]
    return tuple(values[n] for n in names) if all(n in values for n in names) else None


def clock_fields(before: tuple[float, ...] | None, after: tuple[float, ...] | None) -> dict:
    """Mean step time and the share of step time the engine thread was off the CPU."""
    if before is None or after is None or after[0] == before[0]:
        return {}
    n, wall, cpu, n_dec, dec_wall = (a - b for a, b in zip(after, before))
    out = {"engine_step_ms_mean": round(wall / n * 1000, 2), "engine_offcpu_share": round(1 - cpu / wall, 3)}
    if n_dec:
        out["engine_decode_step_ms_mean"] = round(dec_wall / n_dec * 1000, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=2, help="requests per worker")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=250, help="prompt token ids are drawn from [1, vocab)")
    ap.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="C",
        help="first, C requests at once of the measured prompt length and 16 new tokens, other prompts "
        "(weights paged in, every batch shape met; default: one 8-token request)",
    )
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or httpx.get(args.url + "/v1/models", headers=headers).json()["data"][0]["id"]
    if args.warmup:
        asyncio.run(run_level(args.url, model, args.warmup, 1, args.prompt, 16, args.vocab, headers, seed=1))
    else:
        asyncio.run(run_level(args.url, model, 1, 1, 8, 4, args.vocab, headers))
    levels = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        level = run_level(args.url, model, c, args.rounds, args.prompt, args.new, args.vocab, headers)
        before = engine_clock(args.url, headers)
        levels.append(asyncio.run(level))
        levels[-1].update(clock_fields(before, engine_clock(args.url, headers)))
        print(json.dumps(levels[-1]), flush=True)
    print(json.dumps({"url": args.url, "model": model, "levels": levels}))


if __name__ == "__main__":
    main()
