"""One long agent conversation against a llama-server-compatible /completion endpoint:
what each turn computes (``timings.prompt_n``), then a regeneration of the last answer.
Prints one JSON object.

    python bench/conversation.py http://127.0.0.1:8080 [--turns 8 --system 2000 --user 200 --answer 32]

The conversation: a ``--system``-token system prompt (tools included, as agents send),
then ``--turns`` turns of ``--user`` new tokens each; every request is the whole
history (prompt ids, as an agent re-sends it) with the previous answers, greedy,
``--answer`` tokens each, in slot 0. Last, the last turn's prompt again (the answer
regenerated). A server that reuses its cache computes only each turn's new tokens.
With ``--rerender R``, the history carries each answer with its last R tokens written
differently (what chat templates do to an assistant's message: reasoning stripped, an
end marker added), so each turn diverges from the cache R tokens before its end.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import httpx


def complete(client: httpx.Client, prompt: list[int], n: int) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": True,
            "id_slot": 0, "return_tokens": True}  # fmt: skip
    t0 = time.perf_counter()
    r = client.post("/completion", json=body)
    r.raise_for_status()
    out = r.json()
    out["wall_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system", type=int, default=2000)
    ap.add_argument("--user", type=int, default=200)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--rerender", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=250)  # token ids drawn from [1, vocab): the bench tokenizer's bytes
    args = ap.parse_args()
    rng = random.Random(0)
    words = lambda n: [rng.randrange(1, args.vocab) for _ in range(n)]  # noqa: E731
    history = words(args.system)
    turns = []
    with httpx.Client(base_url=args.url, timeout=3600) as client:
        for _ in range(args.turns):
            prompt = history + words(args.user)
            out = complete(client, prompt, args.answer)
            t = out["timings"]
            turns.append({"prompt": len(prompt), "prompt_n": t["prompt_n"], "prompt_ms": round(t["prompt_ms"]),
                          "wall_s": round(out["wall_s"], 2)})  # fmt: skip
            answer = out["tokens"]
            if args.rerender:  # the template writes the answer's end differently next time
                answer = answer[: -args.rerender] + words(args.rerender)
            history = prompt + answer
        again = complete(client, prompt, args.answer)  # the last answer, regenerated
    regen = {"prompt": len(prompt), "prompt_n": again["timings"]["prompt_n"], "wall_s": round(again["wall_s"], 2),
             "same_answer": again["tokens"] == out["tokens"]}  # fmt: skip
    new = [args.system + args.user] + [args.user + args.answer] * (args.turns - 1)  # what each turn adds
    print(json.dumps({"turns": turns, "regenerate": regen, "new_tokens": new,
                      "prompt_n_total": sum(t["prompt_n"] for t in turns)}))  # fmt: skip


if __name__ == "__main__":
    main()
