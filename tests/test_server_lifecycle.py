"""Start-up, readiness, drain on SIGTERM, API keys, settings from flags and env."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
from checkpoints import write_byte_tokenizer
from safetensors.torch import save_file
from server_proc import ServerProcess


def slow_checkpoint(folder):
    """A 1-layer Llama with a 2M-token vocabulary (~1 GB of weights): slow enough to
    load that the listener can be seen answering while the model loads."""
    vocab, hidden = 2_000_000, 64
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    p = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": torch.zeros(vocab, hidden),
        "lm_head.weight": torch.zeros(vocab, hidden),
        "model.norm.weight": torch.ones(hidden),
        p + "input_layernorm.weight": torch.ones(hidden),
        p + "post_attention_layernorm.weight": torch.ones(hidden),
        p + "self_attn.q_proj.weight": torch.zeros(hidden, hidden),
        p + "self_attn.k_proj.weight": torch.zeros(hidden, hidden),
        p + "self_attn.v_proj.weight": torch.zeros(hidden, hidden),
        p + "self_attn.o_proj.weight": torch.zeros(hidden, hidden),
        p + "mlp.gate_proj.weight": torch.zeros(128, hidden),
        p + "mlp.up_proj.weight": torch.zeros(128, hidden),
        p + "mlp.down_proj.weight": torch.zeros(hidden, 128),
    }
    save_file(tensors, str(folder / "model.safetensors"))
    write_byte_tokenizer(folder)
    return folder


def test_health_and_ready_while_loading(tmp_path):
    folder = slow_checkpoint(tmp_path)
    with ServerProcess("-m", str(folder), "-np", "1", "-c", "256") as srv:
        first = srv.wait_listening()
        assert first.status_code == 200 and first.json() == {"status": "ok"}
        ready = httpx.get(srv.url + "/ready")
        assert ready.status_code == 503 and ready.json() == {"status": "loading"}
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        loading = httpx.get(srv.url + "/metrics").text
        assert "slotserve_ready 0.0" in loading and "slotserve_requests_running" not in loading
        srv.wait_ready(120)
        assert httpx.get(srv.url + "/health").status_code == 200
        assert "slotserve_ready 1.0" in httpx.get(srv.url + "/metrics").text
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_sigterm_drains_in_flight_stream(tmp_path):
    with ServerProcess("-np", "2", "--drain-timeout", "30", log=tmp_path / "log") as srv:
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            srv.signal(signal.SIGTERM)
            time.sleep(0.2)
            ready = httpx.get(srv.url + "/ready")
            assert ready.status_code == 503 and ready.json() == {"status": "draining"}
            assert httpx.get(srv.url + "/health").status_code == 200
            refused = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert len(rest) - 1 == 299  # every remaining token arrived: the drain let it finish
        assert srv.proc.wait(30) == 0


def test_drain_timeout_cuts_long_requests(tmp_path):
    with ServerProcess("-np", "1", "--drain-timeout", "0.5") as srv:
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            t0 = time.monotonic()
            srv.signal(signal.SIGTERM)
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - t0 < 10


def test_api_keys_flags_and_env(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("from-file\n")
    env = {
        "SLOTSERVE_API_KEY": "env-key",
        "SLOTSERVE_PARALLEL": "3",
        "SLOTSERVE_CTX_SIZE": "999",
        "SLOTSERVE_ALIAS": "mine",
    }
    args = ("--api-key", "k1,k2", "--api-key-file", str(key_file), "-c", "512")
    with ServerProcess(*args, env=env) as srv:
        srv.wait_ready()
        url = srv.url + "/v1/models"
        missing = httpx.get(url)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
        listed = httpx.get(url, headers={"Authorization": "Bearer k2"})
        assert listed.status_code == 200 and listed.json()["data"][0]["id"] == "mine"  # --alias from the env
        assert httpx.get(url, headers={"X-Api-Key": "from-file"}).status_code == 200
        assert httpx.get(url, headers={"X-Api-Key": "env-key"}).status_code == 401  # the flag wins over env
        props = httpx.get(srv.url + "/props", headers={"Authorization": "Bearer k1"}).json()
        assert props["total_slots"] == 3  # from the environment
        assert props["default_generation_settings"]["n_ctx"] == 512  # the flag over the env's 999
        assert httpx.get(srv.url + "/health").status_code == 200  # probes stay public
        assert httpx.get(srv.url + "/ready").status_code == 200


def test_full_queue_is_503_with_retry_after(tmp_path):
    with ServerProcess("-np", "1", "--max-queue", "1") as srv:
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # keep a reference: a collected iterator closes the stream
            next(line for line in lines if line.startswith("data: "))
            queued = threading.Thread(target=httpx.post, args=(srv.url + "/v1/completions",), kwargs={"json": body})
            queued.start()  # waits in the queue for the only slot
            time.sleep(0.3)
            full = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["type"] == "unavailable_error"
        queued.join(60)


def test_no_kv_unified_is_a_clear_startup_error():
    r = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--no-kv-unified"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and "--no-kv-unified" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "notaport"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "port" in r.stderr


def test_context_shift_flag(tmp_path):
    body = {"prompt": "def f():", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    with ServerProcess("-np", "1", "-c", "256", "--context-shift") as srv:
        srv.wait_ready()
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
        assert r["usage"]["completion_tokens"] == 300 and r["choices"][0]["finish_reason"] == "length"
        slot = httpx.get(srv.url + "/slots").json()[0]
        assert slot["n_cached"] < 256
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"


def test_failure_after_the_first_byte_is_an_sse_error_event():
    """Two streams that together need more KV blocks than the pool holds: the newer one
    fails mid-stream with a final error event; the older one finishes; the server serves on."""
    with ServerProcess("-np", "2", "-c", "64") as srv:  # 4 + 2 blocks of 16 cells
        srv.wait_ready()
        body = {"prompt": "def f():", "max_tokens": 50, "ignore_eos": True, "stream": True}
        results = {}

        def stream(name):
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                results[name] = (r.status_code, [line for line in r.iter_lines() if line.startswith("data: ")])

        threads = [threading.Thread(target=stream, args=(name,)) for name in ("a", "b")]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(60)
        ends = sorted(lines[-1] for _, lines in results.values())
        assert all(status == 200 for status, _ in results.values())
        assert ends[0] == "data: [DONE]"
        error = json.loads(ends[1][6:])["error"]
        assert error["type"] == "unavailable_error" and "full" in error["message"]
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
