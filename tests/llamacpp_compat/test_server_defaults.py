"""Server-wide sampling defaults (llama-server's --temp, --top-k, --top-p, --min-p,
--seed): they apply to requests that set none, on every route, and a request's own
value still wins."""

from __future__ import annotations

import httpx
from server_proc import InProcessServer

BODY = {"prompt": "def quicksort(items):", "n_predict": 24}


def complete(srv, **kw) -> str:
    return httpx.post(srv.url + "/completion", json={**BODY, **kw}, timeout=60).json()["content"]


def openai(srv, **kw) -> str:
    body = {"prompt": BODY["prompt"], "max_tokens": 24, **kw}
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]


def test_defaults_apply_when_a_request_sets_none():
    with InProcessServer(temp=0.0) as greedy:
        assert complete(greedy) == complete(greedy, temperature=0) == openai(greedy) == openai(greedy, temperature=0)
        hot = {complete(greedy, temperature=1.5, seed=s) for s in range(3)}
        assert len(hot) > 1  # the request's own temperature wins
    with InProcessServer(temp=1.5, seed=7, top_k=0, top_p=1.0) as seeded:
        assert complete(seeded) == complete(seeded)  # the server's seed: the same draw
        assert openai(seeded) == openai(seeded)
        assert len({complete(seeded, seed=s) for s in range(3)}) > 1  # the request's seed wins
    with InProcessServer() as plain:
        assert len({complete(plain, temperature=1.5) for _ in range(3)}) > 1  # no server seed: fresh draws
