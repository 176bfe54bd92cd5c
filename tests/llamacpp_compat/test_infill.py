"""llama-server's ``/infill`` (server/routes/infill_api.py, engine/text/fim.py): the FIM
tokens found by name or in GGUF metadata, the prompt laid out as llama-server lays
it out, the answer equal to ``/completion`` on that prompt, the validation of
``input_extra``, and a clear 501 for a model without FIM tokens (llama-server's)."""

from __future__ import annotations

import contextlib

import httpx
import pytest
from checkpoints import add_fim_tokens, make_checkpoint
from server_proc import InProcessServer

from engine import FimTokens, infill_prompt
from engine.text.fim import find_fim_tokens

BODY = {"input_prefix": "def area(w, h):\n", "prompt": "    return ", "input_suffix": "\n\nprint(area(2, 3))\n"}


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    """A tiny Llama whose tokenizer has Qwen2.5-Coder's FIM tokens."""
    return add_fim_tokens(make_checkpoint(tmp_path_factory.mktemp("fim") / "llama", "llama"))


@pytest.fixture(scope="module")
def fim_server(fim_model):
    with InProcessServer(model=fim_model, parallel=1, temp=0.0, batch_size=128) as srv:  # room for extra files
        yield srv


def test_the_tokens_are_found_by_name_and_in_gguf_metadata():
    vocab = {"<fim_prefix>": 5, "<fim_suffix>": 6, "<fim_middle>": 7, "<|file_sep|>": 9}
    assert find_fim_tokens(vocab.get) == FimTokens(5, 6, 7, None, 9)
    fields = {
        "tokenizer.ggml.fim_pre_token_id": 1,
        "tokenizer.ggml.fim_mid_token_id": 3,
        "tokenizer.ggml.prefix_token_id": 8,
    }
    assert find_fim_tokens(vocab.get, fields) == FimTokens(1, 6, 3, None, 9)  # metadata first
    assert find_fim_tokens({}.get).missing() == [
        "prefix token is missing",
        "suffix token is missing",
        "middle token is missing",
    ]


def test_the_prompt_is_laid_out_as_llama_server_lays_it_out():
    enc = lambda text: [ord(c) for c in text]  # noqa: E731 - one id per character
    fim = FimTokens(pre=-1, suf=-2, mid=-3, rep=-4, sep=-5)
    ids = infill_prompt(enc, 0, fim, "abcdefgh", "uvwxyz", [("a.py", "x=1")], "pq", 16, 2, 64)
    # prefix: its last 3/4 of a batch (12: all 8); suffix: its first 16/4 - 2 - len(prompt) = 0
    extra = [-4, *enc("myproject\n"), -5, *enc("a.py\n"), *enc("x=1"), -5, *enc("filename\n")]
    assert ids == [0, *extra, -1, *enc("abcdefgh"), *enc("pq"), -2, -3]
    short = infill_prompt(
        enc, None, FimTokens(pre=-1, suf=-2, mid=-3), "abcdefgh", "uvwxyz", [("f", "t")], "", 8, 10, 30
    )
    # no repo or file tokens: a snippet separator; the extra part keeps its last 30 - 8 - 20 = 2 ids, the
    # prefix its last 3 * 8 / 4 = 6, the suffix none (8 / 4 - 2)
    assert short == [*enc("\nt"), -1, *enc("cdefgh"), -2, -3]


def test_infill_answers_as_completion_on_the_laid_out_prompt(fim_server):
    with contextlib.nullcontext(fim_server) as srv:
        extra = [{"filename": "shapes.py", "text": "PI = 3.14\n"}, {"text": "import math\n"}]
        answer = httpx.post(srv.url + "/infill", json={**BODY, "input_extra": extra, "n_predict": 8}, timeout=60)
        assert answer.status_code == 200
        tok = srv.state.engine.tokenizer
        ids = infill_prompt(
            lambda t: tok.encode(t, add_special=False), None, tok.fim, BODY["input_prefix"], BODY["input_suffix"],
            [("shapes.py", "PI = 3.14\n"), ("tmp", "import math\n")], BODY["prompt"], 128, 8, srv.state.engine.n_ctx,
        )  # fmt: skip
        assert ids[0] == tok.fim.rep and ids[-1] == tok.fim.mid
        plain = httpx.post(srv.url + "/completion", json={"prompt": ids, "n_predict": 8}, timeout=60).json()
        assert answer.json()["tokens"] == plain["tokens"] and answer.json()["tokens_evaluated"] == len(ids)
        with httpx.stream("POST", srv.url + "/infill", json={**BODY, "n_predict": 4, "stream": True}, timeout=60) as r:
            assert r.status_code == 200 and any(line.startswith("data: ") for line in r.iter_lines())


@pytest.mark.parametrize(
    "chunk",
    [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"}, {"filename": 123, "text": 456}],
)
def test_a_bad_extra_file_is_a_400(fim_server, chunk):
    with contextlib.nullcontext(fim_server) as srv:
        r = httpx.post(srv.url + "/infill", json={**BODY, "input_extra": [chunk]}, timeout=60)
        assert r.status_code == 400 and "error" in r.json()
        assert httpx.post(srv.url + "/infill", json={"input_prefix": "x"}, timeout=60).status_code == 400  # no suffix


def test_a_model_without_fim_tokens_says_so(demo_server):
    r = httpx.post(demo_server.url + "/infill", json=BODY, timeout=60)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"  # as llama-server
    assert r.json()["error"]["message"].startswith("Infill is not supported by this model: prefix token is missing")


def test_infill_completes_n_cmpl_times_up_to_the_slots(fim_server):
    """``n_cmpl`` as on ``/completion`` (schemathesis found it ignored here: 3 on one slot answered 200)."""
    too_many = httpx.post(fim_server.url + "/infill", json={**BODY, "n_predict": 2, "n_cmpl": 2}, timeout=60)
    assert too_many.status_code == 400 and "n_cmpl" in too_many.json()["error"]["message"]
    one = httpx.post(fim_server.url + "/infill", json={**BODY, "n_predict": 2, "n_cmpl": 1}, timeout=60)
    assert one.status_code == 200 and one.json()["tokens_predicted"] == 2
