"""llama-server's switches and environment: --no-slots and the default --no-metrics answer 501,
/metrics says when the process started, and LLAMA_ARG_* variables configure the
server as they configure llama-server (SLOTSERVE_* and flags win over them)."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx
from server_proc import InProcessServer, ServerProcess


def test_disabled_endpoints_answer_501_and_metrics_carry_the_start_time():
    before = int(time.time())
    with InProcessServer(metrics=True, slots=False) as srv:
        r = httpx.get(srv.url + "/slots")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert "--slots" in r.json()["error"]["message"]
        m = httpx.get(srv.url + "/metrics")
        assert m.status_code == 200 and before - 1 <= int(m.headers["Process-Start-Time-Unix"]) <= time.time()
    with InProcessServer() as srv:  # llama-server's default: no /metrics without --metrics
        r = httpx.get(srv.url + "/metrics")
        assert r.status_code == 501 and "--metrics" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/slots").status_code == 200


def test_llama_arg_variables_configure_the_server(tmp_path):
    sock_path = tmp_path / "slotserve.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_path))  # a socket file an earlier run left behind
    stale.close()
    env = {
        "LLAMA_ARG_N_PARALLEL": "3",
        "LLAMA_ARG_CTX_SIZE": "1536",
        "LLAMA_API_KEY": "sk-llama",
        "LLAMA_ARG_ENDPOINT_METRICS": "enabled",  # llama.cpp's spelling of true
        "LLAMA_ARG_ALIAS": "from-llama-env",
        "LLAMA_ARG_HOST": f"127.0.0.1,127.0.0.2,{sock_path}",  # several addresses, one a UNIX socket
    }
    with ServerProcess(env=env, log=tmp_path / "s.log") as srv:
        assert isinstance(srv.proc, subprocess.Popen)  # a fresh interpreter: the environment is its own
        srv.wait_ready()
        assert httpx.get(srv.url.replace("127.0.0.1", "127.0.0.2") + "/health").status_code == 200
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock_path)), timeout=60) as local:
            assert local.get("http://localhost/health").json()["status"] == "ok"
        key = {"Authorization": "Bearer sk-llama"}
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers=key).json()["data"][0]["id"] == "from-llama-env"
        slots = httpx.get(srv.url + "/slots", headers=key).json()
        assert len(slots) == 3 and slots[0]["n_ctx"] == 512  # 1536 / 3 per stream
        assert httpx.get(srv.url + "/metrics", headers=key).status_code == 200
        srv.signal()  # SIGTERM: a clean stop
        assert srv.proc.wait(60) == 0
    assert not sock_path.exists()  # the socket file goes with the server
    env["LLAMA_ARG_HOST"] = "127.0.0.1"
    with InProcessServer.from_flags("-np", "2", env={**env, "SLOTSERVE_ALIAS": "ours"}, log=tmp_path / "t.log") as srv:
        srv.wait_ready()  # the flag and SLOTSERVE_* win over LLAMA_ARG_*
        key = {"Authorization": "Bearer sk-llama"}
        assert len(httpx.get(srv.url + "/slots", headers=key).json()) == 2
        assert httpx.get(srv.url + "/v1/models", headers=key).json()["data"][0]["id"] == "ours"


def test_several_aliases_and_tags_are_listed():
    with InProcessServer(alias="zeta-model, alpha-model", tags="code,small") as srv:
        card = httpx.get(srv.url + "/v1/models").json()["data"][0]
        assert card["aliases"] == ["alpha-model", "zeta-model"] and card["tags"] == ["code", "small"]
        assert card["id"] == "alpha-model"  # the first of the sorted names, as llama-server
        body = {"model": "zeta-model", "prompt": "x", "max_tokens": 2}
        answer = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
        assert answer["model"] == "alpha-model"


def test_completions_without_v1_is_the_native_completion():
    with InProcessServer() as srv:
        body = {"prompt": "def f(x):", "n_predict": 4, "temperature": 0}
        native = httpx.post(srv.url + "/completions", json=body, timeout=60).json()
        assert native["content"] == httpx.post(srv.url + "/completion", json=body, timeout=60).json()["content"]
        assert "tokens_cached" in native and "choices" not in native


def test_post_props_needs_the_flag_and_props_names_the_endpoints(demo_server):
    off = httpx.post(demo_server.url + "/props", json={})
    assert off.status_code == 501 and "--props" in off.json()["error"]["message"]
    props = httpx.get(demo_server.url + "/props").json()
    assert (props["endpoint_props"], props["endpoint_slots"], props["endpoint_metrics"]) == (False, True, True)
    with InProcessServer(props=True, slots=False) as srv:
        assert httpx.post(srv.url + "/props", json={}).json() == {"success": True}
        props = httpx.get(srv.url + "/props").json()
        assert (props["endpoint_props"], props["endpoint_slots"], props["endpoint_metrics"]) == (True, False, False)
