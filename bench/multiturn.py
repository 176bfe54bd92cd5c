"""More conversations than slots: multi-turn chats through llama-server's native
``/completion`` (``cache_prompt``), against any server that speaks it (slotserve or
llama-server); prints JSON.

    python bench/multiturn.py http://127.0.0.1:8080
    python bench/multiturn.py URL --conversations 32 --workers 4 --turns 4 --words 32 --new 32

``--workers`` clients each own every ``workers``-th conversation and take turns round
robin over them, so a slot's conversation is followed by another one's before its own
next turn (32 conversations on 4 slots: every follow-up finds its slot taken). Each turn
appends ``--words`` words of user text (seeded, per conversation and turn) and the
previous answer to the history; answers are ``--new`` greedy tokens. Reported: prompt
tokens computed and reused (``timings.prompt_n`` / ``timings.cache_n`` of the final
stream frame), time to first token of the follow-up turns (p50, p90, client side), and
the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx

WORDS = (
    "the of and to in is it that for on with as was at by be this from or have an they which one you were all "
    "her she there would their we him been has when who will more no if out so said what up its about into than "
    "them can only other new some could time these two may then do first any my now such like our over man me "
    "even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year off come"
).split()


def turn_text(conversation: int, turn: int, n_words: int) -> str:
    rng = random.Random(conversation * 1000 + turn)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


async def one_turn(client: httpx.AsyncClient, prompt: str, n_new: int) -> dict:
    body = {"prompt": prompt, "n_predict": n_new, "temperature": 0, "cache_prompt": True, "stream": True}
    for attempt in range(3):  # a kept-alive connection the server closed meanwhile: once more on a new one
        t0 = time.perf_counter()
        t_first, text, final = None, [], {}
        try:
            async with client.stream("POST", "/completion", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    frame = json.loads(line[6:])
                    if frame.get("content") and t_first is None:
                        t_first = time.perf_counter()
                    text.append(frame.get("content", ""))
                    if frame.get("stop"):
                        final = frame
            break
        except httpx.RemoteProtocolError:
            if attempt == 2 or t_first is not None:
                raise
    timings = final.get("timings", {})
    return {
        "ttft_s": (t_first or time.perf_counter()) - t0,
        "text": "".join(text),
        "prompt_n": timings.get("prompt_n", 0),
        "cache_n": timings.get("cache_n", final.get("tokens_cached", 0)),
    }


async def worker(client, convs: list[int], args, out: list[dict]) -> None:
    history = {c: "" for c in convs}
    for turn in range(args.turns):
        for c in convs:
            history[c] += f"User: {turn_text(c, turn, args.words)}\nAssistant:"
            res = await one_turn(client, history[c], args.new)
            history[c] += res["text"] + "\n"
            out.append({"conversation": c, "turn": turn, **res})


async def run(args) -> dict:
    out: list[dict] = []
    async with httpx.AsyncClient(base_url=args.url, timeout=httpx.Timeout(600.0)) as client:
        t0 = time.perf_counter()
        groups = [list(range(w, args.conversations, args.workers)) for w in range(args.workers)]
        await asyncio.gather(*(worker(client, g, args, out) for g in groups))
        wall = time.perf_counter() - t0
    follow = sorted(r["ttft_s"] for r in out if r["turn"] > 0)
    return {
        "url": args.url,
        "conversations": args.conversations,
        "workers": args.workers,
        "turns": args.turns,
        "prompt_tokens_computed": sum(r["prompt_n"] for r in out),
        "prompt_tokens_reused": sum(r["cache_n"] for r in out),
        "followup_ttft_s_p50": statistics.median(follow) if follow else None,
        "followup_ttft_s_p90": follow[int(0.9 * (len(follow) - 1))] if follow else None,
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--words", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    print(json.dumps(asyncio.run(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
