"""Server-wide sampling defaults (llama-server's --temp, --top-k, --top-p, --min-p,
--seed): they apply to requests that set none, on every route, and a request's own
value still wins."""

from __future__ import annotations

import json
import threading

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


def test_request_defaults_stop_constraint_and_prompt_cache(tmp_path):
    """-r is the stop string of requests that give none; --json-schema-file constrains
    requests without a constraint of their own (a request's own wins); --no-cache-prompt
    makes requests compute their prompt again unless they ask to reuse it."""
    schema = tmp_path / "schema.json"
    n = {"type": "integer", "minimum": 0, "maximum": 9}
    schema.write_text(
        json.dumps({"type": "object", "properties": {"n": n}, "required": ["n"], "additionalProperties": False})
    )
    with InProcessServer(temp=0.0, reverse_prompt="(", parallel=1) as srv:
        cut = httpx.post(srv.url + "/completion", json={**BODY, "prompt": "def f"}, timeout=60).json()
        assert cut["stop_type"] == "word" and cut["stopping_word"] == "("
        own = httpx.post(srv.url + "/completion", json={**BODY, "prompt": "def f", "stop": ["\n\n"]}, timeout=60)
        assert own.json()["stopping_word"] != "("
    with InProcessServer(temp=0.0, json_schema_file=schema, cache_prompt=False, parallel=1) as srv:
        assert 0 <= json.loads(complete(srv, n_predict=64))["n"] <= 9  # the server's schema held
        choice = httpx.post(srv.url + "/completion", json={**BODY, "json_schema": {"enum": ["yes", "no"]}}).json()
        assert json.loads(choice["content"]) in ("yes", "no")  # the request's own constraint wins
        again = httpx.post(srv.url + "/completion", json=BODY, timeout=60).json()
        assert again["tokens_cached"] == 0  # --no-cache-prompt: nothing reused
        reuse = httpx.post(srv.url + "/completion", json={**BODY, "cache_prompt": True}, timeout=60).json()
        assert reuse["tokens_cached"] > 0


def test_a_server_wide_grammar_that_does_not_compile_stops_the_start():
    from server.app import create_app
    from server.config.settings import ServerSettings

    engines = lambda: sum(t.name == "slotserve-engine" for t in threading.enumerate())  # noqa: E731
    before = engines()
    app = create_app(ServerSettings(grammar="root ::= (", port=0))
    state = app.state.slotserve
    state._load()  # the loader's work, in this thread
    assert state.status == "failed" and "grammar" in state.error
    assert engines() == before and state.close(timeout=5)  # no engine thread was left that close could not stop


def test_routes_under_an_api_prefix_and_sse_pings():
    """--api-prefix serves every route under the prefix (others: 404 in the error
    shape); --sse-ping-interval sends SSE comments while a stream is quiet."""
    with InProcessServer(api_prefix="/llm/v2", sse_ping_interval=1, parallel=1) as srv:
        assert httpx.get(srv.url + "/llm/v2/health").status_code == 200
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(srv.url + "/llm/v2/v1/chat/completions", json=body, timeout=60).status_code == 200
        _pings_while_quiet(srv, "/llm/v2/completion", {})
    with InProcessServer(parallel=1) as srv:  # the server's 30 s, the request's 1 s
        _pings_while_quiet(srv, "/completion", {"sse_ping_interval": 1})


def _pings_while_quiet(srv, path: str, extra: dict) -> None:
    engine = srv.state.engine._engine  # after its first step, the engine waits for the gate: a quiet stream
    gate, real_step, n_steps = threading.Event(), engine.step, []
    engine.step = lambda *a, **k: (n_steps.append(1), len(n_steps) == 1 or gate.wait(60), real_step(*a, **k))[2]
    body = {"prompt": "def f(x):", "n_predict": 3, "stream": True, **extra}
    try:
        with httpx.stream("POST", srv.url + path, json=body, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            assert next(lines).startswith("data: ")  # the first token
            assert next(lines) == ":"  # an SSE comment while nothing comes
            gate.set()
            assert any(line.startswith("data: ") for line in lines)  # then the rest
    finally:
        gate.set()
        engine.step = real_step


def test_special_tokens_are_written_with_sp(demo_server):
    """-sp/--special: a special token the model picks appears in the text as its text
    (here forced by a logit bias), and not without the flag."""
    token = demo_server.state.engine.tokenizer.hf.token_to_id("<|im_start|>")
    body = {"prompt": "x = 1", "n_predict": 2, "temperature": 0, "logit_bias": [[token, 100]]}
    quiet = httpx.post(demo_server.url + "/completion", json=body, timeout=60).json()
    with InProcessServer(special=True, parallel=1) as srv:
        loud = httpx.post(srv.url + "/completion", json=body, timeout=60).json()
    assert quiet["tokens"] == loud["tokens"] == [token, token]
    assert quiet["content"] == "" and loud["content"] == "<|im_start|><|im_start|>"
