"""Regression tests for defects found by using the server as a client would (issue 24),
each over HTTP against a real in-process uvicorn server:

- a chat template of real size (1-10 KB), from a file or inline, starts the server;
- GET /slots while a request with a banned token runs answers valid JSON, with the
  request's params only under --slots-debug (llama-server's LLAMA_SERVER_SLOTS_DEBUG);
- an empty grammar beside another constraint means "no grammar";
- an integer field past int64 is a 400 naming the field, and one client's huge (but
  valid) number never fails another client's request.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from server_proc import InProcessServer
from waiting import wait_for

# A ChatML template of a real template's size: the padding is a Jinja comment, as real
# templates carry long comments and tool-calling branches.
_BODY = (
    "{%- for m in messages -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant [TEMPLATE-MARK]\n{% endif -%}"
)


def _template(size: int) -> str:
    pad = size - len(_BODY) - len("{##}")
    return "{#" + ("tool calling notes " * size)[:pad] + "#}" + _BODY


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


def _rendered(url: str) -> str:
    r = httpx.post(url + "/apply-template", json={"messages": MESSAGES}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.mark.parametrize("size", [2_000, 10_000])
def test_a_chat_template_file_of_real_size_is_used(tmp_path, size):
    path = tmp_path / "template.jinja"
    path.write_text(_template(size), encoding="utf-8")
    assert path.stat().st_size >= size - 1
    with InProcessServer(chat_template_file=path) as srv:
        prompt = _rendered(srv.url)
    assert prompt.endswith("<|im_start|>assistant [TEMPLATE-MARK]\n")
    assert "<|im_start|>user\nhello there<|im_end|>" in prompt


@pytest.fixture(scope="module")
def debug_srv():
    # an inline template of 3 KB (--chat-template) and the slots' params shown
    with InProcessServer(chat_template=_template(3_000), slots_debug=True, parallel=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def srv():
    with InProcessServer(parallel=2) as srv:
        yield srv


def test_an_inline_chat_template_of_real_size_is_used(debug_srv):
    assert _rendered(debug_srv.url).endswith("assistant [TEMPLATE-MARK]\n")


BIAS_FORMS = {
    "number": {"10": -5.5},
    "false": {"10": False},
    "-inf": {"10": "-inf"},
    "pairs": [[10, False], ["def", -3], [11, 2.0]],
}


class _Running:
    """A streamed /completion that runs until the block ends (the stream is closed,
    which cancels it)."""

    def __init__(self, url: str, body: dict) -> None:
        self.url, self.body = url, {"n_predict": 100_000, "ignore_eos": True, "stream": True, **body}
        self.started = threading.Event()
        self.stop = threading.Event()
        self.status: int | None = None

    def _run(self) -> None:
        with httpx.stream("POST", self.url + "/completion", json=self.body, timeout=60) as r:
            self.status = r.status_code
            for _ in r.iter_lines():
                if self.stop.is_set():
                    break

    def __enter__(self) -> _Running:
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        wait_for(lambda: any(s["is_processing"] for s in httpx.get(self.url + "/slots").json()), what="running")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)
        wait_for(lambda: not any(s["is_processing"] for s in httpx.get(self.url + "/slots").json()), what="idle")


def _slots_while_running(url: str, bias) -> tuple[int, list[dict]]:
    with _Running(url, {"prompt": "def f(x):", "logit_bias": bias}):
        r = httpx.get(url + "/slots")
        busy = [s for s in json.loads(r.text) if s["is_processing"]]  # strict JSON: no NaN, no Infinity
        return r.status_code, busy


@pytest.mark.parametrize("form", list(BIAS_FORMS))
def test_slots_answer_json_while_a_banned_token_runs(srv, form):
    status, busy = _slots_while_running(srv.url, BIAS_FORMS[form])
    assert status == 200 and len(busy) == 1
    assert "params" not in busy[0]  # as llama-server without LLAMA_SERVER_SLOTS_DEBUG


@pytest.mark.parametrize("form", list(BIAS_FORMS))
def test_slots_debug_shows_the_params_as_json(debug_srv, form):
    status, busy = _slots_while_running(debug_srv.url, BIAS_FORMS[form])
    assert status == 200 and len(busy) == 1
    params = busy[0]["params"]
    bias = dict((t, b) for t, b in params["logit_bias"])
    expected = {"number": -5.5, "false": False, "-inf": False, "pairs": False}[form]
    assert bias[10] == expected
    assert params["ignore_eos"] is True and params["n_predict"] == 100_000


def test_slots_debug_is_read_from_the_environment(monkeypatch):
    from server.config.settings import ServerSettings

    monkeypatch.setenv("LLAMA_SERVER_SLOTS_DEBUG", "1")
    assert ServerSettings().slots_debug is True


@pytest.mark.parametrize("empty", ["guided_grammar", "grammar"])
def test_an_empty_grammar_is_no_constraint(srv, empty):
    body = {"prompt": "x", "max_tokens": 4, "guided_choice": ["0"], empty: ""}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "0"


HUGE = 2**65
# (route, body, the field the 400 names)
TOO_LARGE = [
    ("/v1/completions", {"prompt": "x", "top_k": HUGE}, "top_k"),
    ("/v1/completions", {"prompt": "x", "seed": HUGE}, "seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": HUGE}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": HUGE}, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": HUGE}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "n_keep": -HUGE}, "n_keep"),
    ("/v1/completions", {"prompt": "x", "id_slot": HUGE}, "id_slot"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {str(HUGE): 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": [[HUGE, 1]]}, "logit_bias"),
    ("/v1/completions", {"prompt": [1, HUGE]}, "prompt"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": HUGE}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": HUGE}, "top_logprobs"),
    ("/completion", {"prompt": "x", "n_predict": HUGE}, "n_predict"),
    ("/completion", {"prompt": "x", "n_probs": HUGE}, "n_probs"),
    ("/completion", {"prompt": "x", "top_k": -HUGE}, "top_k"),
    ("/detokenize", {"tokens": [HUGE]}, "tokens"),
]


@pytest.mark.parametrize(("route", "body", "field"), TOO_LARGE, ids=[f"{r}:{f}" for r, _, f in TOO_LARGE])
def test_an_integer_past_int64_is_a_400_naming_its_field(srv, route, body, field):
    r = httpx.post(srv.url + route, json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert field in error["message"], error["message"]


def test_a_huge_top_k_runs_and_fails_nobody_beside_it(srv):
    """top_k at the integer bound (10**18), far past the vocabulary, means "all tokens" (clamped), and
    a request running beside it is untouched."""
    plain = {"prompt": "def add(a, b):", "n_predict": 24, "temperature": 0, "ignore_eos": True}
    alone = httpx.post(srv.url + "/completion", json=plain, timeout=60).json()["tokens"]
    with _Running(srv.url, {"prompt": "x", "top_k": 10**18, "seed": 7}) as huge:
        beside = httpx.post(srv.url + "/completion", json=plain, timeout=60)
    assert huge.status == 200
    assert beside.status_code == 200 and beside.json()["tokens"] == alone
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "top_k": 10**18, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
