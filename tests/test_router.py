"""Router mode (issue 39, item 1): ``--models-dir`` with three tiny checkpoints and
``--models-max 2``, each model a child server started on its first request. A request's
``model`` picks the child; answers equal the model's own; streams pass through; the
least recently used model stops past the limit; an unknown model is a 404; a child
killed mid-stream fails only its own stream, and its model serves again on the next
request; /metrics joins the children's with a ``model`` label."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from checkpoints import make_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess
from waiting import wait_for

from server.router.catalog import catalog

MODELS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for seed, name in enumerate(MODELS):
        make_checkpoint(folder / name, "llama", seed=seed)
    return folder


@pytest.fixture(scope="module")
def router(models):
    with ServerProcess("--models-dir", str(models), "--models-max", "2", "-np", "1", "-c", "512") as srv:
        srv.wait_ready()
        yield srv


def statuses(url: str) -> dict[str, dict]:
    return {m["id"]: m["status"] for m in httpx.get(url + "/models").json()["data"]}


def complete(url: str, model: str, **extra) -> httpx.Response:
    body = {"model": model, "prompt": "The sea was", "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def test_each_model_answers_as_itself_and_the_least_recent_stops(router, models):
    from engine import Engine, SamplingParams

    assert set(statuses(router.url)) == set(MODELS)
    assert {s["value"] for s in statuses(router.url).values()} == {"unloaded"}
    props = httpx.get(router.url + "/props").json()
    assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is True
    answers = {}
    for name in MODELS:
        r = complete(router.url, name)
        assert r.status_code == 200, r.text
        answers[name] = r.json()["choices"][0]["text"]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    for name in ("alpha", "gamma"):
        own = Engine.from_pretrained(str(models / name), n_ctx=512, n_seq_max=1).generate(["The sea was"], params)
        assert answers[name] == own[0].text
    assert len(set(answers.values())) == 3  # three models, three answers
    now = statuses(router.url)
    assert [now[n]["value"] for n in MODELS] == ["unloaded", "loaded", "loaded"]  # alpha: least recently used


def test_streams_pass_through(router):
    body = {"model": "beta", "prompt": "The sea was", "max_tokens": 8, "temperature": 0, "stream": True}
    chunks = []
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(chunks) == complete(router.url, "beta").json()["choices"][0]["text"]


def test_unknown_and_missing_models_are_refused(router):
    r = complete(router.url, "delta")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    assert httpx.get(router.url + "/health").status_code == 200


def test_a_killed_child_fails_only_its_own_requests(router):
    assert complete(router.url, "gamma").status_code == 200
    pid = statuses(router.url)["gamma"]["pid"]
    body = {"model": "gamma", "prompt": "a", "max_tokens": 400, "ignore_eos": True, "stream": True}
    got = []
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            got.append(line)
            if len(got) == 3:
                os.kill(pid, signal.SIGKILL)
    assert "data: [DONE]" not in got  # the stream ended with the child
    assert complete(router.url, "beta").status_code == 200  # the other model serves on
    wait_for(lambda: statuses(router.url)["gamma"]["value"] == "unloaded", 30, "gamma seen gone")
    again = complete(router.url, "gamma")  # started again
    assert again.status_code == 200 and statuses(router.url)["gamma"]["pid"] != pid


def test_a_page_on_another_site_cannot_unload(router):
    """The router's state-changing routes carry the server's cross-site refusal: a
    browser's simple POST (text/plain, a foreign Origin) is a 403 and nothing changes."""
    before = statuses(router.url)
    headers = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    r = httpx.post(router.url + "/models/unload", content='{"model": "beta"}', headers=headers)
    assert r.status_code == 403
    assert statuses(router.url)["beta"]["value"] == before["beta"]["value"]


def test_load_unload_and_metrics(router):
    assert httpx.post(router.url + "/models/unload", json={"model": "beta"}).json() == {"success": True}
    assert statuses(router.url)["beta"]["value"] == "unloaded"
    assert httpx.post(router.url + "/models/load", json={"model": "beta"}).json() == {"success": True}
    assert statuses(router.url)["beta"]["value"] == "loaded"
    text = httpx.get(router.url + "/metrics").text
    running = {
        s.labels["model"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "slotserve_requests_running"
    }
    assert running == {n for n, s in statuses(router.url).items() if s["value"] == "loaded"}


def test_the_catalog_reads_llama_servers_layout(tmp_path):
    """GGUF files (a split model as one), a folder with a model and its projector, a
    Hugging Face folder; the preset's flags, its [*] section and a model from elsewhere."""
    (tmp_path / "small.gguf").write_bytes(b"")
    for i in (1, 2):
        (tmp_path / f"big-0000{i}-of-00002.gguf").write_bytes(b"")
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "model-q8.gguf").write_bytes(b"")
    (tmp_path / "vision" / "mmproj-model-f16.gguf").write_bytes(b"")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    outside = tmp_path.parent / f"{tmp_path.name}-coder.gguf"
    outside.write_bytes(b"")
    preset = tmp_path.parent / f"{tmp_path.name}-preset.ini"
    preset.write_text(f"[*]\nctx-size = 4096\n\n[small]\nflash-attn = true\n\n[coder]\nmodel = {outside}\n")
    found = catalog(tmp_path, preset)
    assert set(found) == {"small", "big", "vision", "hf", "coder"}
    assert found["big"].path.name == "big-00001-of-00002.gguf"
    assert found["vision"].mmproj.name == "mmproj-model-f16.gguf" and found["vision"].path.name == "model-q8.gguf"
    assert found["small"].args == ("--ctx-size", "4096", "--flash-attn")
    assert found["coder"].path == outside and found["hf"].args == ("--ctx-size", "4096")


def test_no_child_outlives_a_killed_router(models):
    """SIGKILL to the router (no shutdown runs): the kernel tells its children, which
    drain and exit."""
    with ServerProcess("--models-dir", str(models), "-np", "1", "-c", "256") as srv:
        srv.wait_ready()
        assert complete(srv.url, "alpha").status_code == 200
        pid = statuses(srv.url)["alpha"]["pid"]
        srv.stop()  # SIGKILL

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0  # a zombie: exited

    wait_for(gone, 60, "the child gone")
