"""llama-server's sampler fields and flags over HTTP: every sampler is taken under its
llama-server name and changes what is drawn; a seed gives the same text again; the
``samplers`` order takes names, aliases and letters; ``post_sampling_probs`` answers
llama-server's ``prob``/``top_probs``; server flags set the defaults /props shows."""

from __future__ import annotations

import math

import httpx
import pytest
from server_proc import InProcessServer

PROMPT = "def fibonacci(n):"
SAMPLERS = {
    "top_n_sigma": {"top_n_sigma": 1.0},
    "typical_p": {"typical_p": 0.5},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.05},
    "dynatemp": {"dynatemp_range": 0.9, "dynatemp_exponent": 0.5},
    "mirostat1": {"mirostat": 1, "mirostat_tau": 2.0},
    "mirostat2": {"mirostat": 2, "mirostat_tau": 2.0, "mirostat_eta": 0.2},
    "dry": {"dry_multiplier": 2.0, "dry_allowed_length": 1, "dry_sequence_breakers": ["\n"]},
    "penalties": {"repeat_penalty": 1.5, "repeat_last_n": 16, "presence_penalty": 0.5},
}


def completion(srv, **body) -> dict:
    body = {"prompt": PROMPT, "n_predict": 24, "seed": 11, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0, **body}  # fmt: skip
    r = httpx.post(srv.url + "/completion", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", SAMPLERS)
def test_each_sampler_is_taken_seeded_and_changes_the_draws(demo_server, name):
    fields = SAMPLERS[name]
    first = completion(demo_server, **fields)
    assert completion(demo_server, **fields)["tokens"] == first["tokens"]  # the seed decides
    settings = first["generation_settings"]
    for key, value in fields.items():
        shown = settings.get(key if key != "dry_sequence_breakers" else "dry_multiplier")
        assert shown == (value if key != "dry_sequence_breakers" else fields["dry_multiplier"]), key
    plain = [completion(demo_server, seed=s)["tokens"] for s in range(4)]
    changed = [completion(demo_server, seed=s, **fields)["tokens"] for s in range(4)]
    assert plain != changed


def test_a_dry_breaker_is_any_token_that_writes_it(demo_server):
    """ "\n" as a breaker also stops a repeat at a token that writes "\n" among other
    text (llama.cpp's reading), not only at the token "\n" is encoded to."""
    from engine import DEMO_MODEL
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(DEMO_MODEL)
    nn = next(i for i, w in enumerate(tok.vocab_bytes) if b"\n" in w and len(w) > 1)
    assert [nn] != tok.encode("\n", False)
    prompt = [100, nn, 101, 102, 100, nn, 101]  # 102 would extend "100 nn 101", across nn

    def p102(**dry) -> float:
        body = {"prompt": prompt, "n_predict": 1, "n_probs": 10, "post_sampling_probs": True, "logit_bias": [[102, 8]]}
        first = completion(demo_server, **body, **dry)["completion_probabilities"][0]["top_probs"]
        return next((p["prob"] for p in first if p["id"] == 102), 0.0)  # 0: out of the top 10

    dry = {"dry_multiplier": 3.0, "dry_allowed_length": 2}
    assert p102(**dry, dry_sequence_breakers=["\n"]) == pytest.approx(p102(), abs=1e-6)  # nn breaks: no penalty
    assert p102(**dry, dry_sequence_breakers=["\u00a7"]) < p102() - 0.05  # a breaker nowhere: 102 is lowered


def test_the_samplers_order_takes_names_aliases_and_letters(demo_server):
    hot = {"temperature": 4.0, "top_p": 0.5, "n_probs": 5, "post_sampling_probs": True}
    names = completion(demo_server, samplers=["top_p", "temperature"], **hot)
    letters = completion(demo_server, samplers="pt", **hot)
    aliases = completion(demo_server, samplers=["nucleus", "temp", "no-such-sampler"], **hot)
    assert names["tokens"] == letters["tokens"] == aliases["tokens"]
    assert names["generation_settings"]["samplers"] == ["top_p", "temperature"]
    temp_first = completion(demo_server, samplers=["temperature", "top_p"], **hot)
    n_after = [len(p["top_probs"]) for p in names["completion_probabilities"]]
    n_before = [len(p["top_probs"]) for p in temp_first["completion_probabilities"]]
    assert sum(n_after) < sum(n_before)  # top-p on the sharp distribution keeps fewer tokens


def test_post_sampling_probs_are_llama_servers_fields(demo_server):
    out = completion(demo_server, n_probs=3, top_k=3, post_sampling_probs=True, n_predict=6)
    for entry in out["completion_probabilities"]:
        assert "prob" in entry and "logprob" not in entry and len(entry["top_probs"]) == 3
        assert sum(p["prob"] for p in entry["top_probs"]) == pytest.approx(1.0, abs=1e-4)
        assert any(p["id"] == entry["id"] and p["prob"] == pytest.approx(entry["prob"]) for p in entry["top_probs"])
    pre = completion(demo_server, n_probs=3, top_k=3, n_predict=6)["completion_probabilities"][0]
    assert (
        "logprob" in pre
        and math.exp(pre["top_logprobs"][0]["logprob"]) < out["completion_probabilities"][0]["top_probs"][0]["prob"]
    )


def test_bad_sampler_values_are_400s(demo_server):
    for body in ({"mirostat": 3}, {"typical_p": 1.5}, {"dry_sequence_breakers": []}, {"xtc_threshold": -1}):
        r = httpx.post(demo_server.url + "/completion", json={"prompt": "x", "n_predict": 1, **body}, timeout=60)
        assert r.status_code == 400, body


def test_server_flags_set_the_defaults():
    with InProcessServer(parallel=1, mirostat=2, mirostat_ent=3.0, samplers="top_k;temperature", typical=0.9,
                         repeat_last_n=32, dry_multiplier=0.5, dry_sequence_breaker="none") as srv:  # fmt: skip
        params = httpx.get(srv.url + "/props").json()["default_generation_settings"]["params"]
        assert params["mirostat"] == 2 and params["mirostat_tau"] == 3.0 and params["typical_p"] == 0.9
        assert params["samplers"] == ["top_k", "temperature"] and params["repeat_last_n"] == 32
        shown = completion(srv, n_predict=2)["generation_settings"]
        assert shown["mirostat"] == 2 and shown["samplers"] == ["top_k", "temperature"]
        assert shown["dry_multiplier"] == 0.5
        assert completion(srv, mirostat=0, n_predict=2)["generation_settings"]["mirostat"] == 0
